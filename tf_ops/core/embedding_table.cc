#include "tf_ops/core/embedding_table.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <sys/mman.h>

#include <chrono>
#include <random>

namespace rec_sdk {
namespace {

// Chunks of about 2 MiB of embeddings (one huge page): big enough that growth is rare and
// cheap; memory is committed only as rows are written.
constexpr int64_t kChunkTargetBytes = int64_t{2} << 20;
constexpr int kMinChunkShift = 4;   // 16 rows
constexpr int kMaxChunkShift = 19;  // 524,288 rows

int ChunkShiftFor(int dim) {
  int shift = kMinChunkShift;
  while (shift < kMaxChunkShift &&
         (int64_t{1} << (shift + 1)) * dim * static_cast<int64_t>(sizeof(float)) <=
             kChunkTargetBytes) {
    ++shift;
  }
  return shift;
}

// Tags tell tables apart in addresses; 0 is never used so that small integers are never valid.
uint32_t NextTableTag() {
  static std::atomic<uint32_t> counter{0};
  const uint32_t max_tag = (1u << EmbeddingTable::kTagBits) - 1;
  return counter.fetch_add(1, std::memory_order_relaxed) % max_tag + 1;
}

constexpr size_t kHugePage = size_t{2} << 20;

// Row memory comes straight from mmap: zero-filled and committed only when first written (so
// reserving a fixed-capacity table costs address space, not memory), aligned to 2 MiB and
// marked for transparent huge pages, so random row access rarely misses the TLB. The mapping
// ends with the block (rounded to 4 KiB pages): a block's last, partial huge page stays in
// small pages, since a huge page there would commit memory no row uses (up to 2 MiB a chunk).
constexpr size_t kSmallPage = size_t{4} << 10;
size_t BlockBytes(size_t bytes) { return (bytes + kSmallPage - 1) / kSmallPage * kSmallPage; }

void* AllocateBlock(size_t bytes) {
  const size_t size = BlockBytes(bytes);
  // Over-map by one huge page, then trim both ends to a 2 MiB-aligned block.
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t tail = start + size + kHugePage - (aligned + size);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + size), tail);
  const size_t huge = size / kHugePage * kHugePage;
  if (huge > 0) madvise(reinterpret_cast<void*>(aligned), huge, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

void FreeBlock(void* p, size_t bytes) {
  if (p != nullptr) munmap(p, BlockBytes(bytes));
}


}  // namespace

EmbeddingTable::EmbeddingTable(const TableConfig& config)
    : config_(config),
      chunk_shift_(ChunkShiftFor(config.dim)),
      tag_(NextTableTag()),
      max_rows_(config.dynamic_expansion ? kMaxRows : config.capacity),
      pages_(new std::atomic<DirectoryPage*>[kMaxPages]),
      access_threshold_(config.access_threshold),
      pending_(new PendingShard[HashIndex::kNumShards]),
      newest_clock_(kNoClock),
      row_bytes_(RowBytesFor(0)) {
  for (int64_t i = 0; i < kMaxPages; ++i) pages_[i].store(nullptr, std::memory_order_relaxed);
}

EmbeddingTable::~EmbeddingTable() {
  for (int64_t p = 0; p < kMaxPages; ++p) {
    DirectoryPage* page = pages_[p].load();
    if (page == nullptr) continue;
    for (int64_t c = 0; c < kPageSize; ++c) {
      Chunk* chunk = page->chunks[c].load();
      if (chunk == nullptr) continue;
      FreeBlock(chunk->rows, ChunkBytes());
      delete chunk;
    }
    delete page;
  }
}

Status EmbeddingTable::Create(const TableConfig& config, std::unique_ptr<EmbeddingTable>* table) {
  if (config.name.empty()) return Status::InvalidArgument("table name must not be empty");
  if (config.dim < 1 || config.dim > kMaxDim) {
    return Status::InvalidArgument("table '" + config.name + "': dim must be in [1, " +
                                   std::to_string(kMaxDim) + "], got " +
                                   std::to_string(config.dim));
  }
  if (!config.dynamic_expansion && (config.capacity < 1 || config.capacity > kMaxRows)) {
    return Status::InvalidArgument("table '" + config.name + "': capacity must be in [1, " +
                                   std::to_string(kMaxRows) + "], got " +
                                   std::to_string(config.capacity));
  }
  if (config.initial_capacity < 0 || config.initial_capacity > kMaxRows) {
    return Status::InvalidArgument("table '" + config.name +
                                   "': initial_capacity must be in [0, " +
                                   std::to_string(kMaxRows) + "], got " +
                                   std::to_string(config.initial_capacity));
  }
  REC_SDK_RETURN_IF_ERROR(config.initializer.Validate());
  if (!config.initializer.values.empty() &&
      config.initializer.values.size() != static_cast<size_t>(config.dim)) {
    return Status::InvalidArgument("table '" + config.name + "': the constant initializer has " +
                                   std::to_string(config.initializer.values.size()) +
                                   " values, the table's dim is " + std::to_string(config.dim));
  }
  if (config.access_threshold < -1) {
    return Status::InvalidArgument("table '" + config.name + "': access_threshold must be >= -1, got " +
                                   std::to_string(config.access_threshold));
  }
  if (config.eviction_threshold < -1) {
    return Status::InvalidArgument("table '" + config.name +
                                   "': eviction_threshold must be >= -1, got " +
                                   std::to_string(config.eviction_threshold));
  }
  std::unique_ptr<EmbeddingTable> t(new EmbeddingTable(config));
  const int64_t reserve = config.dynamic_expansion ? config.initial_capacity : config.capacity;
  {
    std::lock_guard<std::mutex> lock(t->alloc_mu_);
    while (t->allocated_rows_.load() < reserve) {
      if (!t->AddChunkLocked()) {
        return Status::ResourceExhausted("table '" + config.name + "': cannot reserve memory for " +
                                         std::to_string(reserve) + " rows of dim " +
                                         std::to_string(config.dim));
      }
    }
  }
  *table = std::move(t);
  return Status::Ok();
}

int64_t EmbeddingTable::Capacity() const {
  return config_.dynamic_expansion ? allocated_rows_.load() : config_.capacity;
}

int64_t EmbeddingTable::MemoryBytes() {
  int64_t row_memory;
  {
    // row_bytes_ changes only in RelayoutLocked, which holds alloc_mu_ too.
    std::lock_guard<std::mutex> lock(alloc_mu_);
    row_memory = num_chunks_ * static_cast<int64_t>(ChunkBytes());
  }
  return row_memory + static_cast<int64_t>(index_.memory_bytes());
}

int64_t EmbeddingTable::EncodeAddress(int64_t row, uint32_t generation) const {
  return TagBits() | IndexEntry(row, generation);
}

Status EmbeddingTable::DecodeAddress(int64_t address, int64_t* row) const {
  if (address == -1) {
    *row = -1;
    return Status::Ok();
  }
  const uint32_t tag = static_cast<uint32_t>(address >> (kRowBits + kGenerationBits));
  const int64_t r = address & (kMaxRows - 1);
  const uint32_t generation =
      static_cast<uint32_t>(address >> kRowBits) & ((1u << kGenerationBits) - 1);
  if (address < -1 || tag != tag_) {
    return Status::InvalidArgument("address " + std::to_string(address) +
                                   " does not belong to table '" + config_.name + "'");
  }
  if (r >= allocated_rows_.load(std::memory_order_acquire)) {
    return Status::InvalidArgument("address " + std::to_string(address) + " of table '" +
                                   config_.name + "' points past its rows");
  }
  // A concurrent remove may change these fields: read them atomically.
  const RowMeta& meta = MetaOf(r);
  if (!__atomic_load_n(&meta.alive, __ATOMIC_ACQUIRE) ||
      __atomic_load_n(&meta.generation, __ATOMIC_RELAXED) != generation) {
    return Status::InvalidArgument("address " + std::to_string(address) + " of table '" +
                                   config_.name +
                                   "' is stale: its row was removed (or the table cleared) "
                                   "after the address was looked up");
  }
  *row = r;
  return Status::Ok();
}

bool EmbeddingTable::AddChunkLocked() {
  if (num_chunks_ >= kMaxPages * kPageSize) return false;
  const int64_t rows = rows_per_chunk();
  const int64_t p = num_chunks_ >> kPageBits;
  DirectoryPage* page = pages_[p].load(std::memory_order_relaxed);
  if (page == nullptr) {
    page = new DirectoryPage;
    for (auto& c : page->chunks) c.store(nullptr, std::memory_order_relaxed);
    pages_[p].store(page, std::memory_order_release);
  }
  std::unique_ptr<Chunk> chunk(new Chunk);
  chunk->rows = static_cast<char*>(AllocateBlock(rows * row_bytes_));
  if (chunk->rows == nullptr) return false;
  if (config_.track_changes) chunk->changed.reset(new uint8_t[rows]());
  page->chunks[num_chunks_ & (kPageSize - 1)].store(chunk.release(), std::memory_order_release);
  ++num_chunks_;
  allocated_rows_.store(num_chunks_ << chunk_shift_, std::memory_order_release);
  return true;
}

Status EmbeddingTable::RelayoutLocked(int num_slots, const float* initial_values) {
  const size_t old_bytes = row_bytes_;
  const size_t new_bytes = RowBytesFor(num_slots);
  const int64_t rows = rows_per_chunk();
  std::vector<char*> blocks(num_chunks_, nullptr);
  for (int64_t c = 0; c < num_chunks_; ++c) {
    blocks[c] = static_cast<char*>(AllocateBlock(rows * new_bytes));
    if (blocks[c] == nullptr) {
      for (int64_t d = 0; d < c; ++d) FreeBlock(blocks[d], rows * new_bytes);
      return Status::ResourceExhausted("table '" + config_.name +
                                       "': out of memory while adding optimizer slots");
    }
  }
  const int dim = config_.dim;
  const size_t kept =
      sizeof(RowMeta) + sizeof(float) * dim * (1 + std::min(num_slots_, num_slots));
  for (int64_t c = 0; c < num_chunks_; ++c) {
    Chunk* chunk = ChunkOf(c << chunk_shift_);
    const int64_t used = std::min<int64_t>(rows, rows_touched_ - (c << chunk_shift_));
    for (int64_t r = 0; r < used; ++r) {
      char* dst = blocks[c] + r * new_bytes;
      std::memcpy(dst, chunk->rows + r * old_bytes, kept);
      float* value = reinterpret_cast<float*>(dst + sizeof(RowMeta));
      for (int s = num_slots_; s < num_slots; ++s) {
        std::fill_n(value + (s + 1) * dim, dim, initial_values[s]);
      }
    }
    FreeBlock(chunk->rows, rows * old_bytes);
    chunk->rows = blocks[c];
  }
  row_bytes_ = new_bytes;
  num_slots_ = num_slots;
  return Status::Ok();
}

std::string EmbeddingTable::FullMessage() const {
  if (config_.dynamic_expansion) {
    return "table '" + config_.name + "' cannot grow past " + std::to_string(Capacity()) +
           " rows: out of memory (or at the limit of " +
           std::to_string(kMaxPages * kPageSize) + " chunks)";
  }
  return "table '" + config_.name + "' is full: it holds its capacity of " +
         std::to_string(config_.capacity) +
         " rows. Raise device_vocabulary_size/host_vocabulary_size, turn on "
         "use_dynamic_expansion, or configure eviction.";
}

void EmbeddingTable::AllocateRows(int64_t count, std::vector<int64_t>* rows) {
  rows->clear();
  std::lock_guard<std::mutex> lock(alloc_mu_);
  while (static_cast<int64_t>(rows->size()) < count && !free_rows_.empty()) {
    rows->push_back(free_rows_.back());
    free_rows_.pop_back();
  }
  while (static_cast<int64_t>(rows->size()) < count && next_row_ < max_rows_) {
    if (next_row_ >= allocated_rows_.load(std::memory_order_relaxed) && !AddChunkLocked()) break;
    rows->push_back(next_row_++);
  }
  rows_touched_ = std::max(rows_touched_, next_row_);
}

void EmbeddingTable::ReleaseRows(const int64_t* rows, size_t count) {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  free_rows_.insert(free_rows_.end(), rows, rows + count);
}

void EmbeddingTable::InitializeRowLocked(int64_t row, int64_t key, int64_t last_seen) {
  float* value = ValueOf(row);
  InitializeRow(config_.initializer, key, config_.dim, value);
  for (int s = 0; s < num_slots_; ++s) {
    std::fill_n(SlotOf(value, s), config_.dim, slot_initial_values_[s]);
  }
  MarkChanged(row);
  RowMeta& meta = MetaOf(row);
  meta.key = key;
  meta.last_seen = last_seen;
  meta.count = 0;
  meta.slots_unset = num_slots_ > 0 && !slot_values_known_;
  __atomic_store_n(&meta.alive, 1, __ATOMIC_RELEASE);
}

void EmbeddingTable::KillRowLocked(RowMeta& meta) {
  // Readers validating an address read alive and generation without the shard lock.
  __atomic_store_n(&meta.alive, 0, __ATOMIC_RELAXED);
  const uint16_t next = static_cast<uint16_t>((meta.generation + 1) & ((1u << kGenerationBits) - 1));
  __atomic_store_n(&meta.generation, next, __ATOMIC_RELEASE);
}

void EmbeddingTable::PrefetchRow(int64_t address) const {
  if (address < 0) return;
  const int64_t row = address & (kMaxRows - 1);
  if (row >= allocated_rows_.load(std::memory_order_relaxed)) return;
  const char* record = RecordOf(row);
  __builtin_prefetch(record);
  if (sizeof(RowMeta) + config_.dim * sizeof(float) > 64) __builtin_prefetch(record + 64);
}

void EmbeddingTable::FreeRow(int64_t row) {
  const int64_t key = MetaOf(row).key;
  KillRowLocked(MetaOf(row));
  size_.fetch_sub(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(alloc_mu_);
  free_rows_.push_back(row);
  if (config_.track_changes) removed_keys_.push_back(key);
}

void EmbeddingTable::ForEachShard(const int64_t* keys, int64_t n, int64_t cost_per_key,
                                  const ShardBatchFn& fn, const ParallelRunner& run) {
  std::vector<uint64_t> hashes;
  std::vector<int64_t> order;
  std::vector<int64_t> begin;
  HashIndex::BucketByShard(keys, n, &hashes, &order, &begin, run);
  const int64_t per_shard_cost = std::max<int64_t>(1, cost_per_key * (n / HashIndex::kNumShards + 1));
  run(HashIndex::kNumShards, per_shard_cost, [&](int64_t first, int64_t last) {
    for (int64_t s = first; s < last; ++s) {
      if (begin[s] == begin[s + 1]) continue;
      HashIndex::Shard& shard = index_.shard(static_cast<int>(s));
      std::lock_guard<std::mutex> lock(shard.mu());
      fn(shard, order.data() + begin[s], begin[s + 1] - begin[s], hashes.data());
    }
  });
}

void EmbeddingTable::ForEachKeyByShard(
    const int64_t* keys, int64_t n, int64_t cost_per_key,
    const std::function<void(HashIndex::Shard&, int64_t, uint64_t)>& fn,
    const ParallelRunner& run) {
  ForEachShard(
      keys, n, cost_per_key,
      [&](HashIndex::Shard& shard, const int64_t* positions, int64_t count,
          const uint64_t* hashes) {
        ProbeInOrder(shard, positions, count, hashes,
                     [&](int64_t i) { fn(shard, i, hashes[i]); });
      },
      run);
}

namespace {
uint32_t SaturatingCount(int64_t count) {
  return static_cast<uint32_t>(std::min<int64_t>(std::max<int64_t>(count, 0), UINT32_MAX));
}
}  // namespace

EmbeddingTable::Pending* EmbeddingTable::PendingShard::Add(int64_t key, uint64_t hash,
                                                          int64_t last_seen) {
  int64_t i;
  if (!free_.empty()) {
    i = free_.back();
    free_.pop_back();
  } else {
    i = static_cast<int64_t>(records_.size());
    records_.emplace_back();
  }
  records_[i] = Pending{key, 0, last_seen};
  map_.Insert(key, hash, i);
  return &records_[i];
}

void EmbeddingTable::PendingShard::Remove(int64_t key, uint64_t hash) {
  const int64_t i = map_.Erase(key, hash);
  if (i < 0) return;
  records_[i].count = -1;
  free_.push_back(i);
}

int64_t EmbeddingTable::PendingShard::RemoveSeenAtOrBefore(int64_t cutoff) {
  int64_t removed = 0;
  for (size_t i = 0; i < records_.size(); ++i) {
    Pending& p = records_[i];
    if (p.count < 0 || p.last_seen > cutoff) continue;
    map_.Erase(p.key, HashIndex::Hash(p.key));
    p.count = -1;
    free_.push_back(static_cast<int64_t>(i));
    ++removed;
  }
  // Give memory back once most records are free (e.g. after a burst of one-off keys).
  if (records_.size() > 1024 && static_cast<size_t>(map_.size()) * 4 < records_.size()) {
    std::vector<Pending> live;
    live.reserve(map_.size() * 2);
    for (const Pending& p : records_) {
      if (p.count >= 0) live.push_back(p);
    }
    Clear();
    for (const Pending& p : live) {
      Pending* q = Add(p.key, HashIndex::Hash(p.key), p.last_seen);
      q->count = p.count;
    }
  }
  return removed;
}

void EmbeddingTable::PendingShard::Clear() {
  map_.Clear();
  std::vector<Pending>().swap(records_);
  std::vector<int64_t>().swap(free_);
}

void EmbeddingTable::RaiseNewestClock(int64_t clock) {
  int64_t seen = newest_clock_.load(std::memory_order_relaxed);
  while (clock > seen && !newest_clock_.compare_exchange_weak(seen, clock)) {
  }
}

int64_t EmbeddingTable::ClockForNewRows() const {
  const int64_t newest = newest_clock_.load(std::memory_order_relaxed);
  return newest == kNoClock ? 0 : newest;
}

Status EmbeddingTable::FindOrInsert(const int64_t* keys, int64_t n, bool insert,
                                    int64_t* addresses, const ParallelRunner& run,
                                    const KeyAccess& access) {
  ChangeScope change(this, insert);
  if (!insert) {
    std::shared_lock<std::shared_mutex> structure(structure_mu_);
    const int64_t tag_bits = TagBits();
    ForEachShard(
        keys, n, 60,
        [&](HashIndex::Shard& shard, const int64_t* positions, int64_t count,
            const uint64_t* hashes) {
          ProbeInOrder(shard, positions, count, hashes, [&](int64_t i) {
            const int64_t entry = shard.Find(keys[i], hashes[i]);
            addresses[i] = entry >= 0 ? (tag_bits | entry) : -1;
          });
        },
        run);
    return Status::Ok();
  }
  const int64_t tick = tick_.fetch_add(1, std::memory_order_relaxed) + 1;
  int64_t unplaced = 0;
  {
    std::shared_lock<std::shared_mutex> structure(structure_mu_);
    InsertPass(keys, n, addresses, access, tick, /*count=*/true, &unplaced, run);
  }
  if (unplaced == 0) return Status::Ok();
  if (!config_.evict_when_full || config_.dynamic_expansion) {
    return Status::ResourceExhausted(FullMessage());
  }
  // Make room for this batch and a little more (so that a full table does not evict on every
  // step), then place the keys again without counting them twice.
  EvictLeastRecent(unplaced + std::max<int64_t>(1, config_.capacity / 100), keys, n,
                   access.times == nullptr ? tick : 0);
  unplaced = 0;
  {
    std::shared_lock<std::shared_mutex> structure(structure_mu_);
    InsertPass(keys, n, addresses, access, tick, /*count=*/false, &unplaced, run);
  }
  if (unplaced > 0) {
    return Status::ResourceExhausted(FullMessage() + " (a batch holds more new keys than the "
                                     "table's capacity can take even after eviction)");
  }
  return Status::Ok();
}

void EmbeddingTable::InsertPass(const int64_t* keys, int64_t n, int64_t* addresses,
                                const KeyAccess& access, int64_t tick, bool count,
                                int64_t* unplaced, const ParallelRunner& run) {
  const int64_t tag_bits = TagBits();
  const int64_t threshold = access_threshold_.load(std::memory_order_relaxed);
  // Rows of keys seen again get their last-seen clock only when eviction reads it; a row's
  // count is the one it was admitted with.
  const bool touch_rows =
      config_.eviction_threshold >= 0 || config_.evict_when_full || config_.track_access;
  const bool count_rows = config_.track_access && count;
  const bool clocked = touch_rows || access.times != nullptr;
  std::atomic<int64_t> total_unplaced{0};
  ForEachShard(
      keys, n, touch_rows ? 400 : 300,
      [&](HashIndex::Shard& shard, const int64_t* positions, int64_t count_in_shard,
          const uint64_t* hashes) {
        PendingShard& pending = pending_[HashIndex::ShardOf(hashes[positions[0]])];
        std::vector<int64_t> missing;  // positions of keys the shard does not hold
        std::vector<int64_t> found;    // rows of keys it holds (when touching rows)
        std::vector<int64_t> found_at;
        int64_t newest = kNoClock;
        ProbeInOrder(shard, positions, count_in_shard, hashes, [&](int64_t i) {
          const int64_t entry = shard.Find(keys[i], hashes[i]);
          if (entry >= 0) {
            addresses[i] = tag_bits | entry;
            if (touch_rows) {
              found.push_back(RowOfEntry(entry));
              found_at.push_back(i);
            }
          } else {
            missing.push_back(i);
          }
          if (clocked) newest = std::max(newest, ClockOf(access, i, tick));
        });
        // Rows are read next by the gather: touching their headers here costs little.
        for (size_t j = 0; j < found.size(); ++j) {
          if (j + kPrefetchDistance < found.size()) {
            __builtin_prefetch(RecordOf(found[j + kPrefetchDistance]), 1);
          }
          RowMeta& meta = MetaOf(found[j]);
          meta.last_seen = std::max(meta.last_seen, ClockOf(access, found_at[j], tick));
          if (count_rows) {
            meta.count = SaturatingCount(
                int64_t{meta.count} + (access.counts ? access.counts[found_at[j]] : 1));
          }
          MarkChanged(found[j]);
        }
        if (clocked) RaiseNewestClock(newest);
        if (missing.empty()) return;
        // Admission: keep only the keys whose count reaches the threshold.
        std::vector<int64_t> admit;
        std::vector<int64_t> admit_count;
        int64_t rejected = 0;
        for (size_t j = 0; j < missing.size(); ++j) {
          const int64_t i = missing[j];
          if (threshold > 0 && j + kPrefetchDistance < missing.size()) {
            pending.Prefetch(hashes[missing[j + kPrefetchDistance]]);
          }
          const int64_t add = count ? (access.counts ? access.counts[i] : 1) : 0;
          if (threshold <= 0) {
            // Counts left from a time admission was on go with the key's new row.
            if (pending.size() > 0 && pending.Find(keys[i], hashes[i]) != nullptr) {
              pending.Remove(keys[i], hashes[i]);
              pending_size_.fetch_sub(1, std::memory_order_relaxed);
            }
            admit.push_back(i);
            admit_count.push_back(add);
            continue;
          }
          Pending* p = pending.Find(keys[i], hashes[i]);
          if (p == nullptr) {
            if (!count) {  // a retry of a key that was never counted
              addresses[i] = -1;
              continue;
            }
            p = pending.Add(keys[i], hashes[i], ClockOf(access, i, tick));
            pending_size_.fetch_add(1, std::memory_order_relaxed);
          }
          if (__builtin_add_overflow(p->count, add, &p->count)) p->count = INT64_MAX;
          p->last_seen = std::max(p->last_seen, ClockOf(access, i, tick));
          if (p->count >= threshold) {
            admit.push_back(i);
            admit_count.push_back(p->count);
          } else {
            addresses[i] = -1;
            if (count) ++rejected;
          }
        }
        if (rejected > 0) rejected_.fetch_add(rejected, std::memory_order_relaxed);
        if (admit.empty()) return;
        // One allocation per shard and batch: a thread's new rows are contiguous, so two
        // threads never initialise rows that share cache lines.
        std::vector<int64_t> rows;
        AllocateRows(static_cast<int64_t>(admit.size()), &rows);
        size_t used = 0;
        int64_t left_out = 0;
        for (size_t j = 0; j < admit.size(); ++j) {
          const int64_t i = admit[j];
          int64_t entry = shard.Find(keys[i], hashes[i]);  // a duplicate inserted just now
          if (entry < 0) {
            if (used == rows.size()) {
              ++left_out;
              addresses[i] = -1;
              continue;
            }
            const int64_t row = rows[used++];
            InitializeRowLocked(row, keys[i], ClockOf(access, i, tick));
            MetaOf(row).count = SaturatingCount(admit_count[j]);
            entry = IndexEntry(row, MetaOf(row).generation);
            shard.Insert(keys[i], hashes[i], entry);
            if (threshold > 0 && pending.Find(keys[i], hashes[i]) != nullptr) {
              pending.Remove(keys[i], hashes[i]);
              pending_size_.fetch_sub(1, std::memory_order_relaxed);
            }
          }
          addresses[i] = tag_bits | entry;
        }
        size_.fetch_add(static_cast<int64_t>(used), std::memory_order_relaxed);
        admitted_.fetch_add(static_cast<int64_t>(used), std::memory_order_relaxed);
        if (used < rows.size()) ReleaseRows(rows.data() + used, rows.size() - used);
        if (left_out > 0) total_unplaced.fetch_add(left_out, std::memory_order_relaxed);
      },
      run);
  *unplaced = total_unplaced.load();
}

Status EmbeddingTable::SetAccessThreshold(int64_t threshold) {
  ChangeScope change(this);
  if (threshold < -1) {
    return Status::InvalidArgument("table '" + config_.name +
                                   "': access_threshold must be >= -1, got " +
                                   std::to_string(threshold));
  }
  access_threshold_.store(threshold, std::memory_order_relaxed);
  return Status::Ok();
}

void EmbeddingTable::EvictRowLocked(int64_t row) {
  RowMeta& meta = MetaOf(row);
  if (config_.track_changes) removed_keys_.push_back(meta.key);
  const uint64_t hash = HashIndex::Hash(meta.key);
  index_.shard(HashIndex::ShardOf(hash)).Erase(meta.key, hash);
  KillRowLocked(meta);
  size_.fetch_sub(1, std::memory_order_relaxed);
  evicted_.fetch_add(1, std::memory_order_relaxed);
}

Status EmbeddingTable::Evict(int64_t* rows_evicted, int64_t* pending_evicted,
                             const ParallelRunner& run) {
  ChangeScope change(this);
  int64_t rows_out = 0, pending_out = 0;
  const int64_t threshold = config_.eviction_threshold;
  const int64_t newest = newest_clock_.load();
  if (threshold >= 0 && newest != kNoClock) {
    // Keys seen at or before `cutoff` are at least `threshold` older than the newest clock.
    int64_t cutoff;
    if (__builtin_sub_overflow(newest, threshold, &cutoff)) cutoff = INT64_MIN;
    std::unique_lock<std::shared_mutex> structure(structure_mu_);
    std::lock_guard<std::mutex> lock(alloc_mu_);
    // Find the victims chunk by chunk in parallel, then unlink them.
    const int64_t chunks = (next_row_ + rows_per_chunk() - 1) >> chunk_shift_;
    std::vector<std::vector<int64_t>> victims(chunks);
    run(chunks, rows_per_chunk() * 10, [&](int64_t first, int64_t last) {
      for (int64_t c = first; c < last; ++c) {
        const int64_t end = std::min(next_row_, (c + 1) << chunk_shift_);
        for (int64_t row = c << chunk_shift_; row < end; ++row) {
          const RowMeta& meta = MetaOf(row);
          if (meta.alive && meta.last_seen <= cutoff) victims[c].push_back(row);
        }
      }
    });
    for (const auto& rows : victims) {
      for (const int64_t row : rows) {
        EvictRowLocked(row);
        free_rows_.push_back(row);
        ++rows_out;
      }
    }
    for (int s = 0; s < HashIndex::kNumShards; ++s) {
      pending_out += pending_[s].RemoveSeenAtOrBefore(cutoff);
    }
    pending_size_.fetch_sub(pending_out, std::memory_order_relaxed);
  }
  if (rows_evicted != nullptr) *rows_evicted = rows_out;
  if (pending_evicted != nullptr) *pending_evicted = pending_out;
  return Status::Ok();
}

void EmbeddingTable::EvictLeastRecent(int64_t count, const int64_t* keys, int64_t n,
                                      int64_t tick) {
  std::vector<int64_t> batch(keys, keys + n);
  std::sort(batch.begin(), batch.end());
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  std::lock_guard<std::mutex> lock(alloc_mu_);
  std::vector<std::pair<int64_t, int64_t>> candidates;  // (last_seen, row)
  candidates.reserve(size_.load());
  for (int64_t row = 0; row < next_row_; ++row) {
    const RowMeta& meta = MetaOf(row);
    if (!meta.alive) continue;
    if (tick > 0 && meta.last_seen >= tick - kProtectedTicks) continue;
    if (std::binary_search(batch.begin(), batch.end(), meta.key)) continue;
    candidates.emplace_back(meta.last_seen, row);
  }
  count = std::min<int64_t>(count, static_cast<int64_t>(candidates.size()));
  if (count <= 0) return;
  std::nth_element(candidates.begin(), candidates.begin() + (count - 1), candidates.end());
  int64_t newest_evicted = INT64_MIN;
  for (int64_t j = 0; j < count; ++j) {
    EvictRowLocked(candidates[j].second);
    free_rows_.push_back(candidates[j].second);
    newest_evicted = std::max(newest_evicted, candidates[j].first);
  }
  // Keys still counting towards admission that were last seen before the rows that had to
  // go would not be kept either: this bounds the pending counts of a full table.
  int64_t pending_out = 0;
  for (int s = 0; s < HashIndex::kNumShards; ++s) {
    pending_out += pending_[s].RemoveSeenAtOrBefore(newest_evicted);
  }
  pending_size_.fetch_sub(pending_out, std::memory_order_relaxed);
}

TableStats EmbeddingTable::Stats() const {
  TableStats stats;
  stats.size = Size();
  stats.capacity = Capacity();
  stats.admitted = admitted_.load();
  stats.rejected = rejected_.load();
  stats.evicted = evicted_.load();
  stats.pending = pending_size_.load();
  stats.newest_clock = ClockForNewRows();
  return stats;
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
        std::memcpy(dst, ValueOf(row), dim * sizeof(float));
      }
    }
  });
  return error;
}

