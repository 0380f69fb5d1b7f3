"""get_asc_insert_func: the key preprocessing of the FeatureSpec pipeline, run in tf.data.

Mirrors mx_rec.core.asc.helper. The returned function is meant for `dataset.map(...)`: per
table it gathers the ids of every feature looked up in that table, deduplicates them once,
and adds to the batch the unique keys, each feature's inverse indices (ids shape) and, for
training, each key's admission count increment (occurrences x faae_coefficient) and newest
per-sample timestamp. sparse_lookup then only maps the unique keys to rows, once per table
and step, however many features share the table. Being part of the dataset, this work
overlaps with training through `prefetch`.

The added entries live under keys starting with PREFIX, in the batch dict (or, for tuple
batches, in a dict appended to the tuple, or the tuple's first dict when str index keys are
used).
"""

import os

import tensorflow as tf

from rec_sdk.base.dump import next_dump_path
from rec_sdk.base.graph_state import state_of
from rec_sdk.base.log import logger
from rec_sdk.base.validation import check_bool
from rec_sdk.core.asc.feature_spec import FeatureSpec
from rec_sdk.ops import table_ops
from rec_sdk.ops.loader import load_ops
from rec_sdk.tables.admission import check_thresholds_agree
from rec_sdk.tables.keys import as_keys
from rec_sdk.tables.table import tables_of_graph

PREFIX = "__rec_sdk__/"


def unique_key(table_name):
    return PREFIX + "table/" + table_name + "/unique"


def counts_key(table_name):
    return PREFIX + "table/" + table_name + "/counts"


def times_key(table_name):
    return PREFIX + "table/" + table_name + "/times"


def inverse_key(spec_name):
    return PREFIX + "feature/" + spec_name + "/inverse"


def registered_specs(graph):
    """[(specs, is_training)] of the insert functions built while `graph` was the default."""
    state = state_of(graph)
    with state.lock:
        return list(state.insert_specs)


def pipeline_dict(batch):
    """The dict of a batch holding the pipeline's entries, or None."""
    if isinstance(batch, dict):
        return batch if any(isinstance(k, str) and k.startswith(PREFIX) for k in batch) else None
    if isinstance(batch, (tuple, list)):
        for item in batch:
            found = pipeline_dict(item)
            if found is not None:
                return found
    return None


def feature_of(batch, index_key, where):
    """The tensor at `index_key` (str: a dict key; int: a tuple position) of a batch."""
    if isinstance(index_key, str):
        if isinstance(batch, dict):
            if index_key in batch:
                return batch[index_key]
        elif isinstance(batch, (tuple, list)):
            for item in batch:
                if isinstance(item, dict) and index_key in item:
                    return item[index_key]
        keys = sorted(k for k in _dict_keys(batch) if not k.startswith(PREFIX))
        raise KeyError(
            "%s: index_key %r is not in the batch; its keys are %s" % (where, index_key, keys)
        )
    if not isinstance(batch, (tuple, list)):
        raise TypeError(
            "%s: index_key %d is a tuple position but the batch is a %s"
            % (where, index_key, type(batch).__name__)
        )
    if index_key >= len(batch):
        raise IndexError(
            "%s: index_key %d is past the batch tuple's %d elements"
            % (where, index_key, len(batch))
        )
    return batch[index_key]


def _dict_keys(batch):
    if isinstance(batch, dict):
        return [k for k in batch if isinstance(k, str)]
    if isinstance(batch, (tuple, list)):
        return [k for item in batch if isinstance(item, dict) for k in item if isinstance(k, str)]
    return []


def _with_entries(batch, entries):
    """The batch with the pipeline's entries added (see the module doc)."""
    if isinstance(batch, dict):
        out = dict(batch)
        out.update(entries)
        return out
    items = list(batch)
    for i, item in enumerate(items):
        if isinstance(item, dict):
            merged = dict(item)
            merged.update(entries)
            items[i] = merged
            return tuple(items)
    return tuple(items) + (entries,)


