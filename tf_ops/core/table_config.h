// A table's configuration, and how two configurations differ: a second handle to an
// existing table (same shared name) must ask for exactly the table that exists.
#ifndef REC_SDK_TF_OPS_CORE_TABLE_CONFIG_H_
#define REC_SDK_TF_OPS_CORE_TABLE_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tf_ops/core/initializer.h"

namespace rec_sdk {

struct TableConfig {
  std::string name;
  int dim = 1;
  // true: the table grows by chunks without bound; false: at most `capacity` rows.
  bool dynamic_expansion = true;
  int64_t capacity = 0;          // fixed-capacity tables only; >= 1
  int64_t initial_capacity = 0;  // dynamic-expansion tables: rows to reserve up front
  InitializerSpec initializer;
  // Admission: a key gets a row once its count reaches access_threshold (-1: every key is
  // inserted at once; 0 admits every key too, but counts).
  int64_t access_threshold = -1;
  // Eviction: Evict() drops rows and pending counts at least this many clock units older than
  // the newest clock seen (-1: Evict() drops nothing).
  int64_t eviction_threshold = -1;
  // Fixed-capacity tables: when full, evict the least recently seen rows instead of failing.
  bool evict_when_full = false;
  // Remember which rows changed and which keys went since the last save, for incremental
  // (delta) checkpoints.
  bool track_changes = false;
  // Keep every row's last-seen clock and access count current on training lookups (count:
  // occurrences, saturating), for Restrict(); otherwise a row keeps the count it was admitted
  // with and its clock moves only when eviction reads it.
  bool track_access = false;
};

// The fields in which `wanted` differs from `existing`, each as "field: existing vs wanted"
// (values printed), in declaration order; empty when they describe the same table. A fixed
// table's capacity counts; a growing table's initial reservation does not (it only sizes the
// first chunks).
std::vector<std::string> ConfigDifferences(const TableConfig& existing, const TableConfig& wanted);

}  // namespace rec_sdk

#endif  // REC_SDK_TF_OPS_CORE_TABLE_CONFIG_H_
