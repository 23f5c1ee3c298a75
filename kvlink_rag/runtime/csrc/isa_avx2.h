// The runner's CPU kernels on AVX2 + FMA + F16C (included by cpu_kernels.cpp where AVX512-VNNI is absent).
//
// The same packed layouts and formulas as isa_avx512.h, 256 bits at a time: a 64-byte vector of a tile is two
// halves of 8 row lanes each, processed one after the other (a tile of one block row fits in L1). AVX2 has no
// vpdpbusd, so the integer dots take llama.cpp's AVX2 route: vpmaddubsw (u8 x s8 -> pairs summed into int16)
// then vpmaddwd by ones (-> int32). Q4 x Q8: |nibble * qx| <= 15 * 127, so the 8 products of a lane's block
// stay below 2^15 in int16 before the widening; Q8 x Q8: the sign trick (|qx| as u8, the weight carrying qx's
// sign), <= 2 * 127 * 128 per int16 pair.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

namespace kvlink {

constexpr int64_t kBlock = 32, kRows = 16, kTileBytes = 320, kTileBytesQ8 = 576;
constexpr const char* kIsa = "avx2";

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Rows 8h..8h+7 of one tile (half h) for R activation rows: y[r][8h + j].
template <int R>
inline void tile_half(const uint8_t* tile, int h, int64_t blocks, int64_t k, const int8_t* qx, const float* dx,
                      const float* sx, float* const* y) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* t = tile + b * kTileBytes;
    __m256i s[R];
    for (int r = 0; r < R; ++r) s[r] = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 64 * p + 32 * h));
      const __m256i lo = _mm256_and_si256(w, low), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
      for (int r = 0; r < R; ++r) {
        const int32_t* xq = reinterpret_cast<const int32_t*>(qx + r * k + b * kBlock);
        s[r] = _mm256_add_epi16(s[r], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xq[2 * p])));
        s[r] = _mm256_add_epi16(s[r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xq[2 * p + 1])));
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 256 + 16 * h)));
    const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 288 + 16 * h)));
    for (int r = 0; r < R; ++r) {
      const int64_t rb = r * blocks + b;
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(s[r], ones));
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(dx[rb])), dot, acc[r]);
      acc[r] = _mm256_fmadd_ps(mn, _mm256_set1_ps(sx[rb]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y[r] + 8 * h, acc[r]);
}

// y[r][16] of one tile for R activation rows (the Q4 x Q8 product, see cpu_kernels.cpp).
template <int R>
inline void tile_rows(const uint8_t* tile, int64_t blocks, int64_t k, const int8_t* qx, const float* dx,
                      const float* sx, float* const* y) {
  tile_half<R>(tile, 0, blocks, k, qx, dx, sx, y);
  tile_half<R>(tile, 1, blocks, k, qx, dx, sx, y);
}

// Q8 x Q8 of one tile and one activation row: y[16] before the per-row weight scales. Signed products, so the
// stored corrections (for the unsigned activations of the AVX512 path) are not needed.
inline void tile_row_q8(const uint8_t* tile, int64_t blocks, const int8_t* qx, const float* dx, float* y) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int h = 0; h < 2; ++h) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* t = tile + b * kTileBytesQ8 + 32 * h;
      const int32_t* xq = reinterpret_cast<const int32_t*>(qx + b * kBlock);
      __m256i s = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        const __m256i x = _mm256_set1_epi32(xq[g]);
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 64 * g));
        const __m256i prod = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(w, x));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(prod, ones));
      }
      acc = _mm256_fmadd_ps(_mm256_set1_ps(dx[b]), _mm256_cvtepi32_ps(s), acc);
    }
    _mm256_storeu_ps(y + 8 * h, acc);
  }
}

// 8 KV values as float32: bfloat16 (the high half of a float32) or float32 pieces.
inline __m256 load8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

// e^x of 8 floats (Cephes' expf, as exp16 of isa_avx512.h).
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// softmax of s[0..n) in place (float32).
inline void softmax_inplace(float* s, int64_t n) {
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + i));
  float mx = hmax8(vmax);
  for (; i < n; ++i) mx = std::fmax(mx, s[i]);
  const __m256 m = _mm256_set1_ps(mx);
  __m256 vsum = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), m));
    _mm256_storeu_ps(s + i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float sum = hsum8(vsum);
  for (; i < n; ++i) { s[i] = std::exp(s[i] - mx); sum += s[i]; }
  const __m256 inv = _mm256_set1_ps(1.f / sum);
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), inv));
  for (; i < n; ++i) s[i] *= 1.f / sum;
}

// One KV head's group of `g` one-token queries over its pieces (T: bfloat16 bits or float32, head_dim 64).
template <typename T>
void attend_group(const float* q, int64_t g, const std::vector<const T*>& ks, const std::vector<const T*>& vs,
                  const std::vector<int64_t>& lens, const std::vector<int64_t>& tstrides, float scale, int64_t total,
                  float* out) {
  constexpr int D = 64;
  std::vector<float> s(g * total);
  int64_t at = 0;
  for (size_t p = 0; p < ks.size(); ++p)  // each key converted once for the whole group
    for (int64_t t = 0; t < lens[p]; ++t, ++at) {
      const T* k = ks[p] + t * tstrides[p];
      __m256 kv[8];
      for (int c = 0; c < 8; ++c) kv[c] = load8(k + 8 * c);
      for (int64_t j = 0; j < g; ++j) {
        const float* qj = q + j * D;
        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(qj), kv[0]);
        for (int c = 1; c < 8; ++c) a = _mm256_fmadd_ps(_mm256_loadu_ps(qj + 8 * c), kv[c], a);
        s[j * total + at] = hsum8(a) * scale;
      }
    }
  for (int64_t j = 0; j < g; ++j) softmax_inplace(s.data() + j * total, total);
  for (int64_t j = 0; j < g; ++j) {  // one query's 8 accumulators at a time (16 registers in all)
    __m256 o[8];
    for (int c = 0; c < 8; ++c) o[c] = _mm256_setzero_ps();
    const float* w = s.data() + j * total;
    int64_t at2 = 0;
    for (size_t p = 0; p < vs.size(); ++p)
      for (int64_t t = 0; t < lens[p]; ++t, ++at2) {
        const T* v = vs[p] + t * tstrides[p];
        const __m256 wt = _mm256_set1_ps(w[at2]);
        for (int c = 0; c < 8; ++c) o[c] = _mm256_fmadd_ps(wt, load8(v + 8 * c), o[c]);
      }
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(out + j * D + 8 * c, o[c]);
  }
}

// One block of 32 activations to int8 as the scalar formula rounds it, bit for bit: d = max|x| / 127,
// q = nearbyint(x * (1 / d)) (cvtps rounds to nearest even, as nearbyint under the default rounding mode);
// returns d, and the block's sum of q in *sum. llama.cpp's quantize_row_q8_0 packs the same way. A block whose
// scale is below FLT_MIN (max|x| < ~1.5e-36) rounds to zeros on both builds (1 / d of a subnormal d loses bits,
// and overflows to inf below ~3e-39).
inline float quantize_block(const float* src, int8_t* dst, int* sum) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(src + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
  }
  const float d = hmax8(amax) / 127.f, inv = d >= FLT_MIN ? 1.f / d : 0.f;  // no 1 / subnormal = inf
  const __m256 vi = _mm256_set1_ps(inv);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vi));
  const __m256i total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  *sum = _mm_cvtsi128_si32(t);
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                      _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  return d;
}

}  // namespace kvlink
