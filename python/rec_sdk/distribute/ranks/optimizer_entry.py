"""The optimizers' one entry point into the ranks (rec_sdk.optimizers.base imports only this
module): what a sparse optimizer's apply_gradients does with the gradients of tables sharded
over ranks. `lookup_pairs` takes a table's gradient apart into its lookups', `is_lookup`
tells the addresses of a lookup over ranks, `owned` sends the gradients to the keys' owners
(one exchange for the batch) and returns what this rank applies, `step_done` ends the step's
updates of this rank's shards."""

from rec_sdk.distribute.ranks.batching import lookup_of
from rec_sdk.distribute.ranks.gradients import owner_gradients, split_table_gradient
from rec_sdk.distribute.ranks.sync import step_done as _end_step


def lookup_pairs(where, table, grad):
    """[(lookup token, gradient rows)] of the IndexedSlices tf.gradients(loss, table) gives
    for a table over ranks; TypeError naming `where` when it is not keyed by its lookups."""
    lookups = split_table_gradient(grad)
    if lookups is None:
        raise TypeError(
            "%s.apply_gradients: the gradient of table %r (sharded over %d ranks) "
            "must come from tf.gradients(loss, table) over its lookups' rows; this "
            "IndexedSlices is not keyed by its lookups"
            % (where, table.table_name, table.ranks.size)
        )
    return lookups


def is_lookup(addresses):
    """Whether `addresses` (of a (gradient, addresses) pair) are a lookup's over ranks."""
    return lookup_of(addresses) is not None


def owned(pairs):
    """[(this rank's owned addresses, their gradient rows summed over the ranks)] for
    [(lookup token, gradient rows)]."""
    return owner_gradients(pairs)


def step_done(finished, tables):
    """`finished` followed by the end of this rank's update step, when any of `tables` is
    sharded over ranks (rank 0 waits for it before it saves: fence)."""
    placements = [t.ranks for t in tables if t.ranks is not None]
    return _end_step(finished, placements[0].task) if placements else finished
