// The SSD tier of a table (config.tiered(); table_tier.cc).
//
// A tiered table keeps at most `capacity` rows in memory; the others are records in a
// ColdTier (cold_tier.h; record files, ColdStore, are its back end): the row's record bytes as
// they are in memory (header, embedding and slots). A key lives in exactly one tier: its
// index entry holds either a row (hot) or, with kColdEntry set, the record's id (cold).
// Training lookups run under the exclusive lock: the batch's cold keys are promoted first
// (records read many at once, or taken from what PrefetchCold read ahead, into free rows:
// addresses and the graph unchanged), then the lookup runs as in memory; when rows run out,
// the rows of lowest priority are demoted (written as one batch, freed, generation bumped):
// never a row of the lookup, rows of the last kProtectedTicks lookups only when the others
// are not enough, rows that just came in (probation) before rows used again. The tier changes
// no value, count or clock: a tiered table trains exactly as an all-in-memory one. Evaluation
// lookups read cold rows without promoting them (their addresses carry the record id with
// generation kColdGeneration, which only Gather accepts). Updates happen only in memory, so
// optimizers never see a cold row.
//
// TableTier is the tier's state in a table: the ColdTier behind it, the records PrefetchCold
// read ahead, and the tier's counters. The operations that move rows between the tiers are
// EmbeddingTable's (they change its index and rows).
#ifndef REC_SDK_CORE_TABLE_TIER_H_
#define REC_SDK_CORE_TABLE_TIER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tf_ops/core/cold_tier.h"

namespace rec_sdk {

struct TableTier {
  // Null: all in memory. Shared: PrefetchCold reads through it after releasing the table's
  // lock.
  std::shared_ptr<ColdTier> store;
  // Ticks of training lookups and upserts of a tiered table (the recency demotion goes by),
  // rows moved each way, and promotions served by records read ahead.
  std::atomic<int64_t> tick{0};
  std::atomic<int64_t> promotions{0};
  std::atomic<int64_t> demotions{0};
  std::atomic<int64_t> prefetch_hits{0};

  // Records read ahead by PrefetchCold: key -> (record number, record bytes), valid while the
  // key's index entry still names that record of the same store (staging_generation).
  struct Staged {
    uint64_t number;
    uint64_t generation;
    std::vector<char> record;
  };
  std::mutex staging_mu;
  std::unordered_map<int64_t, Staged> staged;  // guarded by staging_mu
  std::deque<int64_t> staged_order;            // oldest first; guarded by staging_mu
  std::atomic<uint64_t> staging_generation{1};
};

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_TABLE_TIER_H_
