#include "tf_ops/core/checkpoint_source.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tf_ops/core/checkpoint_files.h"

namespace rec_sdk {
namespace checkpoint_source {

using namespace checkpoint_files;  // NOLINT(build/namespaces): the file layer

namespace {
class BatchQueue {
 public:
  // Rows per batch: up to 32,768, and about 16 MB of row data at most.
  static int64_t RowsFor(int dim, int num_slots, int width, int64_t rows) {
    const int64_t row_bytes = (int64_t{dim} + int64_t{num_slots} * width) * 4 + 20;
    return std::max<int64_t>(
        1, std::min<int64_t>({32768, (int64_t{16} << 20) / row_bytes, std::max<int64_t>(1, rows)}));
  }
  BatchQueue(int dim, int num_slots, int width, int64_t rows)
      : kRows(RowsFor(dim, num_slots, width, rows)) {
    for (Batch& b : batches_) {
      b.keys.resize(kRows);
      b.last_seen.resize(kRows);
      b.counts.resize(kRows);
      b.values.resize(kRows * dim);
      b.slots.assign(num_slots, std::vector<float>(kRows * width));
    }
    for (Batch& b : batches_) free_.push_back(&b);
  }
  // Reader side: a batch to fill (null once the consumer gave up), then Push it.
  Batch* Free() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !free_.empty() || stopped_; });
    if (stopped_) return nullptr;
    Batch* b = free_.front();
    free_.pop_front();
    return b;
  }
  void Push(Batch* b) {
    std::lock_guard<std::mutex> lock(mu_);
    full_.push_back(b);
    cv_.notify_all();
  }
  void Finish() {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
    cv_.notify_all();
  }
  // Consumer side: the next full batch, or null at the end.
  Batch* Next() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !full_.empty() || finished_; });
    if (full_.empty()) return nullptr;
    Batch* b = full_.front();
    full_.pop_front();
    return b;
  }
  void Done(Batch* b, bool stop) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(b);
    if (stop) stopped_ = true;
    cv_.notify_all();
  }
  std::vector<std::array<int64_t, 3>>& pending() { return pending_; }
  const int64_t kRows;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Batch batches_[4];
  std::deque<Batch*> free_, full_;
  bool finished_ = false, stopped_ = false;
  std::vector<std::array<int64_t, 3>> pending_;  // filled by the reader before Finish
};

// Reads a checked source into the queue, then its pending keys, and verifies every file's
// checksum. Always calls queue->Finish().
Status ReadSource(const Source& src, int64_t dim, int num_slots, BatchQueue* queue) {
  struct Finisher {
    BatchQueue* q;
    ~Finisher() { q->Finish(); }
  } finisher{queue};
  std::vector<std::unique_ptr<Reader>> readers;
  for (const auto& f : src.files) {
    readers.emplace_back(new Reader);
    REC_SDK_RETURN_IF_ERROR(readers.back()->Open(Join(src.dir, f.name)));
  }
  for (int64_t done = 0; done < src.info.rows;) {
    Batch* b = queue->Free();
    if (b == nullptr) {
      // The inserter failed (e.g. a key appears twice). If a file is corrupted, that is the
      // real cause: finish checksumming every file so the error can name it.
      for (size_t f = 0; f < readers.size(); ++f) {
        REC_SDK_RETURN_IF_ERROR(readers[f]->Skip(src.files[f].bytes));
        REC_SDK_RETURN_IF_ERROR(CheckCrc(*readers[f], src.files[f]));
      }
      return Status::Ok();
    }
    b->size = std::min(queue->kRows, src.info.rows - done);
    const int64_t n = b->size;
    REC_SDK_RETURN_IF_ERROR(readers[0]->Read(b->keys.data(), n * 8));
    if (src.info.emb_dtype == RowDtype::kFloat32) {
      REC_SDK_RETURN_IF_ERROR(readers[1]->Read(b->values.data(), n * dim * sizeof(float)));
    } else {
      // Half-precision rows, decoded to float32 (the table rounds them to its own dtype).
      b->stored.resize(n * dim * 2);
      REC_SDK_RETURN_IF_ERROR(readers[1]->Read(b->stored.data(), n * dim * 2));
      DecodeRow(src.info.emb_dtype, b->stored.data(), static_cast<int>(n * dim), b->values.data());
    }
    const int64_t width = src.info.slot_width;
    for (int s = 0; s < num_slots; ++s) {
      REC_SDK_RETURN_IF_ERROR(readers[2 + s]->Read(b->slots[s].data(), n * width * sizeof(float)));
    }
    REC_SDK_RETURN_IF_ERROR(readers[2 + num_slots]->Read(b->counts.data(), n * 4));
    REC_SDK_RETURN_IF_ERROR(readers[3 + num_slots]->Read(b->last_seen.data(), n * 8));
    queue->Push(b);
    done += n;
  }
  auto& pending = queue->pending();
  pending.resize(src.info.pending);
  if (src.info.pending > 0) {
    REC_SDK_RETURN_IF_ERROR(readers[4 + num_slots]->Read(pending.data(), src.info.pending * 24));
  }
  for (size_t f = 0; f < readers.size(); ++f) {
    REC_SDK_RETURN_IF_ERROR(CheckCrc(*readers[f], src.files[f]));
  }
  return Status::Ok();
}

}  // namespace