Status EmbeddingTable::Lookup(const int64_t* keys, int64_t n, bool init_missing, float* out,
                              bool* exists, const ParallelRunner& run, int slot,
                              float slot_default) {
  std::shared_lock<std::shared_mutex> structure(structure_mu_);
  if (slot >= 0 && num_slots_ == 0) {
    ForEachKeyByShard(
        keys, n, 60,
        [&](HashIndex::Shard& shard, int64_t i, uint64_t hash) {
          if (exists != nullptr) exists[i] = shard.Find(keys[i], hash) >= 0;
        },
        run);
    std::fill_n(out, n * config_.dim, slot_default);
    return Status::Ok();
  }
  if (slot >= num_slots_) {
    return Status::InvalidArgument("table '" + config_.name + "' has " +
                                   std::to_string(num_slots_) + " optimizer slots, no slot " +
                                   std::to_string(slot));
  }
  const int dim = config_.dim;
  ForEachKeyByShard(
      keys, n, 60 + 2 * dim,
      [&](HashIndex::Shard& shard, int64_t i, uint64_t hash) {
        const int64_t entry = shard.Find(keys[i], hash);
        const int64_t row = entry < 0 ? -1 : RowOfEntry(entry);
        float* dst = out + i * dim;
        if (slot >= 0) {
          if (row >= 0) {
            std::memcpy(dst, SlotOf(ValueOf(row), slot), dim * sizeof(float));
          } else {
            std::fill_n(dst, dim, init_missing ? slot_initial_values_[slot] : 0.0f);
          }
        } else if (row >= 0) {
          std::memcpy(dst, ValueOf(row), dim * sizeof(float));
        } else if (init_missing) {
          InitializeRow(config_.initializer, keys[i], dim, dst);
        } else {
          std::fill_n(dst, dim, 0.0f);
        }
        if (exists != nullptr) exists[i] = row >= 0;
      },
      run);
  return Status::Ok();
}

