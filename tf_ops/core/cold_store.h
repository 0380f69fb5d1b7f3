// ColdStore: the record files of a table's SSD tier (the cold rows of a table larger than
// memory); the table reaches it through the ColdTier interface (OpenFileColdTier, defined in
// file_cold_tier.cc). Its file I/O helpers are in cold_store_io.h.
//
// A record is a fixed number of bytes (a row as the table lays it out: header, embedding and
// optimizer slots) stored with its key. Records are appended to segment files,
// `records_per_segment` slots each, the segments spread round-robin over the directories
// given; a record is addressed by its Location (segment, slot), which the table's index keeps
// for a cold key as one number (Number / AtNumber). Besides the files, the store keeps per
// slot in memory whether it is live, its mark bits and a 64-bit tag (the table's last-seen
// clock), so that eviction by age and change tracking need no disk reads. Removing a record
// marks its slot stale; Compact() rewrites the live records of every segment that is more than
// half stale into the segment being appended to, reports each move, and deletes the old file.
//
// Segment files are scratch space, not checkpoints: a store deletes its files when it is
// destroyed or cleared, and Open() deletes the files that stores of processes no longer
// running left in the directories (a crash). Every write is checked: a full disk (or any
// failed write) is ResourceExhausted / Internal naming the file, and the store stays as it
// was before the call (nothing is half-appended: a slot counts only once its write
// succeeded, and a batch that fails is taken back whole).
//
// With direct_io the files are opened with O_DIRECT (the page cache neither hides reads nor
// holds the tier's data): records are packed into 4 KiB blocks (a record never straddles
// two; a record larger than a block takes whole blocks), each batch of appends starts a new
// block, and every read or write is a whole number of aligned blocks.
//
// Concurrency: Read, ReadMany, ReadKey, ForEachLive, Pin and the accessors may run in many
// threads at once; Append, Remove, Compact, Clear and the mark setters need the store to
// themselves (the table calls them under its exclusive lock). A Pinned record stays
// readable (ReadPinned, without the table's lock) even if its segment is deleted meanwhile.
#ifndef REC_SDK_CORE_COLD_STORE_H_
#define REC_SDK_CORE_COLD_STORE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tf_ops/core/cold_tier.h"
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
    // Existing writable directories; segment i goes to directories[i % size].
    std::vector<std::string> directories;
    std::string prefix = "rec_sdk";  // file names: <prefix>-<pid>-<store>-<segment>.seg
    size_t record_bytes = 0;         // payload bytes per record, >= 1
    uint32_t records_per_segment = 1 << 16;
    bool direct_io = false;  // O_DIRECT files (see above)
  };

  // A record's file and place, readable without the store (see ReadPinned).
  struct SegmentFile;
  struct Pinned {
    std::shared_ptr<SegmentFile> file;
    uint32_t segment = 0;
    uint64_t span_offset = 0;  // the aligned bytes that hold the record
    size_t span_bytes = 0;
    size_t in_span = 0;  // where the record (its key first) starts in them
  };

  struct Stats {
    uint64_t live = 0;           // records that can be read
    uint64_t stale = 0;          // removed records still in segment files
    uint64_t segments = 0;       // segment files
    uint64_t bytes_written = 0;  // by Append and Compact
    uint64_t bytes_read = 0;     // by Read, ForEachLive and Compact
    uint64_t compactions = 0;    // segments rewritten
  };

  // Called by Compact for each live record it moves.
  using MoveFn = std::function<void(uint64_t key, Location from, Location to)>;
  // Called by ForEachLive for each live record; an error stops the scan.
  using RecordFn = std::function<Status(uint64_t key, Location where, const void* record)>;

  static Status Open(const Options& options, std::unique_ptr<ColdStore>* out);
  ~ColdStore();
  ColdStore(const ColdStore&) = delete;
  ColdStore& operator=(const ColdStore&) = delete;

  // Appends `record` (record_bytes bytes) for `key` with `tag`; *where is its location.
  Status Append(uint64_t key, const void* record, Location* where, int64_t tag = 0);
  // Appends n records (records[i]: record_bytes bytes each) in as few writes as the segments
  // allow. All or nothing: on an error no record of the batch is live.
  Status AppendBatch(size_t n, const uint64_t* keys, const void* const* records,
                     const int64_t* tags, Location* where);
  // Reads the record at `where` into `record` (and its key into *key, if not null).
  Status Read(Location where, void* record, uint64_t* key = nullptr) const;
  // Reads n records at once (many reads in flight: a disk serves them in parallel); keys
  // may be null. Returns the first error.
  Status ReadMany(size_t n, const Location* where, void* const* records, uint64_t* keys) const;
  // The file and place of a live record, and reading it later without the store.
  Status Pin(Location where, Pinned* pinned) const;
  Status ReadPinned(const Pinned& pinned, void* record, uint64_t* key) const;
  // ReadMany of pinned records (no store state is used: callable without the table's lock).
  Status ReadManyPinned(size_t n, const Pinned* pinned, void* const* records, uint64_t* keys) const;
  Status ReadKey(Location where, uint64_t* key) const;
  // Marks the record at `where` stale.
  Status Remove(Location where);
  // Rewrites every segment (other than the one being appended to) whose stale slots are
  // more than half of its slots; moved() learns each live record's new location.
  Status Compact(const MoveFn& moved);
  // Whether Compact() would rewrite a segment.
  bool NeedsCompaction() const { return half_stale_ > 0; }
  // Deletes every record and file; the store stays usable (and never reuses a location).
  void Clear();
  // Calls fn for every live record, segment by segment in slot order, reading each segment
  // in large blocks.
  Status ForEachLive(const RecordFn& fn) const;
  // Calls fn(where, tag) for every live record, from memory (no disk reads).
  void ForEachLiveTag(const std::function<void(Location, int64_t)>& fn) const;

  // The tag and mark bits of a live record: kMarkBits independent bits (the table keeps one
  // per change set), set and cleared by mask.
  static constexpr int kMarkBits = 2;
  int64_t tag(Location where) const { return segments_[where.segment].tags[where.slot]; }
  uint8_t marks(Location where) const {
    return (segments_[where.segment].flags[where.slot] >> kMarkShift) & kMarkMask;
  }
  void set_marks(Location where, uint8_t marks);
  // Clears the given mark bits of every record.
  void ClearMarks(uint8_t mask);

  // One number per location (segment * records_per_segment + slot), and back.
  uint64_t Number(Location where) const {
    return uint64_t{where.segment} * records_per_segment_ + where.slot;
  }
  Location AtNumber(uint64_t number) const {
    return Location{static_cast<uint32_t>(number / records_per_segment_),
                    static_cast<uint32_t>(number % records_per_segment_)};
  }
  // Whether `where` holds a live record.
  bool IsLive(Location where) const;

  Stats stats() const;
  uint64_t live() const { return live_; }
  size_t record_bytes() const { return record_bytes_; }
  // Bytes in segment files per live record's payload (1.0: no stale or key space); 0 when
  // empty.
  double space_amplification() const;
  uint64_t file_bytes() const;
  // Memory of the per-slot bookkeeping.
  uint64_t memory_bytes() const;
  std::string segment_path(uint32_t segment) const;
  const Options& options() const { return options_; }

 private:
  static constexpr uint8_t kLive = 1;
  static constexpr int kMarkShift = 1;
  static constexpr uint8_t kMarkMask = (1 << kMarkBits) - 1;
  struct Segment {
    std::shared_ptr<SegmentFile> file;  // null: deleted
    uint32_t used = 0;                  // slots written
    uint32_t stale = 0;                 // of them, removed
    std::vector<uint8_t> flags;         // per slot: kLive, then the mark bits
    std::vector<int64_t> tags;          // per slot
  };

  ColdStore(const Options& options, uint64_t store_id);
  // A slot: the key, then the record.
  size_t slot_bytes() const { return record_bytes_ + sizeof(uint64_t); }
  // Where slot `slot` starts in its segment file, and the aligned span of slots [first,
  // last) (whole blocks with direct I/O).
  uint64_t SlotOffset(uint32_t slot) const;
  void SpanOf(uint32_t first, uint32_t last, uint64_t* begin, size_t* bytes) const;
  // Calls fn for the live records among slots [first, last) of a segment, read in one
  // aligned span from the first live one.
  Status ScanSlots(uint32_t segment, uint32_t first, uint32_t last, const RecordFn& fn) const;
  Status CheckLocation(Location where, const char* what) const;
  Status NewSegment(uint32_t* index);
  // Makes sure the current segment has a free slot.
  Status EnsureCurrent();
  void DeleteSegment(uint32_t segment);
  bool HalfStale(const Segment& s, uint32_t index) const;
  // Marks a live slot stale, keeping the counters (no segment deletion).
  void MarkStale(Location where);

  Options options_;
  size_t align_;      // 1, or the block size with direct I/O
  size_t per_block_;  // direct I/O: records per block when a slot fits in one, else 0
  size_t stride_;     // bytes per slot when slots are not packed into blocks
  size_t record_bytes_;
  uint32_t records_per_segment_;
  uint64_t store_id_;
  std::vector<Segment> segments_;  // by segment index; fd -1: deleted
  uint32_t current_ = 0;           // the segment appended to
  bool has_current_ = false;
  uint64_t live_ = 0, stale_ = 0, segment_count_ = 0;
  uint64_t half_stale_ = 0;  // segments (not current) more than half stale
  uint64_t bytes_written_ = 0, compactions_ = 0;
  mutable std::atomic<uint64_t> bytes_read_{0};
};

// The ColdTier of record files: a ColdStore whose record ids are its locations' numbers.
Status OpenFileColdTier(const ColdStore::Options& options, std::unique_ptr<ColdTier>* out);

// Deletes the segment files of `prefix` in `directory` whose process (the pid in the name) is
// no longer running. Returns how many were deleted.
int RemoveDeadStoreFiles(const std::string& directory, const std::string& prefix);

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_COLD_STORE_H_
