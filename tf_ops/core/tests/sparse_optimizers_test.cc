// Tests of the sparse optimizers against independent reference implementations of
// TensorFlow's documented update formulas, plus lazy-update, address-validation and
// hyperparameter checks.
#include "tf_ops/core/sparse_optimizers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace rec_sdk {
namespace {

constexpr int kDim = 4;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A runner that really splits the work over std::threads.
void ThreadedRunner(int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& work) {
  const int64_t parts = std::min<int64_t>(total, 4);
  std::vector<std::thread> threads;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t first = total * p / parts, last = total * (p + 1) / parts;
    threads.emplace_back([&work, first, last] { work(first, last); });
  }
  for (auto& t : threads) t.join();
}

// The stored state of one row: the embedding and the optimizer's slots.
struct Row {
  std::vector<float> w;
  std::vector<std::vector<float>> slots;
  bool operator==(const Row& o) const { return w == o.w && slots == o.slots; }
};

// --- Reference formulas (double arithmetic; the state is stored as float, like the table) ---

void RefLazyAdam(Row& r, const float* g, const LazyAdamParams& p) {
  const double t = static_cast<double>(p.step);
  const double b1 = p.beta1, b2 = p.beta2;
  const double lr_t = p.learning_rate * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
  for (int d = 0; d < kDim; ++d) {
    const double m = b1 * r.slots[0][d] + (1 - b1) * g[d];
    const double v = b2 * r.slots[1][d] + (1 - b2) * double(g[d]) * g[d];
    r.w[d] = static_cast<float>(r.w[d] - lr_t * m / (std::sqrt(v) + p.epsilon));
    r.slots[0][d] = static_cast<float>(m);
    r.slots[1][d] = static_cast<float>(v);
  }
}

void RefGradientDescent(Row& r, const float* g, const GradientDescentParams& p) {
  for (int d = 0; d < kDim; ++d) {
    r.w[d] = static_cast<float>(r.w[d] -
                                double(p.learning_rate) * (g[d] + double(p.weight_decay) * r.w[d]));
  }
}

void RefAdagrad(Row& r, const float* g, const AdagradParams& p) {
  for (int d = 0; d < kDim; ++d) {
    const double a = r.slots[0][d] + double(g[d]) * g[d];
    r.w[d] = static_cast<float>(r.w[d] - p.learning_rate * g[d] / std::sqrt(a));
    r.slots[0][d] = static_cast<float>(a);
  }
}

// TorchRec/FBGEMM's EXACT_ROWWISE_ADAGRAD: one accumulator per row, the mean of g^2.
void RefRowwiseAdagrad(Row& r, const float* g, const RowwiseAdagradParams& p) {
  double squares = 0;
  for (int d = 0; d < kDim; ++d) squares += double(g[d]) * g[d];
  const double a = r.slots[0][0] + squares / kDim;
  for (int d = 0; d < kDim; ++d) {
    r.w[d] = static_cast<float>(r.w[d] - p.learning_rate * g[d] / (std::sqrt(a) + p.epsilon));
  }
  r.slots[0][0] = static_cast<float>(a);
}

// TensorFlow's ResourceSparseApplyMomentum.
void RefMomentum(Row& r, const float* g, const MomentumParams& p) {
  for (int d = 0; d < kDim; ++d) {
    const double a = double(r.slots[0][d]) * p.momentum + g[d];
    const double step = p.use_nesterov
                            ? g[d] * double(p.learning_rate) + a * p.momentum * p.learning_rate
                            : double(p.learning_rate) * a;
    r.w[d] = static_cast<float>(r.w[d] - step);
    r.slots[0][d] = static_cast<float>(a);
  }
}

