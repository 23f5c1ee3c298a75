// The runner's CPU kernels on AVX512F/BW/VL + VNNI (included by cpu_kernels.cpp; layouts described there).
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "bf16.h"  // store_bf16 (AVX512-BF16 builds)

namespace kvlink {

constexpr int64_t kBlock = 32, kRows = 16, kTileBytes = 320, kTileBytesQ8 = 576;
constexpr const char* kIsa = "avx512";

// y[r][16] of one tile for R activation rows at once: each weight vector is unpacked once for all R rows.
template <int R>
inline void tile_rows(const uint8_t* tile, int64_t blocks, int64_t k, const int8_t* qx, const float* dx,
                      const float* sx, float* const* y) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* t = tile + b * kTileBytes;
    __m512i s[R];
    for (int r = 0; r < R; ++r) s[r] = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {
      const __m512i w = _mm512_loadu_si512(t + 64 * p);
      const __m512i lo = _mm512_and_si512(w, low), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
      for (int r = 0; r < R; ++r) {
        const int32_t* xq = reinterpret_cast<const int32_t*>(qx + r * k + b * kBlock);
        s[r] = _mm512_dpbusd_epi32(s[r], lo, _mm512_set1_epi32(xq[2 * p]));
        s[r] = _mm512_dpbusd_epi32(s[r], hi, _mm512_set1_epi32(xq[2 * p + 1]));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 256)));
    const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 288)));
    for (int r = 0; r < R; ++r) {
      const int64_t rb = r * blocks + b;
      acc0[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx[rb])), _mm512_cvtepi32_ps(s[r]), acc0[r]);
      acc1[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(sx[rb]), acc1[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(y[r], _mm512_add_ps(acc0[r], acc1[r]));
}


// Q8 x Q8: int8 weights (symmetric, one scale per output row, applied by the caller) in tiles of 16 rows,
// per (tile, block) 576 bytes: 8 vectors of 64 bytes (vector g, lane j, byte i: w[j, 4g + i]), then 16 int32
// corrections 128 * sum of the block's weights of each row. The activation rides as unsigned (qx + 128), so
// vpdpbusd(u8 x s8) gives dot + 128 * sum w, the correction taken off.
inline void tile_row_q8(const uint8_t* tile, int64_t blocks, const int8_t* qx, const float* dx, float* y) {
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* t = tile + b * kTileBytesQ8;
    const int32_t* xq = reinterpret_cast<const int32_t*>(qx + b * kBlock);
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int g = 0; g < 8; g += 2) {
      const __m512i x0 = _mm512_xor_si512(_mm512_set1_epi32(xq[g]), bias);  // qx + 128 as unsigned bytes
      const __m512i x1 = _mm512_xor_si512(_mm512_set1_epi32(xq[g + 1]), bias);
      s0 = _mm512_dpbusd_epi32(s0, x0, _mm512_loadu_si512(t + 64 * g));
      s1 = _mm512_dpbusd_epi32(s1, x1, _mm512_loadu_si512(t + 64 * (g + 1)));
    }
    const __m512i corr = _mm512_loadu_si512(t + 512);
    const __m512 isum = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_add_epi32(s0, s1), corr));
    if (b & 1) acc1 = _mm512_fmadd_ps(_mm512_set1_ps(dx[b]), isum, acc1);
    else acc0 = _mm512_fmadd_ps(_mm512_set1_ps(dx[b]), isum, acc0);
  }
  _mm512_storeu_ps(y, _mm512_add_ps(acc0, acc1));
}


// 16 KV values as float32: bfloat16 (the high half of a float32) or float32 pieces.
inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

// The first `left` of 16 lanes (all for left >= 16, none for left <= 0): a row's tail, or its visible keys.
inline __mmask16 first(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1);
}

// The lanes `in` of 16 values from m (bfloat16 bits or float32) as float32; the other lanes read nothing and are 0.
inline __m512 mask16(const uint16_t* m, __mmask16 in) {
  const __m256i x = _mm256_maskz_loadu_epi16(in, m);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}
