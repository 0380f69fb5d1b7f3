// The file layer of table checkpoints (see checkpoint_format.h for the format): buffered,
// checksummed sequential writers and readers, the metadata file, and the checks of a file against
// it. Internal to the core: checkpoint.cc streams tables through it.
#ifndef REC_SDK_CORE_CHECKPOINT_FILES_H_
#define REC_SDK_CORE_CHECKPOINT_FILES_H_

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include <fcntl.h>
#include <unistd.h>

#include "tf_ops/core/checkpoint_format.h"
#include "tf_ops/core/status.h"

namespace rec_sdk {
namespace checkpoint_files {

// "<what> '<path>': <strerror(errno)>".
std::string Errno(const std::string& what, const std::string& path);
// The Status of a failed I/O call (errno set), as TensorFlow reports file errors:
// ResourceExhausted when the disk or the file size limit is full (ENOSPC, EDQUOT, EFBIG),
// InvalidArgument for a path that cannot name a checkpoint file (a file where a directory
// must be, a directory where a file must be, too long, a symlink loop), PermissionDenied
// when access is refused, NotFound when it is missing, Internal otherwise.
Status IoError(const std::string& what, const std::string& path);
// fsyncs a directory (so that the entries created in it are durable).
Status FsyncDir(const std::string& dir);
// Writes `n` bytes to `path` (created or truncated), fsyncs the file and its directory: when
// it returns Ok, the file and its entry are durable.
Status WriteFileDurably(const std::string& path, const void* data, size_t n);
inline std::string Join(const std::string& dir, const std::string& name) {
  return dir + "/" + name;
}
inline std::string SlotFile(int s) { return "slot" + std::to_string(s) + ".bin"; }

// Buffered sequential writer that checksums what it writes and fsyncs on Close.
class Writer {
 public:
  static constexpr size_t kBuffer = size_t{1} << 20;
  Status Open(const std::string& path) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) return IoError("cannot create", path);
    buffer_.reset(new char[kBuffer]);
    return Status::Ok();
  }
  Status Write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const size_t take = std::min(n, kBuffer - used_);
      std::memcpy(buffer_.get() + used_, p, take);
      used_ += take;
      p += take;
      n -= take;
      if (used_ == kBuffer) REC_SDK_RETURN_IF_ERROR(Flush());
    }
    return Status::Ok();
  }
  Status Close() {
    REC_SDK_RETURN_IF_ERROR(Flush());
    if (::fsync(fd_) != 0) return IoError("cannot fsync", path_);
    if (::close(fd_) != 0) return IoError("cannot close", path_);
    fd_ = -1;
    return Status::Ok();
  }
  ~Writer() {
    if (fd_ >= 0) ::close(fd_);
  }
  uint64_t bytes() const { return bytes_; }
  uint32_t crc() const { return crc_; }
  const std::string& path() const { return path_; }

 private:
  Status Flush() {
    crc_ = Crc32c(crc_, buffer_.get(), used_);
    size_t done = 0;
    while (done < used_) {
      const ssize_t w = ::write(fd_, buffer_.get() + done, used_ - done);
      if (w < 0) {
        if (errno == EINTR) continue;
        return IoError("cannot write", path_);
      }
      done += static_cast<size_t>(w);
    }
    bytes_ += used_;
    used_ = 0;
    // Start writing back what is written so far (without waiting), so that the disk works
    // while the table is still being scanned and the final fsync has little left to do.
    if (bytes_ - synced_ >= kWriteback) {
      ::sync_file_range(fd_, static_cast<off_t>(synced_), static_cast<off_t>(bytes_ - synced_),
                        SYNC_FILE_RANGE_WRITE);
      synced_ = bytes_;
    }
    return Status::Ok();
  }
  static constexpr uint64_t kWriteback = uint64_t{8} << 20;
  std::string path_;
  int fd_ = -1;
  std::unique_ptr<char[]> buffer_;
  size_t used_ = 0;
  uint64_t bytes_ = 0;
  uint64_t synced_ = 0;
  uint32_t crc_ = 0;
};

// Buffered sequential reader that checksums what it reads.
class Reader {
 public:
  static constexpr size_t kBuffer = size_t{1} << 20;
  Status Open(const std::string& path) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return Status::NotFound(Errno("cannot open checkpoint file", path));
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);  // larger readahead
    buffer_.reset(new char[kBuffer]);
    return Status::Ok();
  }
  Status Read(void* data, size_t n) {
    char* p = static_cast<char*>(data);
    while (n > 0) {
      if (pos_ == filled_) REC_SDK_RETURN_IF_ERROR(Fill());
      const size_t take = std::min(n, filled_ - pos_);
      std::memcpy(p, buffer_.get() + pos_, take);
      pos_ += take;
      consumed_ += take;
      p += take;
      n -= take;
    }
    return Status::Ok();
  }
  // Reads (and checksums) the rest of the file up to `total` bytes from its start.
  Status Skip(uint64_t total) {
    while (consumed_ < total) {
      if (pos_ == filled_) REC_SDK_RETURN_IF_ERROR(Fill());
      const size_t take =
          static_cast<size_t>(std::min<uint64_t>(filled_ - pos_, total - consumed_));
      pos_ += take;
      consumed_ += take;
    }
    return Status::Ok();
  }
  uint32_t crc() const { return crc_; }
  const std::string& path() const { return path_; }
  ~Reader() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  Status Fill() {
    ssize_t r;
    do {
      r = ::read(fd_, buffer_.get(), kBuffer);
    } while (r < 0 && errno == EINTR);
    if (r < 0) return IoError("cannot read", path_);
    if (r == 0) return Status::DataLoss("checkpoint file '" + path_ + "' is truncated");
    crc_ = Crc32c(crc_, buffer_.get(), static_cast<size_t>(r));
    filled_ = static_cast<size_t>(r);
    pos_ = 0;
    return Status::Ok();
  }
  std::string path_;
  int fd_ = -1;
  std::unique_ptr<char[]> buffer_;
  size_t filled_ = 0, pos_ = 0;
  uint64_t consumed_ = 0;
  uint32_t crc_ = 0;
};

// --- meta.txt ----------------------------------------------------------------------------------

struct Meta {
  std::map<std::string, std::string> values;
  std::string path;

  Status Get(const std::string& name, std::string* out) const {
    auto it = values.find(name);
    if (it == values.end()) {
      return Status::DataLoss("checkpoint metadata '" + path + "' has no '" + name + "'");
    }
    *out = it->second;
    return Status::Ok();
  }
  Status GetInt(const std::string& name, int64_t* out) const {
    std::string v;
    REC_SDK_RETURN_IF_ERROR(Get(name, &v));
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (errno != 0 || end == v.c_str() || *end != '\0') {
      return Status::DataLoss("checkpoint metadata '" + path + "': '" + name +
                              "' is not an integer: '" + v + "'");
    }
    *out = x;
    return Status::Ok();
  }
};

// A file of a table directory, as the metadata describes it.
struct FileInfo {
  std::string name;
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// Reads and verifies (its last line is the CRC-32C of the others) a directory's meta.txt.
Status ReadMeta(const std::string& dir, Meta* meta);
// Checks that file `name` of `dir` has the size the metadata gives, which must be
// expected_bytes; *info receives its size and checksum.
Status CheckFile(const std::string& dir, const Meta& meta, const std::string& name,
                 uint64_t expected_bytes, FileInfo* info);

}  // namespace checkpoint_files
}  // namespace rec_sdk

#endif  // REC_SDK_CORE_CHECKPOINT_FILES_H_
