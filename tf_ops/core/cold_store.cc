#include "tf_ops/core/cold_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "tf_ops/core/checkpoint_files.h"
#include "tf_ops/core/cold_store_io.h"

namespace rec_sdk {
namespace {

using cold_store_io::AlignedBuffer;
using cold_store_io::IoPool;
using cold_store_io::kBlock;
using cold_store_io::ProcessAlive;
using cold_store_io::ReadAll;
using cold_store_io::WriteAll;

std::atomic<uint64_t> next_store_id{1};

}  // namespace

struct ColdStore::SegmentFile {
  int fd = -1;
  ~SegmentFile() {
    if (fd >= 0) ::close(fd);
  }
};

int RemoveDeadStoreFiles(const std::string& directory, const std::string& prefix) {
  DIR* dir = ::opendir(directory.c_str());
  if (dir == nullptr) return 0;
  int removed = 0;
  const std::string head = prefix + "-";
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.size() <= head.size() + 4 || name.compare(0, head.size(), head) != 0 ||
        name.compare(name.size() - 4, 4, ".seg") != 0) {
      continue;
    }
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + head.size(), &end, 10);
    if (end == nullptr || *end != '-' || ProcessAlive(pid)) continue;
    if (::unlink((directory + "/" + name).c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

Status ColdStore::Open(const Options& options, std::unique_ptr<ColdStore>* out) {
  if (options.record_bytes == 0) {
    return Status::InvalidArgument("cold store: record_bytes must be >= 1, got 0");
  }
  if (options.records_per_segment == 0) {
    return Status::InvalidArgument("cold store: records_per_segment must be >= 1, got 0");
  }
  if (options.prefix.empty() || options.prefix.find('/') != std::string::npos) {
    return Status::InvalidArgument(
        "cold store: prefix must be a non-empty file name part, "
        "got '" +
        options.prefix + "'");
  }
  if (options.directories.empty()) {
    return Status::InvalidArgument("cold store: at least one directory is needed");
  }
  for (const std::string& directory : options.directories) {
    struct stat info;
    if (::stat(directory.c_str(), &info) != 0) {
      return checkpoint_files::IoError("cold store: cannot use directory", directory);
    }
    if (!S_ISDIR(info.st_mode)) {
      return Status::InvalidArgument("cold store: '" + directory + "' is not a directory");
    }
    if (::access(directory.c_str(), W_OK) != 0) {
      return checkpoint_files::IoError("cold store: cannot write to directory", directory);
    }
  }
  for (const std::string& directory : options.directories) {
    RemoveDeadStoreFiles(directory, options.prefix);
  }
  out->reset(new ColdStore(options, next_store_id.fetch_add(1)));
  return Status::Ok();
}

ColdStore::ColdStore(const Options& options, uint64_t store_id)
    : options_(options),
      align_(options.direct_io ? kBlock : 1),
      per_block_(0),
      stride_(0),
      record_bytes_(options.record_bytes),
      records_per_segment_(options.records_per_segment),
      store_id_(store_id) {
  if (options.direct_io && slot_bytes() <= kBlock) {
    per_block_ = kBlock / slot_bytes();
    // Whole blocks per segment.
    records_per_segment_ = static_cast<uint32_t>(
        std::max<size_t>(per_block_, records_per_segment_ / per_block_ * per_block_));
  } else {
    stride_ = (slot_bytes() + align_ - 1) / align_ * align_;
  }
}

ColdStore::~ColdStore() { Clear(); }

uint64_t ColdStore::SlotOffset(uint32_t slot) const {
  if (per_block_ > 0)
    return uint64_t{slot / per_block_} * kBlock + (slot % per_block_) * slot_bytes();
  return uint64_t{slot} * stride_;
}

void ColdStore::SpanOf(uint32_t first, uint32_t last, uint64_t* begin, size_t* bytes) const {
  if (per_block_ > 0) {
    *begin = uint64_t{first / per_block_} * kBlock;
    *bytes = ((last - 1) / per_block_ + 1) * kBlock - *begin;
    return;
  }
  *begin = SlotOffset(first);
  *bytes = SlotOffset(last - 1) + (align_ > 1 ? stride_ : slot_bytes()) - *begin;
}

void ColdStore::Clear() {
  // Segment numbers are not reused: an old location never names a new record.
  for (uint32_t i = 0; i < segments_.size(); ++i) DeleteSegment(i);
  has_current_ = false;
  live_ = stale_ = segment_count_ = half_stale_ = 0;
}

std::string ColdStore::segment_path(uint32_t segment) const {
  const std::string& directory = options_.directories[segment % options_.directories.size()];
  return directory + "/" + options_.prefix + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(store_id_) + "-" + std::to_string(segment) + ".seg";
}

ColdStore::Stats ColdStore::stats() const {
  Stats stats;
  stats.live = live_;
  stats.stale = stale_;
  stats.segments = segment_count_;
  stats.bytes_written = bytes_written_;
  stats.bytes_read = bytes_read_.load(std::memory_order_relaxed);
  stats.compactions = compactions_;
  return stats;
}

uint64_t ColdStore::file_bytes() const {
  uint64_t bytes = 0;
  for (const Segment& s : segments_) {
    if (s.file == nullptr || s.used == 0) continue;
    uint64_t begin;
    size_t span;
    SpanOf(0, s.used, &begin, &span);
    bytes += begin + span;
  }
  return bytes;
}

double ColdStore::space_amplification() const {
  if (live_ == 0) return 0.0;
  return static_cast<double>(file_bytes()) / static_cast<double>(live_ * record_bytes_);
}

uint64_t ColdStore::memory_bytes() const {
  uint64_t bytes = segments_.capacity() * sizeof(Segment);
  for (const Segment& s : segments_) {
    bytes += s.flags.capacity() + s.tags.capacity() * sizeof(int64_t);
  }
  return bytes;
}

bool ColdStore::HalfStale(const Segment& s, uint32_t index) const {
  return s.file != nullptr && !(has_current_ && index == current_) &&
         2 * static_cast<uint64_t>(s.stale) > s.used;
}

void ColdStore::DeleteSegment(uint32_t segment) {
  Segment& s = segments_[segment];
  if (s.file == nullptr) return;
  if (HalfStale(s, segment)) half_stale_ -= 1;
  // Readers that pinned a record keep the file open until they are done.
  ::unlink(segment_path(segment).c_str());
  live_ -= s.used - s.stale;
  stale_ -= s.stale;
  segment_count_ -= 1;
  if (has_current_ && segment == current_) has_current_ = false;
  s = Segment();
}

Status ColdStore::NewSegment(uint32_t* index) {
  const uint32_t segment = static_cast<uint32_t>(segments_.size());
  if ((uint64_t{segment} + 1) * records_per_segment_ > ColdTier::kMaxIds) {
    return Status::ResourceExhausted("cold store: " + std::to_string(segment) +
                                     " segments written, the most record numbers can name");
  }
  const std::string path = segment_path(segment);
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (options_.direct_io ? O_DIRECT : 0);
  const int fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0 && options_.direct_io && errno == EINVAL) {
    return Status::InvalidArgument("cold store: the file system of '" + path +
                                   "' does not support direct I/O (O_DIRECT)");
  }
  if (fd < 0) return checkpoint_files::IoError("cold store: cannot create", path);
  Segment s;
  s.file = std::make_shared<SegmentFile>();
  s.file->fd = fd;
  s.flags.assign(records_per_segment_, 0);
  s.tags.assign(records_per_segment_, 0);
  segments_.push_back(std::move(s));
  segment_count_ += 1;
  *index = segment;
  return Status::Ok();
}

Status ColdStore::EnsureCurrent() {
  if (has_current_) {
    Segment& s = segments_[current_];
    // With packed blocks, each batch starts a new block: the rest of the last one stays
    // unused (counted stale).
    if (per_block_ > 0 && s.used % per_block_ != 0) {
      const uint32_t skip = static_cast<uint32_t>(per_block_ - s.used % per_block_);
      s.used += skip;
      s.stale += skip;
      stale_ += skip;
    }
    if (s.used < records_per_segment_) return Status::Ok();
  }
  uint32_t segment = 0;
  REC_SDK_RETURN_IF_ERROR(NewSegment(&segment));
  const bool had = has_current_;
  const uint32_t old = current_;
  current_ = segment;
  has_current_ = true;
  // The full segment stops being the one appended to: it may now count as half stale.
  if (had && HalfStale(segments_[old], old)) half_stale_ += 1;
  return Status::Ok();
}

Status ColdStore::Append(uint64_t key, const void* record, Location* where, int64_t tag) {
  return AppendBatch(1, &key, &record, &tag, where);
}

Status ColdStore::AppendBatch(size_t n, const uint64_t* keys, const void* const* records,
                              const int64_t* tags, Location* where) {
  constexpr size_t kWriteBytes = size_t{1} << 20;
  const size_t per_write = per_block_ > 0 ? kWriteBytes / kBlock * per_block_
                                          : std::max<size_t>(1, kWriteBytes / stride_);
  AlignedBuffer buffer;
  size_t done = 0;
  Status status;
  while (done < n) {
    status = EnsureCurrent();
    if (!status.ok()) break;
    Segment& s = segments_[current_];
    const uint32_t first = s.used;
    const size_t take = std::min({n - done, per_write, size_t{records_per_segment_ - first}});
    uint64_t begin;
    size_t bytes;
    SpanOf(first, first + static_cast<uint32_t>(take), &begin, &bytes);
    uint8_t* data = buffer.Get(bytes);
    if (data == nullptr) {
      status = Status::ResourceExhausted("cold store: out of memory for a write buffer");
      break;
    }
    std::memset(data, 0, bytes);
    for (size_t j = 0; j < take; ++j) {
      uint8_t* slot = data + (SlotOffset(first + static_cast<uint32_t>(j)) - begin);
      std::memcpy(slot, &keys[done + j], sizeof(uint64_t));
      std::memcpy(slot + sizeof(uint64_t), records[done + j], record_bytes_);
    }
    if (!WriteAll(s.file->fd, data, bytes, static_cast<off_t>(begin))) {
      status = checkpoint_files::IoError("cold store: cannot write", segment_path(current_));
      break;
    }
    for (size_t j = 0; j < take; ++j) {
      const uint32_t slot = first + static_cast<uint32_t>(j);
      s.flags[slot] = kLive;
      s.tags[slot] = tags == nullptr ? 0 : tags[done + j];
      where[done + j] = Location{current_, slot};
    }
    s.used += static_cast<uint32_t>(take);
    live_ += take;
    bytes_written_ += bytes;
    done += take;
  }
  if (!status.ok()) {
    // Take the batch back whole: its records written so far become stale.
    for (size_t j = 0; j < done; ++j) {
      MarkStale(where[j]);
      Segment& s = segments_[where[j].segment];
      if (s.stale == s.used && !(has_current_ && where[j].segment == current_)) {
        DeleteSegment(where[j].segment);
      }
    }
  }
  return status;
}

Status ColdStore::CheckLocation(Location where, const char* what) const {
  if (!IsLive(where)) {
    return Status::InvalidArgument(std::string("cold store: ") + what + " of segment " +
                                   std::to_string(where.segment) + " slot " +
                                   std::to_string(where.slot) + ", which holds no record");
  }
  return Status::Ok();
}

bool ColdStore::IsLive(Location where) const {
  return where.segment < segments_.size() && segments_[where.segment].file != nullptr &&
         where.slot < segments_[where.segment].used &&
         (segments_[where.segment].flags[where.slot] & kLive) != 0;
}

Status ColdStore::Pin(Location where, Pinned* pinned) const {
  REC_SDK_RETURN_IF_ERROR(CheckLocation(where, "read"));
  pinned->file = segments_[where.segment].file;
  pinned->segment = where.segment;
  uint64_t begin;
  size_t bytes;
  if (align_ > 1) {
    SpanOf(where.slot, where.slot + 1, &begin, &bytes);
  } else {
    begin = SlotOffset(where.slot);
    bytes = slot_bytes();
  }
  pinned->span_offset = begin;
  pinned->span_bytes = bytes;
  pinned->in_span = static_cast<size_t>(SlotOffset(where.slot) - begin);
  return Status::Ok();
}

Status ColdStore::ReadPinned(const Pinned& pinned, void* record, uint64_t* key) const {
  thread_local AlignedBuffer buffer;
  uint8_t* data = buffer.Get(pinned.span_bytes);
  if (data == nullptr) return Status::ResourceExhausted("cold store: out of memory for a read");
  if (!ReadAll(pinned.file->fd, data, pinned.span_bytes, static_cast<off_t>(pinned.span_offset))) {
    return checkpoint_files::IoError("cold store: cannot read", segment_path(pinned.segment));
  }
  bytes_read_.fetch_add(pinned.span_bytes, std::memory_order_relaxed);
  if (key != nullptr) std::memcpy(key, data + pinned.in_span, sizeof(uint64_t));
  if (record != nullptr) {
    std::memcpy(record, data + pinned.in_span + sizeof(uint64_t), record_bytes_);
  }
  return Status::Ok();
}

Status ColdStore::Read(Location where, void* record, uint64_t* key) const {
  Pinned pinned;
  REC_SDK_RETURN_IF_ERROR(Pin(where, &pinned));
  return ReadPinned(pinned, record, key);
}

Status ColdStore::ReadMany(size_t n, const Location* where, void* const* records,
                           uint64_t* keys) const {
  std::vector<Pinned> pinned(n);
  for (size_t i = 0; i < n; ++i) REC_SDK_RETURN_IF_ERROR(Pin(where[i], &pinned[i]));
  return ReadManyPinned(n, pinned.data(), records, keys);
}

Status ColdStore::ReadManyPinned(size_t n, const Pinned* pinned, void* const* records,
                                 uint64_t* keys) const {
  std::mutex error_mu;
  Status error;
  IoPool::Get().Run(n, [&](size_t i) {
    Status s = ReadPinned(pinned[i], records[i], keys == nullptr ? nullptr : &keys[i]);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (error.ok()) error = s;
    }
  });
  return error;
}

