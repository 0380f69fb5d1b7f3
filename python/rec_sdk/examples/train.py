"""Train a CTR model (Wide&Deep, DLRM or DCN-v2) with rec_sdk tables, in tf.compat.v1.Session
or tf.estimator mode, on MovieLens-100k, the synthetic Criteo-schema data, or your own files.

    python -m rec_sdk.examples.train --model dlrm --data synthetic --steps 2000
    python -m rec_sdk.examples.train --model dcn_v2 --data movielens --mode estimator
    python -m rec_sdk.examples.train --model wide_deep --data criteo:day_0.tsv --logdir runs/w
    python -m rec_sdk.examples.train --data avazu:train.csv --access-threshold 2
    python -m rec_sdk.distribute.launch --ps 2 --workers 1 -- \
        python -m rec_sdk.examples.train --api dynamic_embedding --model dlrm --data synthetic

--data: movielens | synthetic (generated in memory, --rows rows, Criteo's cardinalities times
--scale) | criteo:PATH[,PATH...] (Criteo TSV) | avazu:PATH (Avazu CSV with header) |
tfrecord:PATH (rec_sdk.examples.synthetic's files). Files are streamed (larger than memory is
fine); their first --eval-batches batches are held out for evaluation unless --eval-data
names other files. A progress bar shows samples/s; every --eval-every steps the model is
evaluated (AUC, log loss). With --logdir, TensorBoard gets loss, step time, samples/s, AUC,
log loss and every table's size, admitted, evicted and rejected counts.

With TF_CONFIG set (a cluster, e.g. from rec_sdk.distribute.launch), --api
dynamic_embedding places each variable's shards on the ps tasks (one shard per task) and the
dense layers by replica_device_setter; each worker trains on its own slice of the data
(asynchronously) and worker 0 evaluates and reports. In a cluster without ps tasks, the SDK
API (--api sdk) trains over the ranks: each table sharded by key over them, each rank on its
own slice of the data, synchronously (dense gradients averaged by all_reduce), every rank
evaluating the whole evaluation set:
    python -m rec_sdk.distribute.launch --workers 2 -- \
        python -m rec_sdk.examples.train --model dlrm --data synthetic
"""

import argparse
import collections
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from rec_sdk import distribute  # noqa: E402
from rec_sdk.base import tf_compat  # noqa: E402
from rec_sdk.core.feature_process import TableStatsHook  # noqa: E402
from rec_sdk.examples import feature_spec_demo, inputs, synthetic  # noqa: E402
from rec_sdk.examples.demo import evaluate  # noqa: E402
from rec_sdk.examples.embeddings import make_embeddings  # noqa: E402
from rec_sdk.examples.models import MODELS, logits  # noqa: E402
from rec_sdk.examples.progress import Progress  # noqa: E402
from rec_sdk.graph.modifier import GraphModifierHook  # noqa: E402
from rec_sdk.util.initialize import init, terminate_config_initializer  # noqa: E402
from rec_sdk.util.variable import get_dense_and_sparse_variable  # noqa: E402

# A sparse field: ids = batch[key] (or its column `column`); multi: [batch, k] ids padded
# with -1, mean-pooled.
Field = collections.namedtuple("Field", ["name", "table", "key", "column", "multi"])


class Source:
    """A data set: its fields, whether it has dense features, and its datasets."""

    def __init__(self, name, fields, has_dense, train, evaluation, vocabulary):
        self.name = name
        self.fields = fields
        self.has_dense = has_dense
        self._train = train
        self._eval = evaluation
        self.vocabulary = vocabulary  # distinct keys per table (or an upper bound)

    def train_dataset(self, batch_size, seed):
        return self._train(batch_size, seed)

    def eval_dataset(self, batch_size):
        return self._eval(batch_size)

    @property
    def tables(self):
        return sorted({f.table for f in self.fields})


def _movielens(seed):
    train, test, _ = feature_spec_demo.load_inputs(seed=seed)
    fields = [
        Field("user_id", "user", "user_id", None, False),
        Field("item_id", "item", "item_id", None, False),
        Field("genres", "item", "genres", None, True),
    ]
    fields += [
        Field(name, "user", "user_side", i, False)
        for i, name in enumerate(feature_spec_demo.USER_SIDE_FIELDS)
    ]
    return Source(
        "movielens",
        fields,
        False,
        lambda b, s: inputs.array_dataset(train, b, shuffle=True, seed=s, repeat=True),
        lambda b: inputs.array_dataset(test, b),
        {"user": 5000, "item": 5000},
    )


def _criteo_fields(names):
    return [Field(name, name, "categorical", i, False) for i, name in enumerate(names)]


