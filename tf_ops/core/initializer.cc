#include "tf_ops/core/initializer.h"

#include <cmath>
#include <string>
#include <utility>

namespace rec_sdk {
namespace {

// SplitMix64: a small counter-based generator with good statistical quality, cheap enough to
// seed once per row.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class RowRandom {
 public:
  RowRandom(uint64_t seed, int64_t key)
      : state_(Mix64(seed * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL) ^
               Mix64(static_cast<uint64_t>(key))) {}

  // Uniform float in [0, 1) with 24 random bits; each 64-bit draw serves two values.
  float Uniform() {
    if (spare_bits_ == 0) {
      state_ += 0x9e3779b97f4a7c15ULL;
      bits_ = Mix64(state_);
      spare_bits_ = 2;
    }
    --spare_bits_;
    const uint32_t word = static_cast<uint32_t>(bits_ >> (32 * spare_bits_));
    return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
  }

  // Standard normal by Box-Muller in float (as TensorFlow's CPU kernels); caches the second
  // value of each pair.
  float Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const float u1 = 1.0f - Uniform();  // in (0, 1]: log is finite
    const float u2 = Uniform();
    const float radius = std::sqrt(-2.0f * std::log(u1));
    const float angle = 6.2831853f * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  uint64_t state_;
  uint64_t bits_ = 0;
  int spare_bits_ = 0;
  float spare_ = 0.0f;
  bool has_spare_ = false;
};

}  // namespace

Status InitializerSpec::KindFromName(const std::string& name, InitializerKind* kind) {
  if (name == "constant") {
    *kind = InitializerKind::kConstant;
  } else if (name == "random_uniform") {
    *kind = InitializerKind::kRandomUniform;
  } else if (name == "random_normal") {
    *kind = InitializerKind::kRandomNormal;
  } else if (name == "truncated_normal") {
    *kind = InitializerKind::kTruncatedNormal;
  } else {
    return Status::InvalidArgument("initializer kind '" + name +
                                   "' is not one of constant, random_uniform, random_normal, "
                                   "truncated_normal");
  }
  return Status::Ok();
}

Status InitializerSpec::Validate() const {
  const std::pair<const char*, float> parameters[] = {
      {"init_value", value}, {"init_minval", minval}, {"init_maxval", maxval},
      {"init_mean", mean},   {"init_stddev", stddev}, {"init_scale", scale}};
  for (const auto& p : parameters) {
    if (!std::isfinite(p.second)) {
      return Status::InvalidArgument(std::string("initializer parameter ") + p.first +
                                     " must be finite, got " + std::to_string(p.second));
    }
  }
  for (float v : values) {
    if (!std::isfinite(v)) {
      return Status::InvalidArgument("initializer init_values must be finite, got " +
                                     std::to_string(v));
    }
  }
  if (!values.empty() && kind != InitializerKind::kConstant) {
    return Status::InvalidArgument(
        "init_values (per-element initial values) are for the "
        "constant initializer");
  }
  if (kind == InitializerKind::kRandomUniform && !(minval <= maxval)) {
    return Status::InvalidArgument(
        "random_uniform initializer needs minval <= maxval, got minval=" + std::to_string(minval) +
        " maxval=" + std::to_string(maxval));
  }
  if ((kind == InitializerKind::kRandomNormal || kind == InitializerKind::kTruncatedNormal) &&
      stddev < 0.0f) {
    return Status::InvalidArgument("normal initializer needs stddev >= 0, got " +
                                   std::to_string(stddev));
  }
  return Status::Ok();
}

void InitializeRow(const InitializerSpec& spec, int64_t key, int dim, float* out) {
  switch (spec.kind) {
    case InitializerKind::kConstant: {
      if (!spec.values.empty()) {
        for (int i = 0; i < dim; ++i) out[i] = spec.values[i] * spec.scale;
        return;
      }
      const float v = spec.value * spec.scale;
      for (int i = 0; i < dim; ++i) out[i] = v;
      return;
    }
    case InitializerKind::kRandomUniform: {
      RowRandom rng(spec.seed, key);
      const float width = spec.maxval - spec.minval;
      for (int i = 0; i < dim; ++i) {
        float v = spec.minval + width * rng.Uniform();
        // Rounding can reach maxval; keep the interval half-open.
        if (v >= spec.maxval && spec.maxval > spec.minval)
          v = std::nextafter(spec.maxval, spec.minval);
        out[i] = v * spec.scale;
      }
      return;
    }
    case InitializerKind::kRandomNormal: {
      RowRandom rng(spec.seed, key);
      for (int i = 0; i < dim; ++i) out[i] = (spec.mean + spec.stddev * rng.Normal()) * spec.scale;
      return;
    }
    case InitializerKind::kTruncatedNormal: {
      RowRandom rng(spec.seed, key);
      for (int i = 0; i < dim; ++i) {
        float z = rng.Normal();
        while (std::fabs(z) > 2.0f) z = rng.Normal();
        out[i] = (spec.mean + spec.stddev * z) * spec.scale;
      }
      return;
    }
  }
}

}  // namespace rec_sdk
