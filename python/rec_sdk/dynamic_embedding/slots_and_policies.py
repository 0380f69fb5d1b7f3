"""The views of a de.Variable's rows that are not its embeddings: optimizer slots
(SlotVariable) and restrict policies with their status (the access statistics each row keeps).
Duck-typed on de.Variable (rec_sdk.dynamic_embedding.variable imports this module).
"""

import numbers

import tensorflow as tf

from rec_sdk.ops import table_ops


def by_key(keys, *columns):
    """keys [n] and columns [n, ...] in ascending key order (deterministic exports)."""
    order = tf.argsort(keys)
    return (tf.gather(keys, order),) + tuple(tf.gather(c, order) for c in columns)


def joined(shards):
    """Per-shard tuples of tensors -> one tuple, each tensor concatenated over shards."""
    if len(shards) == 1:
        return tuple(shards[0])
    return tuple(tf.concat(list(parts), 0) for parts in zip(*shards))


class SlotVariable:
    """An optimizer slot of a de.Variable (e.g. Adam's m): read-only views of the slot values
    that live in the variable's rows. Named <variable>/<optimizer>/<slot> as in TFRA."""

    def __init__(self, params, optimizer_name, slot_name, index, initial=0.0, owner=""):
        self.params = params
        self.slot_name = slot_name
        self.slot_index = index
        self.initial_value = float(initial)
        self._owner = owner  # the kernel that must own the table's slots
        self.name = "%s/%s/%s" % (params.name, optimizer_name, slot_name)
        self.dim = params.dim
        self.key_dtype = params.key_dtype
        self.value_dtype = params.value_dtype

    def lookup(self, keys, return_exists=False, name=None):
        """Slot values of keys (keys.shape + [dim]); absent keys, and every key before the
        optimizer first ran, read the slot's initial value."""
        p = self.params
        keys = p.checked_keys(keys)
        with tf.name_scope(name or "%s_lookup" % self.slot_name):
            return p.lookup_rows(
                keys,
                return_exists,
                slot=self.slot_index,
                slot_default=self.initial_value,
                slot_optimizer=self._owner,
            )

    def export(self, name=None):
        """(keys, slot values) of every stored key, in the order of params.export()."""
        p = self.params
        with tf.name_scope(name or "%s_export" % self.slot_name):
            shards = []
            for t in p.shards:
                k, values, s = table_ops.export(t.handle, p.table_key_dtype, p.dim)
                k, values, s = by_key(k, values, tf.transpose(s, [1, 0, 2]))
                k = p.public_keys(k)
                s = tf.transpose(s, [1, 0, 2])
                # Before the optimizer first ran the table has no slots: initial values.
                shards.append(
                    (
                        k,
                        tf.cond(
                            tf.shape(s)[0] > self.slot_index,
                            lambda s=s: s[self.slot_index],
                            lambda v=values: tf.fill(tf.shape(v), self.initial_value),
                        ),
                    )
                )
            return joined(shards)

    def size(self, index=None, name=None):
        return self.params.size(index, name)

    @property
    def tables(self):
        """The tables holding the slot: the variable's own (a slot lives in its key's row),
        so a Saver given them saves the slot with the embedding."""
        return self.params.tables

    @property
    def shards(self):
        return self.params.shards


class PolicyStatus:
    """A restrict policy's `status` (TFRA keeps it in a table of its own): a read-only view of
    the statistic each row of the variable keeps, last-seen clock or access count."""

    def __init__(self, policy):
        self._policy = policy
        self.name = "%s/%s/status" % (policy.var.name, type(policy).__name__)

    def size(self, index=None, name=None):
        """Keys with a status: every key of the variable."""
        return self._policy.var.size(index, name)

    def export(self, name=None):
        """(keys, statistic [n] int64) of every key, shard after shard."""
        var = self._policy.var
        with tf.name_scope(name or "status_export"):
            shards = []
            for t in var.shards:
                keys, last_seen, counts = by_key(*table_ops.export_access(t.handle))
                shards.append(
                    (var.public_keys(keys), last_seen if self._policy.by == "last_seen" else counts)
                )
            return joined(shards)


class RestrictPolicy:
    """Base of the restrict policies: restrict(num_reserved) keeps the num_reserved best keys by
    the policy's statistic, which the variable's rows keep current on every training update
    (no separate status table: `status` is a view of it)."""

    by = None

    def __init__(self, var):
        if type(var).__name__ != "Variable" or not hasattr(var, "tables"):
            raise TypeError("a restrict policy needs a de.Variable, got %r" % (var,))
        self.var = var
        self.status = PolicyStatus(self)
        var.start_tracking_access()

    def apply_update(self, ids):
        """Records that `ids` were seen now (a training step of the variable's optimizer does
        this already): keys without a row get one, with their initial values, since the
        statistic lives in the row. Returns the op."""
        var = self.var
        var.note_writes()
        keys = var.checked_keys(ids)
        with (
            tf.name_scope("%s_status_update" % var.name.split("/")[-1]),
            tf.control_dependencies(var.access_tracking),
        ):
            unique, _ = table_ops.unique_keys(tf.reshape(keys, [-1]))
            _, shard_keys, _ = var.split_keys(unique)
            return tf.group(
                [
                    t.find_or_insert(k, is_train=True, lookup=var.name)
                    for t, k in zip(var.shards, shard_keys)
                ]
            )

    def apply_restriction(self, num_reserved, trigger=None, **kwargs):
        """When the variable holds more than `trigger` keys (default num_reserved), keeps
        int(num_reserved / shard_num) keys per shard and removes the others with their slots.
        Returns the op."""
        del kwargs
        for arg, value in (("num_reserved", num_reserved), ("trigger", trigger)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral)
            ):
                raise TypeError("%s must be an int, got %r" % (arg, value))
        if num_reserved < 0:
            raise ValueError("num_reserved must be >= 0, got %d" % num_reserved)
        trigger = num_reserved if trigger is None else trigger
        var = self.var
        var.note_writes()
        per_shard = int(num_reserved / var.shard_num)
        with (
            tf.name_scope("%s_restrict" % var.name.split("/")[-1]),
            tf.control_dependencies(var.access_tracking),
        ):

            def restrict():
                return tf.group(
                    [table_ops.restrict(t.handle, per_shard, self.by) for t in var.shards]
                )

            return tf.cond(var.size() > trigger, restrict, tf.no_op)


class TimestampRestrictPolicy(RestrictPolicy):
    """restrict() keeps the keys trained most recently."""

    by = "last_seen"

    @property
    def tstp_var(self):
        """TFRA's name of `status` (its last-seen clocks)."""
        return self.status


class FrequencyRestrictPolicy(RestrictPolicy):
    """restrict() keeps the keys trained most often (one count per key per training update)."""

    by = "count"

    @property
    def freq_var(self):
        """TFRA's name of `status` (its access counts)."""
        return self.status
