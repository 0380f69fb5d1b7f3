"""The SSD tier of a table larger than memory: its sizes and directories, checked once, here.
A tiered table keeps `memory_rows` rows in memory; the least recently used others are records
in files under `paths` (at most `ssd_rows` of them; None: no bound, the table then grows
without bound), read back when a training lookup needs them (see "The SSD tier" in
docs/ARCHITECTURE.md). With direct_io the files bypass the page cache (O_DIRECT)."""

import collections
import os

from rec_sdk.base.validation import check_bool, check_int

MAX_ROWS = 2**40  # rows a tier level may be given; far beyond any machine's memory

TierConfig = collections.namedtuple(
    "TierConfig", ["memory_rows", "ssd_rows", "paths", "direct_io"], defaults=(False,)
)


def make(memory_rows, ssd_rows, paths, direct_io=False, names=("memory_rows", "ssd_rows")):
    """A checked TierConfig: memory_rows >= 1, ssd_rows >= 1 or None (no bound), `paths`
    already checked by check_paths. `names`: the parameters the sizes came from (errors name
    them)."""
    memory_rows = check_int(names[0], memory_rows, 1, MAX_ROWS)
    if ssd_rows is not None:
        ssd_rows = check_int(names[1], ssd_rows, 1, MAX_ROWS)
    return TierConfig(memory_rows, ssd_rows, tuple(paths), check_bool("direct_io", direct_io))


# The counters of table.stats() that only a tiered table moves: TensorBoard summaries of
# other tables leave them out.
TIER_STATS = (
    "hot",
    "cold",
    "promotions",
    "demotions",
    "ssd_bytes_read",
    "ssd_bytes_written",
    "ssd_file_bytes",
    "prefetch_hits",
)


def check_paths(parameter, paths, must_exist=True):
    """The directories given as `parameter` (a path or a sequence of paths), as absolute
    paths; with must_exist, each must be an existing directory this process can write to."""
    if isinstance(paths, (str, os.PathLike)):
        paths = (paths,)
    if (
        not isinstance(paths, (list, tuple))
        or not paths
        or not all(isinstance(p, (str, os.PathLike)) and str(p) for p in paths)
    ):
        raise TypeError(
            "%s must be a directory path or a non-empty list of them, got %r" % (parameter, paths)
        )
    checked = []
    for i, path in enumerate(paths):
        where = parameter if len(paths) == 1 else "%s[%d]" % (parameter, i)
        full = os.path.abspath(os.fspath(path))
        if must_exist and not os.path.isdir(full):
            raise ValueError(
                "%s=%r is not an existing directory (the SSD tier keeps its "
                "record files there)" % (where, os.fspath(path))
            )
        if must_exist and not os.access(full, os.W_OK | os.X_OK):
            raise ValueError(
                "%s=%r is a directory this process cannot write to" % (where, os.fspath(path))
            )
        checked.append(full)
    return tuple(checked)


def split(tier, parts):
    """The TierConfig of each of `parts` shards of a table: the rows divided, rounded up."""
    if tier is None:
        return None
    return tier._replace(
        memory_rows=-(-tier.memory_rows // parts),
        ssd_rows=None if tier.ssd_rows is None else -(-tier.ssd_rows // parts),
    )
