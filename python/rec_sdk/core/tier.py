"""The SSD tier of a table larger than memory: its sizes and directories, checked when the
table is built. A tiered table keeps `memory_rows` rows in memory; the least recently used
others are records in files under `paths` (at most `ssd_rows` of them, 0: no bound), read back
when a training lookup needs them (see "The SSD tier" in tf_ops/core/embedding_table.h).
With direct_io the files bypass the page cache (O_DIRECT)."""
import collections
import os

TierConfig = collections.namedtuple("TierConfig",
                                    ["memory_rows", "ssd_rows", "paths", "direct_io"],
                                    defaults=(False,))

# The counters of table.stats() that only a tiered table moves: TensorBoard summaries of
# other tables leave them out.
TIER_STATS = ("hot", "cold", "promotions", "demotions", "ssd_bytes_read", "ssd_bytes_written",
              "ssd_file_bytes", "prefetch_hits")


def check_paths(parameter, paths):
    """The directories given as `parameter` (a path or a sequence of paths), as absolute
    paths; each must be an existing directory this process can write to."""
    if isinstance(paths, (str, os.PathLike)):
        paths = (paths,)
    if not isinstance(paths, (list, tuple)) or not paths or not all(
            isinstance(p, (str, os.PathLike)) and str(p) for p in paths):
        raise TypeError("%s must be a directory path or a non-empty list of them, got %r"
                        % (parameter, paths))
    checked = []
    for i, path in enumerate(paths):
        where = parameter if len(paths) == 1 else "%s[%d]" % (parameter, i)
        full = os.path.abspath(os.fspath(path))
        if not os.path.isdir(full):
            raise ValueError("%s=%r is not an existing directory (the SSD tier keeps its "
                             "record files there)" % (where, os.fspath(path)))
        if not os.access(full, os.W_OK | os.X_OK):
            raise ValueError("%s=%r is a directory this process cannot write to"
                             % (where, os.fspath(path)))
        checked.append(full)
    return tuple(checked)


def split(tier, parts):
    """The TierConfig of each of `parts` shards of a table: the rows divided, rounded up."""
    if tier is None:
        return None
    return TierConfig(-(-tier.memory_rows // parts),
                      -(-tier.ssd_rows // parts) if tier.ssd_rows else 0, tier.paths,
                      tier.direct_io)
