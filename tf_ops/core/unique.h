// DeduplicateKeys: the one dedup of rec_sdk (keys before a lookup, addresses before an update).
//
// Keys are bucketed by the same hash shards as the table index and each shard is deduplicated
// in parallel with a small open-addressing map, so it scales with threads (TensorFlow's Unique
// is single-threaded). Unique keys come out grouped by shard, in first-occurrence order within
// a shard: deterministic for a given input.
#ifndef REC_SDK_CORE_UNIQUE_H_
#define REC_SDK_CORE_UNIQUE_H_

#include <cstdint>
#include <vector>

#include "tf_ops/core/parallel.h"

namespace rec_sdk {

// Writes the distinct keys of keys[0, n) to *unique and, for every i, inverse[i] = the position
// of keys[i] in *unique (so unique[inverse[i]] == keys[i]).
void DeduplicateKeys(const int64_t* keys, int64_t n, std::vector<int64_t>* unique,
                     int32_t* inverse, const ParallelRunner& run);

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_UNIQUE_H_
