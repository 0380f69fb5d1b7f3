// ColdStore: the record files of a table's SSD tier (the cold rows of a table larger than
// memory; tables do not use it yet).
//
// A record is a fixed number of bytes (a row: embedding plus optimizer slots and metadata, as
// the table lays it out) stored with its key. Records are appended to segment files in one
// directory, `records_per_segment` slots each; a record is addressed by its Location
// (segment, slot), which the table's index keeps for a cold key. Removing a record marks its
// slot stale; Compact() rewrites the live records of every segment that is more than half
// stale into the segment being appended to, reports each move, and deletes the old file.
//
// Segment files are scratch space, not checkpoints: a store deletes its files when it is
// destroyed, and Open() deletes the files that stores of processes no longer running left in
// the directory (a crash). Every write is checked: a full disk (or any failed write) is
// ResourceExhausted / Internal naming the file, and the store stays as it was before the
// call (nothing is half-appended: a slot counts only once its write succeeded).
//
// Not thread-safe: the table calls it under its own lock.
#ifndef REC_SDK_CORE_COLD_STORE_H_
#define REC_SDK_CORE_COLD_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tf_ops/core/status.h"

namespace rec_sdk {

class ColdStore {
 public:
  struct Location {
    uint32_t segment = 0;
    uint32_t slot = 0;
    bool operator==(const Location& o) const { return segment == o.segment && slot == o.slot; }
  };

  struct Options {
    std::string directory;           // an existing writable directory
    std::string prefix = "rec_sdk";  // file names: <prefix>-<pid>-<store>-<segment>.seg
    size_t record_bytes = 0;         // payload bytes per record, >= 1
    uint32_t records_per_segment = 1 << 16;
  };

  struct Stats {
    uint64_t live = 0;           // records that can be read
    uint64_t stale = 0;          // removed records still in segment files
    uint64_t segments = 0;       // segment files
    uint64_t bytes_written = 0;  // by Append and Compact
    uint64_t bytes_read = 0;     // by Read and Compact
    uint64_t compactions = 0;    // segments rewritten
  };

  // Called by Compact for each live record it moves.
  using MoveFn = std::function<void(uint64_t key, Location from, Location to)>;

  static Status Open(const Options& options, std::unique_ptr<ColdStore>* out);
  ~ColdStore();
  ColdStore(const ColdStore&) = delete;
  ColdStore& operator=(const ColdStore&) = delete;

  // Appends `record` (record_bytes bytes) for `key`; *where is its location.
  Status Append(uint64_t key, const void* record, Location* where);
  // Reads the record at `where` into `record` (and its key into *key, if not null).
  Status Read(Location where, void* record, uint64_t* key = nullptr);
  // Marks the record at `where` stale.
  Status Remove(Location where);
  // Rewrites every segment (other than the one being appended to) whose stale slots are
  // more than half of its slots; moved() learns each live record's new location.
  Status Compact(const MoveFn& moved);

  Stats stats() const { return stats_; }
  size_t record_bytes() const { return record_bytes_; }
  // Bytes in segment files per live record (1.0 = no stale space); 0 when empty.
  double space_amplification() const;
  std::string segment_path(uint32_t segment) const;

 private:
  struct Segment {
    int fd = -1;
    uint32_t used = 0;            // slots written
    uint32_t stale = 0;           // of them, removed
    std::vector<uint8_t> live;    // per slot
  };

  ColdStore(const Options& options, uint64_t store_id);
  size_t slot_bytes() const { return record_bytes_ + sizeof(uint64_t); }
  Status CheckLocation(Location where, const char* what) const;
  Status NewSegment(uint32_t* index);
  Status AppendTo(uint32_t segment, uint64_t key, const void* record, Location* where);
  void DeleteSegment(uint32_t segment);

  std::string directory_;
  std::string prefix_;
  size_t record_bytes_;
  uint32_t records_per_segment_;
  uint64_t store_id_;
  std::vector<Segment> segments_;  // by segment index; fd -1: deleted
  uint32_t current_ = 0;           // the segment appended to
  bool has_current_ = false;
  Stats stats_;
  std::vector<uint8_t> buffer_;
};

// Deletes the segment files of `prefix` in `directory` whose process (the pid in the name) is
// no longer running. Returns how many were deleted.
int RemoveDeadStoreFiles(const std::string& directory, const std::string& prefix);

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_COLD_STORE_H_
