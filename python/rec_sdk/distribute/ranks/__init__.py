"""The SDK API over N ranks: tables sharded by key over the training tasks of a cluster, trained
synchronously (as the SDK's ranks train).

Rank r of N (the r-th training task, chief first; see rec_sdk.distribute.cluster.training_task) owns
the keys with abs(key % N) == r, the rule rec_sdk's checkpoints restore by. Each rank holds
its shard in its own process. A lookup on rank r:

1. deduplicates its keys locally (the lookup core, rec_sdk.core.embedding, did that) and
   sorts them by owner;
2. sends each owner only the keys it owns, with their admission counts and clocks, in one
   all-to-all (TensorFlow's CollectiveAllToAllV2 over the cluster's gRPC runtime), each part
   padded to a size class every rank already knows: the batch's hint, one class above the
   largest count any rank sent any rank in earlier steps (tf_ops/core/size_class.h). Before
   it, every rank gathers each rank's step header, which carries its largest count
   (rec_sdk.distribute.ranks.headers), so all keep the same hint, ranks in different steps
   fail together and a rank that is gone fails the step at once; in a step whose keys did
   not fit the hint's class, all send them again in a class that holds them;
3. each owner deduplicates the keys it was sent, sums each key's counts over the ranks
   (admission sees the count of the whole global batch), takes the newest clock, and runs
   find-or-insert and gather on its own shard, once per key;
4. each owner sends each rank the rows of the keys that rank asked for, in the same slots
   (a second all-to-all), and each rank puts them back in its keys' order.

Gradients go back the same way: each rank sends each owner the gradients of the keys it asked
that owner for, and each owner sums them per key over the ranks (the SDK's "sum_gradients";
divided by N with all2all_gradients_op="sum_gradients_and_div_by_ranksize") and applies its
sparse optimizer once, in place on its shard. No rank receives keys or rows it did not ask
for or does not own: the bytes per key do not grow with N (beyond the padding). A step has no
barrier: a rank's next step cannot start its exchange before every rank finished this one,
and every rank updates its own shard. Rank 0, which saves and evicts every shard between
steps, first waits until each rank has finished as many update steps as it has (fence), so
a checkpoint is of one step on every shard.

Lookups are exchanged in batches (batch_lookups): the lookups an optimizer trains, of any
tables and dims, share one exchange (the needs gather, the keys all-to-all,
the rows all-to-all, the gradient all-to-all), their bookkeeping done once for the batch, so
a step's ops do not grow with the number of tables; so do the graph's evaluation lookups
(batched when MonitoredTrainingSession or Estimator finalizes the graph). Rank 0 saves,
restores and evicts every shard (managed_shards); in MonitoredTrainingSession and
tf.estimator every rank's variables are set to rank 0's in the session's local
initialisation (broadcast_variables).

Per-host dedup (REC_SDK_RANKS_PER_HOST, rec_sdk.distribute.ranks.routes): the exchange runs in two
levels, each a whole exchange in collective groups of its own: the ranks of a host (each key
to the rank of its host in its owner's place, which deduplicates the host's keys), then the
ranks of a place across the hosts (to the owner); gradients are summed at each level.

Every rank must build the same graph (the same lookups and optimizer calls in the same order:
the n-th collective of each graph meets the n-th of the others) and run the same steps.
"""

from rec_sdk.distribute.ranks.batching import (  # noqa: F401
    batch_lookups,
    batch_pending_lookups,
    lookup_of,
    replace_lookups,
)
from rec_sdk.distribute.ranks.exchange import exchange_rows  # noqa: F401
from rec_sdk.distribute.ranks.gradients import owner_gradients, split_table_gradient  # noqa: F401
from rec_sdk.distribute.ranks.placement import set_shards, shards_of  # noqa: F401
from rec_sdk.distribute.ranks.routes import RANKS_PER_HOST_ENV, ranks_per_host  # noqa: F401
from rec_sdk.distribute.ranks.sync import broadcast_variables, fence, managed_shards, step_done  # noqa: F401