// FTRL-proximal as in TensorFlow's ApplyFtrlV2; slots: n (accumulator), z (linear).
void RefFtrl(Row& r, const float* g, const FtrlParams& p) {
  const double power = p.learning_rate_power, lr = p.learning_rate;
  for (int d = 0; d < kDim; ++d) {
    const double w = r.w[d], n = r.slots[0][d];
    const double g_s = g[d] + 2.0 * p.l2_shrinkage * w;
    const double n_new = n + double(g[d]) * g[d];
    const double sigma = (std::pow(n_new, -power) - std::pow(n, -power)) / lr;
    const double z = r.slots[1][d] + g_s - sigma * w;
    const double sign = z < 0 ? -1.0 : 1.0;
    const double w_new = std::fabs(z) <= p.l1
                             ? 0.0
                             : (sign * p.l1 - z) / (std::pow(n_new, -power) / lr + 2.0 * p.l2);
    r.w[d] = static_cast<float>(w_new);
    r.slots[0][d] = static_cast<float>(n_new);
    r.slots[1][d] = static_cast<float>(z);
  }
}

// --- Fixture: a table with a few rows, batches of random subsets, checks via Export ---------

bool Near(float actual, double expected) {
  return std::fabs(actual - expected) <= 1e-5 * std::fabs(expected) + 1e-7;
}

class SparseOptimizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TableConfig c;
    c.name = "opt_table";
    c.dim = kDim;
    c.initializer.kind = InitializerKind::kRandomUniform;
    c.initializer.minval = -0.5f;
    c.initializer.maxval = 0.5f;
    c.initializer.seed = 9;
    init_ = c.initializer;
    ASSERT_TRUE(EmbeddingTable::Create(c, &table_).ok());
    keys_ = {11, -3, 0, std::numeric_limits<int64_t>::max(), 12345, 7};
    addr_.resize(keys_.size());
    ASSERT_TRUE(
        table_->FindOrInsert(keys_.data(), keys_.size(), true, addr_.data(), SerialRunner).ok());
  }

  // The model's starting point: each key's initializer values and the given slot values.
  std::vector<Row> InitialModel(const std::vector<float>& slot_init) const {
    std::vector<Row> model(keys_.size());
    for (size_t i = 0; i < keys_.size(); ++i) {
      model[i].w.resize(kDim);
      InitializeRow(init_, keys_[i], kDim, model[i].w.data());
      for (float s : slot_init) model[i].slots.push_back(std::vector<float>(slot_width_, s));
    }
    return model;
  }

  // The table's rows in keys_ order (via Export, so slots are included).
  std::vector<Row> Snapshot() {
    std::vector<int64_t> keys;
    std::vector<float> values, slots;
    const int ns = table_->num_slots();
    const int width = table_->slot_width();
    Status s = table_->Export([&](int64_t n, int64_t** k, float** v, float** sl) {
      keys.resize(n);
      values.resize(n * kDim);
      slots.resize(ns * n * width);
      *k = keys.data();
      *v = values.data();
      *sl = slots.data();
      return Status::Ok();
    });
    EXPECT_TRUE(s.ok()) << s.message();
    std::map<int64_t, Row> by_key;
    const int64_t n = keys.size();
    for (int64_t i = 0; i < n; ++i) {
      Row r;
      r.w.assign(values.begin() + i * kDim, values.begin() + (i + 1) * kDim);
      for (int k = 0; k < ns; ++k) {
        r.slots.emplace_back(slots.begin() + (k * n + i) * width,
                             slots.begin() + (k * n + i + 1) * width);
      }
      by_key[keys[i]] = r;
    }
    std::vector<Row> rows;
    for (int64_t k : keys_) rows.push_back(by_key.at(k));
    return rows;
  }

  // A batch: a random non-empty subset of the rows in random order, with a -1 address (NaN
  // gradient: it must be skipped) somewhere in it.
  struct Batch {
    std::vector<int64_t> addr;
    std::vector<float> grads;
    std::vector<int> row;  // index into keys_, or -1
  };
  Batch MakeBatch(std::mt19937& rng) {
    Batch b;
    std::vector<int> rows(keys_.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int>(i);
    std::shuffle(rows.begin(), rows.end(), rng);
    rows.resize(1 + rng() % (rows.size() - 1));  // never all rows
    rows.insert(rows.begin() + rng() % (rows.size() + 1), -1);
    std::uniform_real_distribution<float> grad(-1.0f, 1.0f);
    for (int r : rows) {
      b.row.push_back(r);
      b.addr.push_back(r < 0 ? -1 : addr_[r]);
      for (int d = 0; d < kDim; ++d) b.grads.push_back(r < 0 ? kNaN : grad(rng));
    }
    return b;
  }

  // Runs `steps` batches through apply(batch, step) and reference(row, grads, step), checking
  // every row (value and slots) after each step: touched rows against the reference, untouched
  // rows bit-for-bit unchanged.
  void RunAndCompare(int steps, const std::vector<float>& slot_init,
                     const std::function<Status(const Batch&, int)>& apply,
                     const std::function<void(Row&, const float*, int)>& reference, unsigned seed) {
    std::vector<Row> model = InitialModel(slot_init);
    std::mt19937 rng(seed);
    std::vector<Row> before = Snapshot();
    for (int step = 1; step <= steps; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      Batch b = MakeBatch(rng);
      Status s = apply(b, step);
      ASSERT_TRUE(s.ok()) << s.message();
      std::vector<bool> touched(keys_.size(), false);
      for (size_t i = 0; i < b.row.size(); ++i) {
        if (b.row[i] < 0) continue;
        touched[b.row[i]] = true;
        reference(model[b.row[i]], &b.grads[i * kDim], step);
      }
      std::vector<Row> after = Snapshot();
      ASSERT_EQ(after.size(), model.size());
      for (size_t r = 0; r < model.size(); ++r) {
        SCOPED_TRACE("key " + std::to_string(keys_[r]));
        ASSERT_EQ(after[r].slots.size(), slot_init.size());
        if (!touched[r] && step > 1) {
          EXPECT_TRUE(after[r] == before[r]) << "untouched row changed";
        }
        for (int d = 0; d < kDim; ++d) {
          EXPECT_PRED2(Near, after[r].w[d], model[r].w[d]) << "w[" << d << "]";
        }
        for (size_t k = 0; k < slot_init.size(); ++k) {
          ASSERT_EQ(after[r].slots[k].size(), model[r].slots[k].size()) << "slot " << k;
          for (size_t d = 0; d < model[r].slots[k].size(); ++d) {
            EXPECT_PRED2(Near, after[r].slots[k][d], model[r].slots[k][d])
                << "slot " << k << "[" << d << "]";
          }
        }
      }
      before = after;
      if (HasFatalFailure() || HasNonfatalFailure()) return;
    }
    final_model_ = model;
  }

  InitializerSpec init_;
  int slot_width_ = kDim;  // floats per slot in the reference model
  std::unique_ptr<EmbeddingTable> table_;
  std::vector<int64_t> keys_;
  std::vector<int64_t> addr_;
  std::vector<Row> final_model_;
};