Status EmbeddingTable::Upsert(const int64_t* keys, const float* values, int64_t n,
                              const ParallelRunner& run) {
  ChangeScope change(this);
  std::shared_lock<std::shared_mutex> structure(structure_mu_);
  const int dim = config_.dim;
  std::atomic<bool> full{false};
  ForEachKeyByShard(
      keys, n, 200 + 2 * dim,
      [&](HashIndex::Shard& shard, int64_t i, uint64_t hash) {
        const int64_t entry = shard.Find(keys[i], hash);
        int64_t row = entry < 0 ? -1 : RowOfEntry(entry);
        if (row < 0) {
          std::vector<int64_t> fresh;
          AllocateRows(1, &fresh);
          if (fresh.empty()) {
            full.store(true, std::memory_order_relaxed);
            return;
          }
          row = fresh[0];
          InitializeRowLocked(row, keys[i], ClockForNewRows());
          size_.fetch_add(1, std::memory_order_relaxed);
          PendingShard& pending = pending_[HashIndex::ShardOf(hash)];
          if (pending.size() > 0 && pending.Find(keys[i], hash) != nullptr) {
            pending.Remove(keys[i], hash);
            pending_size_.fetch_sub(1, std::memory_order_relaxed);
          }
          shard.Insert(keys[i], hash, IndexEntry(row, MetaOf(row).generation));
        }
        std::memcpy(ValueOf(row), values + i * dim, dim * sizeof(float));
        MarkChanged(row);
      },
      run);
  if (full.load()) return Status::ResourceExhausted(FullMessage());
  return Status::Ok();
}

