// Prefill attention over bfloat16 KV with float32 scores from AVX512-BF16 dot products (vdpbf16ps).
//
// torch's CPU SDPA reaches ~60-140 GFLOP/s on bfloat16 prefill rows here, against ~400 for a GEMM of the
// same shape (BENCHMARKS.md, issue 24): the link-and-question forward at 4k tokens and a full prefill spend
// most of their time there. This kernel computes, per query row, every score in one pass (bfloat16 products
// accumulated in float32, the softmax scale, the additive mask), the softmax in float32 over the whole row
// (exact maximum, no online rescaling), the probabilities rounded to bfloat16 (as flash attention's P @ V),
// and P @ V accumulated in float32 in registers over all keys; the output is rounded to bfloat16 once.
//
// Layouts (repacked once per call, per KV head, from the pieces in storage order, keys padded to 64 with zeros):
//   kp[h][block of 16 keys][pair p of dims][key i]  = (k[2p], k[2p+1]) of key 16 * block + i  (32 bits)
//   vp[h][pair of keys jp][dim d]                  = (v[2 jp][d], v[2 jp + 1][d])            (32 bits)
// so a score vector is 32 vdpbf16ps of a broadcast query pair against kp, and an output vector 1 vdpbf16ps per
// key pair of a broadcast probability pair against vp. Tasks are (query head, 12 tokens), in parallel.
// Scratch (the packed KV in the calling thread, scores and probabilities per worker) is grow-only per thread:
// ~3 MB and ~0.3 MB a thread at 4k keys, kept for the next call.
#include "kernels.h"
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include "isa.h"
#include "scratch.h"

namespace {

using kvlink::first;
using kvlink::mask16;
using kvlink::scratch;

constexpr int D = 64, P = 32;         // head_dim, dim pairs
constexpr int64_t kTaskRows = 12;     // query tokens of one head per task
constexpr float kMasked = -INFINITY;  // a score that contributes nothing

struct Packed {
  uint32_t *k = nullptr, *v = nullptr;  // see the layouts above
  int64_t len = 0, padded = 0;  // keys, and keys rounded up to 64 (the padding is zeros, never visible)
};

// Key `at`'s 32 dim pairs into its block column, and its values into the halves of its key pair.
inline void pack_one(const uint16_t* krow, const uint16_t* vrow, int64_t at, uint32_t* kh, uint16_t* vh) {
  const uint32_t* k32 = reinterpret_cast<const uint32_t*>(krow);
  uint32_t* dst = kh + (at / 16) * P * 16 + at % 16;
  for (int p = 0; p < P; ++p) dst[p * 16] = k32[p];
  uint16_t* vd = vh + (at / 2) * D * 2 + at % 2;
  for (int d = 0; d < D; ++d) vd[2 * d] = vrow[d];
}

// One piece of KV head h from key `at` on: 16-key blocks by gathers, value pairs by one interleave each, the
// keys at a piece's edges one at a time.
void pack_piece(const uint16_t* kb, const uint16_t* vb, int64_t n, int64_t ts, int64_t vts, int64_t at,
                uint32_t* kh, uint16_t* vh) {
  const __m512i gidx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(static_cast<int>(ts / 2)));
  int64_t t = 0;
  while (t < n) {
    const int64_t a = at + t;
    if (a % 16 == 0 && t + 16 <= n) {  // a whole key block: 32 gathers of one dim pair of 16 keys
      const int* base = reinterpret_cast<const int*>(kb + t * ts);
      uint32_t* dst = kh + (a / 16) * P * 16;
      for (int p = 0; p < P; ++p) _mm512_storeu_si512(dst + p * 16, _mm512_i32gather_epi32(gidx, base + p, 4));
      for (int64_t u = 0; u < 16; u += 2) {
        const uint16_t* r0 = vb + (t + u) * vts;
        const uint16_t* r1 = r0 + vts;
        uint16_t* vd = vh + ((a + u) / 2) * D * 2;
        __m512i w[4];
        kvlink::value_pairs(r0, r1, w);  // dims 16c..16c + 15 of the two keys, paired
        for (int c = 0; c < 4; ++c) _mm512_storeu_si512(vd + 32 * c, w[c]);
      }
      t += 16;
    } else {
      pack_one(kb + t * ts, vb + t * vts, a, kh, vh);
      t += 1;
    }
  }
}

