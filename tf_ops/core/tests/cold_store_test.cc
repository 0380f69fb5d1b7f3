// ColdStore against a std::map of what each key's record should be: appends, reads, removes,
// compaction (moves reported, old files gone), cleanup of dead processes' files, and errors.
#include "tf_ops/core/cold_store.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace rec_sdk {
namespace {

class ColdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/cold_store_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { EXPECT_EQ(std::system(("rm -rf '" + dir_ + "'").c_str()), 0); }

  std::vector<std::string> Files() const {
    std::vector<std::string> names;
    DIR* dir = ::opendir(dir_.c_str());
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(dir);
    return names;
  }

  std::unique_ptr<ColdStore> Make(size_t record_bytes, uint32_t per_segment,
                                  bool direct_io = false) {
    ColdStore::Options options;
    options.directories = {dir_};
    options.record_bytes = record_bytes;
    options.records_per_segment = per_segment;
    options.direct_io = direct_io;
    std::unique_ptr<ColdStore> store;
    EXPECT_TRUE(ColdStore::Open(options, &store).ok());
    return store;
  }

  std::string dir_;
};

std::vector<float> RecordOf(uint64_t key, int version, size_t floats) {
  std::vector<float> record(floats);
  for (size_t i = 0; i < floats; ++i) record[i] = static_cast<float>(key * 1000 + i) + version;
  return record;
}

class ColdStoreMapTest : public ColdStoreTest, public ::testing::WithParamInterface<bool> {};

// Without and with direct I/O (O_DIRECT: records packed into 4 KiB blocks).
TEST_P(ColdStoreMapTest, AppendsReadsRemovesAndCompactsAgainstAMap) {
  const size_t floats = 24;  // e.g. dim 8 with two Adam slots
  auto store = Make(floats * sizeof(float), 16 * 40, GetParam());
  const bool direct = GetParam();
  std::map<uint64_t, std::pair<ColdStore::Location, int>> where;  // key -> (location, version)
  std::mt19937_64 rng(7);
  std::vector<float> got(floats);
  for (int round = 0; round < 2000; ++round) {
    const uint64_t key = rng() % 300;
    auto found = where.find(key);
    if (found != where.end() && rng() % 2 == 0) {
      // A promoted key leaves the store; a demoted one comes back with a new version.
      ASSERT_TRUE(store->Remove(found->second.first).ok());
      where.erase(found);
    } else if (found == where.end()) {
      const int version = static_cast<int>(rng() % 1000);
      const auto record = RecordOf(key, version, floats);
      ColdStore::Location at;
      ASSERT_TRUE(store->Append(key, record.data(), &at).ok());
      where[key] = {at, version};
    }
    if (round % 31 == 0) {
      // A batch of reads in flight at once.
      std::vector<ColdStore::Location> at;
      std::vector<uint64_t> keys;
      for (const auto& entry : where) at.push_back(entry.second.first);
      std::vector<std::vector<float>> got_many(at.size(), std::vector<float>(floats));
      std::vector<void*> out(at.size());
      for (size_t i = 0; i < at.size(); ++i) out[i] = got_many[i].data();
      keys.resize(at.size());
      ASSERT_TRUE(store->ReadMany(at.size(), at.data(), out.data(), keys.data()).ok());
      size_t i = 0;
      for (const auto& entry : where) {
        ASSERT_EQ(keys[i], entry.first);
        ASSERT_EQ(got_many[i], RecordOf(entry.first, entry.second.second, floats));
        ++i;
      }
    }
    if (round % 97 == 0) {
      int moves = 0;
      ASSERT_TRUE(store
                      ->Compact([&](uint64_t k, ColdStore::Location from, ColdStore::Location to) {
                        ASSERT_TRUE(where.at(k).first == from);
                        where[k].first = to;
                        ++moves;
                      })
                      .ok());
      EXPECT_LE(store->space_amplification(), direct ? 400.0 : 16.0);
    }
  }
  EXPECT_EQ(store->stats().live, where.size());
  for (const auto& entry : where) {
    uint64_t key = 0;
    ASSERT_TRUE(store->Read(entry.second.first, got.data(), &key).ok());
    EXPECT_EQ(key, entry.first);
    EXPECT_EQ(got, RecordOf(entry.first, entry.second.second, floats));
  }
  EXPECT_GT(store->stats().compactions, 0u);
  // Every remaining segment is at most half stale, but for the one being appended to.
  ASSERT_TRUE(store->Compact([](uint64_t, ColdStore::Location, ColdStore::Location) {}).ok());
  if (!direct) {
    EXPECT_LE(store->space_amplification(), 2.0 + 16.0 / std::max<size_t>(where.size(), 1));
  }
}

