// Q4 x Q8 matrix-vector products for decode rows (llama.cpp's Q4_1 x Q8_1 dot, AVX512-VNNI).
//
// Weights: 4-bit, asymmetric per block of 32 inputs (w = d * q + m, q in 0..15; GGUF Q4_1's grid), packed in
// tiles of 16 output rows so that each 32-bit lane of a vector holds one row: per (tile, block) 320 bytes:
//   256 bytes of nibbles: 4 vectors of 64 bytes; vector p, lane j, byte i: low nibble q[j, 8p + i],
//       high nibble q[j, 8p + 4 + i] (inputs of the block numbered 0..31);
//   16 float16 scales d, then 16 float16 mins m.
// Activations: each row of x quantised to int8 per block of 32 (x ~ dx * qx, dx = max|x| / 127), so
//   sum_k w_k x_k = sum_b d_b dx_b (q . qx)_b + m_b dx_b (sum qx)_b, the integer dots by vpdpbusd (u8 x s8).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kBlock = 32, kRows = 16, kTileBytes = 320, kTileBytesQ8 = 576;

void quantize_rows(const float* x, int64_t m, int64_t k, int8_t* qx, float* dx, float* sx) {
  const int64_t blocks = k / kBlock;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* src = x + r * k + b * kBlock;
      float amax = 0.f;
      for (int i = 0; i < kBlock; ++i) amax = std::fmax(amax, std::fabs(src[i]));
      const float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
      int sum = 0;
      int8_t* dst = qx + r * k + b * kBlock;
      for (int i = 0; i < kBlock; ++i) {
        const int q = static_cast<int>(std::nearbyint(src[i] * inv));
        dst[i] = static_cast<int8_t>(q);
        sum += q;
      }
      dx[r * blocks + b] = d;
      sx[r * blocks + b] = d * static_cast<float>(sum);
    }
  }
}

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


// bfloat16 -> float32 of 16 values (a bfloat16 is the high half of a float32).
inline __m512 bf16x16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}


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

// One KV head's group of `g` one-token queries over its keys and values in pieces (bfloat16, head_dim 64):
// scores q.k * scale for every key, softmax in float32, then the weighted sum of the values.
void attend_group(const float* q, int64_t g, const std::vector<const uint16_t*>& ks,
                  const std::vector<const uint16_t*>& vs, const std::vector<int64_t>& lens,
                  const std::vector<int64_t>& tstrides, float scale, int64_t total, float* out) {
  constexpr int D = 64;
  std::vector<float> s(g * total);
  int64_t at = 0;
  for (size_t p = 0; p < ks.size(); ++p)  // each key converted once for the whole group
    for (int64_t t = 0; t < lens[p]; ++t, ++at) {
      const uint16_t* k = ks[p] + t * tstrides[p];
      const __m512 k0 = bf16x16(k), k1 = bf16x16(k + 16), k2 = bf16x16(k + 32), k3 = bf16x16(k + 48);
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
        const uint16_t* v = vs[p] + t * tstrides[p];
        const __m512 v0 = bf16x16(v), v1 = bf16x16(v + 16), v2 = bf16x16(v + 32), v3 = bf16x16(v + 48);
        for (int64_t j = 0; j < gn; ++j) {
          const __m512 w = _mm512_set1_ps(s[(j0 + j) * total + at2]);
          o[j][0] = _mm512_fmadd_ps(w, v0, o[j][0]);
          o[j][1] = _mm512_fmadd_ps(w, v1, o[j][1]);
          o[j][2] = _mm512_fmadd_ps(w, v2, o[j][2]);
          o[j][3] = _mm512_fmadd_ps(w, v3, o[j][3]);
        }
      }
    for (int64_t j = 0; j < gn; ++j)
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(out + (j0 + j) * D + 16 * c, o[j][c]);
  }
}

}  // namespace

// The activation rows quantised for a packed weight of `tile_bytes` per (tile, block), and the output.
struct Prepared {
  torch::Tensor y;
  int64_t m, k, n, tiles, blocks;
  std::vector<int8_t> qx;
  std::vector<float> dx, sx;
};

Prepared prepare(torch::Tensor x, const torch::Tensor& packed, int64_t tile_bytes) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x must be [m, k] float32");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kUInt8 && packed.size(2) == tile_bytes,
              "packed must be [n / 16, k / 32, ", tile_bytes, "] uint8");
  x = x.contiguous();
  Prepared p;
  p.m = x.size(0), p.k = x.size(1), p.tiles = packed.size(0), p.blocks = packed.size(1), p.n = p.tiles * kRows;
  TORCH_CHECK(p.k == p.blocks * kBlock, "x has ", p.k, " columns, the weight ", p.blocks * kBlock);
  p.y = torch::empty({p.m, p.n}, x.options());
  p.qx.resize(p.m * p.k), p.dx.resize(p.m * p.blocks), p.sx.resize(p.m * p.blocks);
  quantize_rows(x.data_ptr<float>(), p.m, p.k, p.qx.data(), p.dx.data(), p.sx.data());
  return p;
}