Status ColdStore::ReadKey(Location where, uint64_t* key) const {
  Pinned pinned;
  REC_SDK_RETURN_IF_ERROR(Pin(where, &pinned));
  return ReadPinned(pinned, nullptr, key);
}

void ColdStore::MarkStale(Location where) {
  Segment& s = segments_[where.segment];
  const bool was_half_stale = HalfStale(s, where.segment);
  s.flags[where.slot] = 0;
  s.stale += 1;
  live_ -= 1;
  stale_ += 1;
  if (!was_half_stale && HalfStale(s, where.segment)) half_stale_ += 1;
}

Status ColdStore::Remove(Location where) {
  REC_SDK_RETURN_IF_ERROR(CheckLocation(where, "remove"));
  MarkStale(where);
  const Segment& s = segments_[where.segment];
  if (s.stale == s.used && !(has_current_ && where.segment == current_)) {
    DeleteSegment(where.segment);  // nothing left to keep
  }
  return Status::Ok();
}

void ColdStore::set_marks(Location where, uint8_t marks) {
  uint8_t& flags = segments_[where.segment].flags[where.slot];
  flags = static_cast<uint8_t>((flags & ~(kMarkMask << kMarkShift)) |
                               ((marks & kMarkMask) << kMarkShift));
}

void ColdStore::ClearMarks(uint8_t mask) {
  const uint8_t keep = static_cast<uint8_t>(~((mask & kMarkMask) << kMarkShift));
  for (Segment& s : segments_) {
    for (uint32_t slot = 0; slot < s.used; ++slot) s.flags[slot] &= keep;
  }
}

