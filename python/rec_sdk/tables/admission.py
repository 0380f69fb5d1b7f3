"""A table's admission and eviction: the thresholds its lookups configure (every lookup of a
table must agree: `check_thresholds_agree`, the one place that rule is checked), the one
TableConfigureAdmission op that gives them to the C++ table, and the operations that use them
(set_access_threshold, evict). SparseEmbedding (rec_sdk.tables.table) is a TableAdmission."""

import tensorflow as tf

from rec_sdk.base.validation import THRESHOLD_RANGE, check_threshold
from rec_sdk.ops import table_ops


def check_thresholds_agree(where, table_name, settings, what="lookups"):
    """The one (access_threshold, eviction_threshold) of `settings` (pairs, each from one
    of the `what` - lookups or FeatureSpecs - of table `table_name`; -1 or None for off); a
    ValueError naming `where`, the table and the settings when they differ: a table has one
    setting."""
    agreed = {(-1 if a is None else a, -1 if e is None else e) for a, e in settings}
    if len(agreed) > 1:
        raise ValueError(
            "%s: the %s of table %r disagree on (access_threshold, eviction_threshold): "
            "%s; all of a table's must use the same thresholds (a table has one setting)"
            % (where, what, table_name, sorted(agreed))
        )
    return agreed.pop() if agreed else (-1, -1)


