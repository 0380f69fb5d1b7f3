// Tests of the checkpoint files: CRC-32C, save/restore round trips (rows, slots, counts,
// clocks, pending keys, counters), detection of corrupted, truncated and incomplete files,
// capacity, re-sharding across ranks, and restoring under another optimizer.
#include "tf_ops/core/checkpoint.h"
#include "tf_ops/core/checkpoint_files.h"
#include "tf_ops/core/sparse_optimizers.h"
#include "tf_ops/core/tests/table_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

namespace rec_sdk {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/rec_sdk_ckpt_XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d;
}

TableConfig Config(int dim = 3, bool dynamic = true, int64_t capacity = 0) {
  TableConfig c;
  c.name = "t";
  c.dim = dim;
  c.dynamic_expansion = dynamic;
  c.capacity = capacity;
  c.initializer.kind = InitializerKind::kRandomUniform;
  c.initializer.minval = -1;
  c.initializer.maxval = 1;
  return c;
}

// Tables with admission (threshold 3) and eviction (age 100), as their lookups configure.
std::unique_ptr<EmbeddingTable> Make(const TableConfig& c) {
  std::unique_ptr<EmbeddingTable> t;
  EXPECT_TRUE(EmbeddingTable::Create(c, &t).ok());
  EXPECT_TRUE(t->ConfigureAdmission(AdmissionConfig{3, 100}).ok());
  return t;
}

struct Row {
  std::vector<float> value, slot0, slot1;
  bool operator==(const Row& o) const {
    return value == o.value && slot0 == o.slot0 && slot1 == o.slot1;
  }
};

// Trains a table: keys 0..49 admitted (count 3 at once), keys 100..104 pending, LazyAdam-like
// slots written with recognisable values.
std::unique_ptr<EmbeddingTable> Trained() {
  auto t = Make(Config());
  EXPECT_TRUE(t->EnsureSlots("LazyAdam", {0.0f, 0.0f}).ok());
  std::vector<int64_t> keys, counts;
  for (int64_t k = 0; k < 50; ++k) {
    keys.push_back(k);
    counts.push_back(3);
  }
  for (int64_t k = 100; k < 105; ++k) {
    keys.push_back(k);
    counts.push_back(1);
  }
  std::vector<int64_t> addresses(keys.size());
  KeyAccess access;
  access.counts = counts.data();
  const int64_t clock = 1000;
  access.times = &clock;
  EXPECT_TRUE(
      t->FindOrInsert(keys.data(), keys.size(), true, addresses.data(), SerialRunner, access).ok());
  std::vector<int64_t> live(addresses.begin(), addresses.begin() + 50);
  EXPECT_TRUE(t->UpdateRows(
                   live.data(), live.size(), 1,
                   [](int64_t i, float* v, float* const* slots) {
                     for (int d = 0; d < 3; ++d) {
                       v[d] = i + 0.25f * d;
                       slots[0][d] = -i;
                       slots[1][d] = i * 2.0f + d;
                     }
                   },
                   SerialRunner)
                  .ok());
  return t;
}

// key -> (value, slot0, slot1) via Lookup and a LazyAdam-style read of the slots.
std::map<int64_t, Row> Read(EmbeddingTable* t, int64_t from, int64_t to) {
  std::map<int64_t, Row> out;
  for (int64_t k = from; k < to; ++k) {
    int64_t address;
    EXPECT_TRUE(t->FindOrInsert(&k, 1, false, &address, SerialRunner).ok());
    if (address < 0) continue;
    Row r;
    EXPECT_TRUE(t->UpdateRows(
                     &address, 1, 1,
                     [&](int64_t, float* v, float* const* slots) {
                       r.value.assign(v, v + t->dim());
                       if (t->num_slots() > 0) r.slot0.assign(slots[0], slots[0] + t->dim());
                       if (t->num_slots() > 1) r.slot1.assign(slots[1], slots[1] + t->dim());
                     },
                     SerialRunner)
                    .ok());
    out[k] = r;
  }
  return out;
}

TEST(CheckpointTest, Crc32cKnownValue) {
  EXPECT_EQ(Crc32c(0, "123456789", 9), 0xE3069283u);
  // Incremental equals one shot, for lengths around the 8-byte stride.
  std::string s(1000, 'x');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 7);
  for (size_t cut : {0, 1, 7, 8, 9, 500}) {
    EXPECT_EQ(Crc32c(Crc32c(0, s.data(), cut), s.data() + cut, s.size() - cut),
              Crc32c(0, s.data(), s.size()));
  }
}

