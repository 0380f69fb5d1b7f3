#include "tf_ops/core/checkpoint.h"

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
#include "tf_ops/core/checkpoint_source.h"
#include "tf_ops/core/rank_parts.h"

namespace rec_sdk {
namespace {

using namespace checkpoint_files;  // NOLINT(build/namespaces): the file layer
using checkpoint_source::Batch;
using checkpoint_source::CheckCrc;
using checkpoint_source::OpenSource;
using checkpoint_source::Source;
using checkpoint_source::StreamSource;

}  // namespace

Status SaveTableFiles(EmbeddingTable* table, const std::string& dir, int64_t* rows_out, bool delta,
                      int64_t* save_id) {
  if (delta && !table->tracks_changes()) {
    return Status::FailedPrecondition("table '" + table->name() +
                                      "' does not track changes: "
                                      "create it with incremental checkpoints enabled "
                                      "(init(enable_incremental_checkpoint=True))");
  }
  if (::mkdir(dir.c_str(), 0755) != 0) {
    const char* what = "cannot create checkpoint directory";
    if (errno == EEXIST) {
      return Status::InvalidArgument(Errno(what, dir) +
                                     " (the directory a save writes must not exist)");
    }
    return IoError(what, dir);
  }
  const int dim = table->dim();
  EmbeddingTable::CheckpointInfo info;
  std::vector<std::unique_ptr<Writer>> writers;
  uint64_t removed_bytes = 0;
  uint32_t removed_crc = 0;
  int64_t rows = 0, pending = 0, removed = 0;
  bool cleared = false;
  REC_SDK_RETURN_IF_ERROR(table->Snapshot([&](const EmbeddingTable::SnapshotView& view) {
    info = view.info();
    const int num_slots = info.num_slots;
    std::vector<std::string> names = {"keys.bin", "values.bin"};
    for (int s = 0; s < num_slots; ++s) names.push_back(SlotFile(s));
    names.insert(names.end(), {"counts.bin", "last_seen.bin", "pending.bin"});
    if (delta) {
      // Removed keys are written first, by this thread, before the row scans start.
      cleared = view.cleared();
      Writer removed_writer;
      REC_SDK_RETURN_IF_ERROR(removed_writer.Open(Join(dir, "removed.bin")));
      const auto& keys = view.removed_keys();
      REC_SDK_RETURN_IF_ERROR(removed_writer.Write(keys.data(), keys.size() * 8));
      REC_SDK_RETURN_IF_ERROR(removed_writer.Close());
      removed = static_cast<int64_t>(keys.size());
      removed_bytes = removed_writer.bytes();
      removed_crc = removed_writer.crc();
    }
    for (const auto& name : names) {
      writers.emplace_back(new Writer);
      REC_SDK_RETURN_IF_ERROR(writers.back()->Open(Join(dir, name)));
    }
    // Two scans of the rows run in parallel, each writing its own files (and fsync'ing
    // them): the slots in one, everything else in the other.
    auto scan_main = [&]() -> Status {
      REC_SDK_RETURN_IF_ERROR(view.ForEachRow(
          [&](int64_t key, const char* record, uint32_t count, int64_t last_seen) -> Status {
            ++rows;
            REC_SDK_RETURN_IF_ERROR(writers[0]->Write(&key, 8));
            REC_SDK_RETURN_IF_ERROR(
                writers[1]->Write(view.Embedding(record), view.embedding_bytes()));
            REC_SDK_RETURN_IF_ERROR(writers[2 + num_slots]->Write(&count, 4));
            return writers[3 + num_slots]->Write(&last_seen, 8);
          },
          delta));
      REC_SDK_RETURN_IF_ERROR(
          view.ForEachPending([&](int64_t key, int64_t count, int64_t last_seen) -> Status {
            const int64_t record[3] = {key, count, last_seen};
            ++pending;
            return writers.back()->Write(record, sizeof(record));
          }));
      for (size_t w = 0; w < writers.size(); ++w) {
        if (w < 2 || w >= 2 + static_cast<size_t>(num_slots)) {
          REC_SDK_RETURN_IF_ERROR(writers[w]->Close());
        }
      }
      return Status::Ok();
    };
    auto scan_slots = [&]() -> Status {
      if (num_slots == 0) return Status::Ok();
      REC_SDK_RETURN_IF_ERROR(view.ForEachRow(
          [&](int64_t, const char* record, uint32_t, int64_t) -> Status {
            float slot[EmbeddingTable::kMaxDim];
            for (int s = 0; s < num_slots; ++s) {
              view.ReadSlot(record, s, slot);
              REC_SDK_RETURN_IF_ERROR(writers[2 + s]->Write(slot, info.slot_width * sizeof(float)));
            }
            return Status::Ok();
          },
          delta));
      for (int s = 0; s < num_slots; ++s) REC_SDK_RETURN_IF_ERROR(writers[2 + s]->Close());
      return Status::Ok();
    };
    Status slot_status;
    std::thread slot_thread([&] { slot_status = scan_slots(); });
    Status main_status = scan_main();
    slot_thread.join();
    REC_SDK_RETURN_IF_ERROR(main_status);
    return slot_status;
  }));

  const int num_slots = info.num_slots;
  std::ostringstream meta;
  meta.precision(9);
  meta << "format_version " << kCheckpointFormatVersion << "\n"
       << "kind " << (delta ? "delta" : "full") << "\n"
       << "table " << table->name() << "\n"
       << "dim " << dim << "\n"
       << "emb_dtype " << RowDtypeName(info.emb_dtype) << "\n"
       << "update_step " << info.update_step << "\n"
       << "rows " << rows << "\n"
       << "pending " << pending << "\n"
       << "num_slots " << num_slots << "\n";
  if (num_slots > 0 && info.slot_width != dim) meta << "slot_width " << info.slot_width << "\n";
  if (!info.optimizer.empty()) meta << "optimizer " << info.optimizer << "\n";
  for (int s = 0; s < num_slots; ++s) {
    meta << "slot_initial." << s << " " << info.slot_initial[s] << "\n";
  }
  meta << "has_clock " << (info.has_clock ? 1 : 0) << "\n"
       << "newest_clock " << info.newest_clock << "\n"
       << "tick " << info.tick << "\n"
       << "admitted " << info.admitted << "\n"
       << "rejected " << info.rejected << "\n"
       << "evicted " << info.evicted << "\n"
       << "save_id " << info.save_id << "\n"
       << "parent_id " << info.parent_id << "\n";
  for (const auto& w : writers) {
    const std::string name = w->path().substr(dir.size() + 1);
    meta << "bytes." << name << " " << w->bytes() << "\n"
         << "crc32c." << name << " " << w->crc() << "\n";
  }
  if (delta) {
    meta << "removed " << removed << "\n"
         << "cleared " << (cleared ? 1 : 0) << "\n"
         << "bytes.removed.bin " << removed_bytes << "\n"
         << "crc32c.removed.bin " << removed_crc << "\n";
  }
  std::string text = meta.str();
  // The metadata checks itself too.
  text += "meta_crc32c " + std::to_string(Crc32c(0, text.data(), text.size())) + "\n";
  Writer meta_writer;
  REC_SDK_RETURN_IF_ERROR(meta_writer.Open(Join(dir, "meta.txt")));
  REC_SDK_RETURN_IF_ERROR(meta_writer.Write(text.data(), text.size()));
  REC_SDK_RETURN_IF_ERROR(meta_writer.Close());
  REC_SDK_RETURN_IF_ERROR(FsyncDir(dir));
  if (rows_out != nullptr) *rows_out = rows;
  if (save_id != nullptr) *save_id = info.save_id;
  return Status::Ok();
}

Status RestoreTableFiles(EmbeddingTable* table, const std::vector<std::string>& dirs,
                         const RestoreOptions& options, int64_t* rows_out, std::string* note) {
  if (dirs.empty()) return Status::InvalidArgument("restore needs at least one table directory");
  if (options.rank_size < 1 || options.rank_id < 0 || options.rank_id >= options.rank_size) {
    return Status::InvalidArgument("rank_id must be in [0, rank_size), got rank_id " +
                                   std::to_string(options.rank_id) + " and rank_size " +
                                   std::to_string(options.rank_size));
  }
  const int dim = table->dim();
  std::vector<Source> sources(dirs.size());
  for (size_t d = 0; d < dirs.size(); ++d) {
    REC_SDK_RETURN_IF_ERROR(OpenSource(dirs[d], dim, &sources[d]));
    if (sources[d].delta) {
      return Status::InvalidArgument("'" + dirs[d] +
                                     "' is a delta checkpoint: restore the full "
                                     "checkpoint it follows, then apply the deltas in order");
    }
  }
  // The merged description: slots from the first directory (all must agree).
  EmbeddingTable::CheckpointInfo info = sources[0].info;
  // A merge of several directories or a rank's slice is no checkpoint the table then equals.
  if (dirs.size() > 1 || options.rank_size > 1) info.save_id = 0;
  for (size_t d = 1; d < sources.size(); ++d) {
    const auto& other = sources[d].info;
    if (other.num_slots != info.num_slots || other.optimizer != info.optimizer) {
      return Status::InvalidArgument("checkpoint directories '" + dirs[0] + "' and '" + dirs[d] +
                                     "' were saved with different optimizers");
    }
    info.rows += other.rows;
    info.pending += other.pending;
    info.has_clock = info.has_clock || other.has_clock;
    info.newest_clock = std::max(info.newest_clock, other.newest_clock);
    info.tick = std::max(info.tick, other.tick);
    info.admitted += other.admitted;
    info.rejected += other.rejected;
    info.evicted += other.evicted;
  }
  const bool everything = options.rank_size == 1;
  // Rows expected in this rank (sizes the index up front).
  info.rows /= options.rank_size;
  if (everything && !table->dynamic_expansion()) {
    int64_t total = 0;
    for (const auto& src : sources) total += src.info.rows;
    if (total > table->Capacity()) {
      return Status::ResourceExhausted("restore into table '" + table->name() +
                                       "': the checkpoint has " + std::to_string(total) +
                                       " rows but the table's capacity is " +
                                       std::to_string(table->Capacity()) + " rows");
    }
  }
  auto mine = [&](int64_t key) {
    return everything || OwnerOf(key, options.rank_size) == options.rank_id;
  };
  int64_t restored = 0;
  const int num_slots = info.num_slots;
  auto feed = [&](EmbeddingTable::RestoreSink* sink) -> Status {
    // Each batch is inserted by two lanes in parallel (disjoint index shards).
    static_assert(EmbeddingTable::kRestoreLanes == 2, "two lanes: this thread and one more");
    Status lane_status[EmbeddingTable::kRestoreLanes];
    int64_t lane_rows[EmbeddingTable::kRestoreLanes] = {};
    auto insert = [&](const Batch* batch, int lane) {
      const float* slot_ptrs[EmbeddingTable::kMaxSlots];
      // This lane's rows, then their index slots prefetched a little ahead of the inserts
      // (the index is much larger than the caches: each insert is a cache miss).
      std::vector<int32_t> mine_rows;
      mine_rows.reserve(batch->size / EmbeddingTable::kRestoreLanes + 64);
      for (int64_t i = 0; i < batch->size; ++i) {
        const int64_t key = batch->keys[i];
        if (sink->LaneOf(key) == lane && mine(key)) {
          mine_rows.push_back(static_cast<int32_t>(i));
        }
      }
      sink->ExpectRows(lane, static_cast<int64_t>(mine_rows.size()));
      constexpr size_t kAhead = 16;
      for (size_t j = 0; j < mine_rows.size() && lane_status[lane].ok(); ++j) {
        if (j + kAhead < mine_rows.size()) sink->Prefetch(batch->keys[mine_rows[j + kAhead]]);
        const int64_t i = mine_rows[j];
        const int64_t key = batch->keys[i];
        if (options.int32_keys && (key < INT32_MIN || key > INT32_MAX)) {
          lane_status[lane] = Status::InvalidArgument("checkpoint key " + std::to_string(key) +
                                                      " does not fit the int32 keys of "
                                                      "table '" +
                                                      table->name() + "'");
          break;
        }
        for (int s = 0; s < num_slots; ++s) {
          slot_ptrs[s] = batch->slots[s].data() + i * info.slot_width;
        }
        lane_status[lane] = sink->AddRow(lane, key, batch->values.data() + i * dim, slot_ptrs,
                                         batch->counts[i], batch->last_seen[i]);
        if (lane_status[lane].ok()) ++lane_rows[lane];
      }
    };
    for (const auto& src : sources) {
      std::vector<std::array<int64_t, 3>> pending;
      REC_SDK_RETURN_IF_ERROR(StreamSource(
          src, dim, num_slots,
          [&](const Batch& batch) {
            std::thread other([&] { insert(&batch, 1); });
            insert(&batch, 0);
            other.join();
            for (const Status& st : lane_status) REC_SDK_RETURN_IF_ERROR(st);
            return Status::Ok();
          },
          &pending));
      for (const auto& p : pending) {
        if (mine(p[0])) REC_SDK_RETURN_IF_ERROR(sink->AddPending(p[0], p[1], p[2]));
      }
    }
    restored = lane_rows[0] + lane_rows[1];
    return Status::Ok();
  };
  REC_SDK_RETURN_IF_ERROR(table->Restore(info, feed, note));
  if (rows_out != nullptr) *rows_out = restored;
  return Status::Ok();
}

Status ApplyDeltaFiles(EmbeddingTable* table, const std::string& dir, int64_t* rows_out) {
  Source src;
  REC_SDK_RETURN_IF_ERROR(OpenSource(dir, table->dim(), &src));
  if (!src.delta) {
    return Status::InvalidArgument("'" + dir + "' is a full checkpoint, not a delta");
  }
  // The removed keys are small: read and check them first.
  std::vector<int64_t> removed(src.removed);
  {
    Reader r;
    REC_SDK_RETURN_IF_ERROR(r.Open(Join(dir, "removed.bin")));
    if (src.removed > 0) REC_SDK_RETURN_IF_ERROR(r.Read(removed.data(), src.removed * 8));
    REC_SDK_RETURN_IF_ERROR(CheckCrc(r, src.files.back()));
  }
  src.files.pop_back();  // removed.bin is not streamed with the rows
  const int dim = table->dim();
  const int num_slots = src.info.num_slots;
  int64_t restored = 0;
  auto feed = [&](EmbeddingTable::RestoreSink* sink) -> Status {
    std::vector<std::array<int64_t, 3>> pending;
    REC_SDK_RETURN_IF_ERROR(StreamSource(
        src, dim, num_slots,
        [&](const Batch& batch) {
          const float* slot_ptrs[EmbeddingTable::kMaxSlots];
          for (int64_t i = 0; i < batch.size; ++i) {
            const int64_t key = batch.keys[i];
            for (int s = 0; s < num_slots; ++s) {
              slot_ptrs[s] = batch.slots[s].data() + i * src.info.slot_width;
            }
            REC_SDK_RETURN_IF_ERROR(sink->AddRow(sink->LaneOf(key), key,
                                                 batch.values.data() + i * dim, slot_ptrs,
                                                 batch.counts[i], batch.last_seen[i]));
            ++restored;
          }
          return Status::Ok();
        },
        &pending));
    for (const auto& p : pending) REC_SDK_RETURN_IF_ERROR(sink->AddPending(p[0], p[1], p[2]));
    return Status::Ok();
  };
  REC_SDK_RETURN_IF_ERROR(table->ApplyDelta(src.info, src.cleared, removed, feed));
  if (rows_out != nullptr) *rows_out = restored;
  return Status::Ok();
}

}  // namespace rec_sdk
