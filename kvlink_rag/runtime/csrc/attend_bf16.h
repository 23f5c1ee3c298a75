// attend_group's AVX512-BF16 path over bfloat16 keys and values (included by isa_avx512.h inside namespace kvlink,
// compiled only under -mavx512bf16) for bfloat16-valued queries (the decode rows round theirs to the KV's dtype):
// scores by vdpbf16ps, 16 keys summed at a time, and P @ V with the probabilities rounded to bfloat16, two keys a
// vdpbf16ps, in one pass over the keys in chunks (attend_online).
#pragma once

// Lane i of the result: the sum of the 16 lanes of a[i] (a transposing tree: 15 adds and 30 shuffles for 16 sums,
// against ~10 operations a sum for _mm512_reduce_add_ps).
inline __m512 sum16(const __m512* a) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i)  // b[i]: quarters 0-1 partial sums of a[2i], 2-3 of a[2i + 1]
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44), _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // c[i]: quarter q of a[4i + q]
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88), _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // d[i], quarter q: two lanes of a[8i + q], two of a[8i + 4 + q]
    d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44), _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));
  // lane 4q + m: the sum of a[q + 4m]; back to lane i = a[i]
  const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), e);
}

// Whether the g queries q [g, 64] are all bfloat16 values (their low 16 bits zero): the decode rows round them
// to the KV's dtype first, so their products with bfloat16 keys are exact in vdpbf16ps.
inline bool bf16_exact(const float* q, int64_t g) {
  const uint32_t* u = reinterpret_cast<const uint32_t*>(q);
  for (int64_t i = 0; i < g * 64; ++i)
    if (u[i] & 0xFFFFu) return false;
  return true;
}

// Scores q.k * scale of g <= 8 bfloat16 queries (qb: their dim pairs) over n bfloat16 keys from k (token stride ts)
// into s [g, n] (row stride sstride): each key's 64 products exact, summed in float32 by vdpbf16ps (pairs of dims per
// lane) and a tree across the lanes, 16 keys at a time (the same sums as attend_group's FMAs up to the order of the
// float32 additions). The values v of the same keys are asked into L2 on the way, for P @ V.
inline void scores_segment(const __m512bh (*qb)[2], int64_t g, const uint16_t* k0, const uint16_t* v0, int64_t n,
                           int64_t ts, float scale, float* s, int64_t sstride) {
  const __m512 sc = _mm512_set1_ps(scale);
  int64_t t = 0;
  for (; t + 16 <= n; t += 16) {
    const bool next = t + 32 <= n;
    for (int64_t j = 0; j < g; ++j) {
      __m512 acc[16];
      for (int i = 0; i < 16; ++i) {
        const uint16_t* k = k0 + (t + i) * ts;
        if (j == 0) {  // spread over the first query's keys: the next block's keys, this block's values (for P @ V)
          if (next) prefetch_row(k + 16 * ts, 128, _MM_HINT_T0);
          prefetch_row(v0 + (t + i) * ts, 128, _MM_HINT_T1);
        }
        acc[i] = _mm512_dpbf16_ps(_mm512_setzero_ps(), qb[j][0], (__m512bh)_mm512_loadu_si512(k));
        acc[i] = _mm512_dpbf16_ps(acc[i], qb[j][1], (__m512bh)_mm512_loadu_si512(k + 32));
      }
      _mm512_storeu_ps(s + j * sstride + t, _mm512_mul_ps(sum16(acc), sc));
    }
  }
  for (; t < n; ++t) {
    const uint16_t* k = k0 + t * ts;
    for (int64_t j = 0; j < g; ++j) {
      __m512 a = _mm512_dpbf16_ps(_mm512_setzero_ps(), qb[j][0], (__m512bh)_mm512_loadu_si512(k));
      a = _mm512_dpbf16_ps(a, qb[j][1], (__m512bh)_mm512_loadu_si512(k + 32));
      s[j * sstride + t] = _mm512_reduce_add_ps(a) * scale;
    }
  }
}

// Two value rows a and b (64 bfloat16 each) interleaved into dim pairs: w[c] holds (a[d], b[d]) for dims 16c to
// 16c + 15, the operand vdpbf16ps multiplies a pair of probabilities into (prefill_attention.cpp packs its values
// so, values_segment interleaves them on the way).
inline void value_pairs(const uint16_t* a, const uint16_t* b, __m512i (&w)[4]) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                      39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int c = 0; c < 2; ++c) {
    const __m512i x = _mm512_loadu_si512(a + 32 * c), y = _mm512_loadu_si512(b + 32 * c);
    w[2 * c] = _mm512_permutex2var_epi16(x, lo, y);
    w[2 * c + 1] = _mm512_permutex2var_epi16(x, hi, y);
  }
}

