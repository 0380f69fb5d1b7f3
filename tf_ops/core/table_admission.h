// Admission and eviction in a table (table_admission.cc): the state EmbeddingTable keeps for
// them, TableAdmission.
//
// Training lookups may pass, per key, a count (occurrences x faae_coefficient) and a clock
// value (a data timestamp or a global step; without one, the lookup's tick), described by a
// KeyAccess (table_stats.h). With an access threshold >= 0, a key without a row accumulates
// its count in a per-shard "pending" map and gets a row once the count reaches the threshold;
// until then it maps to -1 (pending_keys.h). Rows and pending entries remember the newest
// clock they were seen with; Evict() drops those whose age (the newest clock the table has
// seen minus theirs) is at least the eviction threshold. A fixed-capacity table with
// evict_when_full drops its least recently seen rows instead of failing when full. Concurrent
// updates of the same row race like TensorFlow's use_locking=False optimizers: values stay
// valid floats, never out-of-bounds memory.
//
// EmbeddingTable's admission operations:
//   ConfigureAdmission(wanted) sets the admission and eviction thresholds (each >= -1; until
//     then both are -1). The first call sets them; a later call with the same values changes
//     nothing (a threshold changed by SetAccessThreshold stays); one with other values fails
//     with InvalidArgument naming the table and each differing threshold with both values.
//   ResetAdmission() forgets the configuration (thresholds back to -1): for a table kept from
//     a session whose graph configured it, taken over by a new graph that configures it anew.
//   SetAccessThreshold(threshold) changes the admission threshold (>= -1) for later lookups;
//     keys already admitted keep their rows. The configuration (admission()) keeps the
//     configured value.
//   TrackAccess() starts keeping access counts and last-seen clocks current on training
//     passes (config.track_access from the start; a restrict policy given a table later turns
//     it on). Rows keep what they had until then.
//   Evict(rows_evicted, pending_evicted, run) drops every row and pending count whose clock
//     is at least eviction_threshold older than the newest clock seen; their rows, slots and
//     counts are gone (a later occurrence starts from scratch). Returns the numbers of rows
//     and pending entries dropped (may be null).
#ifndef REC_SDK_CORE_TABLE_ADMISSION_H_
#define REC_SDK_CORE_TABLE_ADMISSION_H_

#include <atomic>
#include <climits>
#include <cstdint>
#include <mutex>

#include "tf_ops/core/table_config.h"

namespace rec_sdk {

// The newest clock of a table no training lookup has reached yet.
constexpr int64_t kNoClock = INT64_MIN;

// A table's admission and eviction state (the pending keys are the table's PendingKeys).
struct TableAdmission {
  // The thresholds in use, read by every training pass.
  std::atomic<int64_t> access_threshold{-1};
  std::atomic<int64_t> eviction_threshold{-1};
  // Whether training passes keep access counts and last-seen clocks current:
  // config.track_access, or TrackAccess() since.
  std::atomic<bool> track_access{false};
  // What ConfigureAdmission set, and whether it ran; guarded by mu.
  mutable std::mutex mu;
  AdmissionConfig config;
  bool configured = false;
  // Training lookups so far (a lookup's clock when it passes none).
  std::atomic<int64_t> tick{0};
  std::atomic<int64_t> newest_clock{kNoClock};  // kNoClock until a training lookup
  // The TableStats counters of the same names.
  std::atomic<int64_t> admitted{0};
  std::atomic<int64_t> rejected{0};
  std::atomic<int64_t> evicted{0};
};

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_TABLE_ADMISSION_H_
