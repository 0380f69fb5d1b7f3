// The value types of a table's access statistics: what a training lookup tells the table
// about its keys (KeyAccess), what Restrict ranks rows by (RestrictBy), and the table's
// counters (TableStats, which the TableStats op returns in the order fixed here).
#ifndef REC_SDK_CORE_TABLE_STATS_H_
#define REC_SDK_CORE_TABLE_STATS_H_

#include <array>
#include <cstdint>

namespace rec_sdk {

// What Restrict() ranks rows by.
enum class RestrictBy { kLastSeen, kCount };

// What a training lookup tells the table about its keys, for admission and eviction.
struct KeyAccess {
  // Per key: how much its admission count grows (occurrences x faae_coefficient).
  // Null: 1 per key.
  const int64_t* counts = nullptr;
  // Clock values (data timestamps or global steps): per key when times_per_key, otherwise
  // times[0] for every key. Null: the table's own tick (one per training FindOrInsert).
  const int64_t* times = nullptr;
  bool times_per_key = false;
};

// Counters of one table since it was created (or last cleared, for size and pending).
struct TableStats {
  int64_t size = 0;          // keys with a row (in memory or on SSD)
  int64_t capacity = 0;      // as Capacity()
  int64_t admitted = 0;      // keys that got a row in a training lookup
  int64_t rejected = 0;      // training lookups of a key left without a row by admission
  int64_t evicted = 0;       // rows dropped by eviction (age or full table)
  int64_t pending = 0;       // keys counting towards admission, without a row yet
  int64_t newest_clock = 0;  // the newest clock value seen (0 before any)
  // The SSD tier (zero for tables without one): rows in memory and on SSD, rows moved each
  // way since the table was created, bytes the tier read and wrote, and bytes its files take.
  int64_t hot = 0;
  int64_t cold = 0;
  int64_t promotions = 0;
  int64_t demotions = 0;
  int64_t ssd_bytes_read = 0;
  int64_t ssd_bytes_written = 0;
  int64_t ssd_file_bytes = 0;
  int64_t prefetch_hits = 0;  // promotions served by records read ahead (PrefetchCold)

  // The counters in the order the TableStats op returns them, and their names (the op's
  // stat_names attribute, which Python reads): the one place that fixes the order.
  static constexpr int kCount = 15;
  static constexpr std::array<const char*, kCount> kNames = {"size",
                                                             "capacity",
                                                             "admitted",
                                                             "rejected",
                                                             "evicted",
                                                             "pending",
                                                             "newest_clock",
                                                             "hot",
                                                             "cold",
                                                             "promotions",
                                                             "demotions",
                                                             "ssd_bytes_read",
                                                             "ssd_bytes_written",
                                                             "ssd_file_bytes",
                                                             "prefetch_hits"};
  std::array<int64_t, kCount> Values() const {
    return {size,
            capacity,
            admitted,
            rejected,
            evicted,
            pending,
            newest_clock,
            hot,
            cold,
            promotions,
            demotions,
            ssd_bytes_read,
            ssd_bytes_written,
            ssd_file_bytes,
            prefetch_hits};
  }
};

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_TABLE_STATS_H_
