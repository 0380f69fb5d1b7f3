"""Runs the stress scripts, each in its own process (a crash or a hang is counted, not fatal),
and prints their summary lines. `make stress` runs the full suite; `--quick` is the subset
`make test` runs (about 2 minutes).

    python tests/stress/run.py [--quick]

Exits non-zero when any script reports a loss, crashes or runs out of time.
"""

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# (script, full arguments, quick arguments, time limit in seconds for the full run)
SCRIPTS = [
    (
        "kill_during_save.py",
        ["--rows", "3000000", "--kills", "20"],
        ["--rows", "100000", "--kills", "3"],
        3600,
    ),
    ("corruption.py", ["--rows", "3000000"], ["--rows", "100000"], 1800),
    ("full_disk.py", ["--rows", "1000000"], ["--rows", "100000"], 600),
    ("memory.py", [], ["--keys", "300000", "--b-steps", "50"], 600),
    ("concurrency.py", ["--seconds", "60"], ["--seconds", "3"], 600),
    ("fuzz.py", ["--calls", "1000000"], ["--calls", "15000"], 1800),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    failed = 0
    start = time.time()
    for script, full, quick, limit in SCRIPTS:
        command = [sys.executable, os.path.join(HERE, script)] + (quick if args.quick else full)
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=limit if not args.quick else 170
            )
            lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
            summary = lines[-1] if lines else result.stderr.strip()[-1000:]
            ok = result.returncode == 0
        except subprocess.TimeoutExpired:
            summary, ok = "%s: no result within %d s" % (script, limit), False
        failed += not ok
        print(("PASS " if ok else "FAIL ") + summary, flush=True)
    print(
        "stress: %d of %d scripts passed in %.0f s"
        % (len(SCRIPTS) - failed, len(SCRIPTS), time.time() - start)
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
