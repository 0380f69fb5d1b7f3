#include "tf_ops/core/cold_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "tf_ops/core/checkpoint_files.h"

namespace rec_sdk {
namespace {

std::atomic<uint64_t> next_store_id{1};

bool ProcessAlive(long pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

// Writes exactly `size` bytes at `offset`; errno is set on failure (ENOSPC for a short write).
bool WriteAll(int fd, const uint8_t* data, size_t size, off_t offset) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, size, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = ENOSPC;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
    offset += n;
  }
  return true;
}

bool ReadAll(int fd, uint8_t* data, size_t size, off_t offset) {
  while (size > 0) {
    const ssize_t n = ::pread(fd, data, size, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = EIO;  // the file is shorter than the slots written: not ours any more
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
    offset += n;
  }
  return true;
}

}  // namespace

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
    return Status::InvalidArgument("cold store: prefix must be a non-empty file name part, "
                                   "got '" + options.prefix + "'");
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
      record_bytes_(options.record_bytes),
      records_per_segment_(options.records_per_segment),
      store_id_(store_id) {}

ColdStore::~ColdStore() { Clear(); }

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
  return s.fd >= 0 && !(has_current_ && index == current_) &&
         2 * static_cast<uint64_t>(s.stale) > s.used;
}

void ColdStore::DeleteSegment(uint32_t segment) {
  Segment& s = segments_[segment];
  if (s.fd < 0) return;
  if (HalfStale(s, segment)) half_stale_ -= 1;
  ::close(s.fd);
  ::unlink(segment_path(segment).c_str());
  live_ -= s.used - s.stale;
  stale_ -= s.stale;
  segment_count_ -= 1;
  if (has_current_ && segment == current_) has_current_ = false;
  s = Segment();
}

Status ColdStore::NewSegment(uint32_t* index) {
  const uint32_t segment = static_cast<uint32_t>(segments_.size());
  const std::string path = segment_path(segment);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return checkpoint_files::IoError("cold store: cannot create", path);
  Segment s;
  s.fd = fd;
  s.flags.assign(records_per_segment_, 0);
  s.tags.assign(records_per_segment_, 0);
  segments_.push_back(std::move(s));
  segment_count_ += 1;
  *index = segment;
  return Status::Ok();
}

