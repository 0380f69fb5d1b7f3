// FileColdTier: the ColdTier (cold_tier.h) of record files, an adapter over ColdStore that
// turns its Locations into the record ids the table keeps (ColdStore::Number / AtNumber).
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "tf_ops/core/cold_store.h"

namespace rec_sdk {
namespace {

class FileColdTier : public ColdTier {
 public:
  explicit FileColdTier(std::unique_ptr<ColdStore> store) : store_(std::move(store)) {}

  size_t record_bytes() const override { return store_->record_bytes(); }
  uint64_t live() const override { return store_->live(); }
  Stats stats() const override {
    const ColdStore::Stats s = store_->stats();
    Stats out;
    out.live = s.live;
    out.stale = s.stale;
    out.bytes_written = s.bytes_written;
    out.bytes_read = s.bytes_read;
    out.file_bytes = store_->file_bytes();
    out.memory_bytes = store_->memory_bytes();
    return out;
  }
  Status AppendBatch(size_t n, const uint64_t* keys, const void* const* records,
                     const int64_t* tags, uint64_t* ids) override {
    std::vector<ColdStore::Location> where(n);
    REC_SDK_RETURN_IF_ERROR(store_->AppendBatch(n, keys, records, tags, where.data()));
    for (size_t i = 0; i < n; ++i) ids[i] = store_->Number(where[i]);
    return Status::Ok();
  }
  bool IsLive(uint64_t id) const override { return store_->IsLive(At(id)); }
  Status Read(uint64_t id, void* record, uint64_t* key) const override {
    return store_->Read(At(id), record, key);
  }
  Status ReadKey(uint64_t id, uint64_t* key) const override { return store_->ReadKey(At(id), key); }
  Status ReadMany(size_t n, const uint64_t* ids, void* const* records,
                  uint64_t* keys) const override {
    std::vector<ColdStore::Location> where(n);
    for (size_t i = 0; i < n; ++i) where[i] = At(ids[i]);
    return store_->ReadMany(n, where.data(), records, keys);
  }
  Status PinMany(size_t n, const uint64_t* ids, std::unique_ptr<Pinned>* out) const override {
    std::unique_ptr<Pins> pins(new Pins);
    pins->records.resize(n);
    for (size_t i = 0; i < n; ++i) {
      REC_SDK_RETURN_IF_ERROR(store_->Pin(At(ids[i]), &pins->records[i]));
    }
    *out = std::move(pins);
    return Status::Ok();
  }
  Status ReadPinned(const Pinned& pinned, void* const* records, uint64_t* keys) const override {
    const Pins& pins = static_cast<const Pins&>(pinned);
    return store_->ReadManyPinned(pins.records.size(), pins.records.data(), records, keys);
  }
  Status Remove(uint64_t id) override { return store_->Remove(At(id)); }
  bool NeedsCompaction() const override { return store_->NeedsCompaction(); }
  Status Compact(const MoveFn& moved) override {
    return store_->Compact([&](uint64_t key, ColdStore::Location from, ColdStore::Location to) {
      moved(key, store_->Number(from), store_->Number(to));
    });
  }
  void Clear() override { store_->Clear(); }
  Status ForEachLive(const RecordFn& fn) const override {
    return store_->ForEachLive([&](uint64_t key, ColdStore::Location where, const void* record) {
      return fn(key, store_->Number(where), record);
    });
  }
  void ForEachLiveTag(const std::function<void(uint64_t id, int64_t tag)>& fn) const override {
    store_->ForEachLiveTag(
        [&](ColdStore::Location where, int64_t tag) { fn(store_->Number(where), tag); });
  }
  int64_t tag(uint64_t id) const override { return store_->tag(At(id)); }
  uint8_t marks(uint64_t id) const override { return store_->marks(At(id)); }
  void set_marks(uint64_t id, uint8_t marks) override { store_->set_marks(At(id), marks); }
  void ClearMarks(uint8_t mask) override { store_->ClearMarks(mask); }

 private:
  struct Pins : Pinned {
    std::vector<ColdStore::Pinned> records;
  };
  ColdStore::Location At(uint64_t id) const { return store_->AtNumber(id); }
  std::unique_ptr<ColdStore> store_;
};

}  // namespace

Status OpenFileColdTier(const ColdStore::Options& options, std::unique_ptr<ColdTier>* out) {
  std::unique_ptr<ColdStore> store;
  REC_SDK_RETURN_IF_ERROR(ColdStore::Open(options, &store));
  out->reset(new FileColdTier(std::move(store)));
  return Status::Ok();
}

}  // namespace rec_sdk
