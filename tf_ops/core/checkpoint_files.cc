#include "tf_ops/core/checkpoint_files.h"

#include "tf_ops/core/checkpoint.h"

#include <sstream>

#include <sys/stat.h>

namespace rec_sdk {
namespace checkpoint_files {

std::string Errno(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

Status IoError(const std::string& what, const std::string& path) {
  const int error = errno;
  std::string message = Errno(what, path);
  switch (error) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return Status::ResourceExhausted(message);
    case ENOTDIR:
    case EISDIR:
    case ENAMETOOLONG:
    case ELOOP:
      return Status::InvalidArgument(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return Status::PermissionDenied(message);
    case ENOENT:
      return Status::NotFound(message);
    default:
      return Status::Internal(message);
  }
}

Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return IoError("cannot fsync directory", dir);
  return Status::Ok();
}

Status WriteFileDurably(const std::string& path, const void* data, size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("cannot create", path);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      Status error = IoError("cannot write", path);
      ::close(fd);
      return error;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    Status error = IoError("cannot fsync", path);
    ::close(fd);
    return error;
  }
  if (::close(fd) != 0) return IoError("cannot close", path);
  const size_t slash = path.rfind('/');
  return FsyncDir(slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash));
}

Status ReadMeta(const std::string& dir, Meta* meta) {
  meta->path = Join(dir, "meta.txt");
  const int fd = ::open(meta->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::NotFound(
        Errno("cannot open checkpoint metadata (an incomplete or missing "
              "save?)",
              meta->path));
  }
  std::string text;
  char buf[4096];
  ssize_t r;
  while ((r = ::read(fd, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(r));
  ::close(fd);
  if (r < 0) return IoError("cannot read", meta->path);
  const size_t crc_at = text.rfind("meta_crc32c ");
  if (crc_at == std::string::npos ||
      std::to_string(Crc32c(0, text.data(), crc_at)) + "\n" != text.substr(crc_at + 12)) {
    return Status::DataLoss("checkpoint metadata '" + meta->path +
                            "' is corrupted or truncated (its checksum does not match)");
  }
  text.resize(crc_at);
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t space = line.find(' ');
    if (line.empty() || space == std::string::npos) continue;
    meta->values[line.substr(0, space)] = line.substr(space + 1);
  }
  return Status::Ok();
}

Status CheckFile(const std::string& dir, const Meta& meta, const std::string& name,
                 uint64_t expected_bytes, FileInfo* info) {
  info->name = name;
  int64_t bytes, crc;
  REC_SDK_RETURN_IF_ERROR(meta.GetInt("bytes." + name, &bytes));
  REC_SDK_RETURN_IF_ERROR(meta.GetInt("crc32c." + name, &crc));
  const std::string path = Join(dir, name);
  if (static_cast<uint64_t>(bytes) != expected_bytes) {
    return Status::DataLoss("checkpoint metadata '" + meta.path + "' gives " +
                            std::to_string(bytes) + " bytes for '" + name + "', expected " +
                            std::to_string(expected_bytes));
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return Status::NotFound(Errno("missing checkpoint file", path));
  if (static_cast<uint64_t>(st.st_size) != expected_bytes) {
    return Status::DataLoss("checkpoint file '" + path + "' has " + std::to_string(st.st_size) +
                            " bytes, expected " + std::to_string(expected_bytes) +
                            " (truncated or corrupted)");
  }
  info->bytes = expected_bytes;
  info->crc = static_cast<uint32_t>(crc);
  return Status::Ok();
}

}  // namespace checkpoint_files

// checkpoint.h's file-level helpers.
Status ReadCheckpointId(const std::string& dir, int64_t* save_id, bool* delta) {
  checkpoint_files::Meta meta;
  REC_SDK_RETURN_IF_ERROR(checkpoint_files::ReadMeta(dir, &meta));
  REC_SDK_RETURN_IF_ERROR(meta.GetInt("save_id", save_id));
  auto kind = meta.values.find("kind");
  *delta = kind != meta.values.end() && kind->second == "delta";
  return Status::Ok();
}

Status WriteUpdateFile(const std::string& path, const void* data, size_t n) {
  return checkpoint_files::WriteFileDurably(path, data, n);
}

}  // namespace rec_sdk