def _specs_from_args(args_index_list, table_names):
    if table_names is None or len(table_names) != len(args_index_list):
        raise ValueError(
            "get_asc_insert_func: args_index_list needs table_names of the same "
            "length, got %r and %r" % (args_index_list, table_names)
        )
    return [
        FeatureSpec("arg%d_%s" % (index, table), table_name=table, index_key=index)
        for index, table in zip(args_index_list, table_names)
    ]


def _check_specs(specs):
    if not isinstance(specs, (list, tuple)) or not specs:
        raise ValueError(
            "get_asc_insert_func: tgt_key_specs must be a non-empty list of "
            "FeatureSpec, got %r" % (specs,)
        )
    names = set()
    for spec in specs:
        if not isinstance(spec, FeatureSpec):
            raise TypeError(
                "get_asc_insert_func: tgt_key_specs must hold FeatureSpec objects, got %r" % (spec,)
            )
        if spec.name in names:
            raise ValueError(
                "get_asc_insert_func: FeatureSpec %r is listed twice in tgt_key_specs" % spec.name
            )
        names.add(spec.name)
    lookups = [s for s in specs if not s.is_timestamp]
    if not lookups:
        raise ValueError("get_asc_insert_func: tgt_key_specs has only timestamp specs")
    by_table = {}
    for spec in lookups:
        by_table.setdefault(spec.table_name, []).append(spec)
    for table, table_specs in by_table.items():
        check_thresholds_agree(
            "get_asc_insert_func",
            table,
            [
                (s.access_threshold, s.eviction_threshold)
                for s in table_specs
                if s.access_threshold is not None
            ],
            what="FeatureSpecs",
        )
    timestamps = {}
    for spec in specs:
        if not spec.is_timestamp:
            continue
        targets = [spec.table_name] if spec.table_name in by_table else list(by_table)
        for table in targets:
            if table in timestamps:
                raise ValueError(
                    "get_asc_insert_func: table %r has two timestamp specs, %r "
                    "and %r; one per table" % (table, timestamps[table].name, spec.name)
                )
            timestamps[table] = spec
    for table, table_specs in by_table.items():
        if (
            any(s.eviction_threshold is not None and s.eviction_threshold >= 0 for s in table_specs)
            and table not in timestamps
        ):
            raise ValueError(
                "get_asc_insert_func: table %r has an eviction_threshold but no "
                "FeatureSpec with is_timestamp=True names its timestamps" % table
            )
    return by_table, timestamps


def per_key_times(timestamps, ids, where):
    """Per-id timestamps [n] for ids of shape [batch, ...] from per-sample ones."""
    ts = tf.reshape(tf.cast(timestamps, tf.int64), [-1])
    rank = ids.shape.rank
    if rank is None:
        raise ValueError("%s: the ids need a known rank to spread timestamps over them" % where)
    if rank == 0:
        return tf.reshape(ts[:1], [-1])
    ts = tf.reshape(ts, [-1] + [1] * (rank - 1))
    return tf.reshape(tf.broadcast_to(ts, tf.shape(ids, out_type=tf.int64)), [-1])