Status OpenSource(const std::string& dir, int dim, Source* src) {
  src->dir = dir;
  REC_SDK_RETURN_IF_ERROR(ReadMeta(dir, &src->meta));
  const Meta& m = src->meta;
  int64_t version, file_dim, rows, pending, num_slots, has_clock, clock, tick;
  REC_SDK_RETURN_IF_ERROR(m.GetInt("format_version", &version));
  if (version != kCheckpointFormatVersion) {
    return Status::InvalidArgument("checkpoint '" + m.path + "' has format version " +
                                   std::to_string(version) + "; this rec_sdk reads version " +
                                   std::to_string(kCheckpointFormatVersion));
  }
  REC_SDK_RETURN_IF_ERROR(m.GetInt("dim", &file_dim));
  if (file_dim != dim) {
    return Status::InvalidArgument("checkpoint '" + m.path + "' holds rows of dim " +
                                   std::to_string(file_dim) + " but the table has dim " +
                                   std::to_string(dim));
  }
  REC_SDK_RETURN_IF_ERROR(m.GetInt("rows", &rows));
  REC_SDK_RETURN_IF_ERROR(m.GetInt("pending", &pending));
  REC_SDK_RETURN_IF_ERROR(m.GetInt("num_slots", &num_slots));
  REC_SDK_RETURN_IF_ERROR(m.GetInt("has_clock", &has_clock));
  REC_SDK_RETURN_IF_ERROR(m.GetInt("newest_clock", &clock));
  REC_SDK_RETURN_IF_ERROR(m.GetInt("tick", &tick));
  if (rows < 0 || pending < 0 || num_slots < 0 || num_slots > EmbeddingTable::kMaxSlots) {
    return Status::DataLoss("checkpoint metadata '" + m.path + "' is inconsistent");
  }
  auto& info = src->info;
  info.rows = rows;
  info.pending = pending;
  info.num_slots = static_cast<int>(num_slots);
  info.has_clock = has_clock != 0;
  info.newest_clock = clock;
  info.tick = tick;
  REC_SDK_RETURN_IF_ERROR(m.GetInt("admitted", &info.admitted));
  REC_SDK_RETURN_IF_ERROR(m.GetInt("rejected", &info.rejected));
  REC_SDK_RETURN_IF_ERROR(m.GetInt("evicted", &info.evicted));
  REC_SDK_RETURN_IF_ERROR(m.GetInt("save_id", &info.save_id));
  REC_SDK_RETURN_IF_ERROR(m.GetInt("parent_id", &info.parent_id));
  std::string optimizer;
  auto it = m.values.find("optimizer");
  info.optimizer = it == m.values.end() ? "" : it->second;
  for (int s = 0; s < info.num_slots; ++s) {
    std::string v;
    REC_SDK_RETURN_IF_ERROR(m.Get("slot_initial." + std::to_string(s), &v));
    info.slot_initial.push_back(std::strtof(v.c_str(), nullptr));
  }
  // Slots of one float per row (row-wise optimizers) say so; older checkpoints have dim.
  int64_t slot_width = dim;
  if (m.values.count("slot_width") > 0) {
    REC_SDK_RETURN_IF_ERROR(m.GetInt("slot_width", &slot_width));
    if (slot_width != dim && slot_width != 1) {
      return Status::DataLoss("checkpoint metadata '" + m.path + "' has slot_width " +
                              std::to_string(slot_width));
    }
  }
  info.slot_width = static_cast<int>(slot_width);
  // The embeddings' element type (float32 when absent); a restore converts to the table's.
  auto dtype = m.values.find("emb_dtype");
  if (dtype != m.values.end()) {
    Status s = RowDtypeFromName(dtype->second, &info.emb_dtype);
    if (!s.ok()) {
      return Status::DataLoss("checkpoint metadata '" + m.path + "' has emb_dtype '" +
                              dtype->second + "'");
    }
  }
  if (m.values.count("update_step") > 0) {
    REC_SDK_RETURN_IF_ERROR(m.GetInt("update_step", &info.update_step));
  }
  const uint64_t n = static_cast<uint64_t>(rows);
  const uint64_t row_floats = static_cast<uint64_t>(dim) * RowDtypeBytes(info.emb_dtype);
  const uint64_t slot_floats = static_cast<uint64_t>(slot_width) * sizeof(float);
  std::vector<std::pair<std::string, uint64_t>> expected = {{"keys.bin", n * 8},
                                                            {"values.bin", n * row_floats}};
  for (int s = 0; s < info.num_slots; ++s) expected.emplace_back(SlotFile(s), n * slot_floats);
  expected.emplace_back("counts.bin", n * 4);
  expected.emplace_back("last_seen.bin", n * 8);
  expected.emplace_back("pending.bin", static_cast<uint64_t>(pending) * 24);
  auto kind = m.values.find("kind");
  src->delta = kind != m.values.end() && kind->second == "delta";
  if (src->delta) {
    int64_t cleared;
    REC_SDK_RETURN_IF_ERROR(m.GetInt("removed", &src->removed));
    REC_SDK_RETURN_IF_ERROR(m.GetInt("cleared", &cleared));
    src->cleared = cleared != 0;
    expected.emplace_back("removed.bin", static_cast<uint64_t>(src->removed) * 8);
  }
  for (const auto& e : expected) {
    FileInfo f;
    REC_SDK_RETURN_IF_ERROR(CheckFile(dir, m, e.first, e.second, &f));
    src->files.push_back(f);
  }
  return Status::Ok();
}