void ColdStore::ForEachLiveTag(const std::function<void(Location, int64_t)>& fn) const {
  for (uint32_t segment = 0; segment < segments_.size(); ++segment) {
    const Segment& s = segments_[segment];
    if (s.file == nullptr) continue;
    for (uint32_t slot = 0; slot < s.used; ++slot) {
      if (s.flags[slot] & kLive) fn(Location{segment, slot}, s.tags[slot]);
    }
  }
}

Status ColdStore::ForEachLive(const RecordFn& fn) const {
  constexpr size_t kReadBytes = size_t{4} << 20;
  const uint32_t per_read =
      static_cast<uint32_t>(per_block_ > 0 ? kReadBytes / kBlock * per_block_
                                           : std::max<size_t>(1, kReadBytes / stride_));
  for (uint32_t segment = 0; segment < segments_.size(); ++segment) {
    const Segment& s = segments_[segment];
    if (s.file == nullptr || s.stale == s.used) continue;
    for (uint32_t first = 0; first < s.used; first += per_read) {
      REC_SDK_RETURN_IF_ERROR(ScanSlots(segment, first, std::min(s.used, first + per_read), fn));
    }
  }
  return Status::Ok();
}

Status ColdStore::Compact(const MoveFn& moved) {
  for (uint32_t segment = 0; segment < segments_.size() && half_stale_ > 0; ++segment) {
    // No reference into segments_ is held across appends (they may add a segment).
    if (!HalfStale(segments_[segment], segment)) continue;
    // Read the live records, append them as one batch (all or nothing, so a full disk leaves
    // every record where it was), then report the moves and delete the old file.
    std::vector<uint64_t> keys;
    std::vector<uint8_t> records;
    std::vector<Location> from;
    std::vector<int64_t> tags;
    std::vector<uint8_t> marks;
    const size_t bytes = record_bytes_;
    Status status = ScanSlots(segment, 0, segments_[segment].used,
                              [&](uint64_t key, Location where, const void* r) {
                                keys.push_back(key);
                                const uint8_t* record = static_cast<const uint8_t*>(r);
                                records.insert(records.end(), record, record + bytes);
                                from.push_back(where);
                                tags.push_back(segments_[segment].tags[where.slot]);
                                marks.push_back(this->marks(where));
                                return Status::Ok();
                              });
    if (!status.ok()) return status;
    std::vector<const void*> pointers(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) pointers[i] = records.data() + i * bytes;
    std::vector<Location> to(keys.size());
    REC_SDK_RETURN_IF_ERROR(
        AppendBatch(keys.size(), keys.data(), pointers.data(), tags.data(), to.data()));
    for (size_t i = 0; i < keys.size(); ++i) {
      if (marks[i]) set_marks(to[i], marks[i]);
      moved(keys[i], from[i], to[i]);
    }
    DeleteSegment(segment);
    compactions_ += 1;
  }
  return Status::Ok();
}

