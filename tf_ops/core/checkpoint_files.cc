#include "tf_ops/core/checkpoint_files.h"

#include <sstream>

#include <sys/stat.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace rec_sdk {
namespace {

// --- CRC-32C -----------------------------------------------------------------------------------

struct Crc32cTable {
  uint32_t t[8][256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};

uint32_t Crc32cSoftware(uint32_t crc, const unsigned char* p, size_t n) {
  static const Crc32cTable table;
  const auto& t = table.t;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= crc;
    crc = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^
          t[4][(v >> 24) & 0xff] ^ t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^
          t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(uint32_t crc, const unsigned char* p,
                                                          size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
#endif


}  // namespace

uint32_t Crc32c(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  crc = hardware ? Crc32cHardware(crc, p, n) : Crc32cSoftware(crc, p, n);
#else
  crc = Crc32cSoftware(crc, p, n);
#endif
  return ~crc;
}

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

Status ReadMeta(const std::string& dir, Meta* meta) {
  meta->path = Join(dir, "meta.txt");
  const int fd = ::open(meta->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::NotFound(Errno("cannot open checkpoint metadata (an incomplete or missing "
                                  "save?)", meta->path));
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
  if (::stat(path.c_str(), &st) != 0) return Status::NotFound(Errno("missing checkpoint file", path));
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
}  // namespace rec_sdk
