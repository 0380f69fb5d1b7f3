"""SparseOptimizer: the shared apply_gradients of every rec_sdk sparse optimizer.

apply_gradients accepts, per (gradient, variable) pair, any of:
  * (IndexedSlices, table): from tf.gradients(loss, table), indices are row addresses;
  * (Tensor [n, dim] or [..., dim], addresses): from tf.gradients(loss, local_emb) with the
    addresses from the ASCEND_SPARSE_LOOKUP_ID_OFFSET collection;
  * (IndexedSlices, addresses): the same after a tf.gather of local_emb.
Pairs are grouped by table and deduplicated (rec_sdk.ops.table_ops.dedup_rows: one update per
row with the summed gradient; skipped when a single lookup's addresses are already unique), then
applied by one op per table, updating only those rows.
"""
import tensorflow as tf

from rec_sdk.core.table import SparseEmbedding, table_of, tables_of_graph
from rec_sdk.distribute import ranks
from rec_sdk.ops import table_ops
from rec_sdk.util import initialize
from rec_sdk.util.validation import check_float


class SparseOptimizer(tf.compat.v1.train.Optimizer):
    """Base class; subclasses set `slot_names` and implement `_apply(table, addresses, grads)`.

    A tf.compat.v1.train.Optimizer, as the SDK's optimizers are (scripts check it), with the
    learning rate also under the names TensorFlow's optimizers use, `_lr` (Adam) and
    `_learning_rate` (the others): a script may scale it (e.g. for loss scaling) before
    apply_gradients builds the update.
    """

    slot_names = ()

    def __init__(self, name, by_address):
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string, got %r" % (name,))
        super().__init__(use_locking=False, name=name)
        # by_address None: any table (the dynamic_embedding API, which needs no init()).
        expansion = initialize.get_use_dynamic_expansion() if by_address is not None else None
        if by_address and not expansion:
            raise ValueError(
                "%s: the *_by_addr optimizers need init(use_dynamic_expansion=True); "
                "use create_hash_optimizer() for fixed-capacity tables" % name)
        if by_address is False and expansion:
            raise ValueError(
                "%s: with init(use_dynamic_expansion=True) use the *_by_addr optimizers "
                "(create_hash_optimizer_by_address)" % name)
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

    def _prepare(self):
        """Creates per-step state (variables) on the first apply_gradients."""

    def _finish(self, update_ops):
        """Op(s) run after all table updates of one apply_gradients."""
        return update_ops

    def _apply(self, table, addresses, grads):
        """The update op of one table; apply_gradients made the addresses distinct, so the
        kernels get unique_addresses=True."""
        raise NotImplementedError

    def _rows(self, grad, var):
        """[(table, addresses [n], gradient rows [n, dim], whether the addresses are unique)]:
        one entry; for a table sharded over ranks, (table, lookup token, its rows' gradients,
        None) per lookup (apply_gradients sends those to the owners, all at once)."""
        table = table_of(var)
        if table is None:
            raise TypeError("%s.apply_gradients: %r is neither a rec_sdk table nor addresses from "
                            "a rec_sdk sparse_lookup" % (self._name, var))
        if isinstance(var, SparseEmbedding) or var is table.handle:
            if not isinstance(grad, tf.IndexedSlices):
                raise TypeError("%s.apply_gradients: the gradient of table %r must be the "
                                "IndexedSlices from tf.gradients(loss, table), got %r"
                                % (self._name, table.table_name, grad))
            if table.ranks is not None:
                lookups = ranks.split_table_gradient(grad)
                if lookups is None:
                    raise TypeError(
                        "%s.apply_gradients: the gradient of table %r (sharded over %d ranks) "
                        "must come from tf.gradients(loss, table) over its lookups' rows; this "
                        "IndexedSlices is not keyed by its lookups" % (
                            self._name, table.table_name, table.ranks.size))
                return [(table, token, rows, None) for token, rows in lookups]
            return [(table, tf.reshape(grad.indices, [-1]),
                     tf.reshape(grad.values, [-1, table.dim]),
                     table_ops.addresses_are_unique(grad.indices))]
        unique = table_ops.addresses_are_unique(var)
        addresses = tf.reshape(var, [-1])
        if isinstance(grad, tf.IndexedSlices):
            # Gradient of a tf.gather over the looked-up rows: sum it onto those rows.
            rows = table_ops.sum_rows(tf.reshape(grad.values, [-1, table.dim]),
                                      tf.cast(grad.indices, tf.int32), tf.size(addresses))
        else:
            rows = tf.reshape(tf.convert_to_tensor(grad), [-1, table.dim])
        if ranks.exchange_of(var) is not None:
            return [(table, var, rows, None)]
        return [(table, addresses, rows, unique)]

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Updates the rows of every table in grads_and_vars; returns the training op."""
        by_table = {}
        order = []
        entries, sharded = [], []
        for pair in grads_and_vars:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError("%s.apply_gradients: grads_and_vars must be (gradient, variable) "
                                "pairs, got %r" % (self._name, pair))
            grad, var = pair
            if grad is None:
                continue
            for entry in self._rows(grad, var):
                (sharded if entry[3] is None else entries).append(entry)
        if sharded:
            # Lookups of tables sharded over ranks: their exchanges are merged (one
            # collective per stage for all of them), and their gradients go to the keys'
            # owners, which sum them over the ranks; this rank updates the keys it owns.
            ranks.fuse_lookups([token for _, token, _, _ in sharded])
            owned = ranks.owner_gradients([(token, rows) for _, token, rows, _ in sharded])
            entries.extend((table, addresses, rows, True)
                           for (table, _, _, _), (addresses, rows) in zip(sharded, owned))
        for table, addresses, rows, unique in entries:
            if table.table_name not in by_table:
                by_table[table.table_name] = (table, [], [], [])
                order.append(table.table_name)
            by_table[table.table_name][1].append(addresses)
            by_table[table.table_name][2].append(rows)
            by_table[table.table_name][3].append(unique)
        if not order:
            raise ValueError("%s.apply_gradients: no gradients to apply" % self._name)
        with tf.name_scope(table_ops.op_scope_name(name or self._name)):
            self._prepare()
            updates = []
            for table_name in order:
                table, addresses, rows, unique = by_table[table_name]
                with tf.name_scope(table_ops.op_scope_name(table_name)):
                    if len(addresses) == 1 and unique[0]:
                        addresses, rows = addresses[0], rows[0]
                    else:
                        addresses, rows = table_ops.dedup_rows(tf.concat(addresses, 0),
                                                               tf.concat(rows, 0))
                    updates.append(self._apply(table, addresses, rows))
            finished = self._finish(updates)
            sharded = [by_table[t][0].ranks for t in order if by_table[t][0].ranks is not None]
            if sharded:
                # Every rank's shard is updated before the step ends on any rank.
                finished = ranks.barrier(finished, sharded[0].task)
            if global_step is not None:
                with tf.control_dependencies(tf.nest.flatten(finished)):
                    return tf.compat.v1.assign_add(global_step, 1).op
            return tf.group(finished)

    def compute_gradients(self, loss, var_list=None):
        """[(gradient, table)] for var_list (default: every table of the graph)."""
        tables = list(var_list) if var_list is not None else tables_of_graph()
        grads = tf.gradients(loss, [t.handle for t in tables])
        return list(zip(grads, tables))

    def minimize(self, loss, global_step=None, var_list=None, name=None):
        """compute_gradients then apply_gradients, for the tables in var_list (default all)."""
        return self.apply_gradients(self.compute_gradients(loss, var_list),
                                    global_step=global_step, name=name)


def check_learning_rate(name, value, high=None, positive=False):
    """learning_rate is a number >= 0 (> 0 when positive; <= high when given) or a float
    tensor (a schedule, checked by the kernel when it runs)."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return value
    return check_float(name, value, 0.0, high if high is not None else float("inf"),
                       low_open=positive)
