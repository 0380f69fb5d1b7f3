"""The sparse optimizers' shared code.

apply_table_gradients, the apply_gradients of every optimizer that trains rec_sdk tables,
accepts per (gradient, variable) pair any of:
  * (IndexedSlices, table): from tf.gradients(loss, table), indices are row addresses;
  * (Tensor [n, dim] or [..., dim], addresses): from tf.gradients(loss, local_emb) with the
    addresses from the ASCEND_SPARSE_LOOKUP_ID_OFFSET collection;
  * (IndexedSlices, addresses): the same after a tf.gather of local_emb.
Pairs are grouped by table and deduplicated (rec_sdk.ops.table_ops.dedup_rows: one update per
row with the summed gradient; skipped when a single lookup's addresses are already unique), then
applied by one update per table, touching only those rows.

Two kinds of optimizers use it:
  * SparseOptimizer: rec_sdk's own (lazy Adam, SGD, Adagrad, ...), one fused kernel per table;
  * CustomizedOptimizer: the SDK's base class (mx_rec.optimizers.base.CustomizedOptimizer)
    of sparse optimizers that are TensorFlow optimizers, such as a user's own (the SDK's DLRM
    example subclasses GradientDescentOptimizer with it for weight decay). Their
    apply_gradients runs the optimizer's own sparse update on the step's rows and slots, read
    from and written back to the table (rec_sdk.optimizers.row_update), in both of the SDK's
    flows.
"""

import collections

import tensorflow as tf

from rec_sdk.base import tf_patches
from rec_sdk.base.validation import check_float
from rec_sdk.distribute.ranks import optimizer_entry as over_ranks
from rec_sdk.ops import table_ops
from rec_sdk.optimizers.row_update import row_variable, through_variables
from rec_sdk.tables.table import SparseEmbedding, table_of, tables_of_graph
from rec_sdk.util import initialize


def _rows(where, grad, var):
    """[(table, addresses [n], gradient rows [n, dim], whether the addresses are unique)]:
    one entry; for a table sharded over ranks, (table, lookup token, its rows' gradients,
    None) per lookup (apply_table_gradients sends those to the owners, all at once)."""
    table = table_of(var)
    if table is None:
        raise TypeError(
            "%s.apply_gradients: %r is neither a rec_sdk table nor addresses from "
            "a rec_sdk sparse_lookup" % (where, var)
        )
    if isinstance(var, SparseEmbedding) or var is table.handle:
        if not isinstance(grad, tf.IndexedSlices):
            raise TypeError(
                "%s.apply_gradients: the gradient of table %r must be the "
                "IndexedSlices from tf.gradients(loss, table), got %r"
                % (where, table.table_name, grad)
            )
        if table.ranks is not None:
            lookups = over_ranks.lookup_pairs(where, table, grad)
            return [(table, token, rows, None) for token, rows in lookups]
        return [
            (
                table,
                tf.reshape(grad.indices, [-1]),
                tf.reshape(grad.values, [-1, table.dim]),
                table_ops.addresses_are_unique(grad.indices),
            )
        ]
    unique = table_ops.addresses_are_unique(var)
    addresses = tf.reshape(var, [-1])
    if isinstance(grad, tf.IndexedSlices):
        # Gradient of a tf.gather over the looked-up rows: sum it onto those rows.
        rows = table_ops.sum_rows(
            tf.reshape(grad.values, [-1, table.dim]),
            tf.cast(grad.indices, tf.int32),
            tf.size(addresses),
        )
    else:
        rows = tf.reshape(tf.convert_to_tensor(grad), [-1, table.dim])
    if over_ranks.is_lookup(var):
        return [(table, var, rows, None)]
    return [(table, addresses, rows, unique)]


def is_table_pair(var):
    """Whether `var` of a (gradient, variable) pair is a rec_sdk table, its handle or the
    addresses of one of its lookups."""
    return isinstance(var, SparseEmbedding) or (
        isinstance(var, tf.Tensor) and table_of(var) is not None
    )


