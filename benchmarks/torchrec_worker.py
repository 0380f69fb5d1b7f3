"""TorchRec/FBGEMM peer for benchmarks/bench_peers.py: times FBGEMM's fused table-batched
embedding (TBE) on the CPU and writes the medians to a JSON file.

Runs in the peer venv (benchmarks/setup_peers.sh makes .venv-peers), not in the TF venv:

    .venv-peers/bin/python benchmarks/torchrec_worker.py --keys FILE.npz --dim 16 \
        --threads 2 --steps 50 --warmup 10 --out result.json
    .venv-peers/bin/python benchmarks/torchrec_worker.py --selfcheck   # row-wise Adagrad facts

FILE.npz holds `batches` (int64 [num_batches, batch_size], keys in [0, vocab)) and `vocab`.
The module timed is fbgemm_gpu's SplitTableBatchedEmbeddingBagsCodegen, the kernel under
TorchRec's fused and sharded embedding modules (TorchRec's own FusedEmbeddingCollection refuses
device=cpu), with one FP32 table of `vocab` rows, EmbeddingLocation.HOST, ComputeDevice.CPU.
Each operation runs with pooling SUM and one key per bag (TorchRec's EmbeddingBagCollection
path) and with pooling NONE (sequence embeddings) where the CPU TBE accepts it: both give one
output row per key. The reported figure is the faster of the two (SUM on this CPU: NONE's
backward is 8-12x slower); the JSON also has each mode's.

Operations, each on a fresh TBE, on the batches cycled, median ms/step after the warm-up steps:
  lookup                 forward only, under torch.no_grad
  train_sgd              forward + backward of a gradient of ones; the optimizer is fused into
  train_adagrad          the backward (EXACT_SGD, EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD, ADAM),
  train_rowwise_adagrad  so that step is the update; no dense layers
  train_adam
An optimizer the CPU TBE refuses is listed under "unsupported" with the reason, not a crash.
"""

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    BoundsCheckMode,
    ComputeDevice,
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
)

LR = 0.05
EPS = 1e-8
TRAIN_OPS = {
    "train_sgd": EmbOptimType.EXACT_SGD,
    "train_adagrad": EmbOptimType.EXACT_ADAGRAD,
    "train_rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "train_adam": EmbOptimType.ADAM,
}


def make_tbe(rows, dim, optimizer, pooling, lr=LR, eps=EPS):
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=optimizer,
        learning_rate=lr,
        eps=eps,
        pooling_mode=pooling,
        bounds_check_mode=BoundsCheckMode.NONE,
    )  # keys are known to be in range
    tbe.init_embedding_weights_uniform(-0.05, 0.05)
    return tbe


def poolings(dim):
    """SUM, and NONE if a tiny TBE does forward and backward with it on the CPU."""
    try:
        tbe = make_tbe(8, dim, EmbOptimType.EXACT_SGD, PoolingMode.NONE)
        out = tbe(torch.tensor([1, 3]), torch.arange(3))
        out.backward(torch.ones_like(out))
        return [PoolingMode.SUM, PoolingMode.NONE]
    except Exception:  # pylint: disable=broad-except  (no sequence mode on this CPU build)
        return [PoolingMode.SUM]


