// A table's configuration, and how two configurations differ: a second handle to an
// existing table (same shared name) must ask for exactly the table that exists, and every
// graph's lookups must configure its admission alike.
#ifndef REC_SDK_TF_OPS_CORE_TABLE_CONFIG_H_
#define REC_SDK_TF_OPS_CORE_TABLE_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tf_ops/core/initializer.h"
#include "tf_ops/core/row_precision.h"
#include "tf_ops/core/status.h"

namespace rec_sdk {

struct TableConfig {
  std::string name;
  int dim = 1;
  // The element type of the stored embeddings (row_precision.h).
  RowDtype emb_dtype = RowDtype::kFloat32;
  // The element type of optimizer slots of dim values per row (LazyAdam's moments, Adagrad's
  // and FTRL's accumulators): float32 or bfloat16 (float16 cannot hold squared gradients:
  // below 6e-8 they vanish). Slots of one float per row (row-wise Adagrad) stay float32.
  RowDtype slot_dtype = RowDtype::kFloat32;
  // true: the table grows by chunks without bound; false: at most `capacity` rows.
  bool dynamic_expansion = true;
  int64_t capacity = 0;          // fixed-capacity tables only; >= 1
  int64_t initial_capacity = 0;  // dynamic-expansion tables: rows to reserve up front
  InitializerSpec initializer;
  // Fixed-capacity tables: when full, evict the least recently seen rows instead of failing.
  bool evict_when_full = false;
  // Remember which rows changed and which keys went since the last save, for incremental
  // (delta) checkpoints.
  bool track_changes = false;
  // Keep every row's last-seen clock and access count current on training lookups (count:
  // occurrences, saturating), for Restrict(); otherwise a row keeps the count it was admitted
  // with and its clock moves only when eviction reads it.
  bool track_access = false;
  // A table larger than memory (DRAM + SSD tier): with ssd_paths set (a fixed-capacity
  // table), `capacity` rows stay in memory and the least recently used rows move to record
  // files in these directories (spread over them), at most ssd_rows of them (0: no bound).
  std::vector<std::string> ssd_paths;
  int64_t ssd_rows = 0;
  // The record files are read and written with O_DIRECT (no page cache).
  bool ssd_direct_io = false;
  // The layout of the hash index's entries (hash_index.h): kFull, 16 bytes a slot (the key
  // and the row); kCompact, 8 bytes (the row and 12 bits of the key's hash; the key is read
  // back from the row: about 17 bytes less per key, a training probe 10-25% slower); kAuto,
  // compact for half-precision rows (a table storing them asks for memory), full for
  // float32 ones. A tiered table's index is always full (its cold keys have no row).
  enum class IndexLayout { kAuto, kFull, kCompact };
  IndexLayout index_layout = IndexLayout::kAuto;
  // The seed of the index's hashes; 0 (the default): a random one per table, so that keys
  // from user data cannot be crafted to collide. Fixed only to compare two tables row by row
  // (which row a key gets depends on it).
  uint64_t index_seed = 0;
  bool tiered() const { return !ssd_paths.empty(); }
  bool compact_index() const {
    return !tiered() && (index_layout == IndexLayout::kCompact ||
                         (index_layout == IndexLayout::kAuto && emb_dtype != RowDtype::kFloat32));
  }
};

// The layouts of a table's hash index; the op's index_layout attribute allows these.
inline constexpr TableConfig::IndexLayout kIndexLayouts[] = {TableConfig::IndexLayout::kAuto,
                                                             TableConfig::IndexLayout::kFull,
                                                             TableConfig::IndexLayout::kCompact};

// The rule of the index layout: "compact" needs a table without an SSD tier (a compact index
// reads keys back from rows, and cold keys have none). InvalidArgument otherwise, its message
// the layout's value and why (the caller names the table or parameter: index_layout=...). The one
// statement of the rule: EmbeddingTable::Create checks it, and Python asks it when a table is
// configured (rec_sdk_index_layout_error).
Status CheckIndexLayout(const TableConfig& config);

// "auto", "full", "compact" <-> TableConfig::IndexLayout; InvalidArgument for other names.
Status IndexLayoutFromName(const std::string& name, TableConfig::IndexLayout* layout);
const char* IndexLayoutName(TableConfig::IndexLayout layout);

// The fields in which `wanted` differs from `existing`, each as "field: existing vs wanted"
// (values printed), in declaration order; empty when they describe the same table. A fixed
// table's capacity counts; a growing table's initial reservation does not (it only sizes the
// first chunks).
std::vector<std::string> ConfigDifferences(const TableConfig& existing, const TableConfig& wanted);

// Whether two configurations describe the same table (ConfigDifferences is empty): what
// makes a second handle, or a table kept from another session, the same table.
inline bool operator==(const TableConfig& a, const TableConfig& b) {
  return ConfigDifferences(a, b).empty();
}
inline bool operator!=(const TableConfig& a, const TableConfig& b) { return !(a == b); }

// Admission and eviction settings. They come from the table's lookups (FeatureSpecs or
// access_and_evict_config), which the SDK's scripts build after the table, so they are not
// part of TableConfig: the first training lookup of a graph sets them
// (EmbeddingTable::ConfigureAdmission) and every later configuration must be the same.
struct AdmissionConfig {
  // A key gets a row once its count reaches access_threshold (-1: every key is inserted at
  // once; 0 admits every key too, but counts).
  int64_t access_threshold = -1;
  // Evict() drops rows and pending counts at least this many clock units older than the
  // newest clock seen (-1: Evict() drops nothing).
  int64_t eviction_threshold = -1;
};

// As ConfigDifferences, for admission settings.
std::vector<std::string> AdmissionDifferences(const AdmissionConfig& existing,
                                              const AdmissionConfig& wanted);
inline bool operator==(const AdmissionConfig& a, const AdmissionConfig& b) {
  return AdmissionDifferences(a, b).empty();
}
inline bool operator!=(const AdmissionConfig& a, const AdmissionConfig& b) { return !(a == b); }

}  // namespace rec_sdk

#endif  // REC_SDK_TF_OPS_CORE_TABLE_CONFIG_H_