INSTANTIATE_TEST_SUITE_P(DirectIo, ColdStoreMapTest, ::testing::Bool());

TEST_F(ColdStoreTest, CompactionReportsMovesAndDeletesTheOldFile) {
  auto store = Make(8, 4);
  std::vector<ColdStore::Location> at(8);
  for (uint64_t k = 0; k < 8; ++k) {
    const uint64_t value = k * 11;
    ASSERT_TRUE(store->Append(k, &value, &at[k]).ok());
  }
  EXPECT_EQ(store->stats().segments, 2u);
  const std::string first = store->segment_path(0);
  ASSERT_TRUE(store->Remove(at[0]).ok());
  ASSERT_TRUE(store->Remove(at[1]).ok());
  // Half stale is not more than half: nothing moves.
  ASSERT_TRUE(store
                  ->Compact([](uint64_t, ColdStore::Location, ColdStore::Location) {
                    FAIL() << "nothing should move";
                  })
                  .ok());
  ASSERT_TRUE(store->Remove(at[2]).ok());
  std::map<uint64_t, ColdStore::Location> moved;
  ASSERT_TRUE(
      store
          ->Compact([&](uint64_t k, ColdStore::Location, ColdStore::Location to) { moved[k] = to; })
          .ok());
  ASSERT_EQ(moved.size(), 1u);
  ASSERT_EQ(moved.count(3), 1u);
  uint64_t value = 0, key = 0;
  ASSERT_TRUE(store->Read(moved[3], &value, &key).ok());
  EXPECT_EQ(value, 33u);
  EXPECT_EQ(key, 3u);
  EXPECT_FALSE(store->Read(at[3], &value).ok());  // the old location is gone
  EXPECT_NE(::access(first.c_str(), F_OK), 0);
  EXPECT_EQ(store->stats().live, 5u);
  EXPECT_EQ(store->stats().stale, 0u);
}

TEST_F(ColdStoreTest, FilesGoWithTheStoreAndDeadProcessesFilesAreCleaned) {
  {
    auto store = Make(4, 2);
    const uint32_t value = 5;
    ColdStore::Location at;
    ASSERT_TRUE(store->Append(1, &value, &at).ok());
    EXPECT_EQ(Files().size(), 1u);
  }
  EXPECT_TRUE(Files().empty());
  // A file left by a process that is gone (pid 999999999 runs nowhere) and one of this
  // (live) process: Open removes the first only.
  std::ofstream(dir_ + "/rec_sdk-999999999-1-0.seg") << "x";
  const std::string live = dir_ + "/rec_sdk-" + std::to_string(::getpid()) + "-999-0.seg";
  std::ofstream(live) << "x";
  std::ofstream(dir_ + "/other-999999999-1-0.seg") << "x";
  auto store = Make(4, 2);
  auto files = Files();
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files,
            (std::vector<std::string>{"other-999999999-1-0.seg",
                                      "rec_sdk-" + std::to_string(::getpid()) + "-999-0.seg"}));
}