Status EmbeddingTable::Remove(const int64_t* keys, int64_t n, int64_t* removed,
                              const ParallelRunner& run) {
  ChangeScope change(this);
  std::shared_lock<std::shared_mutex> structure(structure_mu_);
  std::atomic<int64_t> count{0};
  ForEachKeyByShard(
      keys, n, 100,
      [&](HashIndex::Shard& shard, int64_t i, uint64_t hash) {
        const int64_t entry = shard.Erase(keys[i], hash);
        if (entry >= 0) {
          FreeRow(RowOfEntry(entry));
          count.fetch_add(1, std::memory_order_relaxed);
        }
      },
      run);
  if (removed != nullptr) *removed = count.load();
  return Status::Ok();
}

Status EmbeddingTable::Restrict(int64_t keep, RestrictBy by, int64_t* removed) {
  if (keep < 0) {
    return Status::InvalidArgument("table '" + config_.name +
                                   "': num_reserved must be >= 0, got " + std::to_string(keep));
  }
  if (by == RestrictBy::kCount && !config_.track_access) {
    return Status::InvalidArgument("table '" + config_.name +
                                   "' does not count accesses (track_access): it cannot be "
                                   "restricted by count");
  }
  if (removed != nullptr) *removed = 0;
  if (Size() <= keep) return Status::Ok();  // nothing to do: the table stays unchanged
  ChangeScope change(this);
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  std::lock_guard<std::mutex> lock(alloc_mu_);
  struct Candidate {
    int64_t primary, secondary, key, row;
  };
  std::vector<Candidate> rows;
  rows.reserve(size_.load());
  for (int64_t row = 0; row < next_row_; ++row) {
    const RowMeta& meta = MetaOf(row);
    if (!meta.alive) continue;
    if (by == RestrictBy::kCount) {
      rows.push_back({int64_t{meta.count}, meta.last_seen, meta.key, row});
    } else {
      rows.push_back({meta.last_seen, 0, meta.key, row});
    }
  }
  const int64_t drop = static_cast<int64_t>(rows.size()) - keep;
  if (removed != nullptr) *removed = std::max<int64_t>(drop, 0);
  if (drop <= 0) return Status::Ok();
  auto worse = [](const Candidate& a, const Candidate& b) {
    if (a.primary != b.primary) return a.primary < b.primary;
    if (a.secondary != b.secondary) return a.secondary < b.secondary;
    return a.key < b.key;
  };
  std::nth_element(rows.begin(), rows.begin() + (drop - 1), rows.end(), worse);
  for (int64_t j = 0; j < drop; ++j) {
    EvictRowLocked(rows[j].row);
    free_rows_.push_back(rows[j].row);
  }
  return Status::Ok();
}