inline __m512 mask16(const float* m, __mmask16 in) { return _mm512_maskz_loadu_ps(in, m); }


// e^x of 16 floats (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-5 polynomial for e^r, 2^n in the
// exponent bits; ~1 ulp for x in [-87, 88], 0 below).
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507E-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073E-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894E-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459E-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201E-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

// softmax of s[0..n) in place (float32).
inline void softmax_inplace(float* s, int64_t n) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + i));
  float mx = _mm512_reduce_max_ps(vmax);
  for (; i < n; ++i) mx = std::fmax(mx, s[i]);
  const __m512 m = _mm512_set1_ps(mx);
  __m512 vsum = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), m));
    _mm512_storeu_ps(s + i, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  float sum = _mm512_reduce_add_ps(vsum);
  for (; i < n; ++i) { s[i] = std::exp(s[i] - mx); sum += s[i]; }
  const __m512 inv = _mm512_set1_ps(1.f / sum);
  for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(s + i, _mm512_mul_ps(_mm512_loadu_ps(s + i), inv));
  for (; i < n; ++i) s[i] *= 1.f / sum;
}

// Rows a loop asks the memory for ahead of its use: the KV of a decode row is read once per step, from memory
// (hundreds of MB a step at 16 rows), and without it the loads of each new 4 KB page stalled (~50% of the kernel's
// samples sat on the first load of a value row).
constexpr int64_t kAhead = 8;

inline void prefetch_row(const void* p, int64_t bytes, int hint) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) {
    if (hint == _MM_HINT_T0) _mm_prefetch(c + b, _MM_HINT_T0);
    else _mm_prefetch(c + b, _MM_HINT_T1);
  }
}

// A value row of 64 into four float32 vectors: float32 as it is; bfloat16 widened by interleaving each word below
// a zero word (one operation per 16 values instead of two), which leaves the dims in the order of
// _mm512_unpacklo/hi_epi16 (vector 0 lane 4L + m: dim 8L + m, vector 1: dim 8L + 4 + m, vectors 2-3: the same
// from dim 32): store_values puts them back. Each dim's products and sums are unchanged.
inline void load_values(const float* v, __m512& v0, __m512& v1, __m512& v2, __m512& v3) {
  v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16), v2 = _mm512_loadu_ps(v + 32), v3 = _mm512_loadu_ps(v + 48);
}
inline void load_values(const uint16_t* v, __m512& v0, __m512& v1, __m512& v2, __m512& v3) {
  const __m512i zero = _mm512_setzero_si512(), a = _mm512_loadu_si512(v), b = _mm512_loadu_si512(v + 32);
  v0 = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, a)), v1 = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, a));
  v2 = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, b)), v3 = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, b));
}

// The 64 output dims accumulated over load_values' vectors, stored in dim order.
template <typename T>
inline void store_values(float* out, const __m512* o) {
  if constexpr (std::is_same_v<T, float>) {
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(out + 16 * c, o[c]);
  } else {
    // dim d of a 32-dim half: L = d / 8, m = d % 8: vector 0 lane 4L + m (m < 4), else vector 1 lane 4L + m - 4
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int h = 0; h < 2; ++h) {
      _mm512_storeu_ps(out + 32 * h, _mm512_permutex2var_ps(o[2 * h], lo, o[2 * h + 1]));
      _mm512_storeu_ps(out + 32 * h + 16, _mm512_permutex2var_ps(o[2 * h], hi, o[2 * h + 1]));
    }
  }
}

#if defined(__AVX512BF16__)
#include "attend_bf16.h"  // the bfloat16 scores and P @ V of attend_group
#endif

