// ColdTier: what a table needs from the store of its SSD tier, the records of the rows that
// are not in memory. The table talks only to this interface; ColdStore's record files
// (cold_store.h, OpenFileColdTier) are the back end today. Another one (a key-value store
// such as RocksDB, should the in-memory index ever become the limit) implements the same
// methods.
//
// A record is a row's bytes as the table lays them out (record_bytes) stored with its key,
// named by an id below kMaxIds that the table keeps in the key's index entry; an id is never
// reused for another record while the tier lives. Per live record the tier also keeps a tag
// (the row's last-seen clock) and mark bits (changed since the last save, or push), readable
// without disk access.
//
// Concurrency: the const methods may run in many threads at once; the others need the tier
// to themselves (the table calls them under its exclusive lock). Records pinned by PinMany
// stay readable by ReadPinned without the table's lock, even if they are removed or moved
// meanwhile.
#ifndef REC_SDK_CORE_COLD_TIER_H_
#define REC_SDK_CORE_COLD_TIER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "tf_ops/core/status.h"

namespace rec_sdk {

class ColdTier {
 public:
  static constexpr uint64_t kMaxIds = uint64_t{1} << 40;  // fits a row address's row bits

  struct Stats {
    uint64_t live = 0;   // records that can be read
    uint64_t stale = 0;  // removed records still taking space
    uint64_t bytes_written = 0;
    uint64_t bytes_read = 0;
    uint64_t file_bytes = 0;    // space taken on disk
    uint64_t memory_bytes = 0;  // the tier's own bookkeeping in memory
  };
  // Records read later without the table's lock (see PinMany).
  class Pinned {
   public:
    virtual ~Pinned() = default;
  };
  using MoveFn = std::function<void(uint64_t key, uint64_t from, uint64_t to)>;
  using RecordFn = std::function<Status(uint64_t key, uint64_t id, const void* record)>;

  virtual ~ColdTier() = default;
  virtual size_t record_bytes() const = 0;
  virtual uint64_t live() const = 0;
  virtual Stats stats() const = 0;

  // Appends n records with their keys and tags; ids[i] receives record i's id. All or
  // nothing: on an error (a full disk) no record of the batch is live.
  virtual Status AppendBatch(size_t n, const uint64_t* keys, const void* const* records,
                             const int64_t* tags, uint64_t* ids) = 0;
  Status Append(uint64_t key, const void* record, int64_t tag, uint64_t* id) {
    return AppendBatch(1, &key, &record, &tag, id);
  }
  virtual bool IsLive(uint64_t id) const = 0;
  // Reads a record (and its key, if key is not null).
  virtual Status Read(uint64_t id, void* record, uint64_t* key) const = 0;
  virtual Status ReadKey(uint64_t id, uint64_t* key) const = 0;
  // Reads n records, many at once; keys may be null. Returns the first error.
  virtual Status ReadMany(size_t n, const uint64_t* ids, void* const* records,
                          uint64_t* keys) const = 0;
  // Pins n live records for ReadPinned (which reads them all, as ReadMany).
  virtual Status PinMany(size_t n, const uint64_t* ids, std::unique_ptr<Pinned>* pinned) const = 0;
  virtual Status ReadPinned(const Pinned& pinned, void* const* records, uint64_t* keys) const = 0;
  virtual Status Remove(uint64_t id) = 0;
  // Gives back the space of removed records when there is enough of it to be worth it;
  // moved() learns each record that got a new id. All or nothing per unit of work: a
  // failed write leaves every record where it was.
  virtual bool NeedsCompaction() const = 0;
  virtual Status Compact(const MoveFn& moved) = 0;
  // Removes every record (ids are still not reused).
  virtual void Clear() = 0;
  // Every live record, in the order that reads the disk best.
  virtual Status ForEachLive(const RecordFn& fn) const = 0;
  // Every live record's id and tag, from memory.
  virtual void ForEachLiveTag(const std::function<void(uint64_t id, int64_t tag)>& fn) const = 0;
  virtual int64_t tag(uint64_t id) const = 0;
  // A record's mark bits (ColdStore::kMarkBits of them), replaced or cleared by mask.
  virtual uint8_t marks(uint64_t id) const = 0;
  virtual void set_marks(uint64_t id, uint8_t marks) = 0;
  virtual void ClearMarks(uint8_t mask) = 0;
};

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_COLD_TIER_H_