class TableAdmission:
    """Admission and eviction of a table (a mixin of SparseEmbedding, which has `spec`,
    `handle`, `eager`, `table_name`, `steps_to_live` and `lookups`)."""

    def _init_admission(self, spec):
        # Admission and eviction, fixed by the first lookup that configures them; they reach
        # the C++ table through one TableConfigureAdmission op (configured_handle), built
        # with the first op that reads them. A rank's shard held by rank 0 follows the
        # thresholds of the table it is a shard of (see follow_admission).
        self._thresholds = (-1, -1 if spec.steps_to_live is None else spec.steps_to_live)
        self._admission_source = None
        self._admission_owner = None
        self._configured = None  # (configured handle, what built it)

    def _admission(self):
        """(access threshold, eviction threshold, what configured them or None): the table's
        own, or those of the table it follows (follow_admission)."""
        if self._admission_owner is not None:
            return self._admission_owner._admission()
        return self._thresholds + (self._admission_source,)

    @property
    def access_threshold(self):
        """The admission threshold its lookups configured (-1: off)."""
        return self._admission()[0]

    @property
    def eviction_threshold(self):
        """The eviction threshold its lookups configured, or steps_to_live (-1: off)."""
        return self._admission()[1]

    def follow_admission(self, table):
        """Makes this table (a shard of `table` on another rank, held by rank 0 for
        checkpoints and eviction) take `table`'s admission and eviction thresholds, as its
        lookups configure them."""
        self._admission_owner = table

    @property
    def admission(self):
        """True when lookups count keys for feature admission."""
        return self._admission()[2] is not None and self.access_threshold >= 0

    @property
    def clock(self):
        """What eviction ages are measured in: "timestamp" (data seconds), "step" (global
        steps, with steps_to_live) or None."""
        if self.steps_to_live is not None:
            return "step"
        if self.eviction_threshold >= 0:
            return "timestamp"
        return None

    def configure_admission(self, where, access_threshold, eviction_threshold):
        """Sets the table's admission and eviction thresholds (None: -1) from a lookup; every
        lookup that configures them must agree."""
        access = -1 if access_threshold is None else access_threshold
        evict = -1 if eviction_threshold is None else eviction_threshold
        if self.steps_to_live is not None and evict >= 0:
            raise ValueError(
                "%s: table %r evicts by steps_to_live=%d; it cannot also take "
                "eviction_threshold=%d (timestamps)"
                % (where, self.table_name, self.steps_to_live, evict)
            )
        if self.steps_to_live is not None:
            evict = self.steps_to_live
        if self._admission_source is not None:
            check_thresholds_agree(
                "%s (and %s before it)" % (where, self._admission_source),
                self.table_name,
                [(self.access_threshold, self.eviction_threshold), (access, evict)],
            )
            return
        if (access >= 0 or evict >= 0) and self.lookups.uncounted_training:
            raise ValueError(
                "%s: table %r gets admission or eviction here, but its training lookups %s "
                "were built without it (they neither count keys nor pass timestamps); give "
                "every training lookup of a table the same access_and_evict_config"
                % (where, self.table_name, self.lookups.uncounted_training)
            )
        if self._configured is not None and (access, evict) != (
            self.access_threshold,
            self.eviction_threshold,
        ):
            raise ValueError(
                "%s: table %r got its thresholds (access_threshold=%d, eviction_threshold=%d) "
                "when %s was built, before this lookup asked for %d and %d; build the lookups "
                "that configure a table before its other ops"
                % (
                    where,
                    self.table_name,
                    self.access_threshold,
                    self.eviction_threshold,
                    self._configured[1],
                    access,
                    evict,
                )
            )
        self._thresholds = (access, evict)
        self._admission_source = where

    def configured_handle(self, user):
        """The table's handle after its TableConfigureAdmission op, which gives the C++ table
        the thresholds configured so far: the table input of every op that reads them. Built
        once per table (by `user`, named in errors) at the graph's top level, so that a first
        use inside a control-flow branch or under control dependencies does not capture it."""
        if self._configured is None and self.eager:
            with tf.init_scope():  # once, eagerly; tf.functions capture the result
                handle = table_ops.configure_admission(
                    self.handle, self.access_threshold, self.eviction_threshold
                )
            self._configured = (handle, user)
        if self._configured is None:
            graph = self.handle.graph
            with (
                graph.as_default(),
                graph.control_dependencies(None),
                graph.name_scope(None),
                graph.colocate_with(self.handle.op),
            ):
                handle = table_ops.configure_admission(
                    self.handle,
                    self.access_threshold,
                    self.eviction_threshold,
                    name=table_ops.op_scope_name(self.table_name + "_admission"),
                )
            self._configured = (handle, user)
        return self._configured[0]

    def set_access_threshold(self, threshold, session=None, name=None):
        """Changes the admission threshold for later steps: returns the op, or runs it when
        `session` is given. `threshold` is an int in [-1, 2**31-1] or an integer scalar tensor
        (read when the op runs; the op fails outside that range). -1 turns admission off;
        keys already admitted keep their rows. The table must have been given admission by
        its lookups (so that they count keys)."""
        if isinstance(threshold, (tf.Tensor, tf.Variable)):
            if not threshold.dtype.is_integer or threshold.shape.rank not in (None, 0):
                raise TypeError(
                    "threshold must be an int or an integer scalar tensor, got %r" % (threshold,)
                )
            threshold = tf.cast(threshold, tf.int64)
            low, high = THRESHOLD_RANGE
            check = tf.debugging.Assert(
                (threshold >= low) & (threshold <= high),
                [
                    tf.strings.format(
                        "set_access_threshold: table %s: threshold must be in "
                        "[%d, %d], got {}" % (self.table_name, low, high),
                        threshold,
                    )
                ],
                name="check_threshold",
            )
            with tf.control_dependencies([check]):
                threshold = tf.identity(threshold)
        else:
            threshold = check_threshold("threshold", threshold)
        if not self.admission:
            raise ValueError(
                "set_access_threshold: table %r has no feature admission; give "
                "its lookups an access_threshold (FeatureSpec or "
                "access_and_evict_config) first" % self.table_name
            )
        op = table_ops.set_access_threshold(
            self.configured_handle("set_access_threshold"), threshold, name=name
        )
        if session is not None:
            session.run(op)
        return op

    def evict(self, name=None):
        """Op evicting the keys whose age reached the eviction threshold (rows, slots and
        counts); returns (rows evicted, pending counts evicted) as int64 scalars."""
        return table_ops.evict(self.configured_handle("evict()"), name=name)