TEST(CheckpointTest, RoundTripKeepsRowsSlotsCountsClocksAndPending) {
  auto t = Trained();
  const std::string dir = TempDir() + "/t";
  int64_t rows = 0;
  ASSERT_TRUE(SaveTableFiles(t.get(), dir, &rows).ok());
  EXPECT_EQ(rows, 50);
  const auto before = Read(t.get(), 0, 200);
  const TableStats stats_before = t->Stats();

  auto u = Make(Config());
  std::string note;
  ASSERT_TRUE(RestoreTableFiles(u.get(), {dir}, RestoreOptions(), &rows, &note).ok());
  EXPECT_EQ(rows, 50);
  EXPECT_NE(note.find("LazyAdam"), std::string::npos) << note;
  EXPECT_EQ(Read(u.get(), 0, 200), before);
  const TableStats stats = u->Stats();
  EXPECT_EQ(stats.size, 50);
  EXPECT_EQ(stats.pending, 5);
  EXPECT_EQ(stats.admitted, stats_before.admitted);
  EXPECT_EQ(stats.rejected, stats_before.rejected);
  EXPECT_EQ(stats.newest_clock, 1000);
  // Pending counts survive: key 100 has 1 of 3; two more occurrences admit it.
  std::vector<int64_t> key = {100}, two = {2};
  int64_t address;
  KeyAccess access;
  access.counts = two.data();
  const int64_t now = 1001;
  access.times = &now;
  ASSERT_TRUE(u->FindOrInsert(key.data(), 1, true, &address, SerialRunner, access).ok());
  EXPECT_GE(address, 0);
  // Clocks survive: nothing is old enough to evict at the restored newest clock.
  int64_t evicted = -1;
  ASSERT_TRUE(u->Evict(&evicted, nullptr, SerialRunner).ok());
  EXPECT_EQ(evicted, 0);
  // The restored slots serve the same optimizer.
  ASSERT_TRUE(u->EnsureSlots("LazyAdam", {0.0f, 0.0f}).ok());
  EXPECT_EQ(u->TakeNotice(), "");
}

TEST(CheckpointTest, AnotherOptimizerReinitialisesSlotsWithANotice) {
  auto t = Trained();
  const std::string dir = TempDir() + "/t";
  ASSERT_TRUE(SaveTableFiles(t.get(), dir, nullptr).ok());
  auto u = Make(Config());
  ASSERT_TRUE(RestoreTableFiles(u.get(), {dir}, RestoreOptions(), nullptr, nullptr).ok());
  ASSERT_TRUE(u->EnsureSlots("Adagrad", {0.5f}).ok());
  const std::string notice = u->TakeNotice();
  EXPECT_NE(notice.find("'LazyAdam' were dropped"), std::string::npos) << notice;
  EXPECT_NE(notice.find("'Adagrad'"), std::string::npos) << notice;
  const auto rows = Read(u.get(), 0, 50);
  ASSERT_EQ(rows.size(), 50u);
  EXPECT_EQ(rows.at(7).value, (std::vector<float>{7.0f, 7.25f, 7.5f}));
  EXPECT_EQ(rows.at(7).slot0, std::vector<float>(3, 0.5f));
  // A table already trained by Adagrad drops LazyAdam slots at restore time.
  auto w = Make(Config());
  ASSERT_TRUE(w->EnsureSlots("Adagrad", {0.1f}).ok());
  std::string note;
  ASSERT_TRUE(RestoreTableFiles(w.get(), {dir}, RestoreOptions(), nullptr, &note).ok());
  EXPECT_NE(note.find("were dropped"), std::string::npos) << note;
  EXPECT_EQ(Read(w.get(), 3, 4).at(3).slot0, std::vector<float>(3, 0.1f));
}

