#include "tf_ops/core/sparse_optimizers.h"

#include <algorithm>
#include <cmath>
#include <string>

// The row-update lambdas capture their scalars by value: captured by reference they could
// alias the rows being written, which keeps the compiler from vectorising the loops.

namespace rec_sdk {
namespace {

Status CheckRange(const char* optimizer, const char* name, double value, double low, bool low_open,
                  double high, bool high_open) {
  const bool ok = std::isfinite(value) && (low_open ? value > low : value >= low) &&
                  (high_open ? value < high : value <= high);
  if (ok) return Status::Ok();
  return Status::InvalidArgument(std::string(optimizer) + ": " + name + " must be in " +
                                 (low_open ? "(" : "[") + std::to_string(low) + ", " +
                                 std::to_string(high) + (high_open ? ")" : "]") + ", got " +
                                 std::to_string(value));
}

constexpr double kInf = INFINITY;

}  // namespace

Status ApplyLazyAdam(EmbeddingTable* table, const int64_t* addresses, const float* grads, int64_t n,
                     const LazyAdamParams& p, const ParallelRunner& run) {
  REC_SDK_RETURN_IF_ERROR(
      CheckRange("LazyAdam", "learning_rate", p.learning_rate, 0, false, kInf, true));
  REC_SDK_RETURN_IF_ERROR(CheckRange("LazyAdam", "beta1", p.beta1, 0, true, 1, true));
  REC_SDK_RETURN_IF_ERROR(CheckRange("LazyAdam", "beta2", p.beta2, 0, false, 1, false));
  REC_SDK_RETURN_IF_ERROR(CheckRange("LazyAdam", "epsilon", p.epsilon, 0, true, 1, false));
  if (!p.bias_corrected && p.step < 1) {
    return Status::InvalidArgument("LazyAdam: step must be >= 1, got " + std::to_string(p.step));
  }
  const double t = static_cast<double>(p.step);
  const float lr_t = p.bias_corrected ? p.learning_rate
                                      : static_cast<float>(p.learning_rate *
                                                           std::sqrt(1.0 - std::pow(p.beta2, t)) /
                                                           (1.0 - std::pow(p.beta1, t)));
  const int dim = table->dim();
  const float b1 = p.beta1, b2 = p.beta2, eps = p.epsilon;
  return table->ApplyUpdate(
      {"LazyAdam", {0.0f, 0.0f}}, addresses, n, 12 * dim,
      [=](int64_t i, float* __restrict w, float* const* slots) {
        const float* __restrict g = grads + i * dim;
        float* __restrict m = slots[0];
        float* __restrict v = slots[1];
        for (int d = 0; d < dim; ++d) {
          m[d] = b1 * m[d] + (1.0f - b1) * g[d];
          v[d] = b2 * v[d] + (1.0f - b2) * g[d] * g[d];
          w[d] -= lr_t * m[d] / (std::sqrt(v[d]) + eps);
        }
      },
      run);
}

Status ApplyGradientDescent(EmbeddingTable* table, const int64_t* addresses, const float* grads,
                            int64_t n, const GradientDescentParams& p, const ParallelRunner& run) {
  REC_SDK_RETURN_IF_ERROR(
      CheckRange("GradientDescent", "learning_rate", p.learning_rate, 0, false, kInf, true));
  REC_SDK_RETURN_IF_ERROR(
      CheckRange("GradientDescent", "weight_decay", p.weight_decay, 0, false, 1, false));
  const int dim = table->dim();
  const float lr = p.learning_rate, wd = p.weight_decay;
  return table->ApplyUpdate(
      {"GradientDescent", {}}, addresses, n, 3 * dim,
      [=](int64_t i, float* __restrict w, float* const*) {
        const float* __restrict g = grads + i * dim;
        for (int d = 0; d < dim; ++d) w[d] -= lr * (g[d] + wd * w[d]);
      },
      run);
}

Status ApplyAdagrad(EmbeddingTable* table, const int64_t* addresses, const float* grads, int64_t n,
                    const AdagradParams& p, const ParallelRunner& run) {
  REC_SDK_RETURN_IF_ERROR(
      CheckRange("Adagrad", "learning_rate", p.learning_rate, 0, false, kInf, true));
  REC_SDK_RETURN_IF_ERROR(CheckRange("Adagrad", "epsilon", p.epsilon, 0, false, 1, false));
  // A zero accumulator is allowed where epsilon keeps the first step finite.
  REC_SDK_RETURN_IF_ERROR(CheckRange("Adagrad", "initial_accumulator_value",
                                     p.initial_accumulator_value, 0, p.epsilon == 0.0f, kInf,
                                     true));
  const int dim = table->dim();
  const float lr = p.learning_rate, eps = p.epsilon;
  // One loop per denominator form, so that the inner loop does not branch.
  auto apply = [&](auto denominator) {
    return table->ApplyUpdate(
        {"Adagrad", {p.initial_accumulator_value}}, addresses, n, 8 * dim,
        [=](int64_t i, float* __restrict w, float* const* slots) {
          const float* __restrict g = grads + i * dim;
          float* __restrict a = slots[0];
          for (int d = 0; d < dim; ++d) {
            a[d] += g[d] * g[d];
            w[d] -= lr * g[d] / denominator(a[d]);
          }
        },
        run);
  };
  if (p.epsilon_inside_sqrt) return apply([eps](float a) { return std::sqrt(a + eps); });
  return apply([eps](float a) { return std::sqrt(a) + eps; });
}

Status ApplyRowwiseAdagrad(EmbeddingTable* table, const int64_t* addresses, const float* grads,
                           int64_t n, const RowwiseAdagradParams& p, const ParallelRunner& run) {
  REC_SDK_RETURN_IF_ERROR(
      CheckRange("RowwiseAdagrad", "learning_rate", p.learning_rate, 0, false, kInf, true));
  REC_SDK_RETURN_IF_ERROR(CheckRange("RowwiseAdagrad", "epsilon", p.epsilon, 0, false, 1, false));
  REC_SDK_RETURN_IF_ERROR(CheckRange("RowwiseAdagrad", "initial_accumulator_value",
                                     p.initial_accumulator_value, 0, p.epsilon == 0.0f, kInf,
                                     true));
  const int dim = table->dim();
  const float lr = p.learning_rate, eps = p.epsilon, inv_dim = 1.0f / static_cast<float>(dim);
  // One float of state per row: the slot is 1 float wide.
  return table->ApplyUpdate(
      {"RowwiseAdagrad", {p.initial_accumulator_value}, /*width=*/1}, addresses, n, 4 * dim,
      [=](int64_t i, float* __restrict w, float* const* slots) {
        const float* __restrict g = grads + i * dim;
        float squares = 0.0f;
        for (int d = 0; d < dim; ++d) squares += g[d] * g[d];
        const float a = slots[0][0] + squares * inv_dim;
        slots[0][0] = a;
        const float step = lr / (std::sqrt(a) + eps);
        for (int d = 0; d < dim; ++d) w[d] -= step * g[d];
      },
      run);
}

Status ApplyMomentum(EmbeddingTable* table, const int64_t* addresses, const float* grads, int64_t n,
                     const MomentumParams& p, const ParallelRunner& run) {
  REC_SDK_RETURN_IF_ERROR(
      CheckRange("Momentum", "learning_rate", p.learning_rate, 0, false, kInf, true));
  REC_SDK_RETURN_IF_ERROR(CheckRange("Momentum", "momentum", p.momentum, 0, false, kInf, true));
  const int dim = table->dim();
  const float lr = p.learning_rate;
  const float mu = p.momentum;
  const bool nesterov = p.use_nesterov;
  if (p.velocity) {
    return table->ApplyUpdate(
        {"KerasMomentum", {0.0f}}, addresses, n, 6 * dim,
        [=](int64_t i, float* __restrict w, float* const* slots) {
          const float* __restrict g = grads + i * dim;
          float* __restrict v = slots[0];
          for (int d = 0; d < dim; ++d) {
            v[d] = v[d] * mu - lr * g[d];
            w[d] += nesterov ? v[d] * mu - lr * g[d] : v[d];
          }
        },
        run);
  }
  return table->ApplyUpdate(
      {"Momentum", {0.0f}}, addresses, n, 6 * dim,
      [=](int64_t i, float* __restrict w, float* const* slots) {
        const float* __restrict g = grads + i * dim;
        float* __restrict a = slots[0];
        for (int d = 0; d < dim; ++d) {
          a[d] = a[d] * mu + g[d];
          w[d] -= nesterov ? g[d] * lr + a[d] * mu * lr : lr * a[d];
        }
      },
      run);
}

Status ApplyFtrl(EmbeddingTable* table, const int64_t* addresses, const float* grads, int64_t n,
                 const FtrlParams& p, const ParallelRunner& run) {
  REC_SDK_RETURN_IF_ERROR(
      CheckRange("Ftrl", "learning_rate", p.learning_rate, 0, true, kInf, true));
  REC_SDK_RETURN_IF_ERROR(
      CheckRange("Ftrl", "learning_rate_power", p.learning_rate_power, -kInf, true, 0, false));
  REC_SDK_RETURN_IF_ERROR(CheckRange("Ftrl", "initial_accumulator_value",
                                     p.initial_accumulator_value, 0, false, kInf, true));
  REC_SDK_RETURN_IF_ERROR(CheckRange("Ftrl", "l1", p.l1, 0, false, kInf, true));
  REC_SDK_RETURN_IF_ERROR(CheckRange("Ftrl", "l2", p.l2, 0, false, kInf, true));
  REC_SDK_RETURN_IF_ERROR(CheckRange("Ftrl", "l2_shrinkage", p.l2_shrinkage, 0, false, kInf, true));
  const int dim = table->dim();
  const FtrlParams q = p;
  return table->ApplyUpdate(
      {"Ftrl", {p.initial_accumulator_value, 0.0f}}, addresses, n, 40 * dim,
      [=](int64_t i, float* w, float* const* slots) {
        const float* g = grads + i * dim;
        float* accum = slots[0];
        float* linear = slots[1];
        for (int d = 0; d < dim; ++d) {
          const double grad = g[d];
          const double var = w[d];
          const double old_accum = accum[d];
          const double new_accum = old_accum + grad * grad;
          const double shrunk = grad + 2.0 * q.l2_shrinkage * var;
          const double power = -q.learning_rate_power;
          const double sigma =
              (std::pow(new_accum, power) - std::pow(old_accum, power)) / q.learning_rate;
          const double lin = linear[d] + shrunk - sigma * var;
          const double quadratic = std::pow(new_accum, power) / q.learning_rate + 2.0 * q.l2;
          linear[d] = static_cast<float>(lin);
          w[d] = std::fabs(lin) > q.l1
                     ? static_cast<float>((q.l1 * (lin > 0 ? 1.0 : -1.0) - lin) / quadratic)
                     : 0.0f;
          accum[d] = static_cast<float>(new_accum);
        }
      },
      run);
}

Status ReadRowsWithSlots(EmbeddingTable* table, const EmbeddingTable::SlotLayout& layout,
                         const int64_t* addresses, int64_t n, float* values, float* slots,
                         const ParallelRunner& run) {
  const int dim = table->dim();
  const size_t k = layout.initial_values.size();
  std::fill_n(values, n * dim, 0.0f);
  for (size_t s = 0; s < k; ++s)
    std::fill_n(slots + s * n * dim, n * dim, layout.initial_values[s]);
  return table->ApplyUpdate(
      layout, addresses, n, 2 * dim * (1 + k),
      [=](int64_t i, float* w, float* const* row_slots) {
        std::copy_n(w, dim, values + i * dim);
        for (size_t s = 0; s < k; ++s) std::copy_n(row_slots[s], dim, slots + (s * n + i) * dim);
      },
      run);
}

Status WriteRowsWithSlots(EmbeddingTable* table, const EmbeddingTable::SlotLayout& layout,
                          const int64_t* addresses, int64_t n, const float* values,
                          const float* slots, const ParallelRunner& run) {
  const int dim = table->dim();
  const size_t k = layout.initial_values.size();
  return table->ApplyUpdate(
      layout, addresses, n, 2 * dim * (1 + k),
      [=](int64_t i, float* w, float* const* row_slots) {
        std::copy_n(values + i * dim, dim, w);
        for (size_t s = 0; s < k; ++s) std::copy_n(slots + (s * n + i) * dim, dim, row_slots[s]);
      },
      run);
}

}  // namespace rec_sdk
