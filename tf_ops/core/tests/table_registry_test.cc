// Tests of TableRegistry: which table a restoring session may use instead of the files
// (readers and trainers), which tables are kept after their last session, and what a session
// hands over to the table it switches to.
#include "tf_ops/core/table_registry.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace rec_sdk {
namespace {

constexpr int kInt64Keys = 9;  // any tag: the registry only compares them
constexpr int kInt32Keys = 3;

TableConfig Config(const std::string& name = "t", int dim = 4) {
  TableConfig c;
  c.name = name;
  c.dim = dim;
  c.initializer.kind = InitializerKind::kConstant;
  c.initializer.value = 0.5f;
  return c;
}

std::shared_ptr<EmbeddingTable> Make(const TableConfig& c = Config()) {
  std::unique_ptr<EmbeddingTable> t;
  EXPECT_TRUE(EmbeddingTable::Create(c, &t).ok());
  return std::shared_ptr<EmbeddingTable>(std::move(t));
}

void Insert(EmbeddingTable* t, int64_t key) {
  int64_t address;
  ASSERT_TRUE(t->FindOrInsert(&key, 1, true, &address, SerialRunner).ok());
}

// Saves (a snapshot without files) and commits: the table then holds the returned checkpoint.
int64_t Commit(EmbeddingTable* t) {
  int64_t save_id = 0;
  EXPECT_TRUE(t->Snapshot([&](const EmbeddingTable::SnapshotView& view) {
                 save_id = view.info().save_id;
                 return Status::Ok();
               }).ok());
  EXPECT_TRUE(t->CommitSave(save_id).ok());
  EXPECT_TRUE(t->HoldsCheckpoint(save_id));
  return save_id;
}

TEST(ShareModeTest, ParsesTheAttributeValues) {
  ShareMode mode;
  ASSERT_TRUE(ParseShareMode("", &mode));
  EXPECT_EQ(mode, ShareMode::kPrivate);
  ASSERT_TRUE(ParseShareMode("reader", &mode));
  EXPECT_EQ(mode, ShareMode::kReader);
  ASSERT_TRUE(ParseShareMode("trainer", &mode));
  EXPECT_EQ(mode, ShareMode::kTrainer);
  EXPECT_FALSE(ParseShareMode("writer", &mode));
}

TEST(TableRegistryTest, ReadersUseALiveTableTrainersOnlyAnUnusedOne) {
  TableRegistry registry;
  auto trained = Make();
  registry.Attach(trained);  // the training session
  Insert(trained.get(), 7);
  const int64_t id = Commit(trained.get());
  registry.Note(id, trained, kInt64Keys);
  auto other = Make();
  EXPECT_EQ(registry.Find(id, *other, kInt64Keys, ShareMode::kReader), trained);
  EXPECT_EQ(registry.Find(id, *other, kInt64Keys, ShareMode::kTrainer), nullptr);
  EXPECT_EQ(registry.Find(id, *other, kInt64Keys, ShareMode::kPrivate), nullptr);
  EXPECT_EQ(registry.Users(*trained), 1);
  registry.Detach(trained);
  EXPECT_EQ(registry.Users(*trained), 0);
  EXPECT_EQ(registry.Find(id, *other, kInt64Keys, ShareMode::kTrainer), trained);
}

TEST(TableRegistryTest, OnlyTheSameUnchangedTableCounts) {
  TableRegistry registry;
  auto t = Make();
  Insert(t.get(), 7);
  const int64_t id = Commit(t.get());
  registry.Note(id, t, kInt64Keys);
  EXPECT_EQ(registry.Find(id, *t, kInt64Keys, ShareMode::kReader), nullptr);  // its own table
  EXPECT_EQ(registry.Find(id + 1, *Make(), kInt64Keys, ShareMode::kReader), nullptr);
  EXPECT_EQ(registry.Find(id, *Make(), kInt32Keys, ShareMode::kReader), nullptr);
  EXPECT_EQ(registry.Find(id, *Make(Config("t", 8)), kInt64Keys, ShareMode::kReader), nullptr);
  EXPECT_EQ(registry.Find(id, *Make(Config("u")), kInt64Keys, ShareMode::kReader), nullptr);
  Insert(t.get(), 8);  // no longer what the checkpoint holds
  EXPECT_EQ(registry.Find(id, *Make(), kInt64Keys, ShareMode::kReader), nullptr);
}

TEST(TableRegistryTest, KeepsATableHoldingItsCheckpointAfterItsLastSession) {
  TableRegistry registry;
  int64_t id;
  {
    auto t = Make();
    registry.Attach(t);
    registry.Attach(t);  // two sessions
    Insert(t.get(), 7);
    id = Commit(t.get());
    registry.Note(id, t, kInt64Keys);
    registry.Detach(t);
    registry.Detach(t);
  }  // only the registry holds it now
  auto found = registry.Find(id, *Make(), kInt64Keys, ShareMode::kTrainer);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->Size(), 1);

  // A table that changed after its checkpoint is not kept (nor is one that never held one).
  std::weak_ptr<EmbeddingTable> changed_ref;
  {
    auto changed = Make();
    changed_ref = changed;
    registry.Attach(changed);
    const int64_t changed_id = Commit(changed.get());
    registry.Note(changed_id, changed, kInt64Keys);
    Insert(changed.get(), 1);
    registry.Detach(changed);
  }
  EXPECT_TRUE(changed_ref.expired());
}

TEST(TableRegistryTest, TrainersHandOverTheirAdmissionSettingsReadersDoNot) {
  auto current = Make();
  ASSERT_TRUE(current->ConfigureAdmission(AdmissionConfig{3, 60}).ok());
  auto next = Make();
  ASSERT_TRUE(next->ConfigureAdmission(AdmissionConfig{5, -1}).ok());  // another graph's
  TableRegistry::HandOver(*current, next.get(), ShareMode::kReader);
  EXPECT_EQ(next->admission(), (AdmissionConfig{5, -1}));
  TableRegistry::HandOver(*current, next.get(), ShareMode::kTrainer);
  EXPECT_EQ(next->admission(), (AdmissionConfig{3, 60}));
  EXPECT_EQ(next->access_threshold(), 3);
  EXPECT_EQ(next->eviction_threshold(), 60);
  // A session whose graph configured nothing yet leaves the next table unconfigured: its
  // graph configures it at its first training step.
  TableRegistry::HandOver(*Make(), next.get(), ShareMode::kTrainer);
  EXPECT_FALSE(next->admission_configured());
  EXPECT_EQ(next->access_threshold(), -1);
}

}  // namespace
}  // namespace rec_sdk