def apply_table_gradients(
    where, grads_and_vars, prepare, apply, finish, global_step=None, name=None
):
    """Applies the gradients of rec_sdk tables (see the module doc): prepare() once,
    apply(table, unique addresses, summed gradient rows) -> the op updating one table,
    finish(update ops, name scope) -> the ops ending the step; returns the training op."""
    by_table = collections.OrderedDict()
    entries, sharded = [], []
    for pair in grads_and_vars:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(
                "%s.apply_gradients: grads_and_vars must be (gradient, variable) "
                "pairs, got %r" % (where, pair)
            )
        grad, var = pair
        if grad is None:
            continue
        for entry in _rows(where, grad, var):
            (sharded if entry[3] is None else entries).append(entry)
    if sharded:
        # Lookups of tables sharded over ranks: they are batched into one exchange, and
        # their gradients go to the keys' owners (one all-to-all for the batch), which sum
        # them over the ranks; this rank updates the keys it owns.
        owned = over_ranks.owned([(token, rows) for _, token, rows, _ in sharded])
        entries.extend(
            (table, addresses, rows, True)
            for (table, _, _, _), (addresses, rows) in zip(sharded, owned)
        )
    for table, addresses, rows, unique in entries:
        group = by_table.setdefault(table.table_name, (table, [], [], []))
        group[1].append(addresses)
        group[2].append(rows)
        group[3].append(unique)
    if not by_table:
        raise ValueError("%s.apply_gradients: no gradients to apply" % where)
    with tf.name_scope(table_ops.op_scope_name(name or where)) as scope:
        prepare()
        updates = []
        for table_name, (table, addresses, rows, unique) in by_table.items():
            with tf.name_scope(table_ops.op_scope_name(table_name)):
                if len(addresses) == 1 and unique[0]:
                    addresses, rows = addresses[0], rows[0]
                else:
                    addresses, rows = table_ops.dedup_rows(
                        tf.concat(addresses, 0), tf.concat(rows, 0)
                    )
                updates.append(apply(table, addresses, rows))
        finished = finish(updates, scope)
        # This rank's shards are updated: rank 0 waits for that before it saves.
        finished = over_ranks.step_done(finished, [t for t, _, _, _ in by_table.values()])
        if global_step is not None:
            with tf.control_dependencies(tf.nest.flatten(finished)):
                return tf.compat.v1.assign_add(global_step, 1).op
        return tf.group(finished)


class CustomizedOptimizer:
    """The SDK's base class of sparse optimizers (mx_rec.optimizers.base.CustomizedOptimizer).

    A sparse optimizer is a TensorFlow optimizer that also derives from this class, e.g.
    `class MyGD(tf.compat.v1.train.GradientDescentOptimizer, CustomizedOptimizer)` with
    `_apply_sparse_duplicate_indices(grad, var)` written with tf.gather(var, grad.indices) and
    tf.compat.v1.scatter_nd_add(var, ...). Its apply_gradients trains rec_sdk tables in both
    of the SDK's flows ((IndexedSlices, table) and (gradient rows, addresses)): per table,
    the step's unique rows (gradients of duplicate keys summed) and their slots are loaded
    into resource variables [n, dim], the optimizer's sparse update runs on them with the
    summed gradients at indices range(n) (`_apply_sparse_duplicate_indices(grad, var)` where
    the subclass writes that one, else `_resource_apply_sparse_duplicate_indices(grad, var,
    indices)`), and the rows and slots are written back. Its
    slots are those that initialize_slots() names ("slot_name" of each dict it returns), with
    the initial values of get_slot_init_values(), kept in the table's rows; get_slot(var,
    name) gives them to the update. Pairs of other variables go to the TensorFlow
    optimizer's own apply_gradients.

    Members shared with the SDK: name_counter, unique_name, base_name, _get_name (unique
    names <name>_0, <name>_1, ...), initialize_slots, insert_slot, get_slot_init_values
    (subclasses define these three). The SDK's NPU channel helpers (get_restore_vector_second,
    get_unique_keys, sum_same_id_gradients) have no CPU meaning and are absent.
    """

    name_counter = collections.defaultdict(int)

    def __init__(self):
        self.unique_name = ""
        self.base_name = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # rec_sdk's own optimizers (rec_sdk_tables) apply table gradients themselves.
        if (
            issubclass(cls, tf.compat.v1.train.Optimizer)
            and not getattr(cls, "rec_sdk_tables", False)
            and not getattr(cls.apply_gradients, "rec_sdk_tables", False)
        ):
            cls.apply_gradients = _with_tables(cls.apply_gradients)

    def initialize_slots(self, var, table_instance):
        raise NotImplementedError(
            "Please define a specific realization on %s" % self.__class__.__name__
        )

    def insert_slot(self, slot, named_slots_key, slot_name):
        raise NotImplementedError(
            "Please define a specific realization on %s" % self.__class__.__name__
        )

    def get_slot_init_values(self):
        raise NotImplementedError(
            "Please define a specific realization on %s" % self.__class__.__name__
        )

    def _get_name(self, name="CustomizedOptimizer"):
        """Sets unique_name to <name>_<n> (n counts the optimizers named `name` in this
        process, from 0) and base_name to `name`."""
        if name in CustomizedOptimizer.name_counter:
            CustomizedOptimizer.name_counter[name] += 1
        count = CustomizedOptimizer.name_counter[name]
        self.unique_name = "%s_%d" % (name, count)
        self.base_name = name


