"""Where graph dumps go (dump_graph=True): ./rec_sdk_dump/<kind>_<n>, numbered per kind."""

import collections
import os
import threading

_lock = threading.Lock()
_counters = collections.Counter()


def next_dump_path(kind):
    """A new path ./rec_sdk_dump/<kind>_<n> (n counts the dumps of that kind in this process)."""
    with _lock:
        number = _counters[kind]
        _counters[kind] += 1
    return os.path.join(os.getcwd(), "rec_sdk_dump", "%s_%d" % (kind, number))