// --- Each optimizer over several steps against its reference --------------------------------

TEST_F(SparseOptimizerTest, LazyAdamMatchesReference) {
  LazyAdamParams p{0.01f, 0.9f, 0.999f, 1e-7f, 0};
  RunAndCompare(
      10, {0.0f, 0.0f},
      [&](const Batch& b, int step) {
        LazyAdamParams q = p;
        q.step = step;  // the global step: rows skipped in a step still see it advance
        return ApplyLazyAdam(table_.get(), b.addr.data(), b.grads.data(), b.addr.size(), q,
                             SerialRunner);
      },
      [&](Row& r, const float* g, int step) {
        LazyAdamParams q = p;
        q.step = step;
        RefLazyAdam(r, g, q);
      },
      1);
  EXPECT_EQ(table_->slot_optimizer(), "LazyAdam");
}

TEST_F(SparseOptimizerTest, LazyAdamOtherHyperparameters) {
  LazyAdamParams p{0.2f, 0.5f, 0.8f, 0.1f, 0};
  RunAndCompare(
      8, {0.0f, 0.0f},
      [&](const Batch& b, int step) {
        LazyAdamParams q = p;
        q.step = step + 100;  // later steps: bias correction close to 1
        return ApplyLazyAdam(table_.get(), b.addr.data(), b.grads.data(), b.addr.size(), q,
                             SerialRunner);
      },
      [&](Row& r, const float* g, int step) {
        LazyAdamParams q = p;
        q.step = step + 100;
        RefLazyAdam(r, g, q);
      },
      2);
}

