// Sparse ("lazy") optimizers: each updates only the rows whose addresses it is given, using
// slot arrays that live in the same table rows as the embeddings.
//
// Callers pass unique addresses with their summed gradients (the Python layer deduplicates);
// address -1 (a key without a row, e.g. not admitted) is skipped. The update formulas follow
// TensorFlow's dense optimizers applied row by row:
//   LazyAdam   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//              w -= lr sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)          slots: m, v
//   SGD        w -= lr (g + weight_decay w)                                   slots: none
//   Adagrad    a += g^2;  w -= lr g / sqrt(a)  (Keras: / (sqrt(a) + eps), / sqrt(a + eps))  slots:
//   a RowwiseAdagrad  a += mean over the row's elements of g^2;  w -= lr g / (sqrt(a) + eps)
//              (TorchRec/FBGEMM's EXACT_ROWWISE_ADAGRAD)              slots: a, 1 float per row
//   FTRL       TensorFlow's ApplyFtrlV2 (l1, l2, l2_shrinkage, lr_power)      slots: accum, linear
//   Momentum   a = momentum a + g;  w -= lr a  (Nesterov: w -= lr (g + momentum a))  slots: a
//              Keras (velocity): v = momentum v - lr g;  w += v  (Nesterov: w += momentum v - lr g)
//
// Optimizers without a kernel here (TensorFlow's own kernels run on gathered rows) use
// ReadRowsWithSlots before and WriteRowsWithSlots after them: the rows and the slots of an
// optimizer layout, by address, attaching the slots on first use as the Apply* do.
#ifndef REC_SDK_CORE_SPARSE_OPTIMIZERS_H_
#define REC_SDK_CORE_SPARSE_OPTIMIZERS_H_

#include <cstdint>
#include <vector>

#include "tf_ops/core/embedding_table.h"

namespace rec_sdk {

struct LazyAdamParams {
  float learning_rate;
  float beta1;
  float beta2;
  float epsilon;
  int64_t step;  // 1 for the first update; drives bias correction
  // learning_rate is already bias-corrected (TensorFlow's AdamOptimizer computes it from its
  // float32 beta powers); step is not used.
  bool bias_corrected = false;
};

struct GradientDescentParams {
  float learning_rate;
  float weight_decay;
};

struct AdagradParams {
  float learning_rate;
  float initial_accumulator_value;
  // Keras' Adagrad: w -= lr g / (sqrt(a) + epsilon) (tf.keras.optimizers.legacy), or
  // lr g / sqrt(a + epsilon) with epsilon_inside_sqrt (tf.keras.optimizers).
  float epsilon = 0.0f;
  bool epsilon_inside_sqrt = false;
};

struct RowwiseAdagradParams {
  float learning_rate;
  float initial_accumulator_value;
  float epsilon;
};

struct MomentumParams {
  float learning_rate;
  float momentum;
  bool use_nesterov;
  // Keras' SGD with momentum: the slot is a velocity, v = momentum v - lr g;  w += v
  // (Nesterov: w += momentum v - lr g). Its slots are "KerasMomentum"'s, not "Momentum"'s.
  bool velocity = false;
};
struct FtrlParams {
  float learning_rate;
  float learning_rate_power;
  float initial_accumulator_value;
  float l1;
  float l2;
  float l2_shrinkage;
};

// Each Apply* validates its hyperparameters, attaches its slots to the table on first use and
// updates the rows. grads has shape [n, table->dim()].
Status ApplyLazyAdam(EmbeddingTable* table, const int64_t* addresses, const float* grads, int64_t n,
                     const LazyAdamParams& params, const ParallelRunner& run);
Status ApplyGradientDescent(EmbeddingTable* table, const int64_t* addresses, const float* grads,
                            int64_t n, const GradientDescentParams& params,
                            const ParallelRunner& run);
Status ApplyAdagrad(EmbeddingTable* table, const int64_t* addresses, const float* grads, int64_t n,
                    const AdagradParams& params, const ParallelRunner& run);
Status ApplyRowwiseAdagrad(EmbeddingTable* table, const int64_t* addresses, const float* grads,
                           int64_t n, const RowwiseAdagradParams& params,
                           const ParallelRunner& run);
Status ApplyFtrl(EmbeddingTable* table, const int64_t* addresses, const float* grads, int64_t n,
                 const FtrlParams& params, const ParallelRunner& run);
Status ApplyMomentum(EmbeddingTable* table, const int64_t* addresses, const float* grads, int64_t n,
                     const MomentumParams& params, const ParallelRunner& run);

// values [n, dim] and slots [layout slots][n][dim] of the rows at `addresses`; address -1
// reads zeros and the slots' initial values. Attaches the layout's slots if needed (all or
// nothing, as ApplyUpdate).
Status ReadRowsWithSlots(EmbeddingTable* table, const EmbeddingTable::SlotLayout& layout,
                         const int64_t* addresses, int64_t n, float* values, float* slots,
                         const ParallelRunner& run);
// Writes values [n, dim] and slots [layout slots][n][dim] into the rows at `addresses`
// (unique; -1 skipped).
Status WriteRowsWithSlots(EmbeddingTable* table, const EmbeddingTable::SlotLayout& layout,
                          const int64_t* addresses, int64_t n, const float* values,
                          const float* slots, const ParallelRunner& run);

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_SPARSE_OPTIMIZERS_H_
