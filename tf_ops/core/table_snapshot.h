// What a table's checkpoints see of it (table_snapshot.cc): the information a checkpoint
// records besides the rows, the consistent view a save reads, the sink a restore fills, and
// the change set that delta checkpoints and HoldsCheckpoint rely on. EmbeddingTable names
// these types CheckpointInfo, SnapshotView and RestoreSink.
//
// EmbeddingTable's checkpoint operations:
//   Snapshot(fn) runs fn(view) under the exclusive lock (batch operations wait until it
//     returns). The view's info carries a new save id, to be passed to CommitSave once the
//     save is durable.
//   CommitSave(save_id) records that the save with this id is complete: the table's change
//     set restarts from it (what a later delta is relative to). Fails if another snapshot was
//     taken since.
//   HoldsCheckpoint(save_id): whether the table holds exactly checkpoint save_id: it was
//     saved (and committed) or restored as that checkpoint, and nothing changed it since (no
//     training lookup, update, eviction, upsert, removal or threshold change). Such a table
//     can stand in for reading the checkpoint's files.
//   Restore(info, feed, note) replaces the table's contents under the exclusive lock:
//     feed(sink) adds the rows. Slots of the checkpoint's optimizer are kept when the table
//     has no optimizer yet (the first optimizer to apply must then be the same one, or the
//     slots are re-initialised with a notice) or has the same one; otherwise they are
//     dropped and *note says so. On any error the table is left empty. *note (may be null)
//     describes what happened to the slots.
//   TakeChanges(full, fn, since, id) runs fn(view, whole) under the exclusive lock with a
//     view of the push change set: the rows changed and the keys removed since the last
//     push, or, when `whole` (asked by `full`, at the first push, after a clear or restore),
//     every row standing for the whole table; then restarts that set. *since is the id of
//     the push the changes follow (0 with every row), *id the new push's id. A failed fn
//     restarts nothing.
//   ApplyDelta(info, cleared, removed, feed) applies a delta checkpoint on top of the
//     table's contents (exclusive lock): clears the table first when `cleared`, removes the
//     `removed` keys, then feed(sink) upserts the changed rows and replaces the pending keys.
//     The slots must be the table's.
#ifndef REC_SDK_CORE_TABLE_SNAPSHOT_H_
#define REC_SDK_CORE_TABLE_SNAPSHOT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tf_ops/core/row_precision.h"
#include "tf_ops/core/status.h"

namespace rec_sdk {

class EmbeddingTable;

// What a checkpoint records besides the rows.
struct TableCheckpointInfo {
  int64_t rows = 0;
  int64_t pending = 0;
  int num_slots = 0;
  int slot_width = 0;  // floats per slot (dim unless the optimizer is row-wise)
  RowDtype emb_dtype = RowDtype::kFloat32;  // the embeddings' element type
  // The update step of stochastic rounding (row_precision.h), continued after a restore.
  int64_t update_step = 0;
  std::string optimizer;            // empty when no optimizer attached slots
  std::vector<float> slot_initial;  // num_slots values
  int64_t newest_clock = 0;
  bool has_clock = false;
  int64_t tick = 0;
  int64_t admitted = 0, rejected = 0, evicted = 0;
  // Lineage: the id of this save, and of the save (or restored checkpoint) it follows.
  int64_t save_id = 0, parent_id = 0;
};

// Change sets, as bit masks: every row keeps one mark bit per set (and the SSD tier one per
// cold record), set by any change of the row; each set restarts on its own.
constexpr uint8_t kCheckpointChanges = 1;  // since the last save (delta checkpoints)
constexpr uint8_t kPushChanges = 2;        // since the last push (serving updates)
constexpr uint8_t kAllChanges = kCheckpointChanges | kPushChanges;

// A table's changes since its last save (and since its last push), and the versions that
// say whether it still equals its checkpoint. Guards: the removed keys and the cleared flags
// by the table's alloc_mu_ (or its structure_mu_ held exclusively); the ids, push_active and
// the recorded versions by structure_mu_.
struct TableChangeSet {
  // Keys removed since the last save (track_changes), and whether the table was cleared or
  // replaced.
  std::vector<int64_t> removed_keys;
  bool cleared_since_save = false;
  // The same since the last push, kept once a push took changes (a table nobody pushes
  // keeps no second list); push_id: the last push's id.
  bool push_active = false;
  std::vector<int64_t> push_removed_keys;
  bool push_cleared = false;
  int64_t push_id = 0;
  void NoteRemoved(int64_t key) {
    removed_keys.push_back(key);
    if (push_active) push_removed_keys.push_back(key);
  }
  void NoteCleared() {
    cleared_since_save = true;
    removed_keys.clear();
    if (push_active) {
      push_cleared = true;
      push_removed_keys.clear();
    }
  }
  // The checkpoint the change set is relative to, and the last snapshot's id.
  int64_t checkpoint_id = 0;
  int64_t snapshot_id = 0;
  // Bumped by every change of the table's contents or settings; the values at the last
  // snapshot and at the last commit or restore say whether it still equals its checkpoint.
  std::atomic<uint64_t> version{0};
  uint64_t snapshot_version = 0;
  uint64_t committed_version = 0;
  void BumpVersion() { version.fetch_add(1, std::memory_order_relaxed); }
};

// Bumps the version before and after a change: a snapshot taken while the change runs
// records a version the change's second bump makes stale, so HoldsCheckpoint never vouches
// for a table that differs from its files.
class TableChangeScope {
 public:
  explicit TableChangeScope(TableChangeSet* changes, bool active = true)
      : changes_(active ? changes : nullptr) {
    if (changes_ != nullptr) changes_->BumpVersion();
  }
  ~TableChangeScope() {
    if (changes_ != nullptr) changes_->BumpVersion();
  }
  TableChangeScope(const TableChangeScope&) = delete;
  TableChangeScope& operator=(const TableChangeScope&) = delete;

