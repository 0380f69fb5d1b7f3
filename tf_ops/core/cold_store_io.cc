#include "tf_ops/core/cold_store_io.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

namespace rec_sdk {
namespace cold_store_io {

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

IoPool& IoPool::Get() {
  static IoPool* pool = new IoPool(64);  // never destroyed: its threads outlive main
  return *pool;
}

void IoPool::Run(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (n == 1) {
    fn(0);
    return;
  }
  auto job = std::make_shared<Job>();
  job->n = n;
  job->fn = &fn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(job);
  }
  cv_.notify_all();
  Work(*job);
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait(lock, [&] { return job->done == job->n; });
}

IoPool::IoPool(int threads) {
  for (int t = 0; t < threads; ++t) std::thread([this] { Loop(); }).detach();
}

void IoPool::Work(Job& job) {
  size_t finished = 0;
  for (size_t i = job.next.fetch_add(1); i < job.n; i = job.next.fetch_add(1)) {
    (*job.fn)(i);
    ++finished;
  }
  if (finished == 0) return;
  std::lock_guard<std::mutex> lock(job.mu);
  job.done += finished;
  if (job.done == job.n) job.cv.notify_all();
}

void IoPool::Loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !jobs_.empty(); });
      job = jobs_.front();
      if (job->next.load() >= job->n) {  // every index taken: the job leaves the queue
        jobs_.pop_front();
        continue;
      }
    }
    Work(*job);
  }
}

}  // namespace cold_store_io
}  // namespace rec_sdk