// Every KV head's keys and values of the pieces, repacked (pieces [kv, t_i, 64] bfloat16, dim stride 1).
Packed pack(const std::vector<torch::Tensor>& ks, const std::vector<torch::Tensor>& vs, int64_t kv) {
  Packed out;
  for (auto& k : ks) out.len += k.size(1);
  out.padded = (out.len + 63) / 64 * 64;
  out.k = scratch<uint32_t, 0>(kv * out.padded * P);
  out.v = scratch<uint32_t, 1>(kv * (out.padded / 2) * D);
  at::parallel_for(0, kv, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      uint32_t* kh = out.k + h * out.padded * P;
      uint16_t* vh = reinterpret_cast<uint16_t*>(out.v + h * (out.padded / 2) * D);
      // the padding reads as zeros: the key blocks and value pairs past the last key
      std::memset(kh + (out.len / 16) * P * 16, 0, (out.padded / 16 - out.len / 16) * P * 16 * sizeof(uint32_t));
      std::memset(vh + (out.len / 2) * D * 2, 0, (out.padded / 2 - out.len / 2) * D * 2 * sizeof(uint16_t));
      int64_t at = 0;
      for (size_t j = 0; j < ks.size(); ++j) {
        const int64_t n = ks[j].size(1);
        pack_piece(reinterpret_cast<const uint16_t*>(ks[j].data_ptr()) + h * ks[j].stride(0),
                   reinterpret_cast<const uint16_t*>(vs[j].data_ptr()) + h * vs[j].stride(0), n, ks[j].stride(1),
                   vs[j].stride(1), at, kh, vh);
        at += n;
      }
    }
  });
  return out;
}

// One task's query rows as the score pass reads them.
template <typename M>
struct RowSet {
  const uint32_t* q32[kTaskRows];  // the row's bfloat16 query as 32 dim pairs
  const M* mask[kTaskRows];        // its additive mask row, or null
  int64_t visible[kTaskRows];      // keys at or past this are masked
  float* s[kTaskRows];             // its scores, scaled and masked (the probabilities go to a buffer of their own)
  float max[kTaskRows][16];        // running maximum per lane
};

// Scores of rows r0..r0+R over keys [0, extent) (a multiple of 64): q.k in float32 from bfloat16 pairs, times the
// scale, plus the mask, masked past `visible`, stored, with each row's running maximum.
template <int R, typename M>
void scores(RowSet<M>& rs, int r0, const uint32_t* kh, int64_t extent, float scale) {
  const __m512 sc = _mm512_set1_ps(scale), masked = _mm512_set1_ps(kMasked);
  for (int64_t j = 0; j < extent; j += 64) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
    const uint32_t* kb = kh + (j / 16) * P * 16;
    for (int p = 0; p < P; ++p) {
      __m512bh kv[4];
      for (int c = 0; c < 4; ++c) kv[c] = (__m512bh)_mm512_loadu_si512(kb + c * P * 16 + p * 16);
      for (int r = 0; r < R; ++r) {
        const __m512bh qb = (__m512bh)_mm512_set1_epi32(static_cast<int>(rs.q32[r0 + r][p]));
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], kv[c], qb);
      }
    }
    for (int r = 0; r < R; ++r) {
      __m512 mx = _mm512_loadu_ps(rs.max[r0 + r]);
      for (int c = 0; c < 4; ++c) {
        const int64_t at = j + 16 * c;
        const __mmask16 in = first(rs.visible[r0 + r] - at);
        __m512 x = _mm512_mul_ps(acc[r][c], sc);
        if (rs.mask[r0 + r] != nullptr) x = _mm512_add_ps(x, mask16(rs.mask[r0 + r] + at, in));
        x = _mm512_mask_blend_ps(in, masked, x);
        _mm512_storeu_ps(rs.s[r0 + r] + at, x);
        mx = _mm512_max_ps(mx, x);
      }
      _mm512_storeu_ps(rs.max[r0 + r], mx);
    }
  }
}