def get_asc_insert_func(
    tgt_key_specs=None,
    args_index_list=None,
    table_names=None,
    is_training=True,
    dump_graph=False,
    **kwargs,
):
    """Returns the key preprocessing function to `dataset.map(...)` before `prefetch`.

    Args:
      tgt_key_specs: the FeatureSpecs of the batch (every feature that is looked up, plus at
        most one timestamp spec per table).
      args_index_list, table_names: instead of specs, positions of id tensors in the flat
        batch and the table each is looked up in (used by graph modification).
      is_training: True for a training dataset (admission counts and timestamps are added);
        False for evaluation.
      dump_graph: write the function's graph to rec_sdk_dump/insert_func_<n>.pbtxt.
    """
    del kwargs
    check_bool("is_training", is_training)
    check_bool("dump_graph", dump_graph)
    if tgt_key_specs is None:
        if args_index_list is None:
            raise ValueError(
                "get_asc_insert_func needs tgt_key_specs (a list of FeatureSpec) "
                "or args_index_list with table_names"
            )
        tgt_key_specs = _specs_from_args(args_index_list, table_names)
        flat_positions = True
    else:
        flat_positions = False
    by_table, timestamps = _check_specs(tgt_key_specs)
    specs = list(tgt_key_specs)
    graph = tf.compat.v1.get_default_graph()
    state = state_of(graph)
    with state.lock:
        state.insert_specs.append((specs, is_training))
    load_ops()  # fail here, not inside tf.data, when the op library is missing

    def insert_fn(*args):
        batch = args[0] if len(args) == 1 else tuple(args)
        source = tuple(tf.nest.flatten(batch)) if flat_positions else batch
        entries = {}
        # Tables with an SSD tier read the batch's rows on SSD here, ahead of its training
        # step (tables created by now: before the dataset is built, or by graph modification).
        tiered = (
            {t.table_name: t for t in tables_of_graph(graph) if t.tier is not None}
            if is_training
            else {}
        )
        with tf.name_scope("rec_sdk_insert"):
            for table, table_specs in by_table.items():
                where = "get_asc_insert_func, table %r" % table
                ids = []
                for spec in table_specs:
                    value = feature_of(source, spec.index_key, "FeatureSpec %r" % spec.name)
                    # Ids of other dtypes are cast here, where the pipeline inserts them, as
                    # in the SDK (tf.strings.to_number gives float32), with a check.
                    ids.append(
                        as_keys(
                            value, tf.int64, "ids of FeatureSpec %r (table %r)" % (spec.name, table)
                        )
                    )
                flat = [tf.reshape(v, [-1]) for v in ids]
                all_ids = flat[0] if len(flat) == 1 else tf.concat(flat, 0)
                unique, inverse = table_ops.unique_keys(all_ids)
                if table in tiered:
                    owner = tiered[table]
                    read = table_ops.prefetch_cold_by_name(
                        owner.shared_name, tf.cast(unique, owner.key_dtype)
                    )
                    with tf.control_dependencies([read]):
                        unique = tf.identity(unique)
                entries[unique_key(table)] = unique
                sizes = [tf.size(v) for v in flat]
                parts = [inverse] if len(flat) == 1 else tf.split(inverse, tf.stack(sizes))
                for spec, value, part in zip(table_specs, ids, parts):
                    entries[inverse_key(spec.name)] = tf.reshape(part, tf.shape(value))
                if not is_training:
                    continue
                coefficients = [s.faae_coefficient for s in table_specs]
                if len(set(coefficients)) == 1:
                    weights = coefficients[0]
                else:
                    weights = tf.concat(
                        [
                            tf.fill([n], tf.constant(c, tf.int64))
                            for n, c in zip(sizes, coefficients)
                        ],
                        0,
                    )
                sample_times = None
                shaped = inverse  # one sample per id, unless one feature takes the timestamps
                if table in timestamps:
                    ts_spec = timestamps[table]
                    ts = feature_of(source, ts_spec.index_key, "FeatureSpec %r" % ts_spec.name)
                    if len(ids) == 1:
                        sample_times = ts  # one per sample: the op spreads it over the ids
                        shaped = tf.reshape(inverse, tf.shape(ids[0]))
                    else:
                        sample_times = tf.concat([per_key_times(ts, v, where) for v in ids], 0)
                counts, newest = table_ops.key_access_stats(
                    shaped, tf.size(unique), weights, sample_times
                )
                entries[counts_key(table)] = counts
                if sample_times is not None:
                    entries[times_key(table)] = newest
        if dump_graph:
            _dump(tf.compat.v1.get_default_graph())
        return _with_entries(batch, entries)

    return insert_fn


def _dump(graph):
    path = next_dump_path("insert_func") + ".pbtxt"
    tf.io.write_graph(graph.as_graph_def(), os.path.dirname(path), os.path.basename(path))
    logger.info("rec_sdk: wrote the insert function's graph to %s", path)