// One KV head's group of `g` one-token queries over its keys and values in pieces (T: bfloat16 bits or
// float32, head_dim 64): scores q.k * scale for every key, softmax in float32, then the weighted sum of values.
// Bfloat16 keys and values with bfloat16-valued queries (the decode rows') take attend_bf16 where the CPU has
// AVX512-BF16: vdpbf16ps for the scores (~3x fewer operations a key; the decode rows were compute-bound at ~13 GB/s
// of KV on two cores) and for P @ V with the probabilities rounded to bfloat16, in one pass over the keys.
template <typename T>
void attend_group(const float* q, int64_t g, const std::vector<const T*>& ks, const std::vector<const T*>& vs, const std::vector<int64_t>& lens,
                  const std::vector<int64_t>& tstrides, float scale, int64_t total, float* out) {
  constexpr int D = 64;
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, uint16_t>) {
    if (attend_bf16(q, g, ks, vs, lens, tstrides, scale, out)) return;
  }
#endif
  std::vector<float> s(g * total);
  int64_t at = 0;
  for (size_t p = 0; p < ks.size(); ++p)  // each key converted once for the whole group
    for (int64_t t = 0; t < lens[p]; ++t, ++at) {
      const T* k = ks[p] + t * tstrides[p];
      const __m512 k0 = load16(k), k1 = load16(k + 16), k2 = load16(k + 32), k3 = load16(k + 48);
      for (int64_t j = 0; j < g; ++j) {
        const float* qj = q + j * D;
        __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qj), k0);
        a = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 16), k1, a);
        a = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 32), k2, a);
        a = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 48), k3, a);
        s[j * total + at] = _mm512_reduce_add_ps(a) * scale;
      }
    }
  for (int64_t j = 0; j < g; ++j) softmax_inplace(s.data() + j * total, total);
  constexpr int kMaxGroup = 8;  // accumulators of up to 8 queries stay in registers (4 vectors each)
  for (int64_t j0 = 0; j0 < g; j0 += kMaxGroup) {
    const int64_t gn = std::min<int64_t>(kMaxGroup, g - j0);
    __m512 o[kMaxGroup][4];
    for (int64_t j = 0; j < gn; ++j)
      for (int c = 0; c < 4; ++c) o[j][c] = _mm512_setzero_ps();
    int64_t at2 = 0;
    for (size_t p = 0; p < vs.size(); ++p)
      for (int64_t t = 0; t < lens[p]; ++t, ++at2) {
        __m512 v0, v1, v2, v3;
        const T* v = vs[p] + t * tstrides[p];
        if (t + kAhead < lens[p]) prefetch_row(v + kAhead * tstrides[p], D * sizeof(T), _MM_HINT_T0);
        load_values(v, v0, v1, v2, v3);
        for (int64_t j = 0; j < gn; ++j) {
          const __m512 w = _mm512_set1_ps(s[(j0 + j) * total + at2]);
          o[j][0] = _mm512_fmadd_ps(w, v0, o[j][0]);
          o[j][1] = _mm512_fmadd_ps(w, v1, o[j][1]);
          o[j][2] = _mm512_fmadd_ps(w, v2, o[j][2]);
          o[j][3] = _mm512_fmadd_ps(w, v3, o[j][3]);
        }
      }
    for (int64_t j = 0; j < gn; ++j) store_values<T>(out + (j0 + j) * D, o[j]);
  }
}

// One block of 32 activations to int8 as the scalar formula rounds it, bit for bit: d = max|x| / 127,
// q = nearbyint(x * (1 / d)) (cvtps rounds to nearest even, as nearbyint under the default rounding mode);
// returns d, and the block's sum of q in *sum.
inline float quantize_block(const float* src, int8_t* dst, int* sum) {
  const __m512 a = _mm512_loadu_ps(src), b = _mm512_loadu_ps(src + 16);
  const float d = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b))) / 127.f;
  const __m512 vi = _mm512_set1_ps(d >= FLT_MIN ? 1.f / d : 0.f);  // as isa_avx2.h: a subnormal scale rounds to 0
  const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, vi)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vi));
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm512_cvtepi32_epi8(qb));
  return d;
}

}  // namespace kvlink