void EmbeddingTable::Clear() {
  ChangeScope change(this);
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  ClearLocked();
}

void EmbeddingTable::ClearLocked() {
  // Also for restores and deltas, which hold the lock throughout: a save snapshotted before
  // them must not be committed as what the table holds.
  BumpVersion();
  // Lock order everywhere: structure_mu_, then a shard, then alloc_mu_.
  for (int s = 0; s < HashIndex::kNumShards; ++s) {
    std::lock_guard<std::mutex> shard_lock(index_.shard(s).mu());
    index_.shard(s).Clear();
    pending_[s].Clear();
  }
  pending_size_.store(0);
  std::lock_guard<std::mutex> lock(alloc_mu_);
  for (int64_t row = 0; row < next_row_; ++row) {
    RowMeta& meta = MetaOf(row);
    if (meta.alive) KillRowLocked(meta);
  }
  free_rows_.clear();
  free_rows_.shrink_to_fit();
  next_row_ = 0;
  size_.store(0);
  if (config_.track_changes) {
    cleared_since_save_ = true;
    removed_keys_.clear();
  }
}

Status EmbeddingTable::EnsureSlots(const std::string& optimizer,
                                   const std::vector<float>& initial_values) {
  ChangeScope change(this);
  const int wanted = static_cast<int>(initial_values.size());
  if (wanted > kMaxSlots) {
    return Status::InvalidArgument("optimizer '" + optimizer + "' asks for " +
                                   std::to_string(wanted) + " slots; at most " +
                                   std::to_string(kMaxSlots) + " are supported");
  }
  {
    std::shared_lock<std::shared_mutex> structure(structure_mu_);
    if (slot_values_known_ && slot_optimizer_ == optimizer && num_slots_ == wanted &&
        std::equal(initial_values.begin(), initial_values.end(), slot_initial_values_)) {
      return Status::Ok();
    }
  }
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  if (slot_values_known_ && slots_from_checkpoint_) {
    slots_from_checkpoint_ = false;
    if (slot_optimizer_ == optimizer && num_slots_ == wanted) {
      // Restored slots of this optimizer: new rows start from this instance's values.
      for (int s = 0; s < wanted; ++s) slot_initial_values_[s] = initial_values[s];
      return Status::Ok();
    }
    // The checkpoint was trained by another optimizer: its slots cannot serve this one.
    std::lock_guard<std::mutex> lock(alloc_mu_);
    REC_SDK_RETURN_IF_ERROR(RelayoutLocked(wanted, initial_values.data()));
    for (int64_t row = 0; row < next_row_; ++row) {
      float* value = ValueOf(row);
      for (int s = 0; s < wanted; ++s) {
        std::fill_n(SlotOf(value, s), config_.dim, initial_values[s]);
      }
    }
    {
      std::lock_guard<std::mutex> notice_lock(notice_mu_);
      notice_ = "table '" + config_.name + "': the checkpoint's slots of optimizer '" +
                slot_optimizer_ + "' were dropped; optimizer '" + optimizer + "' starts its " +
                std::to_string(wanted) + " slot(s) from their initial values";
    }
    for (int s = 0; s < wanted; ++s) slot_initial_values_[s] = initial_values[s];
    slot_optimizer_ = optimizer;
    return Status::Ok();
  }
  if (slot_values_known_) {
    if (slot_optimizer_ == optimizer && num_slots_ == wanted) {
      for (int s = 0; s < wanted; ++s) {
        if (slot_initial_values_[s] != initial_values[s]) {
          return Status::FailedPrecondition(
              "table '" + config_.name + "': optimizer '" + optimizer + "' slot " +
              std::to_string(s) + " starts at " + std::to_string(slot_initial_values_[s]) +
              " for this table; another instance asks for " + std::to_string(initial_values[s]));
        }
      }
      return Status::Ok();
    }
    return Status::FailedPrecondition(
        "table '" + config_.name + "' is already trained by sparse optimizer '" +
        slot_optimizer_ + "'; it cannot also be trained by '" + optimizer +
        "' (one sparse optimizer per table)");
  }
  std::lock_guard<std::mutex> lock(alloc_mu_);
  if (num_slots_ > 0 && num_slots_ != wanted) {
    return Status::FailedPrecondition(
        "table '" + config_.name + "' was imported with " + std::to_string(num_slots_) +
        " optimizer slots but optimizer '" + optimizer + "' uses " + std::to_string(wanted));
  }
  const int first_new = num_slots_;
  // Give every row handed out so far its slots; later rows get them in InitializeRowLocked.
  if (wanted > num_slots_) REC_SDK_RETURN_IF_ERROR(RelayoutLocked(wanted, initial_values.data()));
  for (int s = 0; s < wanted; ++s) slot_initial_values_[s] = initial_values[s];
  // Rows added after an Import of slots but before this call got no slot values of their own.
  for (int64_t row = 0; first_new > 0 && row < next_row_; ++row) {
    RowMeta& meta = MetaOf(row);
    if (!meta.slots_unset) continue;
    meta.slots_unset = 0;
    float* value = ValueOf(row);
    for (int s = 0; s < first_new; ++s) {
      std::fill_n(SlotOf(value, s), config_.dim, initial_values[s]);
    }
  }
  slot_optimizer_ = optimizer;
  slot_values_known_ = true;
  slots_from_checkpoint_ = false;
  return Status::Ok();
}