Status ColdStore::EnsureCurrent() {
  if (has_current_ && segments_[current_].used < records_per_segment_) return Status::Ok();
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
  const size_t per_write = std::max<size_t>(1, kWriteBytes / slot_bytes());
  std::vector<uint8_t> buffer(std::min(n, per_write) * slot_bytes());
  size_t done = 0;
  Status status;
  while (done < n) {
    status = EnsureCurrent();
    if (!status.ok()) break;
    Segment& s = segments_[current_];
    const size_t take =
        std::min({n - done, per_write, size_t{records_per_segment_ - s.used}});
    for (size_t j = 0; j < take; ++j) {
      uint8_t* slot = buffer.data() + j * slot_bytes();
      std::memcpy(slot, &keys[done + j], sizeof(uint64_t));
      std::memcpy(slot + sizeof(uint64_t), records[done + j], record_bytes_);
    }
    const off_t offset = static_cast<off_t>(s.used) * static_cast<off_t>(slot_bytes());
    if (!WriteAll(s.fd, buffer.data(), take * slot_bytes(), offset)) {
      status = checkpoint_files::IoError("cold store: cannot write", segment_path(current_));
      break;
    }
    for (size_t j = 0; j < take; ++j) {
      const uint32_t slot = s.used + static_cast<uint32_t>(j);
      s.flags[slot] = kLive;
      s.tags[slot] = tags == nullptr ? 0 : tags[done + j];
      where[done + j] = Location{current_, slot};
    }
    s.used += static_cast<uint32_t>(take);
    live_ += take;
    bytes_written_ += take * slot_bytes();
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
  return where.segment < segments_.size() && segments_[where.segment].fd >= 0 &&
         where.slot < segments_[where.segment].used &&
         (segments_[where.segment].flags[where.slot] & kLive) != 0;
}

Status ColdStore::Read(Location where, void* record, uint64_t* key) const {
  REC_SDK_RETURN_IF_ERROR(CheckLocation(where, "read"));
  uint64_t stored_key = 0;
  struct iovec parts[2] = {{&stored_key, sizeof(uint64_t)}, {record, record_bytes_}};
  const off_t offset = static_cast<off_t>(where.slot) * static_cast<off_t>(slot_bytes());
  ssize_t n;
  do {
    n = ::preadv(segments_[where.segment].fd, parts, 2, offset);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(slot_bytes())) {
    // A short read: the file is shorter than the slots written (not ours any more), or an
    // I/O error.
    if (n >= 0) errno = EIO;
    return checkpoint_files::IoError("cold store: cannot read", segment_path(where.segment));
  }
  if (key != nullptr) *key = stored_key;
  bytes_read_.fetch_add(slot_bytes(), std::memory_order_relaxed);
  return Status::Ok();
}

Status ColdStore::ReadKey(Location where, uint64_t* key) const {
  REC_SDK_RETURN_IF_ERROR(CheckLocation(where, "read"));
  const off_t offset = static_cast<off_t>(where.slot) * static_cast<off_t>(slot_bytes());
  if (!ReadAll(segments_[where.segment].fd, reinterpret_cast<uint8_t*>(key), sizeof(uint64_t),
               offset)) {
    return checkpoint_files::IoError("cold store: cannot read", segment_path(where.segment));
  }
  bytes_read_.fetch_add(sizeof(uint64_t), std::memory_order_relaxed);
  return Status::Ok();
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

void ColdStore::set_mark(Location where, bool on) {
  uint8_t& flags = segments_[where.segment].flags[where.slot];
  flags = on ? (flags | kMarked) : (flags & ~kMarked);
}

void ColdStore::ClearMarks() {
  for (Segment& s : segments_) {
    for (uint32_t slot = 0; slot < s.used; ++slot) s.flags[slot] &= ~kMarked;
  }
}

void ColdStore::ForEachLiveTag(const std::function<void(Location, int64_t)>& fn) const {
  for (uint32_t segment = 0; segment < segments_.size(); ++segment) {
    const Segment& s = segments_[segment];
    if (s.fd < 0) continue;
    for (uint32_t slot = 0; slot < s.used; ++slot) {
      if (s.flags[slot] & kLive) fn(Location{segment, slot}, s.tags[slot]);
    }
  }
}

Status ColdStore::ForEachLive(const RecordFn& fn) const {
  constexpr size_t kReadBytes = size_t{4} << 20;
  const uint32_t per_read =
      static_cast<uint32_t>(std::max<size_t>(1, kReadBytes / slot_bytes()));
  std::vector<uint8_t> buffer;
  for (uint32_t segment = 0; segment < segments_.size(); ++segment) {
    const Segment& s = segments_[segment];
    if (s.fd < 0 || s.stale == s.used) continue;
    for (uint32_t first = 0; first < s.used; first += per_read) {
      const uint32_t last = std::min(s.used, first + per_read);
      uint32_t live_at = first;
      while (live_at < last && !(s.flags[live_at] & kLive)) ++live_at;
      if (live_at == last) continue;
      const size_t bytes = static_cast<size_t>(last - live_at) * slot_bytes();
      buffer.resize(bytes);
      if (!ReadAll(s.fd, buffer.data(), bytes,
                   static_cast<off_t>(live_at) * static_cast<off_t>(slot_bytes()))) {
        return checkpoint_files::IoError("cold store: cannot read", segment_path(segment));
      }
      bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
      for (uint32_t slot = live_at; slot < last; ++slot) {
        if (!(s.flags[slot] & kLive)) continue;
        const uint8_t* at = buffer.data() + static_cast<size_t>(slot - live_at) * slot_bytes();
        uint64_t key;
        std::memcpy(&key, at, sizeof(key));
        REC_SDK_RETURN_IF_ERROR(fn(key, Location{segment, slot}, at + sizeof(uint64_t)));
      }
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
    Status status = [&]() -> Status {
      const Segment& s = segments_[segment];
      std::vector<uint8_t> block(static_cast<size_t>(s.used) * slot_bytes());
      if (!ReadAll(s.fd, block.data(), block.size(), 0)) {
        return checkpoint_files::IoError("cold store: cannot read", segment_path(segment));
      }
      bytes_read_.fetch_add(block.size(), std::memory_order_relaxed);
      for (uint32_t slot = 0; slot < s.used; ++slot) {
        if (!(s.flags[slot] & kLive)) continue;
        const uint8_t* at = block.data() + static_cast<size_t>(slot) * slot_bytes();
        uint64_t key;
        std::memcpy(&key, at, sizeof(key));
        keys.push_back(key);
        records.insert(records.end(), at + sizeof(uint64_t), at + sizeof(uint64_t) + bytes);
        from.push_back(Location{segment, slot});
        tags.push_back(s.tags[slot]);
        marks.push_back(s.flags[slot] & kMarked);
      }
      return Status::Ok();
    }();
    if (!status.ok()) return status;
    std::vector<const void*> pointers(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) pointers[i] = records.data() + i * bytes;
    std::vector<Location> to(keys.size());
    REC_SDK_RETURN_IF_ERROR(
        AppendBatch(keys.size(), keys.data(), pointers.data(), tags.data(), to.data()));
    for (size_t i = 0; i < keys.size(); ++i) {
      if (marks[i]) set_mark(to[i], true);
      moved(keys[i], from[i], to[i]);
    }
    DeleteSegment(segment);
    compactions_ += 1;
  }
  return Status::Ok();
}

}  // namespace rec_sdk