TEST_F(SparseOptimizerTest, GradientDescentWithWeightDecayMatchesReference) {
  for (float wd : {0.0f, 0.1f}) {
    SCOPED_TRACE("weight_decay " + std::to_string(wd));
    SetUp();  // a fresh table for each setting
    GradientDescentParams p{0.05f, wd};
    RunAndCompare(
        8, {},
        [&](const Batch& b, int) {
          return ApplyGradientDescent(table_.get(), b.addr.data(), b.grads.data(), b.addr.size(), p,
                                      SerialRunner);
        },
        [&](Row& r, const float* g, int) { RefGradientDescent(r, g, p); }, 3);
  }
}

TEST_F(SparseOptimizerTest, AdagradMatchesReference) {
  AdagradParams p{0.1f, 0.1f};
  RunAndCompare(
      10, {0.1f},
      [&](const Batch& b, int) {
        return ApplyAdagrad(table_.get(), b.addr.data(), b.grads.data(), b.addr.size(), p,
                            SerialRunner);
      },
      [&](Row& r, const float* g, int) { RefAdagrad(r, g, p); }, 4);
}

TEST_F(SparseOptimizerTest, RowwiseAdagradMatchesReferenceWithOneFloatPerRow) {
  for (float initial : {0.0f, 0.1f}) {
    SCOPED_TRACE("initial accumulator " + std::to_string(initial));
    SetUp();
    const int64_t bytes_before = table_->MemoryBytes();
    RowwiseAdagradParams p{0.1f, initial, 1e-8f};
    slot_width_ = 1;
    RunAndCompare(
        10, {initial},
        [&](const Batch& b, int) {
          return ApplyRowwiseAdagrad(table_.get(), b.addr.data(), b.grads.data(), b.addr.size(), p,
                                     SerialRunner);
        },
        [&](Row& r, const float* g, int) { RefRowwiseAdagrad(r, g, p); }, 6);
    EXPECT_EQ(table_->slot_optimizer(), "RowwiseAdagrad");
    EXPECT_EQ(table_->num_slots(), 1);
    EXPECT_EQ(table_->slot_width(), 1);
    // A row grew by one float (plus alignment), not by dim floats.
    EXPECT_LE(table_->MemoryBytes(), bytes_before + table_->rows_per_chunk() * 8);
  }
  slot_width_ = kDim;
}

TEST_F(SparseOptimizerTest, RowwiseAdagradHyperparametersAndOtherOptimizers) {
  const int64_t a = addr_[0];
  const float g[kDim] = {1, 1, 1, 1};
  EXPECT_FALSE(
      ApplyRowwiseAdagrad(table_.get(), &a, g, 1, {-0.1f, 0.1f, 1e-8f}, SerialRunner).ok());
  EXPECT_FALSE(ApplyRowwiseAdagrad(table_.get(), &a, g, 1, {0.1f, 0.0f, 0.0f}, SerialRunner).ok());
  EXPECT_FALSE(
      ApplyRowwiseAdagrad(table_.get(), &a, g, 1, {0.1f, -1.0f, 1e-8f}, SerialRunner).ok());
  ASSERT_TRUE(ApplyRowwiseAdagrad(table_.get(), &a, g, 1, {0.1f, 0.0f, 1e-8f}, SerialRunner).ok());
  // One sparse optimizer per table: element-wise Adagrad cannot take over.
  Status s = ApplyAdagrad(table_.get(), &a, g, 1, {0.1f, 0.1f}, SerialRunner);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.message();
  EXPECT_EQ(table_->slot_width(), 1);
}