std::string EmbeddingTable::TakeNotice() {
  std::lock_guard<std::mutex> lock(notice_mu_);
  std::string notice;
  notice.swap(notice_);
  return notice;
}

namespace {
// Ids of saves: random, positive, never 0.
int64_t NewSaveId() {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}() ^ static_cast<uint64_t>(
                                 std::chrono::steady_clock::now().time_since_epoch().count()));
  std::lock_guard<std::mutex> lock(mu);
  int64_t id;
  do {
    id = static_cast<int64_t>(rng() >> 2);
  } while (id == 0);
  return id;
}
}  // namespace

Status EmbeddingTable::CommitSave(int64_t save_id) {
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  if (save_id != snapshot_id_) {
    return Status::FailedPrecondition("table '" + config_.name + "': save " +
                                      std::to_string(save_id) + " is not the table's last "
                                      "snapshot; it cannot be committed");
  }
  ResetChangesLocked();
  checkpoint_id_ = save_id;
  committed_version_ = snapshot_version_;
  return Status::Ok();
}

bool EmbeddingTable::HoldsCheckpoint(int64_t save_id) const {
  std::shared_lock<std::shared_mutex> structure(structure_mu_);
  return save_id != 0 && checkpoint_id_ == save_id &&
         version_.load(std::memory_order_relaxed) == committed_version_;
}

Status EmbeddingTable::Snapshot(const std::function<Status(const SnapshotView&)>& fn) {
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  SnapshotView view;
  view.table_ = this;
  CheckpointInfo& info = view.info_;
  info.rows = size_.load();
  info.pending = pending_size_.load();
  info.num_slots = num_slots_;
  info.optimizer = slot_optimizer_;
  info.slot_initial.assign(slot_initial_values_, slot_initial_values_ + num_slots_);
  const int64_t newest = newest_clock_.load();
  info.has_clock = newest != kNoClock;
  info.newest_clock = info.has_clock ? newest : 0;
  info.tick = tick_.load();
  info.admitted = admitted_.load();
  info.rejected = rejected_.load();
  info.evicted = evicted_.load();
  info.save_id = snapshot_id_ = NewSaveId();
  info.parent_id = checkpoint_id_;
  snapshot_version_ = version_.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    view.next_row_ = next_row_;
  }
  return fn(view);
}

void EmbeddingTable::ResetChangesLocked() {
  if (!config_.track_changes) return;
  std::lock_guard<std::mutex> lock(alloc_mu_);
  for (int64_t c = 0; c < num_chunks_; ++c) {
    std::fill_n(ChunkOf(c << chunk_shift_)->changed.get(), rows_per_chunk(), 0);
  }
  removed_keys_.clear();
  removed_keys_.shrink_to_fit();
  cleared_since_save_ = false;
}

Status EmbeddingTable::SnapshotView::ForEachRow(const RowFn& fn, bool changed_only) const {
  changed_only = changed_only && table_->config_.track_changes;
  for (int64_t row = 0; row < next_row_; ++row) {
    const RowMeta& meta = table_->MetaOf(row);
    if (!meta.alive) continue;
    if (changed_only && !table_->ChunkOf(row)->changed[table_->OffsetOf(row)]) continue;
    REC_SDK_RETURN_IF_ERROR(fn(meta.key, table_->ValueOf(row), meta.count, meta.last_seen));
  }
  return Status::Ok();
}

Status EmbeddingTable::SnapshotView::ForEachPending(const PendingFn& fn) const {
  for (int s = 0; s < HashIndex::kNumShards; ++s) {
    REC_SDK_RETURN_IF_ERROR(table_->pending_[s].ForEach([&](const Pending& p) {
      return fn(p.key, p.count, p.last_seen);
    }));
  }
  return Status::Ok();
}

