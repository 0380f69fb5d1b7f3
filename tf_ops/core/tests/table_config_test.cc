// Tests of ConfigDifferences and AdmissionDifferences: equal configurations, each field that
// must match, and what does not count (a growing table's initial reservation).
#include "tf_ops/core/table_config.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace rec_sdk {
namespace {

TableConfig Base() {
  TableConfig config;
  config.name = "t";
  config.dim = 8;
  config.dynamic_expansion = false;
  config.capacity = 100;
  config.initializer.kind = InitializerKind::kTruncatedNormal;
  config.initializer.stddev = 0.05f;
  config.initializer.seed = 7;
  return config;
}

TEST(ConfigDifferencesTest, EqualConfigurationsHaveNone) {
  EXPECT_TRUE(ConfigDifferences(Base(), Base()).empty());
  EXPECT_TRUE(Base() == Base());
}

TEST(ConfigDifferencesTest, NamesEachDifferingFieldWithBothValues) {
  struct Case {
    std::function<void(TableConfig*)> change;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](TableConfig* c) { c->name = "u"; }, "name: t vs u"},
      {[](TableConfig* c) { c->dim = 4; }, "dim: 8 vs 4"},
      {[](TableConfig* c) { c->capacity = 200; }, "capacity: 100 vs 200"},
      {[](TableConfig* c) { c->dynamic_expansion = true; }, "dynamic_expansion: false vs true"},
      {[](TableConfig* c) { c->initializer.kind = InitializerKind::kRandomUniform; },
       "initializer: truncated_normal vs random_uniform"},
      {[](TableConfig* c) { c->initializer.stddev = 0.5f; }, "initializer stddev: 0.05 vs 0.5"},
      {[](TableConfig* c) { c->initializer.seed = 8; }, "initializer seed: 7 vs 8"},
      {[](TableConfig* c) { c->initializer.values = {1.0f, 2.0f}; },
       "initializer values: [] vs [1, 2]"},
      {[](TableConfig* c) { c->initializer.scale = 2.0f; },
       "init_param (initializer scale): 1 vs 2"},
      {[](TableConfig* c) { c->evict_when_full = true; }, "evict_when_full: false vs true"},
      {[](TableConfig* c) { c->track_changes = true; }, "track_changes: false vs true"},
      {[](TableConfig* c) { c->track_access = true; }, "track_access: false vs true"},
  };
  for (const Case& c : cases) {
    TableConfig wanted = Base();
    c.change(&wanted);
    EXPECT_EQ(ConfigDifferences(Base(), wanted), std::vector<std::string>{c.expected});
    EXPECT_TRUE(Base() != wanted) << c.expected;
  }
}

TEST(ConfigDifferencesTest, ListsSeveralDifferencesInOrder) {
  TableConfig wanted = Base();
  wanted.dim = 16;
  wanted.track_access = true;
  EXPECT_EQ(ConfigDifferences(Base(), wanted),
            (std::vector<std::string>{"dim: 8 vs 16", "track_access: false vs true"}));
}

TEST(ConfigDifferencesTest, GrowingTablesIgnoreReservations) {
  TableConfig a = Base();
  a.dynamic_expansion = true;
  a.initial_capacity = 10;
  TableConfig b = a;
  b.initial_capacity = 1000;
  b.capacity = 5;  // unused by a growing table
  EXPECT_TRUE(ConfigDifferences(a, b).empty());
  EXPECT_TRUE(a == b);
}

TEST(ConfigDifferencesTest, IndexLayoutsCompareAsResolved) {
  using Layout = TableConfig::IndexLayout;
  TableConfig a = Base();  // float32 rows: "auto" is full
  TableConfig b = a;
  b.index_layout = Layout::kFull;
  EXPECT_TRUE(a == b);
  b.index_layout = Layout::kCompact;
  EXPECT_EQ(ConfigDifferences(a, b),
            std::vector<std::string>{"compact index (index_layout): false vs true"});
  a.emb_dtype = b.emb_dtype = RowDtype::kBFloat16;  // half-precision rows: "auto" is compact
  a.index_layout = Layout::kAuto;
  EXPECT_TRUE(a == b);
  EXPECT_TRUE(a.compact_index());
  a.ssd_paths = {"/tmp"};  // a tiered table's index is full
  EXPECT_FALSE(a.compact_index());
}

TEST(IndexLayoutTest, NamesRoundTripAndOthersAreRefused) {
  for (auto layout : {TableConfig::IndexLayout::kAuto, TableConfig::IndexLayout::kFull,
                      TableConfig::IndexLayout::kCompact}) {
    TableConfig::IndexLayout parsed;
    ASSERT_TRUE(IndexLayoutFromName(IndexLayoutName(layout), &parsed).ok());
    EXPECT_EQ(parsed, layout);
  }
  TableConfig::IndexLayout parsed;
  Status s = IndexLayoutFromName("small", &parsed);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("index_layout must be \"auto\", \"full\" or \"compact\", got "
                             "\"small\""),
            std::string::npos)
      << s.message();
}

TEST(AdmissionDifferencesTest, NamesEachDifferingThresholdWithBothValues) {
  const AdmissionConfig base{2, 60};
  EXPECT_TRUE(AdmissionDifferences(base, base).empty());
  EXPECT_TRUE(base == (AdmissionConfig{2, 60}));
  EXPECT_EQ(AdmissionDifferences(base, AdmissionConfig{3, 60}),
            std::vector<std::string>{"access_threshold: 2 vs 3"});
  EXPECT_EQ(AdmissionDifferences(base, AdmissionConfig{2, -1}),
            std::vector<std::string>{"eviction_threshold: 60 vs -1"});
  EXPECT_EQ(AdmissionDifferences(base, AdmissionConfig{-1, 5}),
            (std::vector<std::string>{"access_threshold: 2 vs -1", "eviction_threshold: 60 vs 5"}));
  EXPECT_TRUE(base != (AdmissionConfig{-1, 60}));
}

}  // namespace
}  // namespace rec_sdk
