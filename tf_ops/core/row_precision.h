// Row precision: the element type a table stores its embeddings in, and the conversions
// between it and the float32 the model sees.
//
// A table's embedding is float32 (the default), bfloat16 or float16; optimizer slots of dim
// values are float32 (the default) or bfloat16 (TableConfig::slot_dtype). Lookups decode to
// float32. Values written from outside (upsert, import, restore,
// initialisation) round to nearest, ties to even. Optimizer updates run in float32 on a
// decoded copy and round stochastically on the way back: the result is the lower or the upper
// neighbour with probabilities proportional to closeness, so small updates are not lost in
// expectation (a learning-rate-sized step below half a bfloat16 ulp would otherwise never
// move a weight). The random bits are a pure function of (table seed, key, update step,
// element index) (RoundingBits), so training is reproducible whatever the threads.
#ifndef REC_SDK_CORE_ROW_PRECISION_H_
#define REC_SDK_CORE_ROW_PRECISION_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "tf_ops/core/row_copy.h"
#include "tf_ops/core/status.h"

namespace rec_sdk {

enum class RowDtype : uint8_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// The element types a table stores its embeddings in, and its optimizer slots of dim values
// per row in (float16 cannot hold the squared gradients that Adam's, Adagrad's and FTRL's
// accumulators sum: below 6e-8 they vanish). The op's emb_dtype and slot_dtype attributes
// allow these (ops/table_ops.cc), and Python reads them from the op definition.
inline constexpr RowDtype kRowDtypes[] = {RowDtype::kFloat32, RowDtype::kBFloat16,
                                          RowDtype::kFloat16};
inline constexpr RowDtype kSlotDtypes[] = {RowDtype::kFloat32, RowDtype::kBFloat16};
bool IsSlotDtype(RowDtype dtype);

// "float32", "bfloat16", "float16": the names of the op attribute and checkpoint metadata.
const char* RowDtypeName(RowDtype dtype);
Status RowDtypeFromName(const std::string& name, RowDtype* dtype);
inline int RowDtypeBytes(RowDtype dtype) { return dtype == RowDtype::kFloat32 ? 4 : 2; }

namespace precision {

inline uint32_t BitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
inline float FloatOf(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline float BFloat16ToFloat(uint16_t h) { return FloatOf(uint32_t{h} << 16); }

// bfloat16 of float bits `a`, adding `add` (< 2^16) to the 16 dropped bits before truncating:
// 0x7FFF + lsb rounds to nearest even, 16 random bits round stochastically. NaN stays NaN.
inline uint16_t BFloat16Rounded(uint32_t a, uint32_t add) {
  if ((a & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((a >> 16) | 0x40);
  const uint32_t abs = a & 0x7FFFFFFFu;
  uint32_t r = abs + add;
  if (r > 0x7F800000u) r = 0x7F800000u;  // rounds past the largest finite: infinity
  return static_cast<uint16_t>(((a & 0x80000000u) | r) >> 16);
}
inline uint16_t BFloat16Nearest(float f) {
  const uint32_t a = BitsOf(f);
  return BFloat16Rounded(a, 0x7FFFu + ((a >> 16) & 1));
}
// `random`: 16 uniform bits.
inline uint16_t BFloat16Stochastic(float f, uint32_t random) {
  return BFloat16Rounded(BitsOf(f), random & 0xFFFFu);
}

inline float Float16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t e = (h >> 10) & 0x1F;
  const uint32_t m = h & 0x3FF;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24
    return FloatOf(BitsOf(v) | sign);
  }
  if (e == 31) return FloatOf(sign | 0x7F800000u | (m << 13));
  return FloatOf(sign | ((e + 112) << 23) | (m << 13));
}

// float16 of float bits `a`. The rounding adds to the dropped bits of the significand:
// `nearest` adds half an ulp (ties to even); otherwise `random` (16 uniform bits) is scaled
// to the dropped bits (rounding up with a probability proportional to the remainder, in
// steps of 2^-16). Values that round past 65504 become infinity.
inline uint16_t Float16Rounded(uint32_t a, bool nearest, uint32_t random) {
  const uint16_t sign = static_cast<uint16_t>((a >> 16) & 0x8000u);
  const uint32_t abs = a & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // infinity or NaN
    return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  }
  const int exponent = static_cast<int>(abs >> 23);  // biased float32 exponent
  // Bits of the float32 significand below a float16 ulp: 13 for normal float16 values,
  // more below 2^-14 (float16 subnormals have a fixed ulp of 2^-24).
  const int drop = exponent >= 113 ? 13 : 126 - exponent;
  if (drop > 25) {
    // Below a quarter of the smallest subnormal: nearest gives zero; stochastic rounding
    // would round up with a probability under 2^-16, which 16 random bits cannot express.
    return sign;
  }
  uint32_t add;
  if (nearest) {
    const uint32_t significand = exponent >= 113 ? abs : ((abs & 0x7FFFFFu) | 0x800000u);
    add = (1u << (drop - 1)) - 1 + ((significand >> drop) & 1);
  } else {
    random &= 0xFFFFu;
    add = drop >= 16 ? random << (drop - 16) : random >> (16 - drop);
  }
  if (exponent >= 113) {
    const uint32_t r = abs + add;
    const int e = static_cast<int>(r >> 23) - 112;
    if (e >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
    return static_cast<uint16_t>(sign | (e << 10) | ((r >> 13) & 0x3FF));
  }
  // Subnormal float16 (or zero): the significand with its implicit bit, shifted; a carry
  // into bit 10 gives the smallest normal, as the encoding intends.
  const uint32_t significand = exponent == 0 ? 0 : ((abs & 0x7FFFFFu) | 0x800000u);
  return static_cast<uint16_t>(sign | ((significand + add) >> drop));
}
inline uint16_t Float16Nearest(float f) { return Float16Rounded(BitsOf(f), true, 0); }
inline uint16_t Float16Stochastic(float f, uint32_t random) {
  return Float16Rounded(BitsOf(f), false, random);
}

// SplitMix64's finalizer.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

}  // namespace precision

// The stochastic rounding bits of one row update: element j uses bits 16*(j%4) .. +15 of
// word j/4 (the embedding's elements are 0 .. dim-1; with bfloat16 slots, element i of slot s
// is (s + 1) * dim + i), word w = Mix64(state + (w + 1) * kGolden) with
// state = Mix64(Mix64(seed ^ key) ^ (step * kGolden)). tests/ recompute it in NumPy.
class RoundingBits {
 public:
  RoundingBits(uint64_t seed, int64_t key, uint64_t step)
      : state_(precision::Mix64(precision::Mix64(seed ^ static_cast<uint64_t>(key)) ^
                                (step * precision::kGolden))) {}
  uint64_t Word(int64_t w) const {
    return precision::Mix64(state_ + static_cast<uint64_t>(w + 1) * precision::kGolden);
  }

