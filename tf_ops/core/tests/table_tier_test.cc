// The SSD tier against an all-in-memory table: trained on the same batches (each optimizer,
// with admission and eviction, memory budgets of 1% to 50% of the keys), both hold exactly the
// same rows, slots, counts and clocks; checkpoints go both ways; evaluation lookups read cold
// rows without promoting them; a full disk fails a step and loses nothing.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tf_ops/core/checkpoint.h"
#include "tf_ops/core/sparse_optimizers.h"
#include "tf_ops/core/tests/table_test_util.h"
#include "tf_ops/core/unique.h"

namespace rec_sdk {
namespace {

using table_test::ExportAll;
using table_test::Fixed;
using table_test::MakeTable;
using table_test::RowContents;
using table_test::ThreadedRunner;
using table_test::ToMap;

std::string TempDir(const std::string& name) {
  std::string pattern = "/tmp/" + name + "_XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

TableConfig Tiered(const std::string& name, int dim, int64_t memory_rows, const std::string& dir,
                   int64_t ssd_rows = 0) {
  TableConfig c = Fixed(name, dim, memory_rows);
  c.ssd_paths = {dir};
  c.ssd_rows = ssd_rows;
  return c;
}

// Everything a table holds: rows with slots, last-seen clocks and counts, and its counters.
struct State {
  std::map<int64_t, RowContents> rows;
  std::map<int64_t, std::pair<int64_t, int64_t>> access;
  TableStats stats;
};

State StateOf(EmbeddingTable* t) {
  State s;
  s.rows = ToMap(ExportAll(t), t->dim());
  std::vector<int64_t> keys, last_seen, counts;
  EXPECT_TRUE(t->ExportAccess(&keys, &last_seen, &counts).ok());
  for (size_t i = 0; i < keys.size(); ++i) s.access[keys[i]] = {last_seen[i], counts[i]};
  s.stats = t->Stats();
  return s;
}

void ExpectSame(const State& a, const State& b, const std::string& where) {
  EXPECT_EQ(a.rows.size(), b.rows.size()) << where;
  EXPECT_TRUE(a.rows == b.rows) << where << ": rows or slots differ";
  EXPECT_TRUE(a.access == b.access) << where << ": clocks or counts differ";
  EXPECT_EQ(a.stats.size, b.stats.size) << where;
  EXPECT_EQ(a.stats.admitted, b.stats.admitted) << where;
  EXPECT_EQ(a.stats.rejected, b.stats.rejected) << where;
  EXPECT_EQ(a.stats.evicted, b.stats.evicted) << where;
  EXPECT_EQ(a.stats.pending, b.stats.pending) << where;
  EXPECT_EQ(a.stats.newest_clock, b.stats.newest_clock) << where;
}

// Zipf-distributed keys over [0, n) (scrambled, so hot keys are not small numbers).
class Zipf {
 public:
  Zipf(int64_t n, double s, uint64_t seed) : cdf_(n), rng_(seed) {
    double total = 0;
    for (int64_t r = 0; r < n; ++r) cdf_[r] = total += 1.0 / std::pow(r + 1.0, s);
    for (double& c : cdf_) c /= total;
  }
  int64_t Next() {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    const int64_t r = std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
    return (r * 2654435761LL) % 1000003 - 500000;  // negative keys too
  }

 private:
  std::vector<double> cdf_;
  std::mt19937_64 rng_;
};

enum class Optimizer { kSgd, kAdagrad, kLazyAdam, kFtrl, kMomentum, kRowwiseAdagrad };

Status Apply(Optimizer o, EmbeddingTable* t, const std::vector<int64_t>& addresses,
             const std::vector<float>& grads, int64_t step, const ParallelRunner& run) {
  const int64_t n = static_cast<int64_t>(addresses.size());
  switch (o) {
    case Optimizer::kSgd:
      return ApplyGradientDescent(t, addresses.data(), grads.data(), n, {0.1f, 0.0f}, run);
    case Optimizer::kAdagrad:
      return ApplyAdagrad(t, addresses.data(), grads.data(), n, {0.1f, 0.1f}, run);
    case Optimizer::kLazyAdam:
      return ApplyLazyAdam(t, addresses.data(), grads.data(), n, {0.01f, 0.9f, 0.999f, 1e-8f, step},
                           run);
    case Optimizer::kFtrl:
      return ApplyFtrl(t, addresses.data(), grads.data(), n,
                       {0.1f, -0.5f, 0.1f, 0.01f, 0.01f, 0.0f}, run);
    case Optimizer::kMomentum:
      return ApplyMomentum(t, addresses.data(), grads.data(), n, {0.1f, 0.9f, false}, run);
    case Optimizer::kRowwiseAdagrad:
      return ApplyRowwiseAdagrad(t, addresses.data(), grads.data(), n, {0.1f, 0.0f, 1e-8f}, run);
  }
  return Status::Ok();
}

// Trains tables on identical batches: each step looks up a Zipf batch (deduplicated, with
// per-key counts and a clock), checks the gathered rows agree, and applies a gradient that
// depends on the rows; with eviction, every 20th step evicts; every 7th step an evaluation
// lookup of other keys must agree too.
struct Trainer {
  Optimizer optimizer;
  int64_t batch = 64;
  bool admission = false;
  Zipf zipf{20000, 1.1, 3};
  int64_t step = 0;

  void Configure(EmbeddingTable* t) const {
    if (!admission) return;
    AdmissionConfig a;
    a.access_threshold = 2;
    a.eviction_threshold = 1500;
    ASSERT_TRUE(t->ConfigureAdmission(a).ok());
  }

  void Steps(int count, const std::vector<EmbeddingTable*>& tables) {
    const ParallelRunner run = ThreadedRunner(3);
    for (int k = 0; k < count; ++k) {
      ++step;
      std::map<int64_t, int64_t> occurrences;
      for (int64_t i = 0; i < batch; ++i) occurrences[zipf.Next()] += 1;
      std::vector<int64_t> keys, counts;
      for (const auto& [key, c] : occurrences) {
        keys.push_back(key);
        counts.push_back(c);
      }
      const int64_t clock = step * 10;
      KeyAccess access;
      access.counts = counts.data();
      access.times = &clock;
      std::vector<std::vector<float>> gathered;
      std::vector<std::vector<int64_t>> addresses;
      for (EmbeddingTable* t : tables) {
        std::vector<int64_t> addr(keys.size());
        Status s = t->FindOrInsert(keys.data(), keys.size(), true, addr.data(), run, access);
        ASSERT_TRUE(s.ok()) << t->name() << " step " << step << ": " << s.message();
        std::vector<float> rows(keys.size() * t->dim());
        s = t->Gather(addr.data(), addr.size(), rows.data(), run);
        ASSERT_TRUE(s.ok()) << s.message();
        gathered.push_back(rows);
        addresses.push_back(addr);
      }
      for (size_t j = 1; j < tables.size(); ++j) {
        ASSERT_EQ(gathered[j], gathered[0]) << "step " << step;
        for (size_t i = 0; i < keys.size(); ++i) {
          ASSERT_EQ(addresses[j][i] < 0, addresses[0][i] < 0) << "admission differs";
        }
      }
      std::vector<float> grads(gathered[0].size());
      for (size_t i = 0; i < grads.size(); ++i) {
        grads[i] = 0.3f * gathered[0][i] - 0.05f * static_cast<float>(i % 7) + 0.01f;
      }
      for (size_t j = 0; j < tables.size(); ++j) {
        Status s = Apply(optimizer, tables[j], addresses[j], grads, step, run);
        ASSERT_TRUE(s.ok()) << s.message();
      }
      if (admission && step % 20 == 0) {
        for (EmbeddingTable* t : tables) ASSERT_TRUE(t->Evict(nullptr, nullptr, run).ok());
      }
      if (step % 7 == 0) {
        std::vector<int64_t> probe;
        for (int i = 0; i < 50; ++i) probe.push_back(zipf.Next());
        std::vector<float> first;
        for (EmbeddingTable* t : tables) {
          std::vector<int64_t> addr(probe.size());
          ASSERT_TRUE(t->FindOrInsert(probe.data(), probe.size(), false, addr.data(), run).ok());
          std::vector<float> rows(probe.size() * t->dim());
          Status s = t->Gather(addr.data(), addr.size(), rows.data(), run);
          ASSERT_TRUE(s.ok()) << s.message();
          if (first.empty()) {
            first = rows;
          } else {
            ASSERT_EQ(rows, first) << "evaluation lookup, step " << step;
          }
        }
      }
    }
  }
};

class TierEquivalenceTest : public ::testing::TestWithParam<std::tuple<Optimizer, int, bool>> {};

TEST_P(TierEquivalenceTest, TrainsBitIdenticalToAllInMemory) {
  const auto [optimizer, percent, admission] = GetParam();
  const std::string dir = TempDir("tier_equivalence");
  auto memory = MakeTable(Fixed("memory", 8, 40000));
  // Distinct keys drawn over the run: about 4000, of which about 1500 are admitted and not
  // evicted; the budget is a share of them.
  const int64_t budget = std::max<int64_t>(100, (admission ? 1500 : 4000) * percent / 100);
  auto tiered = MakeTable(Tiered("tiered", 8, budget, dir));
  Trainer trainer{optimizer};
  trainer.admission = admission;
  trainer.Configure(memory.get());
  trainer.Configure(tiered.get());
  trainer.Steps(300, {memory.get(), tiered.get()});
  ExpectSame(StateOf(tiered.get()), StateOf(memory.get()), "after training");
  const TableStats stats = tiered->Stats();
  EXPECT_GT(stats.demotions, 0);
  EXPECT_GT(stats.promotions, 0);
  EXPECT_GT(stats.cold, 0);
  EXPECT_LE(stats.hot, budget);
  EXPECT_EQ(stats.hot + stats.cold, stats.size);
  tiered.reset();
  EXPECT_EQ(std::system(("rmdir '" + dir + "'").c_str()), 0) << "segment files left behind";
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, TierEquivalenceTest,
    ::testing::Combine(::testing::Values(Optimizer::kSgd, Optimizer::kAdagrad, Optimizer::kLazyAdam,
                                         Optimizer::kFtrl, Optimizer::kMomentum,
                                         Optimizer::kRowwiseAdagrad),
                       ::testing::Values(1, 10, 50), ::testing::Bool()));

// Half-precision rows through the tier: records carry the table's element type, training
// stays bit-identical to the same dtype all in memory (also with bfloat16 slots), and a
// checkpoint of a tiered bfloat16 table restores into a float32 table with the same values.
TEST(TierTest, HalfPrecisionRowsTrainIdenticallyThroughTheTier) {
  const std::pair<RowDtype, RowDtype> dtypes[] = {{RowDtype::kBFloat16, RowDtype::kFloat32},
                                                  {RowDtype::kFloat16, RowDtype::kFloat32},
                                                  {RowDtype::kBFloat16, RowDtype::kBFloat16}};
  for (const auto& [dtype, slot_dtype] : dtypes) {
    const std::string dir = TempDir("tier_half");
    const std::string files = TempDir("tier_half_files");
    TableConfig m = Fixed("memory", 8, 40000);
    TableConfig c = Tiered("tiered", 8, 200, dir);
    m.emb_dtype = c.emb_dtype = dtype;
    m.slot_dtype = c.slot_dtype = slot_dtype;
    auto memory = MakeTable(m);
    auto tiered = MakeTable(c);
    Trainer trainer{Optimizer::kLazyAdam};
    trainer.admission = true;
    trainer.Configure(memory.get());
    trainer.Configure(tiered.get());
    trainer.Steps(150, {memory.get(), tiered.get()});
    ExpectSame(StateOf(tiered.get()), StateOf(memory.get()), RowDtypeName(dtype));
    EXPECT_GT(tiered->Stats().cold, 0);
    ASSERT_TRUE(SaveTableFiles(tiered.get(), files + "/t", nullptr).ok());
    auto wide = MakeTable(Fixed("wide", 8, 40000));
    ASSERT_TRUE(
        RestoreTableFiles(wide.get(), {files + "/t"}, RestoreOptions(), nullptr, nullptr).ok());
    ExpectSame(StateOf(wide.get()), StateOf(memory.get()), "restored into float32");
    tiered.reset();
    EXPECT_EQ(std::system(("rm -rf '" + files + "' '" + dir + "'").c_str()), 0);
  }
}

TEST(TierTest, CheckpointsRestoreBothWaysAndTrainingGoesOnIdentically) {
  const std::string dir = TempDir("tier_checkpoint");
  const std::string files = TempDir("tier_files");
  auto memory = MakeTable(Fixed("m", 4, 40000));
  auto tiered = MakeTable(Tiered("t", 4, 150, dir));
  Trainer trainer{Optimizer::kLazyAdam};
  trainer.admission = true;
  trainer.Configure(memory.get());
  trainer.Configure(tiered.get());
  trainer.Steps(120, {memory.get(), tiered.get()});
  ASSERT_GT(tiered->Stats().cold, 0);
  // Tiered -> all in memory, and all in memory -> a tiered table with another budget.
  ASSERT_TRUE(SaveTableFiles(tiered.get(), files + "/from_tiered", nullptr).ok());
  ASSERT_TRUE(SaveTableFiles(memory.get(), files + "/from_memory", nullptr).ok());
  auto memory2 = MakeTable(Fixed("m2", 4, 40000));
  auto tiered2 = MakeTable(Tiered("t2", 4, 300, dir));
  ASSERT_TRUE(
      RestoreTableFiles(memory2.get(), {files + "/from_tiered"}, RestoreOptions(), nullptr, nullptr)
          .ok());
  Status s = RestoreTableFiles(tiered2.get(), {files + "/from_memory"}, RestoreOptions(), nullptr,
                               nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(tiered2->Stats().hot, 300);
  ExpectSame(StateOf(memory2.get()), StateOf(memory.get()), "tiered -> memory");
  ExpectSame(StateOf(tiered2.get()), StateOf(memory.get()), "memory -> tiered");
  trainer.Configure(memory2.get());
  trainer.Configure(tiered2.get());
  trainer.Steps(60, {memory.get(), tiered.get(), memory2.get(), tiered2.get()});
  const State expected = StateOf(memory.get());
  ExpectSame(StateOf(tiered.get()), expected, "tiered, trained on");
  ExpectSame(StateOf(memory2.get()), expected, "restored in memory, trained on");
  ExpectSame(StateOf(tiered2.get()), expected, "restored tiered, trained on");
  // A tiered checkpoint restores into a tiered table whose SSD capacity is too small: a
  // clear error.
  auto small = MakeTable(Tiered("small", 4, 100, dir, 10));
  s = RestoreTableFiles(small.get(), {files + "/from_tiered"}, RestoreOptions(), nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.message();
  EXPECT_EQ(std::system(("rm -rf '" + files + "'").c_str()), 0);
}

TEST(TierTest, DeltaCheckpointsCarryChangesOfColdRows) {
  const std::string dir = TempDir("tier_delta");
  const std::string files = TempDir("tier_delta_files");
  TableConfig config = Tiered("t", 4, 120, dir);
  config.track_changes = true;
  auto tiered = MakeTable(config);
  Trainer trainer{Optimizer::kAdagrad};
  trainer.Steps(40, {tiered.get()});
  int64_t id = 0;
  ASSERT_TRUE(SaveTableFiles(tiered.get(), files + "/full", nullptr, false, &id).ok());
  ASSERT_TRUE(tiered->CommitSave(id).ok());
  trainer.Steps(40, {tiered.get()});
  std::vector<int64_t> gone = {trainer.zipf.Next(), trainer.zipf.Next()};
  ASSERT_TRUE(tiered->Remove(gone.data(), gone.size(), nullptr, SerialRunner).ok());
  ASSERT_TRUE(SaveTableFiles(tiered.get(), files + "/delta", nullptr, /*delta=*/true).ok());
  auto memory = MakeTable(Fixed("m", 4, 40000));
  ASSERT_TRUE(
      RestoreTableFiles(memory.get(), {files + "/full"}, RestoreOptions(), nullptr, nullptr).ok());
  Status s = ApplyDeltaFiles(memory.get(), files + "/delta", nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_GT(tiered->Stats().cold, 0);
  ExpectSame(StateOf(memory.get()), StateOf(tiered.get()), "full + delta");
  EXPECT_EQ(std::system(("rm -rf '" + files + "'").c_str()), 0);
}

TEST(TierTest, EvaluationReadsColdRowsWithoutPromotingThem) {
  const std::string dir = TempDir("tier_eval");
  auto t = MakeTable(Tiered("t", 4, 100, dir));
  std::vector<int64_t> keys(500);
  for (int64_t i = 0; i < 500; ++i) keys[i] = i * 7;
  std::vector<float> values(500 * 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  for (int64_t first = 0; first < 500; first += 50) {
    ASSERT_TRUE(t->Upsert(keys.data() + first, values.data() + first * 4, 50, SerialRunner).ok());
  }
  EXPECT_EQ(t->Stats().cold, 400);
  const int64_t promotions = t->Stats().promotions;
  std::vector<int64_t> addresses(500);
  ASSERT_TRUE(t->FindOrInsert(keys.data(), 500, false, addresses.data(), SerialRunner).ok());
  std::vector<float> out(500 * 4);
  ASSERT_TRUE(t->Gather(addresses.data(), 500, out.data(), ThreadedRunner()).ok());
  EXPECT_EQ(out, values);
  std::vector<float> looked_up(500 * 4);
  ASSERT_TRUE(t->Lookup(keys.data(), 500, false, looked_up.data(), nullptr, ThreadedRunner()).ok());
  EXPECT_EQ(looked_up, values);
  EXPECT_EQ(t->Stats().promotions, promotions);
  // A cold address cannot be updated.
  int64_t cold_address = -1;
  for (int64_t a : addresses) {
    if (a >= 0 && ((a >> EmbeddingTable::kRowBits) & 0xfff) == 0xfff) cold_address = a;
  }
  ASSERT_GE(cold_address, 0);
  Status s =
      t->UpdateRows(&cold_address, 1, 1, [](int64_t, float*, float* const*) {}, SerialRunner);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(table_test::Contains(s.message(), "on SSD")) << s.message();
  // Removing cold keys deletes their records; Restrict ranks both tiers.
  ASSERT_TRUE(t->Remove(keys.data(), 100, nullptr, SerialRunner).ok());
  EXPECT_EQ(t->Size(), 400);
  int64_t removed = 0;
  ASSERT_TRUE(t->Restrict(150, RestrictBy::kLastSeen, &removed).ok());
  EXPECT_EQ(removed, 250);
  EXPECT_EQ(t->Size(), 150);
  EXPECT_EQ(t->Stats().hot + t->Stats().cold, 150);
  // The rows still held are the values upserted.
  const auto exported = ToMap(ExportAll(t.get()), 4);
  for (const auto& [key, row] : exported) {
    const int64_t i = key / 7;
    EXPECT_EQ(row[0], std::vector<float>(values.begin() + i * 4, values.begin() + i * 4 + 4));
  }
}

TEST(TierTest, AFullSsdTierIsAnErrorOrEvictsWithEvictWhenFull) {
  const std::string dir = TempDir("tier_full");
  auto t = MakeTable(Tiered("t", 4, 100, dir, 200));
  std::vector<int64_t> keys(400);
  for (int64_t i = 0; i < 400; ++i) keys[i] = i;
  std::vector<int64_t> addresses(50);
  Status s;
  int64_t first = 0;
  for (; first < 400 && s.ok(); first += 50) {
    s = t->FindOrInsert(keys.data() + first, 50, true, addresses.data(), SerialRunner);
  }
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.message();
  EXPECT_TRUE(table_test::Contains(s.message(), "SSD capacity")) << s.message();
  EXPECT_LE(t->Size(), 300);
  TableConfig config = Tiered("e", 4, 100, dir, 200);
  config.evict_when_full = true;
  auto e = MakeTable(config);
  for (first = 0; first < 400; first += 50) {
    s = e->FindOrInsert(keys.data() + first, 50, true, addresses.data(), SerialRunner);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  EXPECT_LE(e->Size(), 300);
  EXPECT_GT(e->Stats().evicted, 0);
  // The last batch is in memory.
  std::vector<int64_t> found(50);
  ASSERT_TRUE(e->FindOrInsert(keys.data() + 350, 50, false, found.data(), SerialRunner).ok());
  for (int64_t a : found) EXPECT_GE(a, 0);
}

TEST(TierTest, AFullDiskFailsTheStepAndLosesNothing) {
  const std::string dir = TempDir("tier_disk");
  auto t = MakeTable(Tiered("t", 16, 100, dir));
  Trainer trainer{Optimizer::kSgd};
  trainer.Steps(30, {t.get()});
  const State before = StateOf(t.get());
  // RLIMIT_FSIZE fails every write past the files' current sizes (as ENOSPC would).
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = old_limit;
  limit.rlim_cur = 1;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::vector<int64_t> fresh(100);
  for (int64_t i = 0; i < 100; ++i) fresh[i] = 10000000 + i;
  std::vector<int64_t> addresses(100);
  Status s = t->FindOrInsert(fresh.data(), 100, true, addresses.data(), SerialRunner);
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.message();
  EXPECT_TRUE(table_test::Contains(s.message(), "no row is lost")) << s.message();
  // Every row held before is still there, unchanged.
  const State after = StateOf(t.get());
  for (const auto& [key, row] : before.rows) {
    ASSERT_EQ(after.rows.count(key), 1u) << key;
    EXPECT_EQ(after.rows.at(key), row) << key;
  }
  // With room again, training goes on.
  trainer.Steps(10, {t.get()});
}

TEST(TierTest, SlotsAttachedAfterARestoreWithoutSlotsReachColdRows) {
  const std::string dir = TempDir("tier_slots");
  std::vector<int64_t> keys(300);
  std::vector<float> values(300 * 4);
  for (int64_t i = 0; i < 300; ++i) keys[i] = i * 3 + 1;
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i % 13);
  auto memory = MakeTable(Fixed("m", 4, 40000));
  auto tiered = MakeTable(Tiered("t", 4, 100, dir));
  ASSERT_TRUE(memory->Import(keys.data(), values.data(), nullptr, 0, 300).ok());
  ASSERT_TRUE(tiered->Import(keys.data(), values.data(), nullptr, 0, 300).ok());
  EXPECT_EQ(tiered->Stats().cold, 200);
  Trainer trainer{Optimizer::kLazyAdam};
  trainer.Steps(50, {memory.get(), tiered.get()});
  ExpectSame(StateOf(tiered.get()), StateOf(memory.get()), "after attaching slots");
}

TEST(TierTest, ConfigurationErrors) {
  TableConfig config = Tiered("t", 4, 100, "/nonexistent/rec_sdk");
  std::unique_ptr<EmbeddingTable> t;
  Status s = EmbeddingTable::Create(config, &t);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.message();
  EXPECT_TRUE(table_test::Contains(s.message(), "table 't'")) << s.message();
  config = table_test::Dynamic("d", 4);
  config.ssd_paths = {"/tmp"};
  s = EmbeddingTable::Create(config, &t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
}

}  // namespace
}  // namespace rec_sdk
