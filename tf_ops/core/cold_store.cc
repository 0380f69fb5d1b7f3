#include "tf_ops/core/cold_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

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
  struct stat info;
  if (::stat(options.directory.c_str(), &info) != 0) {
    return checkpoint_files::IoError("cold store: cannot use directory", options.directory);
  }
  if (!S_ISDIR(info.st_mode)) {
    return Status::InvalidArgument("cold store: '" + options.directory +
                                   "' is not a directory");
  }
  if (::access(options.directory.c_str(), W_OK) != 0) {
    return checkpoint_files::IoError("cold store: cannot write to directory",
                                     options.directory);
  }
  RemoveDeadStoreFiles(options.directory, options.prefix);
  out->reset(new ColdStore(options, next_store_id.fetch_add(1)));
  return Status::Ok();
}

ColdStore::ColdStore(const Options& options, uint64_t store_id)
    : directory_(options.directory),
      prefix_(options.prefix),
      record_bytes_(options.record_bytes),
      records_per_segment_(options.records_per_segment),
      store_id_(store_id),
      buffer_(options.record_bytes + sizeof(uint64_t)) {}

ColdStore::~ColdStore() {
  for (uint32_t i = 0; i < segments_.size(); ++i) DeleteSegment(i);
}

std::string ColdStore::segment_path(uint32_t segment) const {
  return directory_ + "/" + prefix_ + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(store_id_) + "-" + std::to_string(segment) + ".seg";
}

double ColdStore::space_amplification() const {
  if (stats_.live == 0) return 0.0;
  return static_cast<double>(stats_.live + stats_.stale) / static_cast<double>(stats_.live);
}

void ColdStore::DeleteSegment(uint32_t segment) {
  Segment& s = segments_[segment];
  if (s.fd < 0) return;
  ::close(s.fd);
  ::unlink(segment_path(segment).c_str());
  stats_.live -= s.used - s.stale;
  stats_.stale -= s.stale;
  stats_.segments -= 1;
  s = Segment();
}

Status ColdStore::NewSegment(uint32_t* index) {
  const uint32_t segment = static_cast<uint32_t>(segments_.size());
  const std::string path = segment_path(segment);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return checkpoint_files::IoError("cold store: cannot create", path);
  Segment s;
  s.fd = fd;
  s.live.assign(records_per_segment_, 0);
  segments_.push_back(std::move(s));
  stats_.segments += 1;
  *index = segment;
  return Status::Ok();
}

Status ColdStore::AppendTo(uint32_t segment, uint64_t key, const void* record,
                           Location* where) {
  Segment& s = segments_[segment];
  std::memcpy(buffer_.data(), &key, sizeof(key));
  std::memcpy(buffer_.data() + sizeof(key), record, record_bytes_);
  const off_t offset = static_cast<off_t>(s.used) * static_cast<off_t>(slot_bytes());
  if (!WriteAll(s.fd, buffer_.data(), slot_bytes(), offset)) {
    return checkpoint_files::IoError("cold store: cannot write", segment_path(segment));
  }
  where->segment = segment;
  where->slot = s.used;
  s.live[s.used] = 1;
  s.used += 1;
  stats_.live += 1;
  stats_.bytes_written += slot_bytes();
  return Status::Ok();
}

Status ColdStore::Append(uint64_t key, const void* record, Location* where) {
  if (!has_current_ || segments_[current_].used == records_per_segment_) {
    uint32_t segment = 0;
    Status status = NewSegment(&segment);
    if (!status.ok()) return status;
    current_ = segment;
    has_current_ = true;
  }
  return AppendTo(current_, key, record, where);
}

Status ColdStore::CheckLocation(Location where, const char* what) const {
  if (where.segment >= segments_.size() || segments_[where.segment].fd < 0 ||
      where.slot >= segments_[where.segment].used ||
      !segments_[where.segment].live[where.slot]) {
    return Status::InvalidArgument(std::string("cold store: ") + what + " of segment " +
                                   std::to_string(where.segment) + " slot " +
                                   std::to_string(where.slot) + ", which holds no record");
  }
  return Status::Ok();
}

Status ColdStore::Read(Location where, void* record, uint64_t* key) {
  Status status = CheckLocation(where, "read");
  if (!status.ok()) return status;
  const off_t offset = static_cast<off_t>(where.slot) * static_cast<off_t>(slot_bytes());
  if (!ReadAll(segments_[where.segment].fd, buffer_.data(), slot_bytes(), offset)) {
    return checkpoint_files::IoError("cold store: cannot read", segment_path(where.segment));
  }
  if (key != nullptr) std::memcpy(key, buffer_.data(), sizeof(uint64_t));
  std::memcpy(record, buffer_.data() + sizeof(uint64_t), record_bytes_);
  stats_.bytes_read += slot_bytes();
  return Status::Ok();
}

Status ColdStore::Remove(Location where) {
  Status status = CheckLocation(where, "remove");
  if (!status.ok()) return status;
  Segment& s = segments_[where.segment];
  s.live[where.slot] = 0;
  s.stale += 1;
  stats_.live -= 1;
  stats_.stale += 1;
  if (s.stale == s.used && !(has_current_ && where.segment == current_)) {
    DeleteSegment(where.segment);  // nothing left to keep
  }
  return Status::Ok();
}

Status ColdStore::Compact(const MoveFn& moved) {
  std::vector<uint8_t> record(record_bytes_);
  for (uint32_t segment = 0; segment < segments_.size(); ++segment) {
    // No reference into segments_ is held: Append may add a segment (and move the vector).
    if (segments_[segment].fd < 0 || (has_current_ && segment == current_) ||
        2 * static_cast<uint64_t>(segments_[segment].stale) <= segments_[segment].used) {
      continue;
    }
    // Copy every live record first; the old segment goes only once all copies succeeded,
    // so a failed write (a full disk) leaves every record where it was.
    std::vector<std::pair<Location, Location>> moves;
    std::vector<uint64_t> keys;
    const uint32_t used = segments_[segment].used;
    for (uint32_t slot = 0; slot < used; ++slot) {
      if (!segments_[segment].live[slot]) continue;
      uint64_t key = 0;
      const Location from{segment, slot};
      Status status = Read(from, record.data(), &key);
      Location to;
      if (status.ok()) status = Append(key, record.data(), &to);
      if (!status.ok()) {
        for (const auto& move : moves) Remove(move.second);  // undo the copies
        return status;
      }
      moves.emplace_back(from, to);
      keys.push_back(key);
    }
    for (size_t i = 0; i < moves.size(); ++i) moved(keys[i], moves[i].first, moves[i].second);
    DeleteSegment(segment);
    stats_.compactions += 1;
  }
  return Status::Ok();
}

}  // namespace rec_sdk