// Row r's softmax in float32 over its scores [0, extent) (a multiple of 32), the probabilities as bfloat16 in
// prob; returns 1 / sum (0 for a row with every key masked: its output is zeros).
inline float softmax_row(const float* s, const float* lane_max, int64_t extent, uint16_t* prob) {
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_loadu_ps(lane_max)));
  const __m512 floor = _mm512_set1_ps(-1e30f);  // at or below: masked (the mask's finfo.min or -inf)
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < extent; j += 32) {
    __m512 e[2];
    for (int c = 0; c < 2; ++c) {
      const __m512 x = _mm512_loadu_ps(s + j + 16 * c);
      e[c] = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, floor, _CMP_GT_OQ), kvlink::exp16(_mm512_sub_ps(x, m)));
      vsum = _mm512_add_ps(vsum, e[c]);
    }
    _mm512_storeu_si512(prob + j, (__m512i)_mm512_cvtne2ps_pbh(e[1], e[0]));
  }
  const float sum = _mm512_reduce_add_ps(vsum);
  return sum > 0.f ? 1.f / sum : 0.f;
}

// Outputs of R rows: sum over key pairs of (p[2jp], p[2jp+1]) . vp[jp], times 1 / sum, rounded to bfloat16.
template <int R>
void values(const uint32_t* const* p32, const float* inv, const uint32_t* vh, int64_t extent, uint16_t* const* out) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t jp = 0; jp < extent / 2; ++jp) {
    __m512bh v[4];
    for (int c = 0; c < 4; ++c) v[c] = (__m512bh)_mm512_loadu_si512(vh + jp * D + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512bh pb = (__m512bh)_mm512_set1_epi32(static_cast<int>(p32[r][jp]));
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pb, v[c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 s = _mm512_set1_ps(inv[r]);
    const __m512 lo = _mm512_mul_ps(acc[r][0], s), a1 = _mm512_mul_ps(acc[r][1], s);
    const __m512 a2 = _mm512_mul_ps(acc[r][2], s), a3 = _mm512_mul_ps(acc[r][3], s);
    _mm512_storeu_si512(out[r], (__m512i)_mm512_cvtne2ps_pbh(a1, lo));
    _mm512_storeu_si512(out[r] + 32, (__m512i)_mm512_cvtne2ps_pbh(a3, a2));
  }
}

template <int R>
struct Rows {  // dispatch a runtime row count 1..R to the templates
  template <typename F>
  static void call(int n, F&& f) {
    if (n == R) f(std::integral_constant<int, R>{});
    else if constexpr (R > 1) Rows<R - 1>::call(n, f);
  }
};

// The rows of one task: head hh's query tokens [t0, t0 + rows), scores, softmax and outputs.
template <typename M>
void task(const torch::Tensor& q, const Packed& kvp, int64_t g, const M* mask, int64_t mstride, bool causal,
          float scale, int64_t hh, int64_t t0, int64_t rows, float* s, uint16_t* prob, uint16_t* ob) {
  const int64_t n = q.size(1), L = kvp.len, h = hh / g;
  const uint32_t* kh = kvp.k + h * kvp.padded * P;
  const uint32_t* vh = kvp.v + h * (kvp.padded / 2) * D;
  const int64_t last = causal ? L - n + t0 + rows : L;  // keys the task's last row sees
  const int64_t kext = (last + 63) / 64 * 64, pext = (last + 31) / 32 * 32;
  const uint16_t* qb = reinterpret_cast<const uint16_t*>(q.data_ptr()) + hh * q.stride(0);
  RowSet<M> rs;
  const uint32_t* p32[kTaskRows];
  uint16_t* orow[kTaskRows];
  float inv[kTaskRows];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = t0 + r;
    rs.q32[r] = reinterpret_cast<const uint32_t*>(qb + t * q.stride(1));
    rs.mask[r] = mask == nullptr ? nullptr : mask + t * mstride;
    rs.visible[r] = causal ? L - n + t + 1 : L;
    rs.s[r] = s + r * kvp.padded;
    std::fill(rs.max[r], rs.max[r] + 16, kMasked);
    p32[r] = reinterpret_cast<const uint32_t*>(prob + r * kvp.padded);
    orow[r] = ob + (hh * n + t) * D;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += 6)
    Rows<6>::call(static_cast<int>(std::min<int64_t>(6, rows - r0)),
                  [&](auto R) { scores<decltype(R)::value, M>(rs, static_cast<int>(r0), kh, kext, scale); });
  for (int64_t r = 0; r < rows; ++r) inv[r] = softmax_row(rs.s[r], rs.max[r], pext, prob + r * kvp.padded);
  for (int64_t r0 = 0; r0 < rows; r0 += 6)
    Rows<6>::call(static_cast<int>(std::min<int64_t>(6, rows - r0)),
                  [&](auto R) { values<decltype(R)::value>(p32 + r0, inv + r0, vh, pext, orow + r0); });
}

