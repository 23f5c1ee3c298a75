// One row of stored keys or values into a KV block's row (kv_rows.cpp's inner loop): copied, widened from bfloat16
// to float32, and/or rotated (RoPE) on the way, with streamed stores.
//
// The rotation is linking/rope.py's apply_rope on float32 tables, operation for operation:
//   out[d] = round(x[d] * cos[d] + r[d] * sin[d]),  r = rotate_half(x) = [-x2, x1],
// each product and the sum rounded to float32 (the extension is built with -ffp-contract=off, so no FMA fuses
// them), then rounded to the output dtype (bfloat16: to nearest even, as torch's copy), so the bytes equal
// apply_rope(x.float(), cos, sin).to(dtype)'s; a bfloat16 source widens exactly, so bfloat16 rows written into
// float32 blocks equal apply_rope(x.float(), cos, sin) (and x.float() unrotated).
#pragma once

#include "isa.h"

#include <c10/util/BFloat16.h>

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kv_row {

// Copy one row of n bytes to dst with non-temporal stores where the row is whole vectors at an aligned address:
// the blocks are read again only by later forwards (after every layer of the load), so writing them around the
// caches saves the read-for-ownership of each destination line (~1.6x a memcpy's speed here); else a memcpy.
inline void put_row(void* dst, const void* src, int64_t n) {
#if defined(__AVX512F__)
  constexpr int64_t kVec = 64;
#elif defined(__AVX2__)
  constexpr int64_t kVec = 32;
#else
  constexpr int64_t kVec = 0;
#endif
  if (kVec == 0 || n % kVec != 0 || reinterpret_cast<uintptr_t>(dst) % kVec != 0) {
    std::memcpy(dst, src, n);
    return;
  }
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  for (int64_t i = 0; i < n; i += kVec) {
#if defined(__AVX512F__)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_loadu_si512(s + i));
#elif defined(__AVX2__)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
#endif
  }
}

template <typename T>
inline float widen(T x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return static_cast<float>(c10::BFloat16(x, c10::BFloat16::from_bits()));
}

template <typename T>
inline T narrow(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return c10::BFloat16(x).x;  // round to nearest even, as torch's copy
}

// The vector code of the instruction set isa.h chose (the same conditions): its load16 / load8 read 16 / 8 lanes of
// bfloat16 bits or float32 as float32.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
using kvlink::load16;

// float32 -> bfloat16 bits, rounded to nearest even (NaN -> 0x7FC0), as c10::BFloat16's round_to_nearest_even.
inline void store16(uint16_t* p, __m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }

// The rotation of one row, 16 lanes at a time: lanes d of the first half and d + half of the second together,
// each product and the sum rounded apart (mul, mul, add: no FMA), as the scalar loop below.
template <typename S, typename T>
inline void rotate16(T* y, const S* src, int64_t half, const float* cos, const float* sin) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t d = 0; d < half; d += 16) {
    const __m512 lo = load16(src + d), hi = load16(src + d + half);
    const __m512 a = _mm512_mul_ps(lo, _mm512_loadu_ps(cos + d));
    const __m512 b = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(hi), _mm512_castps_si512(sign))),
                                   _mm512_loadu_ps(sin + d));
    const __m512 c = _mm512_mul_ps(hi, _mm512_loadu_ps(cos + d + half));
    const __m512 e = _mm512_mul_ps(lo, _mm512_loadu_ps(sin + d + half));
    store16(y + d, _mm512_add_ps(a, b));
    store16(y + d + half, _mm512_add_ps(c, e));
  }
}
#else
using kvlink::load8;

// float32 -> bfloat16 bits, rounded to nearest even (NaN -> 0x7FC0), as c10::BFloat16's round_to_nearest_even.
inline void store8(uint16_t* p, __m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
  // every lane holds 0..0xFFFF: the unsigned saturating pack keeps it (per 128-bit half, so the halves go apart)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}
inline void store8(float* p, __m256 x) { _mm256_storeu_ps(p, x); }

// rotate16's AVX2 twin, 8 lanes at a time (mul, mul, add: no FMA).
template <typename S, typename T>
inline void rotate8(T* y, const S* src, int64_t half, const float* cos, const float* sin) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t d = 0; d < half; d += 8) {
    const __m256 lo = load8(src + d), hi = load8(src + d + half);
    const __m256 a = _mm256_mul_ps(lo, _mm256_loadu_ps(cos + d));
    const __m256 b = _mm256_mul_ps(_mm256_xor_ps(hi, sign), _mm256_loadu_ps(sin + d));
    const __m256 c = _mm256_mul_ps(hi, _mm256_loadu_ps(cos + d + half));
    const __m256 e = _mm256_mul_ps(lo, _mm256_loadu_ps(sin + d + half));
    store8(y + d, _mm256_add_ps(a, b));
    store8(y + d + half, _mm256_add_ps(c, e));
  }
}
#endif  // isa.h's choice

// One row of D elements: src (S: bfloat16 bits or float32) -> dst (T: the same, or float32 from bfloat16: widened
// exactly), rotated by the row's angles (cos/sin: D floats) when cos is not null.
template <typename S, typename T>
inline void row(T* dst, const S* src, int64_t D, const float* cos, const float* sin) {
  static_assert(std::is_same_v<S, T> || (std::is_same_v<S, uint16_t> && std::is_same_v<T, float>), "bf16 -> f32 only");
  if (cos == nullptr && std::is_same_v<S, T>) {
    put_row(dst, src, D * sizeof(T));
    return;
  }
  alignas(64) T y[256];
  const int64_t half = D / 2;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  if (half % 16 == 0) {
    if (cos == nullptr) for (int64_t d = 0; d < D; d += 16) store16(y + d, load16(src + d));
    else rotate16<S, T>(y, src, half, cos, sin);
    put_row(dst, y, D * sizeof(T));
    return;
  }
#else
  if (half % 8 == 0) {
    if (cos == nullptr) for (int64_t d = 0; d < D; d += 8) store8(y + d, load8(src + d));
    else rotate8<S, T>(y, src, half, cos, sin);
    put_row(dst, y, D * sizeof(T));
    return;
  }
#endif
  alignas(64) float x[256];
  for (int64_t d = 0; d < D; ++d) x[d] = widen(src[d]);
  if (cos == nullptr) {
    for (int64_t d = 0; d < D; ++d) y[d] = narrow<T>(x[d]);
  } else {
    for (int64_t d = 0; d < half; ++d) {
      const float a = x[d] * cos[d], b = -x[d + half] * sin[d];
      y[d] = narrow<T>(a + b);
    }
    for (int64_t d = half; d < D; ++d) {
      const float a = x[d] * cos[d], b = x[d - half] * sin[d];
      y[d] = narrow<T>(a + b);
    }
  }
  put_row(dst, y, D * sizeof(T));
}

}  // namespace kv_row
