"""The reports of bench_models.py: the row-precision table (`--precision`: bytes per key and
step time per row and slot dtype, each case a worker process that `spawn` runs) and the
scaling plot (`--plot`)."""

import statistics

PRECISION_CASES = ((64, "rowwise_adagrad"), (16, "lazy_adam"))
# (emb_dtype, slot_dtype, index_layout); bfloat16 slots only where the slots have dim
# values. "auto" is compact for half-precision rows; bfloat16 rows with a full index show
# what the compact index adds.
PRECISION_DTYPES = (
    ("float32", "float32", "auto"),
    ("bfloat16", "float32", "auto"),
    ("bfloat16", "float32", "full"),
    ("float16", "float32", "auto"),
    ("bfloat16", "bfloat16", "auto"),
)


def _precision_dtypes(optimizer):
    return [d for d in PRECISION_DTYPES if d[1] == "float32" or optimizer != "rowwise_adagrad"]


def precision(args, spawn):
    """Bytes per key and train step time per row dtype (see the module doc)."""
    results = {}
    for _ in range(args.rounds):
        for dim, optimizer in PRECISION_CASES:
            for dtype, slot_dtype, layout in _precision_dtypes(optimizer):
                r = spawn(
                    [
                        "--scaling-worker",
                        str(args.precision_keys),
                        "--steps",
                        "30",
                        "--dim",
                        str(dim),
                        "--optimizer",
                        optimizer,
                        "--emb-dtype",
                        dtype,
                        "--slot-dtype",
                        slot_dtype,
                        "--index-layout",
                        layout,
                    ]
                )
                results.setdefault((dim, optimizer, dtype, slot_dtype, layout), []).append(r)
    print(
        "\nprecision: rec_sdk train step (65,536 Zipf keys) on a table of %d keys, per row "
        "and slot dtype; medians of %d rounds, ratios to float32 per round"
        % (args.precision_keys, args.rounds)
    )
    print(
        "| dim, optimizer | emb_dtype | slot_dtype | index_layout | bytes/key | x float32 "
        "| ms/step | x float32 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for dim, optimizer in PRECISION_CASES:
        base = results[(dim, optimizer, "float32", "float32", "auto")]
        for dtype, slot_dtype, layout in _precision_dtypes(optimizer):
            runs = results[(dim, optimizer, dtype, slot_dtype, layout)]
            if any("error" in r for r in runs + base):
                print(
                    "| %d, %s | %s | %s | %s | %s | | | |"
                    % (
                        dim,
                        optimizer,
                        dtype,
                        slot_dtype,
                        layout,
                        [r.get("error") for r in runs + base if "error" in r][0],
                    )
                )
                continue
            med = lambda rs, k: statistics.median(r[k] for r in rs)
            ratio = lambda k, runs=runs, base=base: statistics.median(
                r[k] / b[k] for r, b in zip(runs, base)
            )
            print(
                "| %d, %s | %s | %s | %s | %.0f | %.2fx | %.1f | %.2fx |"
                % (
                    dim,
                    optimizer,
                    dtype,
                    slot_dtype,
                    layout,
                    med(runs, "bytes_per_key"),
                    ratio("bytes_per_key"),
                    med(runs, "ms_per_step"),
                    ratio("ms_per_step"),
                )
            )


def plot(results, path, payload_bytes):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: matplotlib is not installed)")
        return
    ok = [r for r in results if "error" not in r]
    keys = [r["keys"] / 1e6 for r in ok]
    fig, left = plt.subplots(figsize=(6, 3.5))
    left.plot(keys, [65536 / r["ms_per_step"] / 1e3 for r in ok], "o-", color="tab:blue")
    left.set_xlabel("keys in the table (millions)")
    left.set_ylabel("train step throughput (M keys/s)", color="tab:blue")
    left.set_ylim(bottom=0)
    right = left.twinx()
    right.plot(keys, [r["bytes_per_key"] for r in ok], "s--", color="tab:red")
    right.axhline(payload_bytes, color="tab:red", linestyle=":", linewidth=1)
    right.text(keys[-1], payload_bytes, "payload", color="tab:red", ha="right", va="bottom")
    right.set_ylabel("bytes per key (RSS growth)", color="tab:red")
    right.set_ylim(0, max(r["bytes_per_key"] for r in ok) * 1.15)
    left.set_title("rec_sdk: throughput and memory against table size")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print("plot: %s" % path)
