// The keys counting towards admission (pending_keys.h).
#include "tf_ops/core/pending_keys.h"

namespace rec_sdk {

PendingKey* PendingShard::Add(int64_t key, uint64_t hash, int64_t last_seen) {
  int64_t i;
  if (!free_.empty()) {
    i = free_.back();
    free_.pop_back();
  } else {
    i = static_cast<int64_t>(records_.size());
    records_.emplace_back();
  }
  records_[i] = PendingKey{key, 0, last_seen};
  map_.Insert(key, hash, i);
  return &records_[i];
}

void PendingShard::Remove(int64_t key, uint64_t hash) {
  const int64_t i = map_.Erase(key, hash);
  if (i < 0) return;
  records_[i].count = -1;
  free_.push_back(i);
}

int64_t PendingShard::RemoveSeenAtOrBefore(int64_t cutoff) {
  int64_t removed = 0;
  for (size_t i = 0; i < records_.size(); ++i) {
    PendingKey& p = records_[i];
    if (p.count < 0 || p.last_seen > cutoff) continue;
    map_.Erase(p.key, map_.Hash(p.key));
    p.count = -1;
    free_.push_back(static_cast<int64_t>(i));
    ++removed;
  }
  // Give memory back once most records are free (e.g. after a burst of one-off keys).
  if (records_.size() > 1024 && static_cast<size_t>(map_.size()) * 4 < records_.size()) {
    std::vector<PendingKey> live;
    live.reserve(map_.size() * 2);
    for (const PendingKey& p : records_) {
      if (p.count >= 0) live.push_back(p);
    }
    Clear();
    for (const PendingKey& p : live) {
      PendingKey* q = Add(p.key, map_.Hash(p.key), p.last_seen);
      q->count = p.count;
    }
  }
  return removed;
}

void PendingShard::Clear() {
  map_.Clear();
  std::vector<PendingKey>().swap(records_);
  std::vector<int64_t>().swap(free_);
}

int64_t PendingKeys::RemoveSeenAtOrBefore(int64_t cutoff) {
  int64_t removed = 0;
  for (int s = 0; s < HashIndex::kNumShards; ++s) {
    removed += shards_[s].RemoveSeenAtOrBefore(cutoff);
  }
  Removed(removed);
  return removed;
}

}  // namespace rec_sdk
