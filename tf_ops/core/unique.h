// DeduplicateKeys: the one dedup of rec_sdk (keys before a lookup, addresses before an update).
//
// Batches of up to 2^20 keys go through open-addressing maps, unique keys in first-occurrence
// order: from 8,192 keys on, a second thread may take the later part of what is left when it
// arrives (that part's new keys are then appended after the earlier part's, which is the same
// order). Larger batches are
// bucketed by the table index's hash shards and the shards deduplicated in parallel (unique keys
// grouped by shard, in first-occurrence order within a shard). Either way the result is
// deterministic for a given input within a process (the hashes are seeded per process, so a large
// batch's shard grouping differs between processes).
#ifndef REC_SDK_CORE_UNIQUE_H_
#define REC_SDK_CORE_UNIQUE_H_

#include <cstdint>
#include <vector>

#include "tf_ops/core/parallel.h"

namespace rec_sdk {

// Writes the distinct keys of keys[0, n) to *unique and, for every i, inverse[i] = the position
// of keys[i] in *unique (so unique[inverse[i]] == keys[i]).
void DeduplicateKeys(const int64_t* keys, int64_t n, std::vector<int64_t>* unique, int32_t* inverse,
                     const ParallelRunner& run);

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_UNIQUE_H_