def _synthetic(rows, scale, seed):
    generator = synthetic.Generator(seed=seed, scale=scale)
    train = synthetic.features(generator.rows(0, rows))
    test = synthetic.features(generator.rows(rows, max(rows // 10, 4096)))
    names = ["C%d" % (i + 1) for i in range(synthetic.NUM_CATEGORICAL)]
    vocabulary = dict(zip(names, generator.cardinalities))
    return Source(
        "synthetic",
        _criteo_fields(names),
        True,
        lambda b, s: inputs.array_dataset(train, b, shuffle=True, seed=s, repeat=True),
        lambda b: inputs.array_dataset(test, b),
        vocabulary,
    )


def _files(kind, paths, eval_paths, eval_batches):
    reader = {
        "criteo": inputs.criteo_tsv_dataset,
        "avazu": inputs.avazu_csv_dataset,
        "tfrecord": inputs.tfrecord_dataset,
    }[kind]
    if kind == "avazu":
        names = list(inputs.AVAZU_CATEGORICAL)
    else:
        names = ["C%d" % (i + 1) for i in range(inputs.CRITEO_CATEGORICAL)]

    def train(batch_size, seed):
        if eval_paths:
            return reader(paths, batch_size, shuffle_buffer=16 * batch_size, seed=seed, repeat=True)
        # The held-out batches come first in file order: train on the rest, unshuffled.
        return reader(paths, batch_size).skip(eval_batches).repeat()

    def evaluation(batch_size):
        if eval_paths:
            return reader(eval_paths, batch_size)
        return reader(paths, batch_size).take(eval_batches)

    return Source(
        kind,
        _criteo_fields(names),
        kind != "avazu",
        train,
        evaluation,
        {name: 1 << 22 for name in names},
    )


def make_source(spec, rows=500_000, scale=0.05, seed=0, eval_data=None, eval_batches=10):
    """The Source named by --data (see the module doc)."""
    if spec == "movielens":
        return _movielens(seed)
    if spec == "synthetic":
        return _synthetic(rows, scale, seed)
    kind, _, paths = spec.partition(":")
    if kind not in ("criteo", "avazu", "tfrecord") or not paths:
        raise ValueError(
            "--data must be movielens, synthetic, criteo:PATH, avazu:PATH or "
            "tfrecord:PATH, got %r" % spec
        )
    eval_paths = eval_data.split(",") if eval_data else None
    return _files(kind, paths.split(","), eval_paths, eval_batches)


def build(model, source, embeddings, batch, is_train, dim, dlrm_top=(256, 128)):
    """(probabilities, labels, loss) of `model` on one batch."""
    embs, wide = embeddings.embed(batch, is_train)
    dense = batch.get("dense") if source.has_dense else None
    out = logits(model, embs, dense, wide=wide, dim=dim, dlrm_top=dlrm_top)
    labels = tf.cast(batch["label"], tf.float32)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=out))
    return tf.sigmoid(out), labels, loss


def _scalars(writer, step, values):
    if writer is None:
        return
    writer.add_summary(
        tf.compat.v1.Summary(
            value=[
                tf.compat.v1.Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()
            ]
        ),
        step,
    )


def _train_op(args, embeddings, loss, reduce_dense=None):
    """TF Adam on the model's dense layers and the embeddings' own sparse update."""
    dense, _ = get_dense_and_sparse_variable()
    return embeddings.train_op(
        loss,
        dense,
        tf.compat.v1.train.AdamOptimizer(args.learning_rate),
        tf.compat.v1.train.get_or_create_global_step(),
        reduce_dense,
    )


def _cluster():
    """(server, its ClusterTask) when TF_CONFIG names a cluster, else (None, None). A cluster
    without ps tasks trains synchronously over its ranks (collectives)."""
    if not os.environ.get("TF_CONFIG"):
        return None, None
    ranks = "ps" not in distribute.task_from_tf_config().cluster.jobs
    server = distribute.start_server(collective=ranks)
    return server, distribute.current_task()


def run_session(args, source, log):
    """Session mode: one graph with a training and an evaluation iterator (in a cluster: this
    worker's slice of the training data, the shards on the ps tasks)."""
    tf.compat.v1.set_random_seed(args.seed)
    server, task = _cluster()
    placement, devices, target, reduce_dense = None, None, "", None
    config = distribute.pinned_config()
    train_data = source.train_dataset(args.batch_size, args.seed)
    if task is not None and "ps" not in task.cluster.jobs:
        # The SDK API over the ranks: tables sharded by key, synchronous steps.
        if args.api == "dynamic_embedding":
            raise ValueError(
                "in a cluster without ps tasks this example trains --api sdk "
                "over the ranks; --api dynamic_embedding needs ps tasks"
            )
        rank, ranks = distribute.rank_of(task)
        placement = distribute.worker_devices(task)[rank]
        target, config = server.target, distribute.worker_config(server, collective=True)
        train_data = train_data.shard(ranks, rank)

        def reduce_dense(grads):
            present = [g for g in grads if g is not None]
            reduced = iter(
                distribute.all_reduce_many(
                    [tf.convert_to_tensor(g) for g in present], "mean", name="dense_all_reduce"
                )
            )
            return [None if g is None else next(reduced) for g in grads]
    elif task is not None:
        if args.api != "dynamic_embedding":
            raise ValueError(
                "in a cluster with ps tasks this example trains --api "
                "dynamic_embedding (shards on the ps tasks); the SDK API "
                "trains over the ranks of a cluster without ps tasks"
            )
        devices = distribute.ps_devices(server)
        placement = tf.compat.v1.train.replica_device_setter(
            worker_device="/job:worker/task:%d" % task.task_index, cluster=task.cluster
        )
        target, config = server.target, distribute.worker_config(server)
        workers = task.cluster.num_tasks("worker")
        train_data = train_data.shard(workers, task.task_index)
    with tf.compat.v1.device(placement):
        train_it = tf.compat.v1.data.make_one_shot_iterator(train_data.prefetch(4))
        eval_it = tf.compat.v1.data.make_initializable_iterator(
            source.eval_dataset(args.eval_batch_size).prefetch(2)
        )
        embeddings = make_embeddings(args, source, devices)
        _, _, loss = build(args.model, source, embeddings, train_it.get_next(), True, args.dim)
        eval_probs, eval_labels, _ = build(
            args.model, source, embeddings, eval_it.get_next(), False, args.dim
        )
        train_op = _train_op(args, embeddings, loss, reduce_dense)
    stats = {name: t.stats() for name, t in embeddings.tables.items()}
    writer = tf.compat.v1.summary.FileWriter(args.logdir) if args.logdir else None
    history, losses = [], []
    with tf.compat.v1.Session(target, config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        progress = Progress(args.steps, "%s on %s" % (args.model, source.name))
        start = time.perf_counter()
        train_time = 0.0
        for i in range(1, args.steps + 1):
            t0 = time.perf_counter()
            _, value = sess.run([train_op, loss])
            dt = time.perf_counter() - t0
            train_time += dt
            losses.append(value)
            progress.update(1, samples=args.batch_size, loss=float(np.mean(losses[-50:])))
            if i % 50 == 0 or i == args.steps:
                _scalars(
                    writer,
                    i,
                    {
                        "loss": np.mean(losses[-50:]),
                        "step_time_ms": dt * 1e3,
                        "samples_per_s": args.batch_size / dt,
                    },
                )
            if i % args.eval_every == 0 or i == args.steps:
                test_auc, test_loss = evaluate(sess, eval_it.initializer, eval_probs, eval_labels)
                history.append((i, test_auc, test_loss))
                table_stats = sess.run(stats)
                _scalars(writer, i, {"eval/auc": test_auc, "eval/log_loss": test_loss})
                for name, values in table_stats.items():
                    _scalars(
                        writer,
                        i,
                        {
                            "tables/%s/%s" % (name, k): values[k]
                            for k in ("size", "admitted", "evicted", "rejected")
                        },
                    )
                log(
                    "step %d: train loss %.4f  eval AUC %.4f  log loss %.4f  keys %d"
                    % (
                        i,
                        float(np.mean(losses[-50:])),
                        test_auc,
                        test_loss,
                        sum(v["size"] for v in table_stats.values()),
                    )
                )
        elapsed = time.perf_counter() - start
    if writer is not None:
        writer.close()
    return {
        "history": history,
        "test_auc": history[-1][1],
        "test_loss": history[-1][2],
        "samples_per_s": args.steps * args.batch_size / train_time,
        "elapsed_s": elapsed,
        "tables": {k: {s: int(v) for s, v in d.items()} for k, d in table_stats.items()},
    }


class _ProgressHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, progress, batch_size):
        self.progress = progress
        self.batch_size = batch_size

    def after_run(self, run_context, run_values):
        self.progress.update(1, samples=self.batch_size)


def run_estimator(args, source, log):
    """tf.estimator mode: train --eval-every steps at a time, evaluating in between; tables
    are shared between the training and evaluation sessions (GraphModifierHook)."""
    tfe = tf_compat.estimator()  # a clear error on TensorFlow >= 2.16, which has no Estimator

    def model_fn(features, labels, mode):
        del labels
        is_train = mode == tfe.ModeKeys.TRAIN
        embeddings = make_embeddings(args, source)
        probs, labels_, loss = build(args.model, source, embeddings, features, is_train, args.dim)
        if mode == tfe.ModeKeys.PREDICT:
            return tfe.EstimatorSpec(mode, predictions={"probability": probs})
        if mode == tfe.ModeKeys.EVAL:
            return tfe.EstimatorSpec(
                mode,
                loss=loss,
                eval_metric_ops={
                    "auc": tf.compat.v1.metrics.auc(
                        labels_,
                        probs,
                        num_thresholds=2000,
                        summation_method="careful_interpolation",
                    )
                },
            )
        return tfe.EstimatorSpec(mode, loss=loss, train_op=_train_op(args, embeddings, loss))

    model_dir = args.logdir or _temp_dir()
    estimator = tfe.Estimator(
        model_fn,
        model_dir=model_dir,
        config=tfe.RunConfig(
            tf_random_seed=args.seed,
            save_checkpoints_steps=args.eval_every,
            save_summary_steps=50,
            log_step_count_steps=None,
        ),
    )
    progress = Progress(args.steps, "%s on %s (estimator)" % (args.model, source.name))
    history, done, start, train_time = [], 0, time.perf_counter(), 0.0
    while done < args.steps:
        chunk = min(args.eval_every, args.steps - done)
        t0 = time.perf_counter()
        estimator.train(
            lambda done=done: source.train_dataset(args.batch_size, args.seed + done),
            steps=chunk,
            hooks=[
                GraphModifierHook(),
                _ProgressHook(progress, args.batch_size),
                TableStatsHook(model_dir, 50),
            ],
        )
        train_time += time.perf_counter() - t0
        done += chunk
        metrics = estimator.evaluate(
            lambda: source.eval_dataset(args.eval_batch_size), hooks=[GraphModifierHook()]
        )
        history.append((done, float(metrics["auc"]), float(metrics["loss"])))
        log("step %d: eval AUC %.4f  loss %.4f" % history[-1])
    return {
        "history": history,
        "test_auc": history[-1][1],
        "test_loss": history[-1][2],
        "samples_per_s": args.steps * args.batch_size / train_time,
        "elapsed_s": time.perf_counter() - start,
        "model_dir": model_dir,
    }


def _temp_dir():
    return tempfile.mkdtemp(prefix="rec_sdk_train_")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=MODELS, default="dlrm")
    parser.add_argument("--data", default="movielens")
    parser.add_argument("--eval-data", default=None, help="files to evaluate on (file sources)")
    parser.add_argument(
        "--eval-batches",
        type=int,
        default=10,
        help="file sources without --eval-data: batches held out",
    )
    parser.add_argument("--mode", choices=("session", "estimator"), default="session")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--eval-batch-size", type=int, default=4096)
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=0.001)
    parser.add_argument("--access-threshold", type=int, default=None)
    parser.add_argument(
        "--api",
        choices=("rec_sdk", "dynamic_embedding"),
        default="rec_sdk",
        help="rec_sdk tables (create_table + sparse_lookup) or TFRA-style "
        "rec_sdk.dynamic_embedding variables",
    )
    parser.add_argument("--rows", type=int, default=500_000, help="synthetic: training rows")
    parser.add_argument(
        "--scale",
        type=float,
        default=0.05,
        help="synthetic: multiplies Criteo's per-field cardinalities",
    )
    parser.add_argument(
        "--logdir", default=None, help="TensorBoard event files (and Estimator checkpoints)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--emb-dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="the tables' row dtype (half: stochastic rounding on update)",
    )
    parser.add_argument(
        "--slot-dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the tables' optimizer slot dtype (bfloat16: stochastic rounding on update)",
    )
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "eval_batch_size", "eval_every", "dim", "rows"):
        if getattr(args, name) < 1:
            parser.error("--%s must be >= 1" % name.replace("_", "-"))
    if args.api == "dynamic_embedding" and args.access_threshold is not None:
        parser.error(
            "--access-threshold is for --api rec_sdk (dynamic_embedding variables "
            "have no feature admission)"
        )
    return args


def main(argv=None, log=None):
    args = parse_args(argv)
    log = log or (lambda line: print(line, file=sys.stderr))
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    source = make_source(
        args.data,
        rows=args.rows,
        scale=args.scale,
        seed=args.seed,
        eval_data=args.eval_data,
        eval_batches=args.eval_batches,
    )
    init(train_steps=args.steps)
    try:
        run = run_estimator if args.mode == "estimator" else run_session
        results = run(args, source, log)
    finally:
        terminate_config_initializer()
    log(
        "final: eval AUC %.4f  log loss %.4f  %.0f samples/s of training"
        % (results["test_auc"], results["test_loss"], results["samples_per_s"])
    )
    return results


if __name__ == "__main__":
    main()