// x: [m, k] float32; packed: [n / 16, k / 32, 320] uint8. Returns [m, n] float32.
torch::Tensor q4q8_mm(torch::Tensor x, torch::Tensor packed) {
  Prepared p = prepare(x, packed, kTileBytes);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  float* out = p.y.data_ptr<float>();
  const int64_t m = p.m, k = p.k, n = p.n, blocks = p.blocks;
  at::parallel_for(0, p.tiles, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* tile = w + t * blocks * kTileBytes;
      int64_t r = 0;
      for (; r + 4 <= m; r += 4) {  // four rows share each unpacked weight vector
        float* y[4] = {out + r * n + t * kRows, out + (r + 1) * n + t * kRows, out + (r + 2) * n + t * kRows,
                       out + (r + 3) * n + t * kRows};
        tile_rows<4>(tile, blocks, k, p.qx.data() + r * k, p.dx.data() + r * blocks, p.sx.data() + r * blocks, y);
      }
      for (; r < m; ++r) {
        float* y[1] = {out + r * n + t * kRows};
        tile_rows<1>(tile, blocks, k, p.qx.data() + r * k, p.dx.data() + r * blocks, p.sx.data() + r * blocks, y);
      }
    }
  });
  return p.y;
}

// x: [m, k] float32; packed: [n / 16, k / 32, 576] uint8 (see tile_row_q8). Returns [m, n] float32 before the
// per-row weight scales.
torch::Tensor q8q8_mm(torch::Tensor x, torch::Tensor packed) {
  Prepared p = prepare(x, packed, kTileBytesQ8);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  float* out = p.y.data_ptr<float>();
  at::parallel_for(0, p.tiles, 64, [&](int64_t t0, int64_t t1) {
    float tmp[kRows];
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t r = 0; r < p.m; ++r) {
        tile_row_q8(w + t * p.blocks * kTileBytesQ8, p.blocks, p.qx.data() + r * p.k, p.dx.data() + r * p.blocks, tmp);
        std::memcpy(out + r * p.n + t * kRows, tmp, sizeof(tmp));
      }
  });
  return p.y;
}

// q: [heads, 64] float32 (one token); ks, vs: pieces [kv_heads, tokens_i, 64] bfloat16 (any head/token strides,
// unit stride inside a token). Returns [heads, 64] float32: softmax(q K^T * scale) V per query head, head h on
// KV head h / (heads / kv_heads).
torch::Tensor decode_attention(torch::Tensor q, std::vector<torch::Tensor> ks, std::vector<torch::Tensor> vs,
                               double scale) {
  TORCH_CHECK(q.dim() == 2 && q.size(1) == 64 && q.scalar_type() == torch::kFloat32, "q must be [heads, 64] float32");
  TORCH_CHECK(!ks.empty() && ks.size() == vs.size(), "one value piece per key piece");
  q = q.contiguous();
  const int64_t heads = q.size(0), kv = ks[0].size(0), g = heads / kv;
  TORCH_CHECK(heads % kv == 0, "query heads must be a multiple of KV heads");
  std::vector<int64_t> lens, tstrides, hstrides;
  int64_t total = 0;
  for (size_t p = 0; p < ks.size(); ++p) {
    for (const auto& t : {ks[p], vs[p]})
      TORCH_CHECK(t.dim() == 3 && t.size(0) == kv && t.size(2) == 64 && t.stride(2) == 1 &&
                  t.scalar_type() == torch::kBFloat16, "pieces must be [kv_heads, tokens, 64] bfloat16");
    TORCH_CHECK(ks[p].size(1) == vs[p].size(1) && ks[p].strides() == vs[p].strides(), "keys and values differ in shape");
    lens.push_back(ks[p].size(1));
    tstrides.push_back(ks[p].stride(1));
    hstrides.push_back(ks[p].stride(0));
    total += ks[p].size(1);
  }
  TORCH_CHECK(total > 0, "no keys to attend to");
  auto out = torch::empty({heads, 64}, q.options());
  at::parallel_for(0, kv, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      std::vector<const uint16_t*> kp, vp;
      for (size_t p = 0; p < ks.size(); ++p) {
        kp.push_back(reinterpret_cast<const uint16_t*>(ks[p].data_ptr<at::BFloat16>()) + h * hstrides[p]);
        vp.push_back(reinterpret_cast<const uint16_t*>(vs[p].data_ptr<at::BFloat16>()) + h * hstrides[p]);
      }
      attend_group(q.data_ptr<float>() + h * g * 64, g, kp, vp, lens, tstrides, static_cast<float>(scale), total,
                   out.data_ptr<float>() + h * g * 64);
    }
  });
  return out;
}

// x: [t, n] float32, w: [n] float32 -> x * rsqrt(mean(x^2) + eps) * w (RMSNorm as Llama computes it in float32).
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && w.scalar_type() == torch::kFloat32 &&
              w.numel() == x.size(1), "x must be [t, n] float32 and w [n] float32");
  x = x.contiguous();
  const int64_t t = x.size(0), n = x.size(1);
  auto y = torch::empty_like(x);
  const float* src = x.data_ptr<float>();
  const float* wt = w.contiguous().data_ptr<float>();
  float* dst = y.data_ptr<float>();
  at::parallel_for(0, t, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* a = src + r * n;
      double ss = 0.0;
      for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(a[i]) * a[i];
      const float inv = 1.f / std::sqrt(static_cast<float>(ss / n) + static_cast<float>(eps));
      for (int64_t i = 0; i < n; ++i) dst[r * n + i] = wt[i] * (a[i] * inv);
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4q8_mm", &q4q8_mm, "Q4 (16-row tiles) x Q8 (per 32) matrix product, float32 out");
  m.def("decode_attention", &decode_attention, "one-token GQA attention over bfloat16 KV pieces, head_dim 64");
  m.def("rms_norm", &rms_norm, "RMSNorm of float32 rows");
  m.def("q8q8_mm", &q8q8_mm, "Q8 (16-row tiles, per-row scale left to the caller) x Q8 (per 32) product");
}