def time_op(tbe, batches, offsets, steps, warmup, train):
    grad = torch.ones(offsets.numel() - 1, tbe.max_D)
    times = []
    for i in range(warmup + steps):
        indices = batches[i % len(batches)]
        start = time.perf_counter()
        if train:
            tbe(indices, offsets).backward(grad)
        else:
            with torch.no_grad():
                tbe(indices, offsets)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def selfcheck():
    """The tiny row-wise Adagrad case: 4 rows, dim 4 (FBGEMM wants dim % 4 == 0), all-zero
    weights, keys [0, 0, 2], output gradient of ones, lr 0.1, eps 1e-8; then eps 1.0."""
    report = {}
    for eps in (1e-8, 1.0):
        tbe = make_tbe(4, 4, EmbOptimType.EXACT_ROWWISE_ADAGRAD, PoolingMode.NONE, 0.1, eps)
        with torch.no_grad():
            tbe.split_embedding_weights()[0].zero_()
        out = tbe(torch.tensor([0, 0, 2]), torch.arange(4))
        out.backward(torch.ones_like(out))
        weights = tbe.split_embedding_weights()[0]
        acc = tbe.split_optimizer_states()[0][0]
        # Duplicates summed first (row 0's gradient is 2), accumulator starts at 0 and adds the
        # mean over the row of the squared summed gradient, eps outside the sqrt.
        g = torch.tensor([2.0, 0.0, 1.0, 0.0])
        want_acc = g * g
        want_w = -0.1 * g / (want_acc.sqrt() + eps)
        assert torch.allclose(acc, want_acc), acc
        assert torch.allclose(weights[:, 0], want_w), weights
        report["eps=%g" % eps] = {"accumulator": acc.tolist(), "weights": weights.tolist()}
    for case, values in report.items():
        print(case, json.dumps(values))


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--out")
    parser.add_argument("--selfcheck", action="store_true")
    args = parser.parse_args()
    if args.selfcheck:
        return selfcheck()
    if not (args.keys and args.out):
        parser.error("--keys and --out are required")
    torch.set_num_threads(args.threads)

    data = np.load(args.keys)
    vocab = int(data["vocab"])
    keys = np.ascontiguousarray(data["batches"], dtype=np.int64)
    if keys.min() < 0 or keys.max() >= vocab:
        sys.exit("keys must lie in [0, vocab)")
    batches = [torch.from_numpy(b) for b in keys]
    offsets = torch.arange(keys.shape[1] + 1, dtype=torch.int64)  # one key per bag
    modes = poolings(args.dim)

    import fbgemm_gpu
    import torchrec

    result = {
        "library": "fbgemm_gpu SplitTableBatchedEmbeddingBagsCodegen (CPU, HOST, FP32)",
        "versions": {
            "torch": torch.__version__,
            "fbgemm_gpu": fbgemm_gpu.__version__,
            "torchrec": getattr(torchrec, "__version__", "?"),
            "python": platform.python_version(),
        },
        "pooling": "the faster of %s (one key per bag)" % " and ".join(m.name for m in modes),
        "threads": torch.get_num_threads(),
        "dim": args.dim,
        "vocab": vocab,
        "batch_size": keys.shape[1],
        "num_batches": keys.shape[0],
        "steps": args.steps,
        "warmup": args.warmup,
        "optimizer_params": {
            "learning_rate": LR,
            "eps": EPS,
            "adagrad_initial_accumulator": 0.0,  # FBGEMM's, not settable
            "gradient": "ones",
        },
        "ms_per_step": {},
        "by_pooling": {m.name: {} for m in modes},
        "unsupported": {},
    }
    ops = [("lookup", EmbOptimType.EXACT_SGD, False)]
    ops += [(name, optimizer, True) for name, optimizer in TRAIN_OPS.items()]
    for name, optimizer, train in ops:
        for mode in modes:
            try:
                tbe = make_tbe(vocab, args.dim, optimizer, mode)
                result["by_pooling"][mode.name][name] = round(
                    time_op(tbe, batches, offsets, args.steps, args.warmup, train), 4
                )
            except Exception as e:  # pylint: disable=broad-except  (e.g. ADAM on the CPU)
                result["unsupported"][name] = "%s: %s" % (type(e).__name__, e)
            tbe = None  # frees the table before the next one is made
        times = [
            result["by_pooling"][m.name][name]
            for m in modes
            if name in result["by_pooling"][m.name]
        ]
        if times:
            result["ms_per_step"][name] = min(times)
            result["unsupported"].pop(name, None)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result["ms_per_step"]))


if __name__ == "__main__":
    main()
