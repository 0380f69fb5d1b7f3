"""No source file of the project grows past 600 lines (Python and C++, tests excluded): a file
that does holds more than one concern and is split by concern before it lands."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ("python", "graph_rewrite", "tf_ops", "benchmarks")
LIMIT = 600


def _sources():
    for top in SOURCES:
        for directory, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [
                d for d in dirs if d not in ("tests", "__pycache__") and not d.endswith(".egg-info")
            ]
            for name in files:
                if name.endswith((".py", ".cc", ".h")) and not name.endswith("_test.cc"):
                    yield os.path.join(directory, name)


def test_no_source_file_is_over_600_lines():
    sizes = {}
    for path in _sources():
        with open(path, encoding="utf-8") as f:
            sizes[os.path.relpath(path, ROOT)] = sum(1 for _ in f)
    assert len(sizes) > 100, sorted(sizes)  # the walk found the project's sources
    too_long = {path: n for path, n in sizes.items() if n > LIMIT}
    assert not too_long, "over %d lines: %s" % (LIMIT, too_long)