// A row-wise optimizer's slots (1 float per row) survive a save and restore, and a table of an
// element-wise optimizer drops them with a notice.
TEST(CheckpointTest, RowWiseSlotsRoundTrip) {
  using table_test::ExportAll;
  using table_test::Exported;
  using table_test::ToMap;
  auto t = Make(Config());
  std::vector<int64_t> keys, counts(40, 3);
  for (int64_t k = 0; k < 40; ++k) keys.push_back(k);
  std::vector<int64_t> addresses(keys.size());
  KeyAccess access;
  access.counts = counts.data();
  ASSERT_TRUE(
      t->FindOrInsert(keys.data(), keys.size(), true, addresses.data(), SerialRunner, access).ok());
  std::vector<float> grads(keys.size() * 3);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>(i % 17);
  ASSERT_TRUE(ApplyRowwiseAdagrad(t.get(), addresses.data(), grads.data(), keys.size(),
                                  {0.1f, 0.0f, 1e-8f}, SerialRunner)
                  .ok());
  const std::string dir = TempDir() + "/rowwise";
  ASSERT_TRUE(SaveTableFiles(t.get(), dir, nullptr).ok());
  std::ifstream slot_file(dir + "/" + checkpoint_files::SlotFile(0),
                          std::ios::binary | std::ios::ate);
  ASSERT_TRUE(slot_file.good());
  EXPECT_EQ(static_cast<int64_t>(slot_file.tellg()), 40 * 4);  // one float per row
  auto u = Make(Config());
  ASSERT_TRUE(RestoreTableFiles(u.get(), {dir}, RestoreOptions(), nullptr, nullptr).ok());
  EXPECT_EQ(u->slot_width(), 1);
  const Exported before = ExportAll(t.get()), after = ExportAll(u.get());
  EXPECT_EQ(ToMap(after, 3), ToMap(before, 3));
  ASSERT_TRUE(ApplyRowwiseAdagrad(u.get(), addresses.data(), grads.data(), 0, {0.1f, 0.0f, 1e-8f},
                                  SerialRunner)
                  .ok());
  EXPECT_EQ(u->TakeNotice(), "");
  // Element-wise Adagrad takes the restored table over with fresh dim-wide slots.
  auto w = Make(Config());
  ASSERT_TRUE(RestoreTableFiles(w.get(), {dir}, RestoreOptions(), nullptr, nullptr).ok());
  ASSERT_TRUE(w->EnsureSlots("Adagrad", {0.5f}).ok());
  EXPECT_NE(w->TakeNotice().find("'RowwiseAdagrad' were dropped"), std::string::npos);
  EXPECT_EQ(w->slot_width(), 3);
  EXPECT_EQ(Read(w.get(), 5, 6).at(5).slot0, std::vector<float>(3, 0.5f));
  EXPECT_EQ(Read(w.get(), 5, 6).at(5).value, ToMap(before, 3).at(5)[0]);
}

void FlipByte(const std::string& path, long offset) {
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, offset, SEEK_SET);
  const int c = std::fgetc(f);
  std::fseek(f, offset, SEEK_SET);
  std::fputc(c ^ 0x40, f);
  std::fclose(f);
}

