"""The summary tables bench_serving.py prints at the end: the load's bytes per key, serving
QPS and latency (static against mutable), the update applies and training with pushes."""

import numpy as np


def report(load, serve, apply_seconds, train, dim):
    print("\n## load (per key: bytes / (8 + 4 x dim) payload)")
    for r in load or []:
        print(
            "| %(keys)d | %(kind)s | export %(export_s)s s | load %(load_s)s s | RSS "
            "%(rss_per_payload)sx | peak %(peak_per_payload)sx |" % r
        )
    # The memory each further key costs (the load's fixed costs cancel): between the two
    # smallest and largest sizes.
    for kind in ("static", "mutable", "plugin"):
        runs = sorted((r["keys"], r["rss_kb"]) for r in load or [] if r["kind"] == kind)
        if len(runs) >= 2 and runs[-1][0] > runs[0][0]:
            per_key = (runs[-1][1] - runs[0][1]) * 1024 / (runs[-1][0] - runs[0][0])
            print(
                "| %s | %.1f bytes per further key | %.2fx the payload |"
                % (kind, per_key, per_key / (8 + 4 * dim))
            )
    print("\n## serving (mutable with updates / static without)")
    for batch in (1, 256) if serve else ():
        for metric in ("qps", "p50_ms", "p99_ms"):
            s, m = (
                np.mean([r[metric] for r in serve if r["batch"] == batch and r["kind"] == kind])
                for kind in ("static", "mutable")
            )
            print(
                "| batch %d | %s | static %.2f | mutable %.2f | ratio %.2f |"
                % (batch, metric, s, m, m / s)
            )
    if apply_seconds:
        print("update apply: %.3f-%.3f s" % (min(apply_seconds), max(apply_seconds)))
    if not train:
        return
    base = np.mean([train[k]["steps_per_s"] for k in ("no push", "no push 2")])
    pushed = np.mean([train[k]["steps_per_s"] for k in ("push", "push 2")])
    print(
        "\n## training: %.2f steps/s without pushes, %.2f with (ratio %.3f); max lag %s s"
        % (base, pushed, pushed / base, max(train[k]["max_lag_s"] or 0 for k in ("push", "push 2")))
    )
