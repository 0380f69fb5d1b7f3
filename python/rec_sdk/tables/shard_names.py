"""The names of shards, formatted and parsed here only.

* A de.Variable's shards are tables `<base>_mht_<i>of<n>` (i from 1; TFRA's names), where
  `<base>` is the variable's name made a table name (`table_base_name`); its string-key
  dictionary is `<base>_key_strings`; TFRA's key/value files of shard i saved by process r of
  s are `<base>_mht_<i>of<n>_rank<r>_size<s>`.
* A table of the SDK API sharded over N ranks keeps rank r's shard in checkpoints as the
  directory `<table>@<r>of<N>`.
"""

import re
import zlib

_VARIABLE_SHARD = re.compile(r"^(.*)_mht_(\d+)of(\d+)$")
_RANK_SHARD = re.compile(r"^(.*)@(\d+)of(\d+)$")
DEFAULT_BASE = "DynamicEmbedding_Variable"


def table_base_name(name):
    """The stem of the table names of the de.Variable `name`: characters outside
    [A-Za-z0-9_.] become "_", and a long name is cut and given a checksum of the whole."""
    base = re.sub(r"[^A-Za-z0-9_.]", "_", name) or DEFAULT_BASE
    if len(base) > 80:
        base = base[:70] + "_%08x" % zlib.crc32(base.encode("utf-8"))
    return base


def variable_shards(base, count):
    """The table names of the `count` shards of a variable whose base name is `base`."""
    return ["%s%dof%d" % (variable_shard_prefix(base), i + 1, count) for i in range(count)]


def variable_shard_prefix(base):
    """What the names of every shard (and of every key/value file of one) of the variable
    with base name `base` start with."""
    return base + "_mht_"


def parse_variable_shard(table_name):
    """(base, shard index from 0, shard count) of a variable shard's table name, or None."""
    match = _VARIABLE_SHARD.match(table_name)
    if match is None:
        return None
    return match.group(1), int(match.group(2)) - 1, int(match.group(3))


def key_strings_name(base):
    """The table name of the string-key dictionary of the variable with base name `base`."""
    return base + "_key_strings"


def shard_file_name(table_name, rank, size):
    """TFRA's key/value file name of shard `table_name` saved by process `rank` of `size`."""
    return "%s_rank%d_size%d" % (table_name, rank, size)


def rank_shard(table_name, rank, size):
    """The checkpoint directory name of rank `rank`'s shard of a table over `size` ranks."""
    return "%s@%dof%d" % (table_name, rank, size)


def parse_rank_shard(name):
    """(table name, rank, rank count) of a rank shard's directory name, or None."""
    match = _RANK_SHARD.match(name)
    if match is None:
        return None
    return match.group(1), int(match.group(2)), int(match.group(3))