TEST_F(SparseOptimizerTest, MomentumMatchesReference) {
  for (bool nesterov : {false, true}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "heavy ball");
    SetUp();
    MomentumParams p{0.1f, 0.9f, nesterov};
    RunAndCompare(
        10, {0.0f},
        [&](const Batch& b, int) {
          return ApplyMomentum(table_.get(), b.addr.data(), b.grads.data(), b.addr.size(), p,
                               SerialRunner);
        },
        [&](Row& r, const float* g, int) { RefMomentum(r, g, p); }, 5);
  }
}

TEST_F(SparseOptimizerTest, FtrlSquareRootPowerMatchesReference) {
  FtrlParams p{0.1f, -0.5f, 0.1f, /*l1=*/0.01f, /*l2=*/0.02f, /*l2_shrinkage=*/0.05f};
  RunAndCompare(
      10, {0.1f, 0.0f},
      [&](const Batch& b, int) {
        return ApplyFtrl(table_.get(), b.addr.data(), b.grads.data(), b.addr.size(), p,
                         SerialRunner);
      },
      [&](Row& r, const float* g, int) { RefFtrl(r, g, p); }, 5);
}

TEST_F(SparseOptimizerTest, FtrlOtherPowerStrongL1MatchesReference) {
  FtrlParams p{0.3f, -0.25f, 0.5f, /*l1=*/0.3f, /*l2=*/0.0f, /*l2_shrinkage=*/0.1f};
  RunAndCompare(
      12, {0.5f, 0.0f},
      [&](const Batch& b, int) {
        return ApplyFtrl(table_.get(), b.addr.data(), b.grads.data(), b.addr.size(), p,
                         SerialRunner);
      },
      [&](Row& r, const float* g, int) { RefFtrl(r, g, p); }, 6);
  // The strong l1 zeroed some weights and left others: both branches were compared.
  int zeros = 0, nonzeros = 0;
  for (const Row& r : final_model_) {
    for (float w : r.w) (w == 0.0f ? zeros : nonzeros)++;
  }
  EXPECT_GT(zeros, 0);
  EXPECT_GT(nonzeros, 0);
}

TEST_F(SparseOptimizerTest, FtrlConstantLearningRate) {
  // learning_rate_power = 0: a constant learning rate (sigma is always 0).
  FtrlParams p{0.05f, 0.0f, 0.1f, /*l1=*/0.001f, /*l2=*/0.1f, /*l2_shrinkage=*/0.0f};
  RunAndCompare(
      6, {0.1f, 0.0f},
      [&](const Batch& b, int) {
        return ApplyFtrl(table_.get(), b.addr.data(), b.grads.data(), b.addr.size(), p,
                         SerialRunner);
      },
      [&](Row& r, const float* g, int) { RefFtrl(r, g, p); }, 7);
}

// --- Threaded runs give exactly the serial result -------------------------------------------