class _CustomizedRows:
    """The variables a CustomizedOptimizer's update runs on for one table in one graph: the
    step's rows and one variable per slot, registered as the slots of the rows variable."""

    def __init__(self, optimizer, table):
        scope = "%s_%s_rows" % (
            table_ops.op_scope_name(table.table_name),
            table_ops.op_scope_name(optimizer.get_name()),
        )
        with tf.init_scope(), tf.compat.v1.variable_scope(None, default_name=scope):
            self.rows = row_variable(table.dim, "rows")
            names = _slot_names(optimizer, table)
            values = [float(v) for v in (optimizer.get_slot_init_values() or [])]
            if len(values) != len(names):
                raise ValueError(
                    "%s: get_slot_init_values() gives %d initial values but initialize_slots() "
                    "names %d slots (%s); give one value per slot"
                    % (type(optimizer).__name__, len(values), len(names), ", ".join(names))
                )
            self.slots = [row_variable(table.dim, name) for name in names]
            self.initial = values
            for name, slot in zip(names, self.slots):
                tf_patches.v1_slot_dict(optimizer, name)[tf_patches.var_key(self.rows)] = slot
            # The optimizer's own non-slot state (e.g. Adam's beta powers).
            tf_patches.v1_create_slots(optimizer, [self.rows])
        # The table's slots belong to this optimizer class (a table is trained by one).
        self.owner = type(optimizer).__name__


def _slot_names(optimizer, table):
    """The slot names initialize_slots() gives (the "slot_name" of each dict it returns),
    asked with a variable of a scratch graph so that what it creates stays there."""
    with tf.Graph().as_default():
        probe = tf.compat.v1.Variable(tf.zeros([1, table.dim]), name="probe")
        specs = optimizer.initialize_slots(probe, table) or []
    names = []
    for spec in specs:
        if not isinstance(spec, dict) or "slot_name" not in spec:
            raise TypeError(
                "%s.initialize_slots must return a list of dicts with a "
                "'slot_name' (as the SDK's optimizers do), got %r"
                % (type(optimizer).__name__, spec)
            )
        names.append(spec["slot_name"])
    return names


def _resource_path(cls):
    """Whether a CustomizedOptimizer class's sparse update is its resource-variable path
    (_resource_apply_sparse[_duplicate_indices]) rather than its ref-variable path
    (_apply_sparse[_duplicate_indices]): the one the most derived class outside TensorFlow
    overrides (the resource path when a class overrides both, or neither is overridden:
    TensorFlow's own ref-variable kernels need ref variables)."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("tensorflow.") or klass is CustomizedOptimizer:
            continue
        defined = klass.__dict__
        if (
            "_resource_apply_sparse_duplicate_indices" in defined
            or "_resource_apply_sparse" in defined
        ):
            return True
        if "_apply_sparse_duplicate_indices" in defined or "_apply_sparse" in defined:
            return False
    return True


def _with_tables(original):
    """A CustomizedOptimizer subclass's apply_gradients: pairs of rec_sdk tables go through
    apply_table_gradients with the optimizer's own sparse update, the others to `original`."""

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        pairs = list(grads_and_vars)
        tables = [
            p for p in pairs if isinstance(p, (tuple, list)) and len(p) == 2 and is_table_pair(p[1])
        ]
        if not tables:
            return original(self, pairs, global_step=global_step, name=name)
        others = [p for p in pairs if not any(p is t for t in tables)]
        graph = tf.compat.v1.get_default_graph()
        locals_ = self.__dict__.setdefault("_rec_sdk_rows", {})

        def apply(table, addresses, grads):
            key = (graph, table.table_name)
            if key not in locals_:
                locals_[key] = _CustomizedRows(self, table)
            state = locals_[key]
            rows = state.rows

            def update():
                indices = tf.range(tf.shape(addresses)[0])
                if _resource_path(type(self)):
                    return self._resource_apply_sparse_duplicate_indices(grads, rows, indices)
                grad = tf.IndexedSlices(grads, indices, tf.shape(grads, out_type=tf.int32))
                return self._apply_sparse_duplicate_indices(grad, rows)

            return through_variables(
                table, addresses, state.owner, state.initial, rows, state.slots, update
            )

        train = apply_table_gradients(
            self.get_name(), tables, self._prepare, apply, self._finish, name=name
        )
        if others:
            train = tf.group(train, original(self, others, name=name))
        if global_step is None:
            return train
        with tf.control_dependencies([train]):
            return tf.compat.v1.assign_add(global_step, 1).op

    apply_gradients.__doc__ = original.__doc__
    apply_gradients.rec_sdk_tables = True
    return apply_gradients


