#include "tf_ops/core/row_precision.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace rec_sdk {

void DecodeFloat16Scalar(const uint16_t* h, int n, float* out) {
  for (int j = 0; j < n; ++j) out[j] = precision::Float16ToFloat(h[j]);
}

void EncodeFloat16StochasticScalar(const float* in, int n, const RoundingBits& bits, int64_t first,
                                   uint16_t* out) {
  ForEachRandom(bits, first, n, [&](int j, uint32_t random) {
    out[j] = precision::Float16Stochastic(in[j], random);
  });
}

#if defined(__x86_64__)

namespace {

__attribute__((target("avx2,f16c"))) void DecodeFloat16Simd(const uint16_t* h, int n, float* out) {
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + j));
    _mm256_storeu_ps(out + j, _mm256_cvtph_ps(halves));
  }
  DecodeFloat16Scalar(h + j, n - j, out + j);
}

// Float16Rounded's normal-range arithmetic on 8 lanes: add the random bits scaled to the 13
// dropped bits of the significand, then truncate. A group with a lane below float16's
// smallest normal (2^-14), or that rounds past 65504 (or is infinite or NaN), is done by
// the scalar code.
__attribute__((target("avx2"))) void EncodeFloat16StochasticSimd(const float* in, int n,
                                                                 const RoundingBits& bits,
                                                                 int64_t first, uint16_t* out) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i smallest_normal = _mm256_set1_epi32(113 << 23);  // abs below: subnormal
  // r above: rounds past 65504 (abs above too: also NaN and infinity, and r cannot wrap).
  const __m256i largest = _mm256_set1_epi32((143 << 23) - 1);
  const __m256i rebias = _mm256_set1_epi32(112 << 10);
  int j = 0;
  int64_t element = first;
  alignas(32) uint32_t random[8];
  for (; j + 8 <= n; j += 8, element += 8) {
    ForEachRandom(bits, element, 8, [&](int k, uint32_t r) { random[k] = r >> 3; });
    const __m256i a = _mm256_castps_si256(_mm256_loadu_ps(in + j));
    const __m256i abs = _mm256_and_si256(a, abs_mask);
    const __m256i r =
        _mm256_add_epi32(abs, _mm256_load_si256(reinterpret_cast<const __m256i*>(random)));
    const __m256i outside = _mm256_or_si256(
        _mm256_cmpgt_epi32(smallest_normal, abs),
        _mm256_or_si256(_mm256_cmpgt_epi32(abs, largest), _mm256_cmpgt_epi32(r, largest)));
    if (!_mm256_testz_si256(outside, outside)) {
      EncodeFloat16StochasticScalar(in + j, 8, bits, element, out + j);
      continue;
    }
    const __m256i sign = _mm256_srli_epi32(_mm256_andnot_si256(abs_mask, a), 16);
    const __m256i h = _mm256_or_si256(sign, _mm256_sub_epi32(_mm256_srli_epi32(r, 13), rebias));
    // 32-bit lanes to 16 bits (each fits): pack within 128-bit halves, then join them.
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), packed);
  }
  EncodeFloat16StochasticScalar(in + j, n - j, bits, element, out + j);
}

bool CpuHasFloat16Simd() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

}  // namespace

bool Float16UsesSimd() {
  static const bool simd = CpuHasFloat16Simd();
  return simd;
}

void DecodeFloat16(const uint16_t* h, int n, float* out) {
  if (Float16UsesSimd()) {
    DecodeFloat16Simd(h, n, out);
  } else {
    DecodeFloat16Scalar(h, n, out);
  }
}

void EncodeFloat16Stochastic(const float* in, int n, const RoundingBits& bits, int64_t first,
                             uint16_t* out) {
  if (Float16UsesSimd()) {
    EncodeFloat16StochasticSimd(in, n, bits, first, out);
  } else {
    EncodeFloat16StochasticScalar(in, n, bits, first, out);
  }
}

#else  // not x86-64: one element at a time

bool Float16UsesSimd() { return false; }

void DecodeFloat16(const uint16_t* h, int n, float* out) { DecodeFloat16Scalar(h, n, out); }

void EncodeFloat16Stochastic(const float* in, int n, const RoundingBits& bits, int64_t first,
                             uint16_t* out) {
  EncodeFloat16StochasticScalar(in, n, bits, first, out);
}

#endif

const char* RowDtypeName(RowDtype dtype) {
  switch (dtype) {
    case RowDtype::kFloat32:
      return "float32";
    case RowDtype::kBFloat16:
      return "bfloat16";
    case RowDtype::kFloat16:
      return "float16";
  }
  return "float32";
}

bool IsSlotDtype(RowDtype dtype) {
  for (RowDtype d : kSlotDtypes) {
    if (d == dtype) return true;
  }
  return false;
}

Status RowDtypeFromName(const std::string& name, RowDtype* dtype) {
  for (RowDtype d : kRowDtypes) {
    if (name == RowDtypeName(d)) {
      *dtype = d;
      return Status::Ok();
    }
  }
  return Status::InvalidArgument("emb_dtype '" + name +
                                 "' is not a row dtype: use float32, bfloat16 or float16");
}

}  // namespace rec_sdk
