#include "tf_ops/core/embedding_table.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <chrono>
#include <random>

#include "tf_ops/core/unique.h"

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

}  // namespace

EmbeddingTable::EmbeddingTable(const TableConfig& config)
    : config_(config),
      chunk_shift_(ChunkShiftFor(config.dim)),
      tag_(NextTableTag()),
      max_rows_(config.dynamic_expansion ? kMaxCapacity : config.capacity),
      emb_bytes_((size_t(config.dim) * RowDtypeBytes(config.emb_dtype) + 3) / 4 * 4),
      index_(config.index_seed != 0 ? config.index_seed : HashIndex::RandomSeed()),
      pages_(new std::atomic<DirectoryPage*>[kMaxPages]),
      slot_width_(config.dim),
      tier_(this) {
  for (int64_t i = 0; i < kMaxPages; ++i) pages_[i].store(nullptr, std::memory_order_relaxed);
  dir_.pages = pages_.get();
  dir_.chunk_shift = chunk_shift_;
  dir_.row_bytes = RowBytesFor(0, config.dim);
  pending_.set_seed(index_.seed());
  if (config.compact_index()) index_.set_rows(&dir_);
  admission_.track_access.store(config.track_access, std::memory_order_relaxed);
}

Status EmbeddingTable::Create(const TableConfig& config, std::unique_ptr<EmbeddingTable>* table) {
  if (config.name.empty()) return Status::InvalidArgument("table name must not be empty");
  if (config.dim < 1 || config.dim > kMaxDim) {
    return Status::InvalidArgument("table '" + config.name + "': dim must be in [1, " +
                                   std::to_string(kMaxDim) + "], got " +
                                   std::to_string(config.dim));
  }
  if (!config.dynamic_expansion && (config.capacity < 1 || config.capacity > kMaxCapacity)) {
    return Status::InvalidArgument("table '" + config.name + "': capacity must be in [1, " +
                                   std::to_string(kMaxCapacity) + "], got " +
                                   std::to_string(config.capacity));
  }
  if (config.initial_capacity < 0 || config.initial_capacity > kMaxCapacity) {
    return Status::InvalidArgument("table '" + config.name + "': initial_capacity must be in [0, " +
                                   std::to_string(kMaxCapacity) + "], got " +
                                   std::to_string(config.initial_capacity));
  }
  if (!IsSlotDtype(config.slot_dtype)) {
    return Status::InvalidArgument("table '" + config.name +
                                   "': slot_dtype must be float32 or "
                                   "bfloat16, got float16 (squared gradients below 6e-8 would "
                                   "vanish in optimizer accumulators)");
  }
  REC_SDK_RETURN_IF_ERROR(config.initializer.Validate());
  if (!config.initializer.values.empty() &&
      config.initializer.values.size() != static_cast<size_t>(config.dim)) {
    return Status::InvalidArgument("table '" + config.name +
                                   "': the constant initializer's init_values has " +
                                   std::to_string(config.initializer.values.size()) +
                                   " values, the table's dim is " + std::to_string(config.dim));
  }
  {
    const Status layout = CheckIndexLayout(config);
    if (!layout.ok())
      return Status::InvalidArgument("table '" + config.name +
                                     "': index_layout=" + layout.message());
  }
  if (config.tiered()) {
    if (config.dynamic_expansion) {
      return Status::InvalidArgument("table '" + config.name +
                                     "': an SSD tier needs a fixed "
                                     "number of rows in memory (capacity); it cannot be used "
                                     "with dynamic expansion");
    }
    if (config.ssd_rows < 0) {
      return Status::InvalidArgument("table '" + config.name +
                                     "': ssd_rows must be >= 0 (0: "
                                     "no bound), got " +
                                     std::to_string(config.ssd_rows));
    }
  }
  std::unique_ptr<EmbeddingTable> t(new EmbeddingTable(config));
  if (config.tiered()) {
    std::unique_ptr<ColdTier> store;
    REC_SDK_RETURN_IF_ERROR(t->tier_.OpenColdTier(t->dir_.row_bytes, &store));
    t->tier_.store = std::move(store);
  }
  const int64_t reserve = config.dynamic_expansion ? config.initial_capacity : config.capacity;
  REC_SDK_RETURN_IF_ERROR(t->CheckReservation(reserve));
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
  if (generation == kColdGeneration) {
    return Status::InvalidArgument("address " + std::to_string(address) + " of table '" +
                                   config_.name +
                                   "' names a row on SSD (an evaluation "
                                   "lookup's address): it can be gathered, not updated");
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

std::string EmbeddingTable::FullMessage() const {
  if (config_.tiered()) {
    return "table '" + config_.name + "' is full: it holds " + std::to_string(config_.capacity) +
           " rows in memory and its SSD capacity of " + std::to_string(config_.ssd_rows) +
           " rows. Raise ssd_vocabulary_size, or configure eviction (evict_when_full or an "
           "eviction threshold).";
  }
  if (config_.dynamic_expansion) {
    return "table '" + config_.name + "' cannot grow past " + std::to_string(Capacity()) +
           " rows: out of memory (or at the limit of " + std::to_string(kMaxPages * kPageSize) +
           " chunks)";
  }
  return "table '" + config_.name + "' is full: it holds its capacity of " +
         std::to_string(config_.capacity) +
         " rows. Raise device_vocabulary_size/host_vocabulary_size, turn on "
         "use_dynamic_expansion, or configure eviction.";
}

void EmbeddingTable::InitializeRowLocked(int64_t row, int64_t key, int64_t last_seen) {
  char* record = RecordOf(row);
  if (config_.emb_dtype == RowDtype::kFloat32) {
    InitializeRow(config_.initializer, key, config_.dim,
                  reinterpret_cast<float*>(EmbeddingIn(record)));
  } else {
    thread_local std::vector<float> initial;
    initial.resize(config_.dim);
    InitializeRow(config_.initializer, key, config_.dim, initial.data());
    WriteEmbedding(record, initial.data());
  }
  for (int s = 0; s < num_slots_; ++s) FillSlot(record, s, slots_.initial_values[s]);
  MarkChanged(row);
  RowMeta& meta = MetaOf(row);
  meta.key = key;
  meta.last_seen = last_seen;
  meta.count = 0;
  meta.slots_unset = num_slots_ > 0 && !slots_.values_known;
  __atomic_store_n(&meta.alive, 1, __ATOMIC_RELEASE);
}

void EmbeddingTable::KillRowLocked(RowMeta& meta) {
  // Readers validating an address read alive and generation without the shard lock.
  __atomic_store_n(&meta.alive, 0, __ATOMIC_RELAXED);
  // kColdGeneration marks the addresses of cold rows: rows never have it.
  const uint16_t next = static_cast<uint16_t>((meta.generation + 1) % kColdGeneration);
  __atomic_store_n(&meta.generation, next, __ATOMIC_RELEASE);
}

void EmbeddingTable::PrefetchRow(int64_t address) const {
  if (address < 0) return;
  const int64_t row = address & (kMaxRows - 1);
  if (row >= allocated_rows_.load(std::memory_order_relaxed)) return;
  const char* record = RecordOf(row);
  __builtin_prefetch(record);
  if (sizeof(RowMeta) + emb_bytes_ > 64) __builtin_prefetch(record + 64);
}

void EmbeddingTable::FreeRow(int64_t row) {
  const int64_t key = MetaOf(row).key;
  KillRowLocked(MetaOf(row));
  size_.fetch_sub(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(alloc_mu_);
  free_rows_.push_back(row);
  if (config_.track_changes) changes_.NoteRemoved(key);
}

void EmbeddingTable::RaiseNewestClock(int64_t clock) {
  int64_t seen = admission_.newest_clock.load(std::memory_order_relaxed);
  while (clock > seen && !admission_.newest_clock.compare_exchange_weak(seen, clock)) {
  }
}

int64_t EmbeddingTable::ClockForNewRows() const {
  const int64_t newest = admission_.newest_clock.load(std::memory_order_relaxed);
  return newest == kNoClock ? 0 : newest;
}

Status EmbeddingTable::FindOrInsert(const int64_t* keys, int64_t n, bool insert, int64_t* addresses,
                                    const ParallelRunner& run, const KeyAccess& access,
                                    float* rows) {
  ChangeScope change(&changes_, insert);
  if (!insert) {
    std::shared_lock<std::shared_mutex> structure(structure_mu_);
    return FindRowsLocked(keys, n, addresses, run, rows);
  }
  if (tiered()) {
    REC_SDK_RETURN_IF_ERROR(tier_.TieredFindOrInsert(keys, n, addresses, run, access));
    return rows == nullptr ? Status::Ok() : Gather(addresses, n, rows, run);
  }
  const int64_t tick = admission_.tick.fetch_add(1, std::memory_order_relaxed) + 1;
  int64_t unplaced = 0;
  {
    std::shared_lock<std::shared_mutex> structure(structure_mu_);
    InsertPass(keys, n, addresses, access, tick, /*count=*/true, &unplaced, run);
    // The rows of the addresses just placed, in the same hold: nothing freed them since.
    if (unplaced == 0 && rows != nullptr) CopyRowsLocked(addresses, n, rows, run);
  }
  if (unplaced == 0) return Status::Ok();
  // Not every new key found a free row, and none was placed. Try again in one exclusive hold
  // (concurrent lookups of the table may have placed some of the keys, or freed rows), then,
  // for an evict_when_full table, make room for this batch and a little more (so that a
  // full table does not evict on every step) and place it: a concurrent lookup (two features
  // sharing the table) cannot take the rows evicted for this batch before it is placed.
  const bool evicts = config_.evict_when_full && !config_.dynamic_expansion;
  {
    std::unique_lock<std::shared_mutex> structure(structure_mu_);
    unplaced = 0;
    InsertPass(keys, n, addresses, access, tick, /*count=*/false, &unplaced, run);
    // Rows of the table's last kProtectedTicks lookups are spared, counted from the newest
    // tick: lookups that started after this one may be using theirs. Nothing is evicted when
    // the batch could not fit anyway.
    const int64_t newest_tick =
        access.times == nullptr ? admission_.tick.load(std::memory_order_relaxed) : 0;
    if (unplaced > 0 && evicts &&
        EvictLeastRecentLocked(unplaced + std::max<int64_t>(1, config_.capacity / 100), unplaced,
                               keys, n, newest_tick)) {
      unplaced = 0;
      InsertPass(keys, n, addresses, access, tick, /*count=*/false, &unplaced, run);
    }
    if (unplaced == 0 && rows != nullptr) CopyRowsLocked(addresses, n, rows, run);
  }
  if (unplaced > 0) {
    return Status::ResourceExhausted(
        FullMessage() + (evicts ? " (a batch holds more new keys than the table's capacity "
                                  "can take even after eviction; nothing was evicted)"
                                : ""));
  }
  return Status::Ok();
}

Status EmbeddingTable::Lookup(const int64_t* keys, int64_t n, bool init_missing, float* out,
                              bool* exists, const ParallelRunner& run, int slot,
                              float slot_default) {
  std::shared_lock<std::shared_mutex> structure(structure_mu_);
  if (slot >= 0 && num_slots_ == 0) {
    index_.ForEachKeyByShard(
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
  std::mutex error_mu;
  Status error;
  index_.ForEachKeyByShard(
      keys, n, 60 + 2 * dim,
      [&](HashIndex::Shard& shard, int64_t i, uint64_t hash) {
        const int64_t entry = shard.Find(keys[i], hash);
        const bool found = entry >= 0;
        float* dst = out + i * dim;
        // A cold entry holds no row id: its record is read from the tier, and RecordOf would
        // index the chunk directory with garbage.
        const char* record = nullptr;
        if (found && !TableTier::IsCold(entry)) record = RecordOf(RowOfEntry(entry));
        if (found && TableTier::IsCold(entry)) {
          // A cold row is read from its record, not promoted.
          thread_local std::vector<char> cold;
          cold.resize(dir_.row_bytes);
          Status s = tier_.ReadColdRecord(entry, keys[i], cold.data());
          if (!s.ok()) {
            std::lock_guard<std::mutex> lock(error_mu);
            if (error.ok()) error = s;
            return;
          }
          record = cold.data();
        }
        if (slot >= 0) {
          if (found && slot_width_ == 1) {
            float value;  // a row-wise slot: one value
            DecodeRow(SlotDtypeFor(1), SlotIn(record, slot), 1, &value);
            std::fill_n(dst, dim, value);  // one value per row, repeated
          } else if (found) {
            ReadSlot(record, slot, dst);
          } else {
            std::fill_n(dst, dim, init_missing ? slots_.initial_values[slot] : 0.0f);
          }
        } else if (found) {
          ReadEmbedding(record, dst);
        } else if (init_missing) {
          // What a new row would hold: the initial values in the table's precision.
          InitializeRow(config_.initializer, keys[i], dim, dst);
          RoundToTable(dst);
        } else {
          std::fill_n(dst, dim, 0.0f);
        }
        if (exists != nullptr) exists[i] = found;
      },
      run);
  return error;
}

Status EmbeddingTable::UpdateRows(const int64_t* addresses, int64_t n, int64_t cost_per_row,
                                  const RowUpdate& update, const ParallelRunner& run) {
  std::lock_guard<std::mutex> serialize(update_mu_);
  ChangeScope change(&changes_);
  std::shared_lock<std::shared_mutex> structure(structure_mu_);
  update_step_.fetch_add(1, std::memory_order_relaxed);
  return UpdateRowsLocked(addresses, n, cost_per_row, update, run);
}

Status EmbeddingTable::ApplyUpdate(const SlotLayout& layout, const int64_t* addresses, int64_t n,
                                   int64_t cost_per_row, const RowUpdate& update,
                                   const ParallelRunner& run) {
  std::lock_guard<std::mutex> serialize(update_mu_);
  ChangeScope change(&changes_);
  update_step_.fetch_add(1, std::memory_order_relaxed);
  {
    std::shared_lock<std::shared_mutex> structure(structure_mu_);
    if (SlotsReadyLocked(layout.optimizer, layout.initial_values, layout.width)) {
      return UpdateRowsLocked(addresses, n, cost_per_row, update, run);
    }
  }
  // The first update of this optimizer: validate, attach the slots and update in one
  // exclusive hold, so a failure leaves the table unbound and nothing can go stale between.
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  std::vector<int64_t> rows(n);
  REC_SDK_RETURN_IF_ERROR(DecodeAddresses(addresses, n, rows.data(), run));
  REC_SDK_RETURN_IF_ERROR(EnsureSlotsLocked(layout.optimizer, layout.initial_values, layout.width));
  WriteRowsLocked(rows.data(), n, cost_per_row, update, run);
  return Status::Ok();
}

Status EmbeddingTable::DecodeAddresses(const int64_t* addresses, int64_t n, int64_t* rows,
                                       const ParallelRunner& run) const {
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
  return error;
}

Status EmbeddingTable::UpdateRowsLocked(const int64_t* addresses, int64_t n, int64_t cost_per_row,
                                        const RowUpdate& update, const ParallelRunner& run) {
  std::vector<int64_t> rows(n);
  REC_SDK_RETURN_IF_ERROR(DecodeAddresses(addresses, n, rows.data(), run));
  WriteRowsLocked(rows.data(), n, cost_per_row, update, run);
  return Status::Ok();
}

void EmbeddingTable::WriteRowsLocked(const int64_t* rows, int64_t n, int64_t cost_per_row,
                                     const RowUpdate& update, const ParallelRunner& run) {
  const int num_slots = num_slots_;
  // Prefetch whole records (up to 4 cache lines; longer rows stream sequentially anyway).
  const size_t prefetch_bytes = std::min<size_t>(dir_.row_bytes, 256);
  const RowDtype dtype = config_.emb_dtype;
  const int dim = config_.dim;
  const uint64_t seed = config_.initializer.seed;
  const uint64_t step = update_step_.load(std::memory_order_relaxed);
  const RowDtype slot_dtype = SlotDtypeFor(slot_width_);
  const int slot_width = slot_width_;
  run(n, cost_per_row, [&](int64_t first, int64_t last) {
    float* slots[kMaxSlots];
    thread_local std::vector<float> scratch;
    if (dtype != RowDtype::kFloat32) scratch.resize(dim);
    thread_local std::vector<float> slot_scratch;
    if (slot_dtype != RowDtype::kFloat32) {
      slot_scratch.resize(size_t(num_slots) * slot_width);
      for (int s = 0; s < num_slots; ++s) slots[s] = slot_scratch.data() + s * slot_width;
    }
    for (int64_t i = first; i < last; ++i) {
      if (i + kPrefetchDistance < last && rows[i + kPrefetchDistance] >= 0) {
        const char* ahead = RecordOf(rows[i + kPrefetchDistance]);
        for (size_t b = 0; b < prefetch_bytes; b += 64) __builtin_prefetch(ahead + b, 1);
      }
      const int64_t row = rows[i];
      if (row < 0) continue;
      char* record = RecordOf(row);
      if (dtype == RowDtype::kFloat32 && slot_dtype == RowDtype::kFloat32) {
        for (int s = 0; s < num_slots; ++s) slots[s] = reinterpret_cast<float*>(SlotIn(record, s));
        update(i, reinterpret_cast<float*>(EmbeddingIn(record)), slots);
        MarkChanged(row);
        continue;
      }
      // Updated in float32, the half-precision parts rounded back stochastically: the
      // embedding's elements first, then each slot's (RoundingBits).
      const RoundingBits bits(seed, MetaOf(row).key, step);
      float* value = reinterpret_cast<float*>(EmbeddingIn(record));
      if (dtype != RowDtype::kFloat32) {
        ReadEmbedding(record, scratch.data());
        value = scratch.data();
      }
      if (slot_dtype == RowDtype::kFloat32) {
        for (int s = 0; s < num_slots; ++s) slots[s] = reinterpret_cast<float*>(SlotIn(record, s));
      } else {
        for (int s = 0; s < num_slots; ++s) ReadSlot(record, s, slots[s]);
      }
      update(i, value, slots);
      if (dtype != RowDtype::kFloat32) {
        EncodeRowStochastic(dtype, value, dim, bits, EmbeddingIn(record));
      }
      if (slot_dtype != RowDtype::kFloat32) {
        for (int s = 0; s < num_slots; ++s) {
          EncodeRowStochastic(slot_dtype, slots[s], slot_width, bits, SlotIn(record, s),
                              int64_t{s + 1} * dim);
        }
      }
      MarkChanged(row);
    }
  });
}

}  // namespace rec_sdk
