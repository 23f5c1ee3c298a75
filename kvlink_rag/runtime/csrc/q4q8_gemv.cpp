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

// y[16] of one tile for one activation row.
inline void tile_row(const uint8_t* tile, int64_t blocks, const int8_t* qx, const float* dx, const float* sx,
                     float* y) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* t = tile + b * kTileBytes;
    const int32_t* xq = reinterpret_cast<const int32_t*>(qx + b * kBlock);
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {
      const __m512i w = _mm512_loadu_si512(t + 64 * p);
      s0 = _mm512_dpbusd_epi32(s0, _mm512_and_si512(w, low), _mm512_set1_epi32(xq[2 * p]));
      s1 = _mm512_dpbusd_epi32(s1, _mm512_and_si512(_mm512_srli_epi16(w, 4), low), _mm512_set1_epi32(xq[2 * p + 1]));
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 256)));
    const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 288)));
    const __m512 isum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
    acc0 = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx[b])), isum, acc0);
    acc1 = _mm512_fmadd_ps(mn, _mm512_set1_ps(sx[b]), acc1);
  }
  _mm512_storeu_ps(y, _mm512_add_ps(acc0, acc1));
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

}  // namespace

// x: [m, k] float32; packed: [n / 16, k / 32, 320] uint8. Returns [m, n] float32.
torch::Tensor q4q8_mm(torch::Tensor x, torch::Tensor packed) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x must be [m, k] float32");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kUInt8 && packed.size(2) == kTileBytes,
              "packed must be [n / 16, k / 32, 320] uint8");
  x = x.contiguous();
  const int64_t m = x.size(0), k = x.size(1), tiles = packed.size(0), blocks = packed.size(1);
  TORCH_CHECK(k == blocks * kBlock, "x has ", k, " columns, the weight ", blocks * kBlock);
  const int64_t n = tiles * kRows;
  auto y = torch::empty({m, n}, x.options());
  std::vector<int8_t> qx(m * k);
  std::vector<float> dx(m * blocks), sx(m * blocks);
  quantize_rows(x.data_ptr<float>(), m, k, qx.data(), dx.data(), sx.data());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  float* out = y.data_ptr<float>();
  at::parallel_for(0, tiles, 16, [&](int64_t t0, int64_t t1) {
    float tmp[kRows];
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t r = 0; r < m; ++r) {
        tile_row(w + t * blocks * kTileBytes, blocks, qx.data() + r * k, dx.data() + r * blocks,
                 sx.data() + r * blocks, tmp);
        std::memcpy(out + r * n + t * kRows, tmp, sizeof(tmp));
      }
  });
  return y;
}

// x: [m, k] float32; packed: [n / 16, k / 32, 576] uint8 (see tile_row_q8). Returns [m, n] float32 before the
// per-row weight scales.
torch::Tensor q8q8_mm(torch::Tensor x, torch::Tensor packed) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "x must be [m, k] float32");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kUInt8 && packed.size(2) == kTileBytesQ8,
              "packed must be [n / 16, k / 32, 576] uint8");
  x = x.contiguous();
  const int64_t m = x.size(0), k = x.size(1), tiles = packed.size(0), blocks = packed.size(1);
  TORCH_CHECK(k == blocks * kBlock, "x has ", k, " columns, the weight ", blocks * kBlock);
  const int64_t n = tiles * kRows;
  auto y = torch::empty({m, n}, x.options());
  std::vector<int8_t> qx(m * k);
  std::vector<float> dx(m * blocks), sx(m * blocks);
  quantize_rows(x.data_ptr<float>(), m, k, qx.data(), dx.data(), sx.data());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  float* out = y.data_ptr<float>();
  at::parallel_for(0, tiles, 64, [&](int64_t t0, int64_t t1) {
    float tmp[kRows];
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t r = 0; r < m; ++r) {
        tile_row_q8(w + t * blocks * kTileBytesQ8, blocks, qx.data() + r * k, dx.data() + r * blocks, tmp);
        std::memcpy(out + r * n + t * kRows, tmp, sizeof(tmp));
      }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4q8_mm", &q4q8_mm, "Q4 (16-row tiles) x Q8 (per 32) matrix product, float32 out");
  m.def("q8q8_mm", &q8q8_mm, "Q8 (16-row tiles, per-row scale left to the caller) x Q8 (per 32) product");
}