 private:
  uint64_t state_;
};

// Calls fn(j, random) for j in [0, n), random being the 16 bits of element first + j of the
// update (one word per 4 elements).
template <typename Fn>
inline void ForEachRandom(const RoundingBits& bits, int64_t first, int n, Fn fn) {
  int64_t element = first;
  for (int j = 0; j < n;) {
    uint64_t word = bits.Word(element / 4) >> (16 * (element % 4));
    const int end = static_cast<int>(std::min<int64_t>(n, j + 4 - element % 4));
    for (; j < end; ++j, ++element, word >>= 16) fn(j, static_cast<uint32_t>(word & 0xFFFF));
  }
}

// float16 rows in bulk (row_precision.cc): with the CPU's F16C and AVX2 instructions where it
// has them (decoding: the hardware conversion; stochastic rounding: 8 lanes of the scalar
// arithmetic, lanes outside float16's normal range falling back to it), else one element at
// a time. Results are identical either way (tests compare them exhaustively).
void DecodeFloat16(const uint16_t* h, int n, float* out);
// in[0] is element `first` of the update (RoundingBits).
void EncodeFloat16Stochastic(const float* in, int n, const RoundingBits& bits, int64_t first,
                             uint16_t* out);
// The element-at-a-time versions (and whether the bulk ones use F16C / AVX2 here).
void DecodeFloat16Scalar(const uint16_t* h, int n, float* out);
void EncodeFloat16StochasticScalar(const float* in, int n, const RoundingBits& bits, int64_t first,
                                   uint16_t* out);
bool Float16UsesSimd();

// Decodes n elements of `dtype` at src into float32.
inline void DecodeRow(RowDtype dtype, const void* src, int n, float* out) {
  switch (dtype) {
    case RowDtype::kFloat32:
      CopyFloats(out, static_cast<const float*>(src), n);
      return;
    case RowDtype::kBFloat16: {
      const uint16_t* h = static_cast<const uint16_t*>(src);
      for (int j = 0; j < n; ++j) out[j] = precision::BFloat16ToFloat(h[j]);
      return;
    }
    case RowDtype::kFloat16:
      DecodeFloat16(static_cast<const uint16_t*>(src), n, out);
      return;
  }
}

// Encodes n float32 values as `dtype`, rounding to nearest (ties to even).
inline void EncodeRowNearest(RowDtype dtype, const float* in, int n, void* dst) {
  switch (dtype) {
    case RowDtype::kFloat32:
      std::memcpy(dst, in, sizeof(float) * n);
      return;
    case RowDtype::kBFloat16: {
      uint16_t* h = static_cast<uint16_t*>(dst);
      for (int j = 0; j < n; ++j) h[j] = precision::BFloat16Nearest(in[j]);
      return;
    }
    case RowDtype::kFloat16: {
      uint16_t* h = static_cast<uint16_t*>(dst);
      for (int j = 0; j < n; ++j) h[j] = precision::Float16Nearest(in[j]);
      return;
    }
  }
}

// Encodes n float32 values as `dtype`, rounding stochastically with `bits` (float32: a copy);
// in[0] is element `first` of the update (RoundingBits).
inline void EncodeRowStochastic(RowDtype dtype, const float* in, int n, const RoundingBits& bits,
                                void* dst, int64_t first = 0) {
  if (dtype == RowDtype::kFloat32) {
    std::memcpy(dst, in, sizeof(float) * n);
    return;
  }
  uint16_t* h = static_cast<uint16_t*>(dst);
  if (dtype == RowDtype::kFloat16) {
    EncodeFloat16Stochastic(in, n, bits, first, h);
    return;
  }
  ForEachRandom(bits, first, n, [&](int j, uint32_t random) {
    h[j] = precision::BFloat16Stochastic(in[j], random);
  });
}

// Fills n elements of `dtype` at dst with `value` (rounded to nearest).
inline void FillRow(RowDtype dtype, float value, int n, void* dst) {
  if (dtype == RowDtype::kFloat32) {
    float* f = static_cast<float*>(dst);
    for (int j = 0; j < n; ++j) f[j] = value;
    return;
  }
  uint16_t h;
  EncodeRowNearest(dtype, &value, 1, &h);
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (int j = 0; j < n; ++j) out[j] = h;
}

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_ROW_PRECISION_H_
