// The file I/O under ColdStore (cold_store_io.cc): whole positioned reads and writes, buffers
// aligned for direct I/O, the pool of threads that keeps many reads in flight, and whether a
// process that left segment files behind still runs.
#ifndef REC_SDK_CORE_COLD_STORE_IO_H_
#define REC_SDK_CORE_COLD_STORE_IO_H_

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

namespace rec_sdk {
namespace cold_store_io {

constexpr size_t kBlock = 4096;  // the alignment of direct I/O

// Whether process `pid` runs (it may belong to another user).
bool ProcessAlive(long pid);

// Writes exactly `size` bytes at `offset`; errno is set on failure (ENOSPC for a short write).
bool WriteAll(int fd, const uint8_t* data, size_t size, off_t offset);
// Reads exactly `size` bytes at `offset`; errno is set on failure (EIO past the file's end).
bool ReadAll(int fd, uint8_t* data, size_t size, off_t offset);

// A buffer aligned for direct I/O.
class AlignedBuffer {
 public:
  ~AlignedBuffer() { std::free(data_); }
  uint8_t* Get(size_t bytes) {
    if (bytes > size_) {
      std::free(data_);
      data_ = nullptr;
      size_ = 0;
      void* p = nullptr;
      if (::posix_memalign(&p, kBlock, (bytes + kBlock - 1) / kBlock * kBlock) != 0) {
        return nullptr;
      }
      data_ = static_cast<uint8_t*>(p);
      size_ = bytes;
    }
    return data_;
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Threads that keep many reads in flight (a disk serves random reads in parallel: 16 at
// once go about 20 times as fast as one after the other). One pool per process, started on
// first use; the caller works along.
class IoPool {
 public:
  static IoPool& Get();
  // Calls fn(i) for every i in [0, n), on the pool's threads and the caller's; returns when
  // every call has returned.
  void Run(size_t n, const std::function<void(size_t)>& fn);

 private:
  struct Job {
    size_t n = 0;
    const std::function<void(size_t)>* fn = nullptr;
    std::atomic<size_t> next{0};
    size_t done = 0;  // guarded by mu
    std::mutex mu;
    std::condition_variable cv;
  };
  explicit IoPool(int threads);
  static void Work(Job& job);
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
};

}  // namespace cold_store_io
}  // namespace rec_sdk

#endif  // REC_SDK_CORE_COLD_STORE_IO_H_