TEST(SparseOptimizerThreadsTest, ThreadedRunnerMatchesSerial) {
  const int dim = 16;
  std::vector<int64_t> keys(2000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<int64_t>(i) * 31 - 5000;
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> grad(-1.0f, 1.0f);
  std::vector<float> grads(keys.size() * dim);
  for (auto& g : grads) g = grad(rng);
  auto run_all = [&](const ParallelRunner& run) {
    TableConfig c;
    c.name = "threads";
    c.dim = dim;
    c.initializer.kind = InitializerKind::kRandomNormal;
    std::unique_ptr<EmbeddingTable> t;
    EXPECT_TRUE(EmbeddingTable::Create(c, &t).ok());
    std::vector<int64_t> addr(keys.size());
    EXPECT_TRUE(t->FindOrInsert(keys.data(), keys.size(), true, addr.data(), run).ok());
    for (int step = 1; step <= 3; ++step) {
      Status s = ApplyFtrl(t.get(), addr.data(), grads.data(), addr.size(),
                           FtrlParams{0.1f, -0.5f, 0.1f, 0.01f, 0.01f, 0.0f}, run);
      EXPECT_TRUE(s.ok()) << s.message();
    }
    std::vector<float> out(keys.size() * dim);
    EXPECT_TRUE(t->Lookup(keys.data(), keys.size(), false, out.data(), nullptr, run).ok());
    return out;
  };
  EXPECT_EQ(run_all(ThreadedRunner), run_all(SerialRunner));
}

// --- An invalid address anywhere fails the whole batch before any row is updated ----------

TEST_F(SparseOptimizerTest, InvalidAddressUpdatesNoRow) {
  // A stale address (key removed), garbage, and an address of another table.
  const int64_t victim = 999;
  int64_t stale = -1;
  TableConfig oc;
  oc.name = "other";
  oc.dim = kDim;
  std::unique_ptr<EmbeddingTable> other;
  ASSERT_TRUE(EmbeddingTable::Create(oc, &other).ok());
  int64_t foreign = -1;
  ASSERT_TRUE(other->FindOrInsert(&victim, 1, true, &foreign, SerialRunner).ok());

  using Apply = std::function<Status(const int64_t*, const float*, int64_t, const ParallelRunner&)>;
  const std::vector<std::pair<std::string, Apply>> optimizers = {
      {"LazyAdam",
       [&](const int64_t* a, const float* g, int64_t n, const ParallelRunner& run) {
         return ApplyLazyAdam(table_.get(), a, g, n, {0.1f, 0.9f, 0.999f, 1e-7f, 1}, run);
       }},
      {"GradientDescent",
       [&](const int64_t* a, const float* g, int64_t n, const ParallelRunner& run) {
         return ApplyGradientDescent(table_.get(), a, g, n, {0.1f, 0.01f}, run);
       }},
      {"Adagrad",
       [&](const int64_t* a, const float* g, int64_t n, const ParallelRunner& run) {
         return ApplyAdagrad(table_.get(), a, g, n, {0.1f, 0.1f}, run);
       }},
      {"Ftrl",
       [&](const int64_t* a, const float* g, int64_t n, const ParallelRunner& run) {
         return ApplyFtrl(table_.get(), a, g, n, {0.1f, -0.5f, 0.1f, 0.0f, 0.0f, 0.0f}, run);
       }},
      {"Momentum",
       [&](const int64_t* a, const float* g, int64_t n, const ParallelRunner& run) {
         return ApplyMomentum(table_.get(), a, g, n, {0.1f, 0.9f, true}, run);
       }},
  };
  for (const auto& [name, apply] : optimizers) {
    SCOPED_TRACE(name);
    SetUp();  // a fresh table per optimizer (one optimizer per table)
    ASSERT_TRUE(table_->FindOrInsert(&victim, 1, true, &stale, SerialRunner).ok());
    ASSERT_TRUE(table_->Remove(&victim, 1, nullptr, SerialRunner).ok());
    std::vector<float> grads(addr_.size() * kDim + kDim, 0.5f);
    // One good step first, so that the slots exist and hold non-initial values.
    ASSERT_TRUE(apply(addr_.data(), grads.data(), addr_.size(), SerialRunner).ok());
    const std::vector<Row> before = Snapshot();
    for (int64_t bad : {stale, int64_t{5}, int64_t{-7}, foreign}) {
      for (size_t pos : {size_t{0}, addr_.size() / 2, addr_.size()}) {
        std::vector<int64_t> batch = addr_;
        batch.insert(batch.begin() + pos, bad);
        for (const ParallelRunner& run :
             {ParallelRunner(SerialRunner), ParallelRunner(ThreadedRunner)}) {
          Status s = apply(batch.data(), grads.data(), batch.size(), run);
          EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "bad " << bad << " at " << pos;
        }
      }
    }
    EXPECT_TRUE(Snapshot() == before) << "a row changed although the batch was rejected";
  }
}

// --- Hyperparameter validation ---------------------------------------------------------------

TEST_F(SparseOptimizerTest, HyperparameterErrorsNameTheParameter) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t* a = addr_.data();
  std::vector<float> g(addr_.size() * kDim, 0.5f);
  const int64_t n = addr_.size();
  const LazyAdamParams adam{0.01f, 0.9f, 0.999f, 1e-7f, 1};
  const FtrlParams ftrl{0.1f, -0.5f, 0.1f, 0.0f, 0.0f, 0.0f};
  struct Case {
    std::string param;
    std::function<Status()> call;
  };
  auto with = [](auto params, auto field, auto value) {
    params.*field = value;
    return params;
  };
  const std::vector<Case> cases = {
      {"learning_rate",
       [&] {
         return ApplyLazyAdam(table_.get(), a, g.data(), n,
                              with(adam, &LazyAdamParams::learning_rate, -0.1f), SerialRunner);
       }},
      {"learning_rate",
       [&] {
         return ApplyLazyAdam(table_.get(), a, g.data(), n,
                              with(adam, &LazyAdamParams::learning_rate, nan), SerialRunner);
       }},
      {"beta1",
       [&] {
         return ApplyLazyAdam(table_.get(), a, g.data(), n,
                              with(adam, &LazyAdamParams::beta1, 1.0f), SerialRunner);
       }},
      {"beta1",
       [&] {
         return ApplyLazyAdam(table_.get(), a, g.data(), n,
                              with(adam, &LazyAdamParams::beta1, -0.5f), SerialRunner);
       }},
      {"beta2",
       [&] {
         return ApplyLazyAdam(table_.get(), a, g.data(), n,
                              with(adam, &LazyAdamParams::beta2, 1.5f), SerialRunner);
       }},
      {"epsilon",
       [&] {
         return ApplyLazyAdam(table_.get(), a, g.data(), n,
                              with(adam, &LazyAdamParams::epsilon, 0.0f), SerialRunner);
       }},
      {"step",
       [&] {
         return ApplyLazyAdam(table_.get(), a, g.data(), n,
                              with(adam, &LazyAdamParams::step, int64_t{0}), SerialRunner);
       }},
      {"learning_rate",
       [&] {
         return ApplyGradientDescent(table_.get(), a, g.data(), n, {-1.0f, 0.0f}, SerialRunner);
       }},
      {"weight_decay",
       [&] {
         return ApplyGradientDescent(table_.get(), a, g.data(), n, {0.1f, -0.1f}, SerialRunner);
       }},
      {"weight_decay",
       [&] {
         return ApplyGradientDescent(table_.get(), a, g.data(), n, {0.1f, 2.0f}, SerialRunner);
       }},
      {"learning_rate",
       [&] { return ApplyAdagrad(table_.get(), a, g.data(), n, {-0.1f, 0.1f}, SerialRunner); }},
      {"initial_accumulator_value",
       [&] { return ApplyAdagrad(table_.get(), a, g.data(), n, {0.1f, 0.0f}, SerialRunner); }},
      {"learning_rate",
       [&] {
         return ApplyMomentum(table_.get(), a, g.data(), n, {-0.1f, 0.9f, false}, SerialRunner);
       }},
      {"momentum",
       [&] {
         return ApplyMomentum(table_.get(), a, g.data(), n, {0.1f, -0.9f, false}, SerialRunner);
       }},
      {"learning_rate",
       [&] {
         return ApplyFtrl(table_.get(), a, g.data(), n,
                          with(ftrl, &FtrlParams::learning_rate, 0.0f), SerialRunner);
       }},
      {"learning_rate_power",
       [&] {
         return ApplyFtrl(table_.get(), a, g.data(), n,
                          with(ftrl, &FtrlParams::learning_rate_power, 0.5f), SerialRunner);
       }},
      {"initial_accumulator_value",
       [&] {
         return ApplyFtrl(table_.get(), a, g.data(), n,
                          with(ftrl, &FtrlParams::initial_accumulator_value, -1.0f), SerialRunner);
       }},
      {"l1",
       [&] {
         return ApplyFtrl(table_.get(), a, g.data(), n, with(ftrl, &FtrlParams::l1, -0.1f),
                          SerialRunner);
       }},
      {"l2",
       [&] {
         return ApplyFtrl(table_.get(), a, g.data(), n, with(ftrl, &FtrlParams::l2, -0.1f),
                          SerialRunner);
       }},
      {"l2_shrinkage",
       [&] {
         return ApplyFtrl(table_.get(), a, g.data(), n,
                          with(ftrl, &FtrlParams::l2_shrinkage, -0.1f), SerialRunner);
       }},
  };
  const std::vector<Row> before = Snapshot();
  for (const Case& c : cases) {
    Status s = c.call();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.param;
    EXPECT_NE(s.message().find(": " + c.param + " must"), std::string::npos)
        << "expected '" << c.param << "' named in: " << s.message();
  }
  // Rejected calls neither updated rows nor claimed the table for an optimizer.
  EXPECT_TRUE(Snapshot() == before);
  EXPECT_EQ(table_->slot_optimizer(), "");
  EXPECT_EQ(table_->num_slots(), 0);
}