template <typename M>
void run(const torch::Tensor& q, const Packed& kvp, int64_t kv, const M* mask, int64_t mstride, bool causal,
         float scale, torch::Tensor& out) {
  const int64_t heads = q.size(0), n = q.size(1), tasks = (n + kTaskRows - 1) / kTaskRows;
  uint16_t* ob = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, heads * tasks, 1, [&](int64_t i0, int64_t i1) {
    float* s = scratch<float, 2>(kTaskRows * kvp.padded);
    uint16_t* prob = scratch<uint16_t, 3>(kTaskRows * kvp.padded);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t hh = i / tasks, t0 = (i % tasks) * kTaskRows;
      task<M>(q, kvp, heads / kv, mask, mstride, causal, scale, hh, t0, std::min(kTaskRows, n - t0), s, prob, ob);
    }
  });
}

}  // namespace

bool prefill_attention_available() { return true; }

// q: [heads, n, 64] bfloat16 (dim stride 1); ks, vs: the pieces [kv_heads, t_i, 64] bfloat16 in storage order
// (dim stride 1); mask: additive [n, sum t_i] bfloat16 or float32 (column stride 1) or none; causal: no mask,
// query t sees keys up to L - n + t. Returns [heads, n, 64] bfloat16.
torch::Tensor prefill_attention(torch::Tensor q, std::vector<torch::Tensor> ks, std::vector<torch::Tensor> vs,
                                std::optional<torch::Tensor> mask, bool causal, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.size(2) == D && q.stride(2) == 1 && q.scalar_type() == torch::kBFloat16,
              "q must be [heads, n, 64] bfloat16");
  TORCH_CHECK(!ks.empty() && ks.size() == vs.size(), "one value piece per key piece");
  const int64_t kv = ks[0].size(0);
  for (size_t j = 0; j < ks.size(); ++j)
    TORCH_CHECK(ks[j].dim() == 3 && ks[j].size(0) == kv && ks[j].size(2) == D && ks[j].stride(2) == 1 &&
                ks[j].scalar_type() == torch::kBFloat16 && vs[j].sizes() == ks[j].sizes() && vs[j].stride(2) == 1 &&
                vs[j].scalar_type() == torch::kBFloat16, "pieces must be [kv_heads, tokens, 64] bfloat16");
  TORCH_CHECK(q.size(0) % kv == 0, "query heads must be a multiple of KV heads");
  for (auto& k : ks) TORCH_CHECK(k.stride(1) % 2 == 0, "key rows must start on 32-bit boundaries");
  const Packed kvp = pack(ks, vs, kv);
  TORCH_CHECK(!causal || kvp.len >= q.size(1), "causal rows need at least their own keys");
  auto out = torch::empty({q.size(0), q.size(1), D}, q.options());
  if (mask.has_value() && !causal) {
    const auto& m = *mask;
    TORCH_CHECK(m.dim() == 2 && m.size(0) == q.size(1) && m.size(1) == kvp.len && m.stride(1) == 1 &&
                (m.scalar_type() == torch::kBFloat16 || m.scalar_type() == torch::kFloat32), "mask must be [n, keys] bfloat16 or float32");
    if (m.scalar_type() == torch::kFloat32) run<float>(q, kvp, kv, m.data_ptr<float>(), m.stride(0), false, scale, out);
    else run<uint16_t>(q, kvp, kv, reinterpret_cast<const uint16_t*>(m.data_ptr()), m.stride(0), false, scale, out);
  } else {
    run<float>(q, kvp, kv, nullptr, 0, causal, scale, out);
  }
  return out;
}

#else

bool prefill_attention_available() { return false; }

torch::Tensor prefill_attention(torch::Tensor q, std::vector<torch::Tensor>, std::vector<torch::Tensor>,
                                std::optional<torch::Tensor>, bool, double) {
  TORCH_CHECK(false, "prefill_attention needs AVX512-BF16 (not compiled in)");
  return q;
}

#endif