Status CheckCrc(const Reader& r, const FileInfo& f) {
  if (r.crc() != f.crc) {
    return Status::DataLoss("checkpoint file '" + r.path() + "' is corrupted (CRC-32C " +
                            std::to_string(r.crc()) + ", expected " + std::to_string(f.crc) + ")");
  }
  return Status::Ok();
}

// Streams the rows of a checked source: a reader thread fills batches (file reads and
// checksums) while this thread hands the previous batch to insert(). After the rows,
// *pending holds the source's pending keys. A corrupted file is reported in preference to
// the insert error it may have caused.
Status StreamSource(const Source& src, int64_t dim, int num_slots,
                    const std::function<Status(const Batch&)>& insert,
                    std::vector<std::array<int64_t, 3>>* pending) {
  BatchQueue queue(dim, num_slots, src.info.slot_width, src.info.rows);
  Status read_status;
  std::thread reader([&] { read_status = ReadSource(src, dim, num_slots, &queue); });
  Status insert_status;
  for (;;) {
    Batch* batch = queue.Next();
    if (batch == nullptr) break;
    if (insert_status.ok()) insert_status = insert(*batch);
    queue.Done(batch, !insert_status.ok());
  }
  reader.join();
  REC_SDK_RETURN_IF_ERROR(read_status);
  REC_SDK_RETURN_IF_ERROR(insert_status);
  pending->swap(queue.pending());
  return Status::Ok();
}

}  // namespace checkpoint_source
}  // namespace rec_sdk