 private:
  TableChangeSet* changes_;
};

// A consistent view of the table for a checkpoint, valid inside EmbeddingTable::Snapshot.
class TableSnapshotView {
 public:
  using RowFn =
      std::function<Status(int64_t key, const char* record, uint32_t count, int64_t last_seen)>;
  using PendingFn = std::function<Status(int64_t key, int64_t count, int64_t last_seen)>;
  const TableCheckpointInfo& info() const { return info_; }
  // Calls fn for every row in row order with the row's record, read with the accessors
  // below. Several threads may scan at once. An error stops the scan.
  // changed_only: only rows changed since the last save (or push, in a view of
  // TakeChanges) (tables with track_changes).
  Status ForEachRow(const RowFn& fn, bool changed_only = false) const;
  Status ForEachPending(const PendingFn& fn) const;
  // A record's embedding: dim elements of info().emb_dtype (embedding_bytes() bytes), or
  // decoded to float32; and its slot s (info().slot_width values) decoded to float32.
  const void* Embedding(const char* record) const;
  size_t embedding_bytes() const;
  void ReadEmbedding(const char* record, float* out) const;
  void ReadSlot(const char* record, int s, float* out) const;
  // Keys removed (or evicted) since the last save (push), and whether the table was cleared
  // or replaced since then (a delta must then start from an empty table).
  const std::vector<int64_t>& removed_keys() const {
    return set_ == kPushChanges ? changes_->push_removed_keys : changes_->removed_keys;
  }
  bool cleared() const {
    return set_ == kPushChanges ? changes_->push_cleared : changes_->cleared_since_save;
  }

 private:
  friend class EmbeddingTable;
  const EmbeddingTable* table_ = nullptr;
  const TableChangeSet* changes_ = nullptr;
  uint8_t set_ = kCheckpointChanges;  // the change set changed_only and removed_keys read
  TableCheckpointInfo info_;
  int64_t next_row_ = 0;
};

// Receives the rows of a restore (see EmbeddingTable::Restore). Rows are put in by lanes
// that may run in parallel: lane l takes the keys whose index shard s has
// s % kRestoreLanes == l (EmbeddingTable::RestoreLaneOf), so lanes never touch the same shard.
class TableRestoreSink {
 public:
  // slots: info.num_slots arrays of dim floats (null entries, or slots == null, when the
  // checkpoint's slots are not kept).
  virtual Status AddRow(int lane, int64_t key, const float* value, const float* const* slots,
                        uint32_t count, int64_t last_seen) = 0;
  virtual Status AddPending(int64_t key, int64_t count, int64_t last_seen) = 0;
  // A hint that AddRow(key) follows soon: starts loading the key's index slot.
  virtual void Prefetch(int64_t key) const = 0;
  // Announces that lane will add n rows (before those AddRow calls).
  virtual void ExpectRows(int lane, int64_t n) = 0;
  // The lane that adds `key` (RestoreLaneOf of the table).
  virtual int LaneOf(int64_t key) const = 0;
  virtual ~TableRestoreSink() = default;
};

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_TABLE_SNAPSHOT_H_
