"""A small terminal progress display: a bar on a TTY, periodic lines otherwise (CI logs)."""

import sys
import time


class Progress:
    def __init__(self, total, label, stream=None, width=30, line_every=10.0):
        self.total = max(1, int(total))
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self.line_every = line_every
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()
        self.last_line = self.start
        self.done = 0
        self.samples = 0

    def update(self, steps=1, samples=0, **fields):
        self.done += steps
        self.samples += samples
        now = time.perf_counter()
        finished = self.done >= self.total
        if not self.tty and not finished and now - self.last_line < self.line_every:
            return
        self.last_line = now
        elapsed = max(now - self.start, 1e-9)
        filled = int(self.width * min(self.done, self.total) / self.total)
        bar = "#" * filled + "-" * (self.width - filled)
        extra = " ".join("%s=%.4f" % (k, v) for k, v in fields.items())
        text = "%s [%s] %d/%d  %.0f samples/s  %s" % (
            self.label,
            bar,
            self.done,
            self.total,
            self.samples / elapsed,
            extra,
        )
        if self.tty:
            self.stream.write("\r" + text + ("\n" if finished else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
