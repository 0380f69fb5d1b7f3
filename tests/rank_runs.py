"""Running a cluster's rank processes to the end, reading every rank's output and exit code
(tests of ranks that fail, leave or hang; the chaos test)."""

import subprocess
import sys
import threading
import time


class Rank:
    """One started rank process: its output is read as it comes (`text()`)."""

    def __init__(self, argv, env):
        self.process = subprocess.Popen(
            [sys.executable] + [str(a) for a in argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines = []
        self.ended_at = None  # time.time() when its exit was seen
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line)

    def text(self):
        return "".join(self.lines)

    def poll(self):
        code = self.process.poll()
        if code is not None and self.ended_at is None:
            self.ended_at = time.time()
        return code

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.reader.join(30)
        self.process.stdout.close()


def report(ranks):
    """Every rank's exit code and the end of its output."""
    return "\n".join(
        "--- rank %d (exit %s):\n%s" % (i, r.process.returncode, r.text()[-4000:])
        for i, r in enumerate(ranks)
    )


def wait_all(ranks, timeout):
    """Waits until every rank exited; kills them all and fails (showing each one's output)
    when one still runs after `timeout` seconds. -> [(exit code, output)] (each Rank's
    ended_at tells when it exited)."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if all(r.poll() is not None for r in ranks):
                break
            time.sleep(0.1)
        hung = [i for i, r in enumerate(ranks) if r.poll() is None]
    finally:
        for r in ranks:
            r.stop()
    assert not hung, "ranks %s still running after %d s\n%s" % (hung, timeout, report(ranks))
    return [(r.process.returncode, r.text()) for r in ranks]


def run_ranks(runs, timeout):
    """Starts [(argv after python, env)] at once and waits for every one: wait_all."""
    return wait_all([Rank(argv, env) for argv, env in runs], timeout)
