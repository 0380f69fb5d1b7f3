// The sender's side of an exchange between ranks, one pass each: RouteKeys gives each key
// its destination and its slot among that destination's keys (a stable counting sort,
// where the exchange took an argsort, a bincount, cumulative sums and gathers), FillParts
// writes values into the destinations' fixed-size parts (where it took ScatterNd into a
// zeroed buffer, then a pad, a cut and a concat with the parts' headers).
#ifndef REC_SDK_CORE_RANK_PARTS_H_
#define REC_SDK_CORE_RANK_PARTS_H_

#include <cstdint>

#include "tf_ops/core/status.h"

namespace rec_sdk {

// The owner of a key among `ranks` ranks: abs(key % ranks), with C's remainder (the rule of
// the checkpoints' shards).
inline int64_t OwnerOf(int64_t key, int64_t ranks) {
  const int64_t r = key % ranks;
  return r < 0 ? -r : r;
}

// For each of the n keys: dest[i] = dest_of_owner[OwnerOf(keys[i], ranks)], within[i] = the
// number of keys before i with the same destination; per_dest[d] (parts entries) = the keys
// of destination d. Fails (before writing) when ranks < 1, parts < 1 or a destination of
// dest_of_owner is outside [0, parts).
Status RouteKeys(const int64_t* keys, int64_t n, const int32_t* dest_of_owner, int64_t ranks,
                 int32_t parts, int32_t* dest, int32_t* within, int32_t* per_dest);

// Fills out, [parts, head_rows + cap, width] values of T: out[d, :head_rows] = head[d]
// (head: [parts, head_rows, width]); out[d, head_rows + within[i]] = the row take[i] of
// values (row i when take is null) for every i in [0, n) with within[i] < cap (the others
// do not fit: the caller sends them again in larger parts); zeros everywhere else. values
// has num_values rows of width. Fails (before writing) when a destination is outside
// [0, parts), a slot is negative or a take index is outside [0, num_values).
template <typename T>
Status FillParts(const T* values, int64_t num_values, int64_t width, const int32_t* take,
                 const int32_t* dest, const int32_t* within, int64_t n, const T* head,
                 int64_t head_rows, int32_t parts, int64_t cap, T* out);

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_RANK_PARTS_H_