TEST_F(SparseOptimizerTest, SecondOptimizerOnATableIsRejected) {
  std::vector<float> g(addr_.size() * kDim, 0.5f);
  ASSERT_TRUE(ApplyGradientDescent(table_.get(), addr_.data(), g.data(), addr_.size(), {0.1f, 0.0f},
                                   SerialRunner)
                  .ok());
  const std::vector<Row> before = Snapshot();
  Status s =
      ApplyAdagrad(table_.get(), addr_.data(), g.data(), addr_.size(), {0.1f, 0.1f}, SerialRunner);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Snapshot() == before);
}

TEST_F(SparseOptimizerTest, OnlyMinusOneAddressesIsANoOp) {
  const std::vector<Row> before = Snapshot();
  const std::vector<int64_t> none = {-1, -1};
  const std::vector<float> g(2 * kDim, kNaN);
  ASSERT_TRUE(
      ApplyAdagrad(table_.get(), none.data(), g.data(), 2, {0.1f, 0.1f}, SerialRunner).ok());
  ASSERT_TRUE(ApplyAdagrad(table_.get(), nullptr, nullptr, 0, {0.1f, 0.1f}, SerialRunner).ok());
  std::vector<Row> after = Snapshot();
  for (size_t r = 0; r < after.size(); ++r) {
    EXPECT_EQ(after[r].w, before[r].w);
    EXPECT_EQ(after[r].slots, std::vector<std::vector<float>>(1, std::vector<float>(kDim, 0.1f)));
  }
}