TEST_F(ColdStoreTest, BadArgumentsAndLocationsAreErrors) {
  ColdStore::Options options;
  options.directories = {dir_};
  std::unique_ptr<ColdStore> store;
  EXPECT_EQ(ColdStore::Open(options, &store).code(), StatusCode::kInvalidArgument);
  options.record_bytes = 4;
  options.directories = {dir_ + "/missing"};
  EXPECT_EQ(ColdStore::Open(options, &store).code(), StatusCode::kNotFound);
  options.directories = {dir_};
  options.prefix = "a/b";
  EXPECT_EQ(ColdStore::Open(options, &store).code(), StatusCode::kInvalidArgument);
  store = Make(4, 2);
  uint32_t value = 0;
  EXPECT_EQ(store->Read({0, 0}, &value).code(), StatusCode::kInvalidArgument);
  ColdStore::Location at;
  ASSERT_TRUE(store->Append(9, &value, &at).ok());
  ASSERT_TRUE(store->Remove(at).ok());
  EXPECT_EQ(store->Remove(at).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Read(at, &value).code(), StatusCode::kInvalidArgument);
}

TEST_F(ColdStoreTest, AFullDiskIsAnErrorThatLosesNothing) {
  // RLIMIT_FSIZE makes writes past 100 bytes fail (EFBIG, as a full disk fails them with
  // ENOSPC); SIGXFSZ is ignored so that the write returns the error.
  auto store = Make(4, 64);  // 12-byte slots: 8 fit under the limit
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = old_limit;
  limit.rlim_cur = 100;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::vector<ColdStore::Location> at;
  Status status;
  for (uint32_t k = 0; k < 20 && status.ok(); ++k) {
    ColdStore::Location where;
    status = store->Append(k, &k, &where);
    if (status.ok()) at.push_back(where);
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.message();
  EXPECT_NE(status.message().find(".seg"), std::string::npos) << status.message();
  ASSERT_EQ(at.size(), 8u);
  EXPECT_EQ(store->stats().live, 8u);
  for (uint32_t k = 0; k < at.size(); ++k) {
    uint32_t value = 0;
    ASSERT_TRUE(store->Read(at[k], &value).ok());
    EXPECT_EQ(value, k);
  }
  // With room again, the store goes on where it stopped.
  ColdStore::Location where;
  const uint32_t value = 99;
  ASSERT_TRUE(store->Append(99, &value, &where).ok());
  EXPECT_EQ(where.slot, 8u);
}

TEST_F(ColdStoreTest, BatchesTagsMarksScansAndDirectories) {
  char second[] = "/tmp/cold_store_test2_XXXXXX";
  ASSERT_NE(::mkdtemp(second), nullptr);
  ColdStore::Options options;
  options.directories = {dir_, second};
  options.record_bytes = 8;
  options.records_per_segment = 4;
  std::unique_ptr<ColdStore> store;
  ASSERT_TRUE(ColdStore::Open(options, &store).ok());
  std::vector<uint64_t> keys(10), values(10);
  std::vector<int64_t> tags(10);
  std::vector<const void*> records(10);
  for (uint64_t k = 0; k < 10; ++k) {
    keys[k] = k + 100;
    values[k] = k * 3;
    tags[k] = -static_cast<int64_t>(k);
    records[k] = &values[k];
  }
  std::vector<ColdStore::Location> at(10);
  ASSERT_TRUE(store->AppendBatch(10, keys.data(), records.data(), tags.data(), at.data()).ok());
  EXPECT_EQ(store->stats().segments, 3u);
  // Segments alternate between the directories.
  EXPECT_EQ(store->segment_path(0).rfind(dir_, 0), 0u);
  EXPECT_EQ(store->segment_path(1).rfind(second, 0), 0u);
  for (uint64_t k = 0; k < 10; ++k) {
    EXPECT_EQ(store->tag(at[k]), tags[k]);
    EXPECT_EQ(store->AtNumber(store->Number(at[k])), at[k]);
  }
  store->set_marks(at[5], 2);
  store->set_marks(at[8], 1);
  // Segment 1 (keys 104..107) loses three records: compaction moves key 105 with its tag and
  // mark.
  for (int k : {4, 6, 7}) ASSERT_TRUE(store->Remove(at[k]).ok());
  EXPECT_TRUE(store->NeedsCompaction());
  ColdStore::Location moved_to;
  ASSERT_TRUE(store
                  ->Compact([&](uint64_t key, ColdStore::Location from, ColdStore::Location to) {
                    EXPECT_EQ(key, 105u);
                    EXPECT_EQ(from, at[5]);
                    moved_to = to;
                  })
                  .ok());
  EXPECT_FALSE(store->NeedsCompaction());
  EXPECT_EQ(store->tag(moved_to), -5);
  EXPECT_EQ(store->marks(moved_to), 2);
  at[5] = moved_to;
  // A scan sees every live record once, with its bytes.
  std::map<uint64_t, uint64_t> seen;
  ASSERT_TRUE(store
                  ->ForEachLive([&](uint64_t key, ColdStore::Location where, const void* record) {
                    uint64_t value;
                    std::memcpy(&value, record, sizeof(value));
                    EXPECT_TRUE(seen.emplace(key, value).second);
                    EXPECT_EQ(where, at[key - 100]);
                    return Status::Ok();
                  })
                  .ok());
  EXPECT_EQ(seen, (std::map<uint64_t, uint64_t>{
                      {100, 0}, {101, 3}, {102, 6}, {103, 9}, {105, 15}, {108, 24}, {109, 27}}));
  // Clearing one mark bit keeps the other.
  store->ClearMarks(1);
  EXPECT_EQ(store->marks(at[5]), 2);
  EXPECT_EQ(store->marks(at[8]), 0);
  store->set_marks(at[8], 3);
  store->ClearMarks(2);
  EXPECT_EQ(store->marks(at[5]), 0);
  EXPECT_EQ(store->marks(at[8]), 1);
  // Clear deletes every file; later locations are new ones.
  store->Clear();
  EXPECT_TRUE(Files().empty());
  EXPECT_EQ(store->stats().live, 0u);
  ColdStore::Location after;
  const uint64_t value = 1;
  ASSERT_TRUE(store->Append(1, &value, &after).ok());
  EXPECT_GT(after.segment, at[9].segment);
  EXPECT_EQ(std::system(("rm -rf '" + std::string(second) + "'").c_str()), 0);
}

TEST_F(ColdStoreTest, AFailedBatchIsTakenBackWhole) {
  auto store = Make(4, 4);
  const uint32_t first = 7;
  ColdStore::Location kept;
  ASSERT_TRUE(store->Append(1, &first, &kept).ok());
  // No file can be opened: the batch fills the current segment (3 records), then cannot
  // start the next one, and takes the 3 records back.
  std::vector<uint64_t> keys(10);
  std::vector<uint32_t> values(10);
  std::vector<const void*> records(10);
  for (uint32_t k = 0; k < 10; ++k) {
    keys[k] = k + 10;
    values[k] = k;
    records[k] = &values[k];
  }
  std::vector<ColdStore::Location> at(10);
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old_limit), 0);
  const int lowest_free = ::dup(0);
  ASSERT_GE(lowest_free, 0);
  ::close(lowest_free);
  struct rlimit limit = old_limit;
  limit.rlim_cur = static_cast<rlim_t>(lowest_free);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limit), 0);
  Status status = store->AppendBatch(10, keys.data(), records.data(), nullptr, at.data());
  ::setrlimit(RLIMIT_NOFILE, &old_limit);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find(".seg"), std::string::npos) << status.message();
  EXPECT_EQ(store->stats().live, 1u);
  EXPECT_EQ(store->stats().stale, 3u);
  uint32_t value = 0;
  ASSERT_TRUE(store->Read(kept, &value).ok());
  EXPECT_EQ(value, 7u);
  // The store goes on.
  ASSERT_TRUE(store->AppendBatch(10, keys.data(), records.data(), nullptr, at.data()).ok());
  EXPECT_EQ(store->stats().live, 11u);
}

}  // namespace
}  // namespace rec_sdk