class SparseOptimizer(tf.compat.v1.train.Optimizer, CustomizedOptimizer):
    """Base class of rec_sdk's own sparse optimizers; subclasses set `slot_names` (and
    `initial_accumulator_value`, the first slot's start, when it is not 0) and implement
    `_apply(table, addresses, grads)`, one fused kernel per table.

    A tf.compat.v1.train.Optimizer and a CustomizedOptimizer, as the SDK's optimizers are
    (scripts check it), with the learning rate also under the names TensorFlow's optimizers
    use, `_lr` (Adam) and `_learning_rate` (the others): a script may scale it (e.g. for loss
    scaling) before apply_gradients builds the update.
    """

    slot_names = ()
    rec_sdk_tables = True

    def __init__(self, name, by_address):
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string, got %r" % (name,))
        tf.compat.v1.train.Optimizer.__init__(self, use_locking=False, name=name)
        CustomizedOptimizer.__init__(self)
        self._get_name(name)
        # by_address None: any table (the dynamic_embedding API, which needs no init()).
        expansion = initialize.get_use_dynamic_expansion() if by_address is not None else None
        if by_address and not expansion:
            raise ValueError(
                "%s: the *_by_addr optimizers need init(use_dynamic_expansion=True); "
                "use create_hash_optimizer() for fixed-capacity tables" % name
            )
        if by_address is False and expansion:
            raise ValueError(
                "%s: with init(use_dynamic_expansion=True) use the *_by_addr optimizers "
                "(create_hash_optimizer_by_address)" % name
            )
        self._name = name
        self.by_address = by_address

    def get_name(self):
        return self._name

    def _get_learning_rate(self):
        return self.learning_rate

    def _set_learning_rate(self, value):
        self.learning_rate = value

    _lr = property(_get_learning_rate, _set_learning_rate)
    _learning_rate = property(_get_learning_rate, _set_learning_rate)

    @property
    def name(self):
        return self._name

    def initialize_slots(self, var, table_instance):
        """The slots live in the table's rows: nothing to create (the SDK's dicts, no slot)."""
        del var, table_instance
        return []

    def insert_slot(self, slot, named_slots_key, slot_name):
        self._slot_dict(slot_name)[named_slots_key] = slot

    def get_slot_init_values(self):
        """The initial values of the optimizer's slots, one per slot name: the accumulator
        (Adagrad, row-wise Adagrad, FTRL: the first slot) starts at initial_accumulator_value,
        as the kernels start it, every other slot at 0."""
        values = [0.0] * len(self.slot_names)
        if values and hasattr(self, "initial_accumulator_value"):
            values[0] = float(self.initial_accumulator_value)
        return values

    def _prepare(self):
        """Creates per-step state (variables) on the first apply_gradients."""

    def _finish(self, update_ops, name_scope=None):
        """Op(s) run after all table updates of one apply_gradients."""
        del name_scope
        return update_ops

    def _apply(self, table, addresses, grads):
        """The update op of one table; apply_gradients made the addresses distinct, so the
        kernels get unique_addresses=True."""
        raise NotImplementedError

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Updates the rows of every table in grads_and_vars; returns the training op."""
        return apply_table_gradients(
            self._name,
            grads_and_vars,
            self._prepare,
            self._apply,
            self._finish,
            global_step=global_step,
            name=name,
        )

    def compute_gradients(self, loss, var_list=None):
        """[(gradient, table)] for var_list (default: every table of the graph)."""
        tables = list(var_list) if var_list is not None else tables_of_graph()
        grads = tf.gradients(loss, [t.handle for t in tables])
        return list(zip(grads, tables))

    def minimize(self, loss, global_step=None, var_list=None, name=None):
        """compute_gradients then apply_gradients, for the tables in var_list (default all)."""
        return self.apply_gradients(
            self.compute_gradients(loss, var_list), global_step=global_step, name=name
        )


def check_learning_rate(name, value, high=None, positive=False):
    """learning_rate is a number >= 0 (> 0 when positive; <= high when given) or a float
    tensor (a schedule, checked by the kernel when it runs)."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return value
    return check_float(
        name, value, 0.0, high if high is not None else float("inf"), low_open=positive
    )
