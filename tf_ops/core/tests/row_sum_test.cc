// SumRowsByIndex and GatherRowsByIndex against plain loops, serial and threaded, and their
// index checks.
#include "tf_ops/core/row_sum.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <vector>

namespace rec_sdk {
namespace {

void ThreeThreads(int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& work) {
  std::vector<std::thread> threads;
  for (int p = 0; p < 3; ++p) {
    const int64_t first = total * p / 3, last = total * (p + 1) / 3;
    if (first < last) threads.emplace_back([&work, first, last] { work(first, last); });
  }
  for (auto& t : threads) t.join();
}

TEST(RowSumTest, MatchesReferenceForManyShapes) {
  std::mt19937 rng(11);
  for (int dim : {1, 3, 16, 100}) {
    // 5000 rows: per-thread copies of the output (both paths of SumRowsByIndex are taken: its
    // copies at up to 1M floats, its row ranges at 20000 rows of dim 100).
    for (int64_t rows : {1, 7, 5000, 20000}) {
      const int64_t n = 3 * rows + 5;
      std::vector<float> values(n * dim);
      std::vector<int32_t> index(n);
      for (auto& v : values) v = static_cast<float>(rng() % 1000) / 100.0f - 5.0f;
      for (auto& i : index) i = static_cast<int32_t>(rng() % rows);
      std::vector<float> expected(rows * dim, 0.0f);
      for (int64_t i = 0; i < n; ++i) {
        for (int d = 0; d < dim; ++d) expected[index[i] * dim + d] += values[i * dim + d];
      }
      for (const ParallelRunner& run :
           {ParallelRunner(SerialRunner), ParallelRunner(ThreeThreads)}) {
        std::vector<float> out(rows * dim, 123.0f);
        ASSERT_TRUE(
            SumRowsByIndex(values.data(), index.data(), n, dim, rows, out.data(), run).ok());
        for (size_t k = 0; k < out.size(); ++k) {
          ASSERT_NEAR(out[k], expected[k], 1e-4) << "dim " << dim << " rows " << rows << " k " << k;
        }
      }
    }
  }
}

TEST(RowSumTest, GatherRowsMatchesReferenceAndChecksIndices) {
  std::mt19937 rng(13);
  const int dim = 5;
  const int64_t rows = 300, n = 2000;
  std::vector<float> values(rows * dim);
  std::vector<int32_t> index(n);
  for (auto& v : values) v = static_cast<float>(rng() % 1000);
  for (auto& i : index) i = static_cast<int32_t>(rng() % rows);
  for (const ParallelRunner& run : {ParallelRunner(SerialRunner), ParallelRunner(ThreeThreads)}) {
    std::vector<float> out(n * dim, -1.0f);
    ASSERT_TRUE(GatherRowsByIndex(values.data(), rows, dim, index.data(), n, out.data(), run).ok());
    for (int64_t i = 0; i < n; ++i) {
      for (int d = 0; d < dim; ++d) ASSERT_EQ(out[i * dim + d], values[index[i] * dim + d]);
    }
  }
  std::vector<float> out(dim);
  const int32_t bad = static_cast<int32_t>(rows);
  EXPECT_EQ(GatherRowsByIndex(values.data(), rows, dim, &bad, 1, out.data(), SerialRunner).code(),
            StatusCode::kInvalidArgument);
}

TEST(RowSumTest, RowsWithoutIndicesAreZeroAndBadIndicesAreErrors) {
  const std::vector<float> values = {1, 2, 3, 4};
  std::vector<float> out(3 * 2, 9.0f);
  const std::vector<int32_t> index = {2, 2};
  ASSERT_TRUE(SumRowsByIndex(values.data(), index.data(), 2, 2, 3, out.data(), SerialRunner).ok());
  EXPECT_EQ(out, (std::vector<float>{0, 0, 0, 0, 4, 6}));
  EXPECT_EQ(SumRowsByIndex(values.data(), index.data(), 2, 0, 3, out.data(), SerialRunner).code(),
            StatusCode::kInvalidArgument);
  for (int32_t bad : {-1, 3}) {
    const std::vector<int32_t> wrong = {0, bad};
    Status s = SumRowsByIndex(values.data(), wrong.data(), 2, 2, 3, out.data(), SerialRunner);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(std::to_string(bad)), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace rec_sdk
