"""TableSpec: everything a table is, fixed when it is made (the Python side of the C++ core's
TableConfig, tf_ops/core/table_config.h).

The APIs build one (`create_table` from the SDK's arguments, `de.Variable` one per shard, a
graph loaded from a MetaGraph from its table op: `TableSpec.from_op`); `SparseEmbedding` is made
from it and never changes it. A spec travels one way: API -> spec -> op attributes
(`op_attrs`, the attributes of the RecSdk>EmbeddingTable op) -> TableConfig. It checks itself
when made, so each rule is written once, here.

What lookups decide later (admission and eviction thresholds) is not part of the spec: the
table keeps it (SparseEmbedding.configure_admission).
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional, Tuple

import numpy as np
import tensorflow as tf

from rec_sdk.base.validation import check_dtype_name, check_int
from rec_sdk.ops import loader, table_ops
from rec_sdk.tables import shard_names
from rec_sdk.tables.tier import MAX_ROWS, TierConfig

KEY_DTYPES = (tf.int64, tf.int32)


# What the table op allows, read from its definition (written once, in the C++ core): the
# element types a table can store its embeddings in and its optimizer slots of dim values in
# (tf_ops/core/row_precision.h: kRowDtypes, kSlotDtypes; lookups return float32), and the
# layouts of its hash index (table_config.h: kIndexLayouts).
def emb_dtypes():
    return table_ops.allowed_values("emb_dtype")


def slot_dtypes():
    return table_ops.allowed_values("slot_dtype")


def index_layouts():
    return table_ops.allowed_values("index_layout")


def emb_dtype_name(value, parameter="emb_dtype"):
    """The row dtype `value` names (a tf.DType, NumPy dtype or name) as one of emb_dtypes();
    a ValueError naming `parameter` for anything else."""
    return check_dtype_name(parameter, value, emb_dtypes(), "the element type of the rows")


def slot_dtype_name(value, parameter="slot_dtype"):
    """The slot dtype `value` names as one of slot_dtypes(); a ValueError naming `parameter`
    (and why float16 is not one) for anything else."""
    return check_dtype_name(
        parameter,
        value,
        slot_dtypes(),
        "the element type of optimizer slots of dim values per row; "
        "float16 cannot hold squared gradients below 6e-8",
    )


def index_layout_name(value, parameter="index_layout", tiered=False):
    """`value` as one of index_layouts(); a ValueError naming `parameter` for anything else, and
    for "compact" on a table with an SSD tier (`tiered`)."""
    if value not in index_layouts():
        raise ValueError(
            '%s must be one of %s (the hash index\'s entries: "full" 16 bytes '
            'with the key, "compact" 8 bytes with the key read back from the '
            'row, "auto" compact for half-precision rows), got %r'
            % (parameter, ", ".join(repr(v) for v in index_layouts()), value)
        )
    refused = loader.index_layout_error(value, tiered)  # the core's rule
    if refused is not None:
        raise ValueError("%s=%s" % (parameter, refused))
    return value


def _as_attr_values(initializer):
    """The initializer as the op's attributes hold it (floats of 32 bits, a list of values)."""
    out = {
        key: float(np.float32(value)) if isinstance(value, float) else value
        for key, value in initializer.items()
    }
    out["values"] = [float(np.float32(v)) for v in initializer.get("values", [])]
    return out


@dataclasses.dataclass(frozen=True)
class RankPlacement:
    """Where a table of the SDK API sharded over the `size` ranks of a cluster lives: this
    process is rank `rank` (its task `task`, a rec_sdk.distribute.cluster.ClusterTask);
    `devices[r]` holds rank r's shard. `divide_gradients`: divide the summed gradients by the
    rank count. Fixed when the table is made; the shards' table objects are the ranks'
    (rec_sdk.distribute.ranks.shards_of)."""

    task: Any
    rank: int
    size: int
    devices: Tuple[str, ...]
    divide_gradients: bool = False

    def __post_init__(self):
        object.__setattr__(self, "devices", tuple(self.devices))
        if not 0 <= self.rank < self.size == len(self.devices):
            raise ValueError(
                "a table's placement needs 0 <= rank < size == len(devices), got "
                "rank=%r, size=%r and %d devices" % (self.rank, self.size, len(self.devices))
            )

    @property
    def device(self):
        """This rank's shard's device."""
        return self.devices[self.rank]

    def checkpoint_dir_name(self, table_name, rank):
        """The directory of rank `rank`'s shard in a checkpoint."""
        return shard_names.rank_shard(table_name, rank, self.size)

    def __repr__(self):
        return "<rank %d of %d>" % (self.rank, self.size)