TEST(CheckpointTest, CorruptedTruncatedAndIncompleteFilesAreNamed) {
  auto t = Trained();
  for (const std::string file :
       {"keys.bin", "values.bin", "slot1.bin", "counts.bin", "last_seen.bin", "pending.bin"}) {
    const std::string dir = TempDir() + "/t";
    ASSERT_TRUE(SaveTableFiles(t.get(), dir, nullptr).ok());
    FlipByte(dir + "/" + file, 5);
    auto u = Make(Config());
    Status s = RestoreTableFiles(u.get(), {dir}, RestoreOptions(), nullptr, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << file << ": " << s.message();
    EXPECT_NE(s.message().find(file), std::string::npos) << s.message();
    EXPECT_EQ(u->Size(), 0) << "a failed restore leaves the table empty";
  }
  const std::string dir = TempDir() + "/t";
  ASSERT_TRUE(SaveTableFiles(t.get(), dir, nullptr).ok());
  ASSERT_EQ(::truncate((dir + "/values.bin").c_str(), 100), 0);
  auto u = Make(Config());
  Status s = RestoreTableFiles(u.get(), {dir}, RestoreOptions(), nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("values.bin"), std::string::npos) << s.message();
  FlipByte(dir + "/meta.txt", 30);
  s = RestoreTableFiles(u.get(), {dir}, RestoreOptions(), nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("meta.txt"), std::string::npos) << s.message();
  ASSERT_EQ(std::remove((dir + "/meta.txt").c_str()), 0);
  s = RestoreTableFiles(u.get(), {dir}, RestoreOptions(), nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("meta.txt"), std::string::npos) << s.message();
}

TEST(CheckpointTest, DimAndCapacityMismatchesAreErrors) {
  auto t = Trained();
  const std::string dir = TempDir() + "/t";
  ASSERT_TRUE(SaveTableFiles(t.get(), dir, nullptr).ok());
  auto wide = Make(Config(4));
  Status s = RestoreTableFiles(wide.get(), {dir}, RestoreOptions(), nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dim 3"), std::string::npos) << s.message();
  auto small = Make(Config(3, false, 10));
  s = RestoreTableFiles(small.get(), {dir}, RestoreOptions(), nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  auto big = Make(Config(3, false, 60));
  EXPECT_TRUE(RestoreTableFiles(big.get(), {dir}, RestoreOptions(), nullptr, nullptr).ok());
  EXPECT_EQ(big->Size(), 50);
  auto exact = Make(Config(3, false, 50));  // a full table restores into its own size
  EXPECT_TRUE(RestoreTableFiles(exact.get(), {dir}, RestoreOptions(), nullptr, nullptr).ok());
  EXPECT_EQ(exact->Size(), 50);
}

TEST(CheckpointTest, ReshardsOneToTwoToOne) {
  auto t = Trained();
  const std::string root = TempDir();
  ASSERT_TRUE(SaveTableFiles(t.get(), root + "/one", nullptr).ok());
  const auto all = Read(t.get(), 0, 200);
  std::vector<std::unique_ptr<EmbeddingTable>> ranks;
  for (int64_t r = 0; r < 2; ++r) {
    ranks.push_back(Make(Config()));
    RestoreOptions o;
    o.rank_id = r;
    o.rank_size = 2;
    int64_t rows = 0;
    ASSERT_TRUE(RestoreTableFiles(ranks[r].get(), {root + "/one"}, o, &rows, nullptr).ok());
    EXPECT_EQ(rows, 25);
    for (const auto& kv : Read(ranks[r].get(), 0, 200)) {
      EXPECT_EQ(kv.first % 2, r);
      EXPECT_EQ(kv.second, all.at(kv.first));
    }
    ASSERT_TRUE(SaveTableFiles(ranks[r].get(), root + "/rank" + std::to_string(r), nullptr).ok());
  }
  auto merged = Make(Config());
  int64_t rows = 0;
  ASSERT_TRUE(RestoreTableFiles(merged.get(), {root + "/rank0", root + "/rank1"}, RestoreOptions(),
                                &rows, nullptr)
                  .ok());
  EXPECT_EQ(rows, 50);
  EXPECT_EQ(Read(merged.get(), 0, 200), all);
  EXPECT_EQ(merged->Stats().pending, 5);
}

TEST(CheckpointTest, SaveRefusesAnExistingDirectory) {
  auto t = Trained();
  const std::string dir = TempDir();
  Status s = SaveTableFiles(t.get(), dir, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rec_sdk

namespace rec_sdk {
namespace {

// Keys with rows -> (value, slot0, slot1), pending count, for comparing tables.
struct State {
  std::map<int64_t, Row> rows;
  int64_t pending;
  bool operator==(const State& o) const { return rows == o.rows && pending == o.pending; }
};

State StateOf(EmbeddingTable* t) { return {Read(t, -10, 2000), t->Stats().pending}; }

void Touch(EmbeddingTable* t, const std::vector<int64_t>& keys, float add, int64_t clock) {
  std::vector<int64_t> counts(keys.size(), 3), addresses(keys.size());
  KeyAccess access;
  access.counts = counts.data();
  access.times = &clock;
  ASSERT_TRUE(
      t->FindOrInsert(keys.data(), keys.size(), true, addresses.data(), SerialRunner, access).ok());
  std::vector<int64_t> live;
  for (int64_t a : addresses)
    if (a >= 0) live.push_back(a);
  ASSERT_TRUE(t->UpdateRows(
                   live.data(), live.size(), 1,
                   [add](int64_t, float* v, float* const* slots) {
                     for (int d = 0; d < 3; ++d) {
                       v[d] += add;
                       slots[0][d] += 2 * add;
                       slots[1][d] -= add;
                     }
                   },
                   SerialRunner)
                  .ok());
}

TEST(DeltaCheckpointTest, FullPlusDeltasEqualsAFullSave) {
  TableConfig c = Config();
  c.track_changes = true;
  auto t = Make(c);
  ASSERT_TRUE(t->EnsureSlots("LazyAdam", {0.0f, 0.0f}).ok());
  std::vector<int64_t> first(300);
  for (int64_t i = 0; i < 300; ++i) first[i] = i;
  Touch(t.get(), first, 1.0f, 100);
  const std::string root = TempDir();
  // Saves are committed once durable; each starts the next change set.
  auto save = [&](const std::string& name, bool delta, int64_t* rows) {
    int64_t id = 0;
    ASSERT_TRUE(SaveTableFiles(t.get(), root + name, rows, delta, &id).ok()) << name;
    ASSERT_TRUE(t->CommitSave(id).ok());
  };
  save("/full", false, nullptr);

  // Delta 1: some rows change, some keys go (remove and eviction), new keys come.
  Touch(t.get(), {5, 6, 7, 400, 401}, 0.5f, 150);
  const std::vector<int64_t> gone = {10, 11, 400};
  ASSERT_TRUE(t->Remove(gone.data(), gone.size(), nullptr, SerialRunner).ok());
  Touch(t.get(), {10, 500}, 0.25f, 250);  // 10 comes back fresh; eviction threshold is 100
  int64_t evicted = 0;
  ASSERT_TRUE(t->Evict(&evicted, nullptr, SerialRunner).ok());  // drops rows seen at <= 150
  EXPECT_GT(evicted, 0);
  int64_t rows = -1;
  save("/delta1", true, &rows);
  EXPECT_LT(rows, 10);  // only the changed rows

  // Delta 2: the table is cleared and refilled.
  t->Clear();
  Touch(t.get(), {1, 2, 3}, 2.0f, 300);
  save("/delta2", true, nullptr);
  Touch(t.get(), {2, 900}, 1.0f, 301);
  save("/delta3", true, nullptr);
  save("/full_now", false, nullptr);

  auto a = Make(Config());
  ASSERT_TRUE(
      RestoreTableFiles(a.get(), {root + "/full"}, RestoreOptions(), nullptr, nullptr).ok());
  for (const char* d : {"/delta1", "/delta2", "/delta3"}) {
    ASSERT_TRUE(ApplyDeltaFiles(a.get(), root + d, nullptr).ok()) << d;
  }
  auto b = Make(Config());
  ASSERT_TRUE(
      RestoreTableFiles(b.get(), {root + "/full_now"}, RestoreOptions(), nullptr, nullptr).ok());
  EXPECT_EQ(StateOf(a.get()), StateOf(t.get()));
  EXPECT_EQ(StateOf(b.get()), StateOf(t.get()));
  EXPECT_EQ(a->Stats().newest_clock, t->Stats().newest_clock);
  EXPECT_EQ(a->Stats().evicted, t->Stats().evicted);

  // Deltas apply only in order onto the checkpoint they follow.
  auto c2 = Make(Config());
  ASSERT_TRUE(
      RestoreTableFiles(c2.get(), {root + "/full"}, RestoreOptions(), nullptr, nullptr).ok());
  Status skipped = ApplyDeltaFiles(c2.get(), root + "/delta2", nullptr);
  EXPECT_EQ(skipped.code(), StatusCode::kFailedPrecondition) << skipped.message();
  EXPECT_NE(skipped.message().find("follows checkpoint"), std::string::npos);
  // ... and onto it unchanged: a table trained after its restore would end up a mix.
  Touch(c2.get(), {7000, 7001}, 1.0f, 260);
  Status changed = ApplyDeltaFiles(c2.get(), root + "/delta1", nullptr);
  EXPECT_EQ(changed.code(), StatusCode::kFailedPrecondition) << changed.message();
  EXPECT_NE(changed.message().find("changed after"), std::string::npos) << changed.message();
  // An uncommitted save (e.g. its rename failed) keeps the changes for the next delta.
  save("/base2", false, nullptr);
  Touch(t.get(), {3}, 1.0f, 302);
  ASSERT_TRUE(SaveTableFiles(t.get(), root + "/lost", nullptr, true).ok());
  int64_t again = 0;
  ASSERT_TRUE(SaveTableFiles(t.get(), root + "/retry", &again, true).ok());
  EXPECT_EQ(again, 1);

  // Deltas are not full checkpoints, and need change tracking to be written.
  Status s = RestoreTableFiles(b.get(), {root + "/delta1"}, RestoreOptions(), nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  auto untracked = Make(Config());
  s = SaveTableFiles(untracked.get(), root + "/x", nullptr, true);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace rec_sdk

namespace rec_sdk {
namespace {

TEST(CheckpointTest, ACorruptedKeyThatRepeatsAnotherIsReportedAsTheCorruptedFile) {
  auto t = Trained();
  const std::string dir = TempDir() + "/t";
  ASSERT_TRUE(SaveTableFiles(t.get(), dir, nullptr).ok());
  // Overwrite the second key with the first: a duplicate key, and a checksum mismatch.
  std::FILE* f = std::fopen((dir + "/keys.bin").c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  int64_t first;
  ASSERT_EQ(std::fread(&first, 8, 1, f), 1u);
  ASSERT_EQ(std::fwrite(&first, 8, 1, f), 1u);
  std::fclose(f);
  auto u = Make(Config());
  Status s = RestoreTableFiles(u.get(), {dir}, RestoreOptions(), nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("keys.bin"), std::string::npos) << s.message();
  EXPECT_EQ(u->Size(), 0);
}

}  // namespace
}  // namespace rec_sdk

namespace rec_sdk {
namespace {

TEST(CheckpointTest, HoldsCheckpointUntilTheTableChanges) {
  auto t = Trained();
  const std::string dir = TempDir() + "/t";
  int64_t save_id = 0;
  ASSERT_TRUE(SaveTableFiles(t.get(), dir, nullptr, false, &save_id).ok());
  EXPECT_FALSE(t->HoldsCheckpoint(save_id));  // not committed yet
  ASSERT_TRUE(t->CommitSave(save_id).ok());
  EXPECT_TRUE(t->HoldsCheckpoint(save_id));
  EXPECT_FALSE(t->HoldsCheckpoint(save_id + 1));
  EXPECT_FALSE(t->HoldsCheckpoint(0));
  int64_t id = 0;
  bool delta = true;
  ASSERT_TRUE(ReadCheckpointId(dir, &id, &delta).ok());
  EXPECT_EQ(id, save_id);
  EXPECT_FALSE(delta);

  // Reading (an evaluation lookup, a gather) keeps it; a training lookup does not.
  const int64_t key = 7;
  int64_t address = 0;
  ASSERT_TRUE(t->FindOrInsert(&key, 1, false, &address, SerialRunner).ok());
  float row[3];
  ASSERT_TRUE(t->Gather(&address, 1, row, SerialRunner).ok());
  EXPECT_TRUE(t->HoldsCheckpoint(save_id));
  ASSERT_TRUE(t->FindOrInsert(&key, 1, true, &address, SerialRunner).ok());
  EXPECT_FALSE(t->HoldsCheckpoint(save_id));

  // A restored table holds the checkpoint it restored, until it changes.
  auto u = Make(Config());
  int64_t rows = 0;
  std::string note;
  ASSERT_TRUE(RestoreTableFiles(u.get(), {dir}, RestoreOptions(), &rows, &note).ok());
  EXPECT_TRUE(u->HoldsCheckpoint(save_id));
  ASSERT_TRUE(u->SetAccessThreshold(5).ok());
  EXPECT_FALSE(u->HoldsCheckpoint(save_id));

  // A change between the snapshot and its commit: the table is not the checkpoint.
  auto v = Trained();
  const std::string dir2 = TempDir() + "/v";
  ASSERT_TRUE(SaveTableFiles(v.get(), dir2, nullptr, false, &save_id).ok());
  const int64_t other = 12345;
  ASSERT_TRUE(v->FindOrInsert(&other, 1, true, &address, SerialRunner).ok());
  ASSERT_TRUE(v->CommitSave(save_id).ok());
  EXPECT_FALSE(v->HoldsCheckpoint(save_id));
}

}  // namespace
}  // namespace rec_sdk

namespace rec_sdk {
namespace {

TEST(CheckpointTest, FailedAndPartialRestoresHoldNoCheckpoint) {
  auto t = Trained();
  const std::string good = TempDir() + "/good", bad = TempDir() + "/bad";
  int64_t good_id = 0, bad_id = 0, rows = 0;
  ASSERT_TRUE(SaveTableFiles(t.get(), good, nullptr, false, &good_id).ok());
  ASSERT_TRUE(SaveTableFiles(t.get(), bad, nullptr, false, &bad_id).ok());
  FlipByte(bad + "/values.bin", 5);
  auto u = Make(Config());
  std::string note;
  ASSERT_TRUE(RestoreTableFiles(u.get(), {good}, RestoreOptions(), &rows, &note).ok());
  EXPECT_TRUE(u->HoldsCheckpoint(good_id));
  EXPECT_FALSE(RestoreTableFiles(u.get(), {bad}, RestoreOptions(), &rows, &note).ok());
  EXPECT_EQ(u->Size(), 0);
  EXPECT_FALSE(u->HoldsCheckpoint(good_id));  // emptied: it no longer holds `good`
  EXPECT_EQ(u->checkpoint_id(), 0);
  // A rank's slice of a checkpoint is not that checkpoint.
  RestoreOptions half;
  half.rank_size = 2;
  ASSERT_TRUE(RestoreTableFiles(u.get(), {good}, half, &rows, &note).ok());
  EXPECT_LT(rows, 50);
  EXPECT_FALSE(u->HoldsCheckpoint(good_id));
}

// Two directories, one holding key 100 pending and the other holding it stored, restored
// together: the table held it both ways, and its next checkpoint no longer restored.
TEST(CheckpointTest, AKeyStoredInOneDirectoryAndPendingInAnotherIsAnError) {
  auto t = Trained();  // 100..104 pending (count 1 of 3)
  const std::string root = TempDir();
  ASSERT_TRUE(SaveTableFiles(t.get(), root + "/pending", nullptr).ok());
  auto other = Make(Config());  // holds key 100 stored, and no other key
  ASSERT_TRUE(other->EnsureSlots("LazyAdam", {0.0f, 0.0f}).ok());
  std::vector<int64_t> key = {100}, counts = {3}, address(1);
  KeyAccess access;
  access.counts = counts.data();
  ASSERT_TRUE(other->FindOrInsert(key.data(), 1, true, address.data(), SerialRunner, access).ok());
  ASSERT_GE(address[0], 0);
  ASSERT_TRUE(SaveTableFiles(other.get(), root + "/stored", nullptr).ok());
  for (const auto& dirs : {std::vector<std::string>{root + "/pending", root + "/stored"},
                           std::vector<std::string>{root + "/stored", root + "/pending"}}) {
    auto u = Make(Config());
    const Status s = RestoreTableFiles(u.get(), dirs, RestoreOptions(), nullptr, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.message();
    EXPECT_NE(s.message().find("key 100"), std::string::npos) << s.message();
  }
}

// --- Pushes (TakeChanges): the change set of serving updates, apart from checkpoints' ---------

// A served copy of a table: key -> embedding, updated by the pushes.
struct Served {
  std::map<int64_t, std::vector<float>> rows;
  int64_t last_id = 0;
  // Takes the table's changes and applies them; returns whether the push was whole.
  bool Push(EmbeddingTable* t, bool full = false) {
    std::vector<std::pair<int64_t, std::vector<float>>> changed;
    std::vector<int64_t> removed;
    bool replace = false;
    int64_t since = -1, id = -1;
    EXPECT_TRUE(t->TakeChanges(
                     full,
                     [&](const EmbeddingTable::SnapshotView& view, bool whole) {
                       replace = whole;
                       if (!whole) removed = view.removed_keys();
                       return view.ForEachRow(
                           [&](int64_t key, const char* r, uint32_t, int64_t) {
                             std::vector<float> row(t->dim());
                             view.ReadEmbedding(r, row.data());
                             changed.emplace_back(key, row);
                             return Status::Ok();
                           },
                           /*changed_only=*/!whole);
                     },
                     &since, &id)
                    .ok());
    EXPECT_NE(id, 0);
    EXPECT_EQ(since, replace ? 0 : last_id);  // a chain: each push follows the last one
    last_id = id;
    if (replace) rows.clear();
    for (int64_t k : removed) rows.erase(k);
    for (auto& kv : changed) rows[kv.first] = kv.second;
    return replace;
  }
};

std::map<int64_t, std::vector<float>> Embeddings(EmbeddingTable* t) {
  using table_test::ExportAll;
  using table_test::ToMap;
  std::map<int64_t, std::vector<float>> out;
  for (const auto& kv : ToMap(ExportAll(t), t->dim())) out[kv.first] = kv.second[0];
  return out;
}

TEST(PushChangesTest, PushesReplayedInOrderEqualTheTableWhateverTheCheckpointsDo) {
  TableConfig c = Config();
  c.track_changes = true;
  auto t = Make(c);
  ASSERT_TRUE(t->EnsureSlots("LazyAdam", {0.0f, 0.0f}).ok());
  std::vector<int64_t> first(200);
  for (int64_t i = 0; i < 200; ++i) first[i] = i;
  Touch(t.get(), first, 1.0f, 100);
  Served served;
  EXPECT_TRUE(served.Push(t.get()));  // the first push is whole
  EXPECT_EQ(served.rows, Embeddings(t.get()));
  const std::string root = TempDir();
  // A checkpoint save between pushes restarts only its own change set.
  Touch(t.get(), {5, 6, 300}, 0.5f, 150);
  int64_t save_id = 0;
  ASSERT_TRUE(SaveTableFiles(t.get(), root + "/full", nullptr, false, &save_id).ok());
  ASSERT_TRUE(t->CommitSave(save_id).ok());
  const std::vector<int64_t> gone = {10, 11, 300};
  ASSERT_TRUE(t->Remove(gone.data(), gone.size(), nullptr, SerialRunner).ok());
  Touch(t.get(), {10, 500}, 0.25f, 250);  // 10 comes back
  int64_t evicted = 0;
  ASSERT_TRUE(t->Evict(&evicted, nullptr, SerialRunner).ok());
  EXPECT_GT(evicted, 0);
  EXPECT_FALSE(served.Push(t.get()));
  EXPECT_EQ(served.rows, Embeddings(t.get()));
  EXPECT_EQ(served.rows.count(11), 0u);
  EXPECT_EQ(served.rows.count(10), 1u);
  // The delta checkpoint still holds every change since the save, pushes or not.
  int64_t delta_rows = -1;
  ASSERT_TRUE(SaveTableFiles(t.get(), root + "/delta", &delta_rows, true, &save_id).ok());
  ASSERT_TRUE(t->CommitSave(save_id).ok());
  auto b = Make(Config());
  ASSERT_TRUE(
      RestoreTableFiles(b.get(), {root + "/full"}, RestoreOptions(), nullptr, nullptr).ok());
  ASSERT_TRUE(ApplyDeltaFiles(b.get(), root + "/delta", nullptr).ok());
  EXPECT_EQ(Embeddings(b.get()), Embeddings(t.get()));
  // Nothing changed: an empty push. A failed take restarts nothing.
  EXPECT_FALSE(served.Push(t.get()));
  Touch(t.get(), {7}, 1.0f, 260);
  int64_t since = 0, id = 0;
  Status failed = t->TakeChanges(
      false,
      [](const EmbeddingTable::SnapshotView&, bool) { return Status::Internal("disk full"); },
      &since, &id);
  EXPECT_FALSE(failed.ok());
  std::map<int64_t, std::vector<float>> before = served.rows;
  EXPECT_FALSE(served.Push(t.get()));
  EXPECT_EQ(served.rows, Embeddings(t.get()));
  EXPECT_NE(served.rows, before);  // key 7's change came through
  // A cleared, or restored, table pushes whole; so does a push asked to.
  t->Clear();
  Touch(t.get(), {1, 2}, 2.0f, 300);
  EXPECT_TRUE(served.Push(t.get()));
  EXPECT_EQ(served.rows, Embeddings(t.get()));
  ASSERT_TRUE(
      RestoreTableFiles(t.get(), {root + "/full"}, RestoreOptions(), nullptr, nullptr).ok());
  EXPECT_TRUE(served.Push(t.get()));
  EXPECT_EQ(served.rows, Embeddings(t.get()));
  EXPECT_TRUE(served.Push(t.get(), /*full=*/true));
  EXPECT_EQ(served.rows, Embeddings(t.get()));
  // Tables without change tracking cannot push.
  auto u = Make(Config());
  Status refused = u->TakeChanges(
      false, [](const EmbeddingTable::SnapshotView&, bool) { return Status::Ok(); }, &since, &id);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.message()).find("track_changes"), std::string::npos);
}

TEST(PushChangesTest, ApplyRowsRemovesThenWritesOrReplacesTheTable) {
  auto t = Make(Config());
  std::vector<int64_t> keys = {1, 2, 3, 4};
  std::vector<float> values(12);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  ASSERT_TRUE(t->ApplyRows(keys.data(), values.data(), 4, nullptr, 0, false, SerialRunner).ok());
  // Removals go before the rows: key 2 removed and written again stays.
  std::vector<int64_t> update = {2, 5};
  std::vector<float> rows = {7, 7, 7, 8, 8, 8};
  std::vector<int64_t> gone = {1, 2, 9};
  ASSERT_TRUE(
      t->ApplyRows(update.data(), rows.data(), 2, gone.data(), 3, false, SerialRunner).ok());
  auto now = Embeddings(t.get());
  EXPECT_EQ(now.size(), 4u);  // 2, 3, 4, 5
  EXPECT_EQ(now.count(1), 0u);
  EXPECT_EQ(now[2], std::vector<float>({7, 7, 7}));
  EXPECT_EQ(now[3], std::vector<float>({6, 7, 8}));
  // A replacing update leaves only its rows.
  ASSERT_TRUE(t->ApplyRows(update.data(), rows.data(), 2, nullptr, 0, true, SerialRunner).ok());
  now = Embeddings(t.get());
  EXPECT_EQ(now.size(), 2u);
  EXPECT_EQ(now[5], std::vector<float>({8, 8, 8}));
}

}  // namespace
}  // namespace rec_sdk
