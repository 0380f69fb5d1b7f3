"""TFRA's key-value store creators. rec_sdk has one store, its own table (embedding, slots and
statistics of a key in one row): the CPU creators TFRA scripts pass (`CuckooHashTableCreator`,
its config and `FileSystemSaver`) are accepted and map onto it; the back ends rec_sdk does not
have (Redis, HKV on GPU) are names whose construction says so. `TieredTableCreator` (rec_sdk's
own) gives a variable tables larger than memory, with an SSD tier."""

from rec_sdk.base.validation import check_int
from rec_sdk.tables import tier
from rec_sdk.tables.table_spec import emb_dtype_name, index_layout_name, slot_dtype_name


class KVCreator:
    """Base of the creators a de.Variable takes as `kv_creator`.

    emb_dtype (beyond TFRA): the element type the tables store a float32 variable's values
    in: None or tf.float32, tf.bfloat16 or tf.float16 (half the memory per value; lookups
    still return float32 and training updates round stochastically). A variable whose
    value_dtype is itself tf.bfloat16 or tf.float16 stores that dtype without it.
    slot_dtype (beyond TFRA): the element type of the optimizer slots the tables keep per
    value (Adam's moments, Adagrad's accumulators): None or tf.float32, or tf.bfloat16 (half
    the slot memory, rounded stochastically on update); a slot of one float per row stays
    float32.
    index_layout (beyond TFRA): the tables' hash index entries: "auto" (the default: compact
    for half-precision rows), "full" (16 bytes, the key beside its row) or "compact" (8
    bytes, the key read back from the row: about 17 bytes less per key, a training lookup
    about 10% slower); see rec_sdk.create_table.
    """

    def __init__(self, config=None, emb_dtype=None, slot_dtype=None, index_layout="auto"):
        self.config = config
        self.emb_dtype = None if emb_dtype is None else emb_dtype_name(emb_dtype)
        self.slot_dtype = None if slot_dtype is None else slot_dtype_name(slot_dtype)
        self.index_layout = index_layout_name(index_layout)


class CuckooHashTableConfig:
    """TFRA's (empty) configuration of its CPU hash table."""


class FileSystemSaver:
    """TFRA's saver of tables to files: accepted; rec_sdk tables are saved by
    tf.compat.v1.train.Saver or rec_sdk.saver.save_tables."""

    def __init__(self, config=None, proc_size=None, proc_rank=None):
        self.config = config
        self.proc_size = proc_size
        self.proc_rank = proc_rank


class CuckooHashTableCreator(KVCreator):
    """TFRA's CPU hash table: a de.Variable given it uses rec_sdk's table, as with no
    creator."""

    def __init__(
        self, config=None, saver=None, emb_dtype=None, slot_dtype=None, index_layout="auto"
    ):
        super().__init__(
            config if config is not None else CuckooHashTableConfig(),
            emb_dtype,
            slot_dtype,
            index_layout,
        )
        self.saver = saver


class TieredTableCreator(KVCreator):
    """rec_sdk's table with an SSD tier, for variables larger than memory (no TFRA
    counterpart; DeepRec's DRAM + SSDHASH storage is the same idea).

    Args:
      memory_rows: rows kept in memory for the whole variable (an int >= 1), divided over its
        shards.
      ssd_path: the directory (or list of directories) of the record files of the rows
        beyond memory; each must exist and be writable. The files are scratch space, deleted
        with the tables; checkpoints hold every row.
      ssd_rows: the most rows on SSD for the whole variable (0: no bound).
      direct_io: read and write the files with O_DIRECT, past the page cache.
      emb_dtype, slot_dtype: as for every creator (KVCreator): half-precision rows and slots,
        in memory and on SSD (the index stays full: cold keys have no row to read a key
        from).

    The variable trains exactly as with all its rows in memory: a training lookup brings the
    rows it needs into memory (moving the least recently used ones out), an evaluation
    lookup reads rows on SSD where they are.
    """

    def __init__(
        self, memory_rows, ssd_path, ssd_rows=0, direct_io=False, emb_dtype=None, slot_dtype=None
    ):
        super().__init__(None, emb_dtype, slot_dtype)
        ssd_rows = check_int("ssd_rows", ssd_rows, 0, tier.MAX_ROWS)
        self.tier = tier.make(
            memory_rows, ssd_rows or None, tier.check_paths("ssd_path", ssd_path), direct_io
        )


def _not_here(what, instead):
    class Missing:
        __doc__ = "%s: not part of rec_sdk (%s); the name exists so that imports work." % (
            what,
            instead,
        )

        def __init__(self, *args, **kwargs):
            del args, kwargs
            raise NotImplementedError("%s is not available in rec_sdk: %s" % (what, instead))

    Missing.__name__ = Missing.__qualname__ = what.split(".")[-1]
    return Missing


_CPU = (
    "rec_sdk's tables live in this process's memory; use de.Variable without kv_creator "
    "(or with CuckooHashTableCreator)"
)
RedisTableConfig = _not_here("de.RedisTableConfig", "the Redis back end is out of scope; " + _CPU)
RedisTableCreator = _not_here("de.RedisTableCreator", "the Redis back end is out of scope; " + _CPU)
HkvHashTableConfig = _not_here(
    "de.HkvHashTableConfig", "HKV is a GPU back end, out of scope on CPU; " + _CPU
)
HkvHashTableCreator = _not_here(
    "de.HkvHashTableCreator", "HKV is a GPU back end, out of scope on CPU; " + _CPU
)
