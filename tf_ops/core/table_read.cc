// The table's reads by address and the rows of an evaluation lookup (find only): Gather,
// CopyRowsLocked, FindRowsLocked.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <shared_mutex>

#include "tf_ops/core/embedding_table.h"

namespace rec_sdk {

Status EmbeddingTable::FindRowsLocked(const int64_t* keys, int64_t n, int64_t* addresses,
                                      const ParallelRunner& run, float* rows) {
  const int64_t tag_bits = TagBits();
  const int dim = config_.dim;
  std::mutex error_mu;
  Status error;
  // A compact index has just read the row's header to check its key: the row is copied
  // there. With a full index the rows are copied after, in the keys' order: the output is
  // then written in order rather than shard by shard (scattered writes cost more than
  // reading the rows a second time would). A tiered table copies in the probe loop: its cold
  // rows are read from their records there.
  const bool copy_after = rows != nullptr && !config_.compact_index() && !tiered();
  index_.ForEachShard(
      keys, n, rows == nullptr ? 60 : 60 + 2 * dim,
      [&](HashIndex::Shard& shard, const int64_t* positions, int64_t count,
          const uint64_t* hashes) {
        HashIndex::FindInOrder(
            shard, keys, positions, count, hashes, [&](int64_t i, int64_t entry) {
              if (entry < 0) {
                addresses[i] = -1;
              } else {
                addresses[i] = TableTier::IsCold(entry) ? ColdAddress(entry) : (tag_bits | entry);
              }
              if (rows == nullptr || copy_after) return;
              // The row is copied where the key is found (a cold row: read from its record).
              float* dst = rows + i * dim;
              if (entry < 0) {
                std::fill_n(dst, dim, 0.0f);
              } else if (TableTier::IsCold(entry)) {
                Status s = tier_.GatherCold(addresses[i], dst);
                if (!s.ok()) {
                  std::lock_guard<std::mutex> lock(error_mu);
                  if (error.ok()) error = s;
                }
              } else {
                ReadEmbedding(RecordOf(RowOfEntry(entry)), dst);
              }
            });
      },
      run);
  if (copy_after) CopyRowsLocked(addresses, n, rows, run);
  return error;
}

Status EmbeddingTable::Gather(const int64_t* addresses, int64_t n, float* out,
                              const ParallelRunner& run) {
  std::shared_lock<std::shared_mutex> structure(structure_mu_);
  const int dim = config_.dim;
  std::mutex error_mu;
  Status error;
  run(n, 20 + 2 * dim, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      if (i + kPrefetchDistance < last) PrefetchRow(addresses[i + kPrefetchDistance]);
      if (tier_.store != nullptr && IsColdAddress(addresses[i])) {
        // An evaluation lookup's cold row: read from its record, not promoted.
        Status s = tier_.GatherCold(addresses[i], out + i * dim);
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (error.ok()) error = s;
          return;
        }
        continue;
      }
      int64_t row;
      Status s = DecodeAddress(addresses[i], &row);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (error.ok()) error = s;
        return;
      }
      float* dst = out + i * dim;
      if (row < 0) {
        std::fill_n(dst, dim, 0.0f);
      } else {
        ReadEmbedding(RecordOf(row), dst);
      }
    }
  });
  return error;
}

void EmbeddingTable::CopyRowsLocked(const int64_t* addresses, int64_t n, float* out,
                                    const ParallelRunner& run) const {
  const int dim = config_.dim;
  const bool two_lines = sizeof(RowMeta) + emb_bytes_ > 64;
  run(n, 10 + 2 * dim, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      // Every address is one just placed (or -1): its row is allocated, no check needed.
      if (i + kPrefetchDistance < last && addresses[i + kPrefetchDistance] >= 0) {
        const char* record = RecordOf(addresses[i + kPrefetchDistance] & (kMaxRows - 1));
        __builtin_prefetch(record);
        if (two_lines) __builtin_prefetch(record + 64);
      }
      float* dst = out + i * dim;
      if (addresses[i] < 0) {
        std::fill_n(dst, dim, 0.0f);
      } else {
        ReadEmbedding(RecordOf(addresses[i] & (kMaxRows - 1)), dst);
      }
    }
  });
}

}  // namespace rec_sdk