// acc[j] += sum over the n keys from v (token stride ts) of p[j][t] v[t], p bfloat16 bits [G, n] (row stride
// pstride), acc in dim order. Two keys a step: their value rows interleaved into dim pairs (4 permutes), one
// vdpbf16ps per 16 dims and query: ~10 vector operations a key for 3 queries (6 of them vdpbf16ps), against ~19 for
// the float32 loop that widens each value (4 unpacks) and multiplies it per query (12 FMAs).
template <int G>
inline void values_segment(const uint16_t* p, int64_t pstride, const uint16_t* v, int64_t n, int64_t ts,
                           __m512 (&acc)[G][4]) {
  for (int64_t t = 0; t < n; t += 2) {
    const uint16_t* a = v + t * ts;
    const bool two = t + 1 < n;  // the last key of an odd count pairs with itself at probability 0
    __m512i w[4];
    value_pairs(a, two ? a + ts : a, w);
    for (int j = 0; j < G; ++j) {
      const uint16_t* pj = p + j * pstride + t;
      const uint32_t pair = two ? (static_cast<uint32_t>(pj[1]) << 16) | pj[0] : pj[0];
      const __m512bh pb = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      for (int c = 0; c < 4; ++c) acc[j][c] = _mm512_dpbf16_ps(acc[j][c], pb, (__m512bh)w[c]);
    }
  }
}

// Keys whose values stay in cache between their scores and P @ V: the KV is read from memory once, where two whole
// passes (all scores, then all values) read the values a second time (BENCHMARKS.md, issue 24: the kernel a 16-row
// step 28.5-29.4 ms from memory, 17.1-19.5 with the KV in cache, before; 25.0-28.3 and 11.4-12.6 now).
constexpr int64_t kChunk = 256;

// Query j's chunk of scores s [n] -> exp(s - m) as bfloat16 bits into p, with its running maximum m and sum
// (online softmax: a larger maximum rescales the sum and the accumulators by exp(old - new)).
inline void softmax_chunk(const float* s, int64_t n, float& m, float& sum, __m512 (&acc)[4], uint16_t* p) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16)
    vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, first(n - i), s + i));
  const float mc = _mm512_reduce_max_ps(vmax);
  if (mc > m) {
    const float alpha = m == -INFINITY ? 0.f : std::exp(m - mc);
    for (int c = 0; c < 4; ++c) acc[c] = _mm512_mul_ps(acc[c], _mm512_set1_ps(alpha));
    sum *= alpha, m = mc;
  }
  const __m512 mv = _mm512_set1_ps(m);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 in = first(n - i);
    const __m512 e = _mm512_maskz_mov_ps(in, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, s + i), mv)));
    vsum = _mm512_add_ps(vsum, e);
    store_bf16(p + i, e, in);
  }
  sum += _mm512_reduce_add_ps(vsum);
}

// attend_group for G <= 8 bfloat16-valued queries q [G, 64] over bfloat16 pieces, into out [G, 64] float32: scores,
// online softmax and P @ V chunk by chunk in one pass over the keys.
template <int G>
inline void attend_online(const float* q, const std::vector<const uint16_t*>& ks, const std::vector<const uint16_t*>& vs,
                          const std::vector<int64_t>& lens, const std::vector<int64_t>& tstrides, float scale, float* out) {
  __m512bh qb[G][2];
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < 2; ++c)
      qb[j][c] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + j * 64 + 32 * c + 16), _mm512_loadu_ps(q + j * 64 + 32 * c));
  __m512 acc[G][4];
  float m[G], sum[G];
  for (int j = 0; j < G; ++j) {
    m[j] = -INFINITY, sum[j] = 0.f;
    for (int c = 0; c < 4; ++c) acc[j][c] = _mm512_setzero_ps();
  }
  alignas(64) float s[G * kChunk];
  alignas(64) uint16_t p[G * kChunk];
  for (size_t pc = 0; pc < ks.size(); ++pc)
    for (int64_t t0 = 0; t0 < lens[pc]; t0 += kChunk) {
      const int64_t n = std::min(kChunk, lens[pc] - t0), ts = tstrides[pc];
      const uint16_t* v = vs[pc] + t0 * ts;
      scores_segment(qb, G, ks[pc] + t0 * ts, v, n, ts, scale, s, kChunk);
      for (int j = 0; j < G; ++j) softmax_chunk(s + j * kChunk, n, m[j], sum[j], acc[j], p + j * kChunk);
      values_segment<G>(p, kChunk, v, n, ts, acc);
    }
  for (int j = 0; j < G; ++j) {
    const __m512 inv = _mm512_set1_ps(sum[j] > 0.f ? 1.f / sum[j] : 0.f);
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(out + j * 64 + 16 * c, _mm512_mul_ps(acc[j][c], inv));
  }
}

// attend_online at a compile-time group size; false (attend_group's general loops take it) where g > 8 or a
// query is not bfloat16-valued.
inline bool attend_bf16(const float* q, int64_t g, const std::vector<const uint16_t*>& ks,
                        const std::vector<const uint16_t*>& vs, const std::vector<int64_t>& lens,
                        const std::vector<int64_t>& tstrides, float scale, float* out) {
  if (g > 8 || !bf16_exact(q, g)) return false;
  switch (g) {
    case 1: attend_online<1>(q, ks, vs, lens, tstrides, scale, out); return true;
    case 2: attend_online<2>(q, ks, vs, lens, tstrides, scale, out); return true;
    case 3: attend_online<3>(q, ks, vs, lens, tstrides, scale, out); return true;
    case 4: attend_online<4>(q, ks, vs, lens, tstrides, scale, out); return true;
    case 5: attend_online<5>(q, ks, vs, lens, tstrides, scale, out); return true;
    case 6: attend_online<6>(q, ks, vs, lens, tstrides, scale, out); return true;
    case 7: attend_online<7>(q, ks, vs, lens, tstrides, scale, out); return true;
    case 8: attend_online<8>(q, ks, vs, lens, tstrides, scale, out); return true;
    default: return false;
  }
}