Status ColdStore::ScanSlots(uint32_t segment, uint32_t first, uint32_t last,
                            const RecordFn& fn) const {
  const Segment& s = segments_[segment];
  if (s.file == nullptr) return Status::Ok();
  while (first < last && !(s.flags[first] & kLive)) ++first;  // nothing to read before
  if (first == last) return Status::Ok();
  uint64_t begin;
  size_t bytes;
  SpanOf(first, last, &begin, &bytes);
  AlignedBuffer buffer;
  uint8_t* data = buffer.Get(bytes);
  if (data == nullptr) return Status::ResourceExhausted("cold store: out of memory");
  if (!ReadAll(s.file->fd, data, bytes, static_cast<off_t>(begin))) {
    return checkpoint_files::IoError("cold store: cannot read", segment_path(segment));
  }
  bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
  for (uint32_t slot = first; slot < last; ++slot) {
    if (!(s.flags[slot] & kLive)) continue;
    const uint8_t* at = data + (SlotOffset(slot) - begin);
    uint64_t key;
    std::memcpy(&key, at, sizeof(key));
    REC_SDK_RETURN_IF_ERROR(fn(key, Location{segment, slot}, at + sizeof(uint64_t)));
  }
  return Status::Ok();
}

}  // namespace rec_sdk