// Defect found by hostile use: a first update with one stale address among valid ones
// failed after attaching its slots, binding the table to that optimizer. Every op is all or
// nothing: the failed update leaves no slots, no bound optimizer and no row changed, so
// another optimizer can still train the table.
TEST_F(SparseOptimizerTest, AFailedFirstUpdateLeavesTheTableUnbound) {
  const int64_t victim = 999;
  int64_t stale = -1;
  ASSERT_TRUE(table_->FindOrInsert(&victim, 1, true, &stale, SerialRunner).ok());
  ASSERT_TRUE(table_->Remove(&victim, 1, nullptr, SerialRunner).ok());
  std::vector<int64_t> addresses = addr_;
  addresses.push_back(stale);
  const std::vector<float> grads(addresses.size() * kDim, 0.5f);
  const std::vector<Row> before = Snapshot();
  const Status s = ApplyLazyAdam(table_.get(), addresses.data(), grads.data(), addresses.size(),
                                 {0.1f, 0.9f, 0.999f, 1e-7f, 1}, SerialRunner);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(table_->num_slots(), 0);
  EXPECT_EQ(table_->slot_optimizer(), "");
  EXPECT_TRUE(Snapshot() == before);
  // Not bound to LazyAdam: Adagrad may train it.
  EXPECT_TRUE(ApplyAdagrad(table_.get(), addr_.data(), grads.data(), addr_.size(), {0.1f, 0.1f},
                           SerialRunner)
                  .ok());
  EXPECT_EQ(table_->slot_optimizer(), "Adagrad");
}

}  // namespace
}  // namespace rec_sdk