@dataclasses.dataclass(frozen=True)
class TableSpec:  # pylint: disable=too-many-instance-attributes
    """A table's configuration.

    name: the table's name (unique in a graph; the resource's name in sessions).
    key_dtype: tf.int64 or tf.int32. dim: floats per row of embedding (>= 1).
    initializer: the C++ row initialiser (rec_sdk.tables.initializer_spec.describe_initializer).
    dynamic_expansion: the table grows without bound (else it holds capacity_rows rows).
    capacity_rows: the rows of a fixed-capacity table (memory and SSD together), else None.
    initial_rows: rows reserved up front by a table that grows (0 for the others).
    tier: the SSD tier (rec_sdk.tables.tier.TierConfig) of a table larger than memory, or None;
      its memory holds tier.memory_rows rows, its files tier.ssd_rows (None: no bound, the
      table then grows without bound).
    is_save: checkpoints include the table. saved_by_owner: a de.Variable's shard (the
      variable serializes its shards together in TF2 checkpoints).
    steps_to_live: evict keys not trained for this many global steps (None: by timestamps,
      if the lookups say so). evict_when_full: a full fixed-capacity table evicts its least
      recently seen rows instead of failing.
    track_changes: remember changed and removed keys for delta checkpoints.
    track_access: keep last-seen steps and update counts (de restrict policies).
    padding_keys, padding_keys_mask, padding_keys_len: the SDK's padding keys (looked up,
      never trained) and the keys per step they imply.
    shard_keys_filter: for shard i of a de.Variable: keys (NumPy) -> which of them the
      variable's partitioner sends to this shard (restores of another shard count), or None.
    placement: where the shards of a table of the SDK API are over the ranks of a cluster
      (a RankPlacement), or None in one process.
    emb_dtype: the element type of the stored embeddings, one of emb_dtypes() (half-precision
      rows round stochastically on update).
    slot_dtype: the element type of optimizer slots of dim values per row, one of
      slot_dtypes() (bfloat16 slots round stochastically on update); slots of one float per
      row (row-wise Adagrad's) stay float32.
    index_layout: the hash index's entries, one of index_layouts(): "full" (16 bytes a slot:
      the key and the row), "compact" (8 bytes: the row and 12 bits of the key's hash, the
      key read back from the row; about 17 bytes less per key at a slower training probe;
      not with a tier) or "auto" (compact for half-precision rows, full otherwise; a tiered
      table's index is always full).
    """

    name: str
    key_dtype: tf.DType
    dim: int
    initializer: Mapping[str, Any]
    dynamic_expansion: bool = True
    capacity_rows: Optional[int] = None
    initial_rows: int = 0
    tier: Optional[TierConfig] = None
    is_save: bool = True
    saved_by_owner: bool = False
    steps_to_live: Optional[int] = None
    evict_when_full: bool = False
    track_changes: bool = False
    track_access: bool = False
    padding_keys: Tuple[int, ...] = ()
    padding_keys_mask: bool = False
    padding_keys_len: Optional[int] = None
    shard_keys_filter: Optional[Callable] = None
    placement: Optional[RankPlacement] = None
    emb_dtype: str = "float32"
    slot_dtype: str = "float32"
    index_layout: str = "auto"

    __hash__ = None  # the initializer is a dict

    def __post_init__(self):
        where = "table %r" % (self.name,)
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("a table's name must be a non-empty string, got %r" % (self.name,))
        if self.key_dtype not in KEY_DTYPES:
            raise ValueError("key_dtype must be tf.int32 or tf.int64, got %r" % (self.key_dtype,))
        check_int("dim", self.dim, 1, table_ops.max_dim())
        for field, allowed in (("emb_dtype", emb_dtypes()), ("slot_dtype", slot_dtypes())):
            if getattr(self, field) not in allowed:
                raise ValueError(
                    "%s: %s must be one of %s, got %r"
                    % (where, field, ", ".join(allowed), getattr(self, field))
                )
        index_layout_name(self.index_layout, "%s: index_layout" % where, self.tier is not None)
        if self.tier is not None and self.dynamic_expansion != (self.tier.ssd_rows is None):
            raise ValueError(
                "%s: a tiered table grows without bound exactly when its SSD "
                "rows are unbounded (ssd_rows=None), got dynamic_expansion=%r "
                "and ssd_rows=%r" % (where, self.dynamic_expansion, self.tier.ssd_rows)
            )
        if self.dynamic_expansion:
            if self.capacity_rows is not None:
                raise ValueError(
                    "%s grows without bound: capacity_rows must be None, got %r"
                    % (where, self.capacity_rows)
                )
            if self.evict_when_full:
                raise ValueError(
                    "evict_when_full=True is for fixed-capacity tables; %s grows "
                    "without bound (init(use_dynamic_expansion=True))" % where
                )
        elif not isinstance(self.capacity_rows, int) or not 1 <= self.capacity_rows <= MAX_ROWS * 2:
            raise ValueError(
                "%s needs a capacity of at least one row without dynamic "
                "expansion (capacity_rows in [1, %d]; create_table: "
                "device_vocabulary_size + host_vocabulary_size >= 1), got %r"
                % (where, MAX_ROWS * 2, self.capacity_rows)
            )
        if (
            self.tier is not None
            and not self.dynamic_expansion
            and self.capacity_rows != self.tier.memory_rows + self.tier.ssd_rows
        ):
            raise ValueError(
                "%s: capacity_rows (%d) must be the tier's memory_rows + ssd_rows "
                "(%d)" % (where, self.capacity_rows, self.tier.memory_rows + self.tier.ssd_rows)
            )
        if not isinstance(self.initial_rows, int) or not 0 <= self.initial_rows <= MAX_ROWS:
            raise ValueError(
                "%s: initial_rows must be an int in [0, %d], got %r"
                % (where, MAX_ROWS, self.initial_rows)
            )

    def replace(self, **changes):
        """A copy with `changes` (checked as a new spec)."""
        return dataclasses.replace(self, **changes)

    def op_attrs(self):
        """The keyword arguments of table_ops.create_table (the table op's attributes) that
        this spec gives, shared_name aside."""
        attrs = dict(
            table_name=self.name,
            key_dtype=self.key_dtype,
            dim=self.dim,
            emb_dtype=self.emb_dtype,
            slot_dtype=self.slot_dtype,
            index_layout=self.index_layout,
            initializer=_as_attr_values(self.initializer),
            evict_when_full=self.evict_when_full,
            track_changes=self.track_changes,
            track_access=self.track_access,
        )
        if self.tier is not None:  # a fixed number of rows in memory, the others on SSD
            attrs.update(
                dynamic_expansion=False,
                capacity=self.tier.memory_rows,
                initial_capacity=0,
                ssd_paths=tuple(self.tier.paths),
                ssd_rows=self.tier.ssd_rows or 0,
                ssd_direct_io=self.tier.direct_io,
            )
        else:
            attrs.update(
                dynamic_expansion=self.dynamic_expansion,
                capacity=0 if self.dynamic_expansion else self.capacity_rows,
                initial_capacity=self.initial_rows if self.dynamic_expansion else 0,
                ssd_paths=(),
                ssd_rows=0,
                ssd_direct_io=False,
            )
        return attrs

    @classmethod
    def from_op(cls, op, is_save):
        """The spec of the table op `op` (of a graph loaded from a MetaGraph, which keeps ops,
        not Python objects): what its attributes hold; is_save as given."""
        attr = op.get_attr
        kind = attr("initializer")
        initializer = {
            "kind": kind.decode() if isinstance(kind, bytes) else kind,
            "value": attr("init_value"),
            "values": list(attr("init_values")),
            "minval": attr("init_minval"),
            "maxval": attr("init_maxval"),
            "mean": attr("init_mean"),
            "stddev": attr("init_stddev"),
            "seed": attr("init_seed"),
            "scale": attr("init_scale"),
        }
        paths = tuple(p.decode() for p in attr("ssd_paths"))
        tier = (
            TierConfig(attr("capacity"), attr("ssd_rows") or None, paths, attr("ssd_direct_io"))
            if paths
            else None
        )
        if tier is not None:
            dynamic = tier.ssd_rows is None
            capacity = None if dynamic else tier.memory_rows + tier.ssd_rows
        else:
            dynamic = attr("dynamic_expansion")
            capacity = None if dynamic else attr("capacity")
        return cls(
            attr("table_name").decode(),
            tf.as_dtype(attr("key_dtype")),
            attr("dim"),
            initializer,
            dynamic_expansion=dynamic,
            capacity_rows=capacity,
            initial_rows=attr("initial_capacity") if dynamic and tier is None else 0,
            tier=tier,
            is_save=is_save,
            evict_when_full=attr("evict_when_full"),
            track_changes=attr("track_changes"),
            track_access=attr("track_access"),
            emb_dtype=_dtype_attr(op, "emb_dtype"),
            slot_dtype=_dtype_attr(op, "slot_dtype"),
            index_layout=_dtype_attr(op, "index_layout", "auto"),
        )


def _dtype_attr(op, name, default="float32"):
    """The op's string attribute `name` (a dtype or the index layout); `default` for ops of
    graphs saved before it existed."""
    try:
        value = op.get_attr(name)
    except ValueError:
        return default
    return value.decode() if isinstance(value, bytes) else value