class EmbeddingTable::RowSink : public RestoreSink {
 public:
  RowSink(EmbeddingTable* t, bool keep_slots, bool upsert)
      : t_(t), keep_slots_(keep_slots), upsert_(upsert) {}
  Status AddRow(int lane, int64_t key, const float* value, const float* const* slots,
                uint32_t count, int64_t last_seen) override {
    std::vector<int64_t>& rows_ = rows_of_[lane];
    size_t& next_ = next_of_[lane];
    const uint64_t hash = HashIndex::Hash(key);
    HashIndex::Shard& shard = t_->index_.shard(HashIndex::ShardOf(hash));
    const int64_t existing = shard.Find(key, hash);
    if (existing >= 0 && !upsert_) {
      return Status::DataLoss("table '" + t_->config_.name + "': key " + std::to_string(key) +
                              " appears twice in the checkpoint");
    }
    if (existing >= 0) {  // a delta's new values for a stored key
      WriteRow(RowOfEntry(existing), value, slots, count, last_seen);
      return Status::Ok();
    }
    if (next_ == rows_.size()) {
      // A fixed-capacity table hands out exactly the rows announced by ExpectRows (a delta:
      // one at a time), so that no lane sits on rows another lane needs.
      int64_t block = 4096;
      if (!t_->config_.dynamic_expansion) {
        block = upsert_ ? 1 : std::max<int64_t>(1, std::min<int64_t>(block, expected_[lane]));
      }
      t_->AllocateRows(block, &rows_);
      expected_[lane] -= static_cast<int64_t>(rows_.size());
      next_ = 0;
      if (rows_.empty()) {
        return Status::ResourceExhausted(
            "restore into table '" + t_->config_.name + "': the checkpoint has more rows "
            "than the table's capacity of " + std::to_string(t_->Capacity()) + " rows");
      }
    }
    const int64_t row = rows_[next_++];
    WriteRow(row, value, slots, count, last_seen);
    RowMeta& meta = t_->MetaOf(row);
    meta.key = key;
    meta.slots_unset = 0;
    __atomic_store_n(&meta.alive, 1, __ATOMIC_RELEASE);
    shard.Insert(key, hash, IndexEntry(row, meta.generation));
    t_->size_.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
  }
  void WriteRow(int64_t row, const float* value, const float* const* slots, uint32_t count,
                int64_t last_seen) {
    const int dim = t_->config_.dim;
    float* dst = t_->ValueOf(row);
    std::memcpy(dst, value, dim * sizeof(float));
    for (int s = 0; s < t_->num_slots_; ++s) {
      if (keep_slots_ && slots != nullptr && slots[s] != nullptr) {
        std::memcpy(t_->SlotOf(dst, s), slots[s], dim * sizeof(float));
      } else {
        std::fill_n(t_->SlotOf(dst, s), dim, t_->slot_initial_values_[s]);
      }
    }
    RowMeta& meta = t_->MetaOf(row);
    meta.last_seen = last_seen;
    meta.count = count;
  }
  Status AddPending(int64_t key, int64_t count, int64_t last_seen) override {
    const uint64_t hash = HashIndex::Hash(key);
    PendingShard& pending = t_->pending_[HashIndex::ShardOf(hash)];
    if (count < 0 || pending.Find(key, hash) != nullptr ||
        t_->index_.shard(HashIndex::ShardOf(hash)).Find(key, hash) >= 0) {
      return Status::DataLoss("table '" + t_->config_.name + "': pending key " +
                              std::to_string(key) + " is invalid or repeated in the checkpoint");
    }
    pending.Add(key, hash, last_seen)->count = count;
    t_->pending_size_.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
  }
  void ExpectRows(int lane, int64_t n) override { expected_[lane] += n; }
  void Prefetch(int64_t key) const override {
    const uint64_t hash = HashIndex::Hash(key);
    t_->index_.shard(HashIndex::ShardOf(hash)).Prefetch(hash);
  }
  void ReleaseUnused() {
    for (int l = 0; l < kRestoreLanes; ++l) {
      if (next_of_[l] < rows_of_[l].size()) {
        t_->ReleaseRows(rows_of_[l].data() + next_of_[l], rows_of_[l].size() - next_of_[l]);
      }
      rows_of_[l].clear();
      next_of_[l] = 0;
    }
  }

 private:
  EmbeddingTable* t_;
  const bool keep_slots_;
  const bool upsert_;
  // Rows taken from the allocator, per lane.
  std::vector<int64_t> rows_of_[kRestoreLanes];
  size_t next_of_[kRestoreLanes] = {};
  int64_t expected_[kRestoreLanes] = {};  // rows announced and not yet allocated, per lane
};

Status EmbeddingTable::Restore(const CheckpointInfo& info,
                               const std::function<Status(RestoreSink*)>& feed,
                               std::string* note) {
  if (info.num_slots < 0 || info.num_slots > kMaxSlots ||
      static_cast<int>(info.slot_initial.size()) != info.num_slots) {
    return Status::InvalidArgument("restore into table '" + config_.name + "': " +
                                   std::to_string(info.num_slots) + " slots (at most " +
                                   std::to_string(kMaxSlots) + ")");
  }
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  std::string what;
  bool keep_slots;
  if (slot_values_known_ && !slots_from_checkpoint_) {
    // An optimizer already trains this table: keep its slots only if they are the same.
    keep_slots = info.num_slots == num_slots_ && info.optimizer == slot_optimizer_;
    if (keep_slots) {
      what = info.num_slots > 0 ? "slots of '" + info.optimizer + "' restored" : "";
    } else {
      what = "the checkpoint's slots" +
             (info.optimizer.empty() ? std::string() : " of optimizer '" + info.optimizer + "'") +
             " were dropped: the table is trained by '" + slot_optimizer_ +
             "', whose slots start from their initial values";
    }
  } else {
    keep_slots = true;
    if (info.num_slots != num_slots_) {
      std::lock_guard<std::mutex> lock(alloc_mu_);
      REC_SDK_RETURN_IF_ERROR(RelayoutLocked(info.num_slots, info.slot_initial.data()));
    }
    for (int s = 0; s < info.num_slots; ++s) slot_initial_values_[s] = info.slot_initial[s];
    slot_optimizer_ = info.optimizer;
    slot_values_known_ = info.num_slots > 0;
    slots_from_checkpoint_ = info.num_slots > 0;
    if (info.num_slots > 0) what = "slots of '" + info.optimizer + "' restored";
  }
  ClearLocked();
  checkpoint_id_ = 0;  // until the restore succeeds: an emptied table holds no checkpoint
  // Size the index for the rows to come (one rehash instead of one per doubling).
  for (int s = 0; s < HashIndex::kNumShards; ++s) {
    index_.shard(s).Reserve(static_cast<size_t>(info.rows / HashIndex::kNumShards * 11 / 10));
  }
  admitted_.store(info.admitted);
  rejected_.store(info.rejected);
  evicted_.store(info.evicted);
  tick_.store(info.tick);
  newest_clock_.store(info.has_clock ? info.newest_clock : kNoClock);

  RowSink sink(this, keep_slots, /*upsert=*/false);
  Status status = feed(&sink);
  sink.ReleaseUnused();
  if (!status.ok()) {
    ClearLocked();
    return status;
  }
  ResetChangesLocked();  // the table now equals the checkpoint
  checkpoint_id_ = info.save_id;
  committed_version_ = version_.load(std::memory_order_relaxed);
  if (note != nullptr) *note = what;
  return Status::Ok();
}

