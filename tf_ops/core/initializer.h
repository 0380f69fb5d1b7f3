// Initializer: fills a new row from a description of the user's TensorFlow initializer.
//
// Values are a pure function of (seed, key, element index): the same key always starts from
// the same values whatever the batch, thread or insertion order, so a table is reproducible and
// a row removed and reinserted starts exactly as it first did.
#ifndef REC_SDK_CORE_INITIALIZER_H_
#define REC_SDK_CORE_INITIALIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tf_ops/core/status.h"

namespace rec_sdk {

enum class InitializerKind { kConstant, kRandomUniform, kRandomNormal, kTruncatedNormal };

struct InitializerSpec {
  InitializerKind kind = InitializerKind::kConstant;
  float value = 0.0f;         // kConstant
  std::vector<float> values;  // kConstant with one value per element (dim values), if set
  float minval = 0.0f;        // kRandomUniform: [minval, maxval)
  float maxval = 1.0f;
  float mean = 0.0f;    // kRandomNormal / kTruncatedNormal
  float stddev = 1.0f;  // kTruncatedNormal redraws values beyond 2 stddev, as TensorFlow does
  uint64_t seed = 0;
  float scale = 1.0f;  // the SDK's init_param: multiplies every initial value

  // Parses the kind name used by the op attribute ("constant", "random_uniform",
  // "random_normal", "truncated_normal").
  static Status KindFromName(const std::string& name, InitializerKind* kind);
  Status Validate() const;
};

// Writes dim initial values for `key` into out.
void InitializeRow(const InitializerSpec& spec, int64_t key, int dim, float* out);

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_INITIALIZER_H_