Status EmbeddingTable::ApplyDelta(const CheckpointInfo& info, bool cleared,
                                  const std::vector<int64_t>& removed,
                                  const std::function<Status(RestoreSink*)>& feed) {
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  if (info.num_slots != num_slots_ || (info.num_slots > 0 && info.optimizer != slot_optimizer_)) {
    return Status::FailedPrecondition(
        "delta checkpoint for table '" + config_.name + "' has " +
        std::to_string(info.num_slots) + " slots of optimizer '" + info.optimizer +
        "' but the table has " + std::to_string(num_slots_) + " of '" + slot_optimizer_ +
        "': apply deltas onto the full checkpoint they follow");
  }
  if (info.parent_id != checkpoint_id_) {
    return Status::FailedPrecondition(
        "delta checkpoint " + std::to_string(info.save_id) + " of table '" + config_.name +
        "' follows checkpoint " + std::to_string(info.parent_id) + " but the table holds " +
        std::to_string(checkpoint_id_) + ": restore the full checkpoint it follows and apply "
        "every delta in order");
  }
  if (cleared) ClearLocked();
  for (const int64_t key : removed) {
    const uint64_t hash = HashIndex::Hash(key);
    const int64_t entry = index_.shard(HashIndex::ShardOf(hash)).Erase(key, hash);
    if (entry < 0) continue;
    const int64_t row = RowOfEntry(entry);
    KillRowLocked(MetaOf(row));
    size_.fetch_sub(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(alloc_mu_);
    free_rows_.push_back(row);
  }
  // The delta carries the whole pending set.
  for (int s = 0; s < HashIndex::kNumShards; ++s) pending_[s].Clear();
  pending_size_.store(0);
  admitted_.store(info.admitted);
  rejected_.store(info.rejected);
  evicted_.store(info.evicted);
  tick_.store(info.tick);
  newest_clock_.store(info.has_clock ? info.newest_clock : kNoClock);
  RowSink sink(this, /*keep_slots=*/true, /*upsert=*/true);
  Status status = feed(&sink);
  sink.ReleaseUnused();
  if (!status.ok()) {
    ClearLocked();
    checkpoint_id_ = 0;  // emptied: it holds no checkpoint, no delta applies to it
    return status;
  }
  ResetChangesLocked();
  checkpoint_id_ = info.save_id;
  committed_version_ = version_.load(std::memory_order_relaxed);
  return Status::Ok();
}

Status EmbeddingTable::UpdateRows(const int64_t* addresses, int64_t n, int64_t cost_per_row,
                                  const RowUpdate& update, const ParallelRunner& run) {
  ChangeScope change(this);
  std::shared_lock<std::shared_mutex> structure(structure_mu_);
  std::vector<int64_t> rows(n);
  std::mutex error_mu;
  Status error;
  run(n, 20, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      if (i + kPrefetchDistance < last) PrefetchRow(addresses[i + kPrefetchDistance]);
      Status s = DecodeAddress(addresses[i], &rows[i]);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (error.ok()) error = s;
        return;
      }
    }
  });
  REC_SDK_RETURN_IF_ERROR(error);
  const int num_slots = num_slots_;
  // Prefetch whole records (up to 4 cache lines; longer rows stream sequentially anyway).
  const size_t prefetch_bytes = std::min<size_t>(row_bytes_, 256);
  run(n, cost_per_row, [&](int64_t first, int64_t last) {
    float* slots[kMaxSlots];
    for (int64_t i = first; i < last; ++i) {
      if (i + kPrefetchDistance < last && rows[i + kPrefetchDistance] >= 0) {
        const char* ahead = RecordOf(rows[i + kPrefetchDistance]);
        for (size_t b = 0; b < prefetch_bytes; b += 64) __builtin_prefetch(ahead + b, 1);
      }
      const int64_t row = rows[i];
      if (row < 0) continue;
      float* value = ValueOf(row);
      for (int s = 0; s < num_slots; ++s) slots[s] = SlotOf(value, s);
      update(i, value, slots);
      MarkChanged(row);
    }
  });
  return Status::Ok();
}

Status EmbeddingTable::Export(const ExportAllocator& allocate) {
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  std::lock_guard<std::mutex> lock(alloc_mu_);
  const int64_t n = size_.load();
  int64_t* keys = nullptr;
  float* values = nullptr;
  float* slots = nullptr;
  REC_SDK_RETURN_IF_ERROR(allocate(n, &keys, &values, &slots));
  const int dim = config_.dim;
  int64_t out = 0;
  for (int64_t row = 0; row < next_row_ && out < n; ++row) {
    const RowMeta& meta = MetaOf(row);
    if (!meta.alive) continue;
    float* value = ValueOf(row);
    keys[out] = meta.key;
    std::memcpy(values + out * dim, value, dim * sizeof(float));
    for (int s = 0; s < num_slots_; ++s) {
      std::memcpy(slots + (s * n + out) * dim, SlotOf(value, s), dim * sizeof(float));
    }
    ++out;
  }
  return Status::Ok();
}

Status EmbeddingTable::Import(const int64_t* keys, const float* values, const float* slots,
                              int num_slots, int64_t n) {
  ChangeScope change(this);
  if (slots != nullptr && (num_slots < 0 || num_slots > kMaxSlots)) {
    return Status::InvalidArgument("import into table '" + config_.name + "': " +
                                   std::to_string(num_slots) + " slot arrays given, at most " +
                                   std::to_string(kMaxSlots) + " allowed");
  }
  if (slots == nullptr) num_slots = 0;
  if (n > max_rows_) {
    return Status::ResourceExhausted("import of " + std::to_string(n) + " rows into table '" +
                                     config_.name + "' exceeds its capacity of " +
                                     std::to_string(max_rows_) + " rows");
  }
  // One exclusive section: no other operation sees a half-imported table.
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  if (num_slots > 0 && slot_values_known_ && num_slots != num_slots_) {
    return Status::InvalidArgument(
        "import into table '" + config_.name + "': " + std::to_string(num_slots) +
        " slot arrays given but its optimizer '" + slot_optimizer_ + "' has " +
        std::to_string(num_slots_));
  }
  if (num_slots > num_slots_) {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    // Placeholder initial values: the imported rows get their slots below, and rows added
    // before the optimizer's EnsureSlots are marked slots_unset.
    const float zeros[kMaxSlots] = {0, 0, 0, 0};
    REC_SDK_RETURN_IF_ERROR(RelayoutLocked(num_slots, zeros));
  }
  ClearLocked();
  std::vector<int64_t> rows;
  AllocateRows(n, &rows);
  size_t used = 0;
  const int dim = config_.dim;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t hash = HashIndex::Hash(keys[i]);
    HashIndex::Shard& shard = index_.shard(HashIndex::ShardOf(hash));
    const int64_t entry = shard.Find(keys[i], hash);  // set when keys[i] repeats
    int64_t row;
    if (entry >= 0) {
      row = RowOfEntry(entry);
    } else {
      if (used == rows.size()) {
        ReleaseRows(rows.data() + used, rows.size() - used);
        size_.fetch_add(static_cast<int64_t>(used), std::memory_order_relaxed);
        return Status::ResourceExhausted(FullMessage());
      }
      row = rows[used++];
      InitializeRowLocked(row, keys[i], ClockForNewRows());
      shard.Insert(keys[i], hash, IndexEntry(row, MetaOf(row).generation));
    }
    float* value = ValueOf(row);
    std::memcpy(value, values + i * dim, dim * sizeof(float));
    for (int s = 0; s < num_slots; ++s) {
      std::memcpy(SlotOf(value, s), slots + (s * n + i) * dim, dim * sizeof(float));
    }
    if (num_slots > 0 && num_slots == num_slots_) MetaOf(row).slots_unset = 0;
  }
  size_.fetch_add(static_cast<int64_t>(used), std::memory_order_relaxed);
  if (used < rows.size()) ReleaseRows(rows.data() + used, rows.size() - used);
  return Status::Ok();
}

}  // namespace rec_sdk
