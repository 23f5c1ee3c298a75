// The runner's CPU kernels: Q4 x Q8 and Q8 x Q8 products for decode rows (llama.cpp's Q4_1 x Q8_1 dot),
// one-token GQA attention over KV pieces and RMSNorm. The vector code is per instruction set, chosen at
// compile time by the flags cpu_kernels.py passes: isa_avx512.h (AVX512-VNNI) or isa_avx2.h (AVX2 + FMA).
//
// Weights: 4-bit, asymmetric per block of 32 inputs (w = d * q + m, q in 0..15; GGUF Q4_1's grid), packed in
// tiles of 16 output rows so that each 32-bit lane of a vector holds one row: per (tile, block) 320 bytes:
//   256 bytes of nibbles: 4 vectors of 64 bytes; vector p, lane j, byte i: low nibble q[j, 8p + i],
//       high nibble q[j, 8p + 4 + i] (inputs of the block numbered 0..31);
//   16 float16 scales d, then 16 float16 mins m.
// Activations: each row of x quantised to int8 per block of 32 (x ~ dx * qx, dx = max|x| / 127), so
//   sum_k w_k x_k = sum_b d_b dx_b (q . qx)_b + m_b dx_b (sum qx)_b, the integer dots by vpdpbusd (u8 x s8).
#include "kernels.h"
#include <ATen/Parallel.h>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

#include "pieces.h"

namespace {

using namespace kvlink;

void quantize_rows(const float* x, int64_t m, int64_t k, int8_t* qx, float* dx, float* sx) {
  // each row of int8 per block of 32: d = max|x| / 127, q = nearbyint(x / d) as x * (1 / d), sx = d * sum q;
  // vectorised per block (quantize_block, bit for bit the scalar formula), rows split over threads
  const int64_t blocks = k / kBlock;
  at::parallel_for(0, m, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        int sum = 0;
        const float d = quantize_block(x + r * k + b * kBlock, qx + r * k + b * kBlock, &sum);
        dx[r * blocks + b] = d;
        sx[r * blocks + b] = d * static_cast<float>(sum);
      }
  });
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

// q: [heads, 64] float32 (one token); ks, vs: pieces [kv_heads, tokens_i, 64], all bfloat16 or all float32
// (any head/token strides, unit stride inside a token). Returns [heads, 64] float32: softmax(q K^T * scale) V
// per query head, head h on KV head h / (heads / kv_heads).
torch::Tensor decode_attention(torch::Tensor q, std::vector<torch::Tensor> ks, std::vector<torch::Tensor> vs,
                               double scale) {
  TORCH_CHECK(q.dim() == 2 && q.size(1) == 64 && q.scalar_type() == torch::kFloat32, "q must be [heads, 64] float32");
  TORCH_CHECK(!ks.empty() && ks.size() == vs.size(), "one value piece per key piece");
  q = q.contiguous();
  const int64_t heads = q.size(0), kv = ks[0].size(0), g = heads / kv;
  const auto dtype = ks[0].scalar_type();
  TORCH_CHECK(dtype == torch::kBFloat16 || dtype == torch::kFloat32, "pieces must be bfloat16 or float32");
  TORCH_CHECK(heads % kv == 0, "query heads must be a multiple of KV heads");
  Pieces pieces;
  for (size_t p = 0; p < ks.size(); ++p) {
    for (const auto& t : {ks[p], vs[p]})
      TORCH_CHECK(t.dim() == 3 && t.size(0) == kv && t.size(2) == 64 && t.stride(2) == 1 && t.scalar_type() == dtype,
                  "pieces must be [kv_heads, tokens, 64] of one dtype");
    TORCH_CHECK(ks[p].size(1) == vs[p].size(1) && ks[p].strides() == vs[p].strides(), "keys and values differ in shape");
    pieces.add(ks[p].data_ptr(), vs[p].data_ptr(), ks[p].size(1), ks[p].stride(1), ks[p].stride(0));
  }
  TORCH_CHECK(pieces.total > 0, "no keys to attend to");
  auto out = torch::empty({heads, 64}, q.options());
  auto run = [&](auto tag) {
    at::parallel_for(0, kv, 1, [&](int64_t h0, int64_t h1) {
      for (int64_t h = h0; h < h1; ++h)
        pieces.attend<decltype(tag)>(h, q.data_ptr<float>() + h * g * 64, g, static_cast<float>(scale),
                                     out.data_ptr<float>() + h * g * 64);
    });
  };
  if (dtype == torch::kBFloat16) run(uint16_t{});
  else run(float{});
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
  m.def("decode_attention", &decode_attention, "one-token GQA attention over bfloat16 or float32 KV pieces, head_dim 64");
  m.def("rms_norm", &rms_norm, "RMSNorm of float32 rows");
  m.def("decode_pre", &decode_pre, "a decoder layer up to attention for decode rows (decode_layer.cpp)");
  m.def("lowrank_add", &lowrank_add, "y[:, start:start + span] += (x A^T) B_t in place, per row (decode_layer.cpp)");
  m.def("decode_post", &decode_post, "a decoder layer after attention for decode rows (decode_layer.cpp)");
  m.def("decode_rows", &decode_rows, "decode rows' K/V writes and attention of one layer in one call (decode_rows.cpp)");
  m.def("isa", [] { return std::string(kIsa); }, "the instruction set the kernels were compiled for");
  m.def("kv_rows_into", &kv_rows_into, "a stored document's layer tensor into an [H, n, D] view of KV blocks, keys rotated on the way (kv_rows.cpp)");
  m.def("kv_rows_many", &kv_rows_many, "several documents' layer tensors into rows of one [H, N, D] view of KV blocks in one call (kv_rows.cpp)",
        py::arg("out"), py::arg("srcs"), py::arg("token_major"), py::arg("starts"), py::arg("cos"), py::arg("sin"),
        py::arg("widen") = std::vector<bool>());
  m.def("prefill_attention", &prefill_attention, "prefill rows' GQA attention over bfloat16 KV pieces, float32 scores by AVX512-BF16 (prefill_attention.cpp)");
  m.def("prefill_attention_available", &prefill_attention_available, "whether prefill_attention was compiled in (AVX512-BF16)");
  m.def("train_softmax_available", &train_softmax_available, "whether the bfloat16 softmax kernels were compiled in (AVX512-BF16)");
  m.def("masked_softmax_bf16_", &masked_softmax_bf16_, "rows of bfloat16 scores + a float32 mask -> softmax, in place (train_softmax.cpp)");
  m.def("softmax_backward_bf16_", &softmax_backward_bf16_, "softmax backward over bfloat16 rows, in place on the gradient (train_softmax.cpp)");
  m.def("train_elementwise_available", &train_elementwise_available, "whether the training step's elementwise kernels were compiled in (AVX512-BF16)");
  m.def("silu_mul_bf16", &silu_mul_bf16, "silu(gate) * up from bfloat16 gate|up rows, float32 out (train_elementwise.cpp)");
  m.def("silu_mul_backward_bf16", &silu_mul_backward_bf16, "silu_mul's backward: float32 grad -> bfloat16 [T, 2I] (train_elementwise.cpp)");
  m.def("rms_norm_train", &rms_norm_train, "RMSNorm of float32 rows, and each row's 1 / rms (train_elementwise.cpp)");
  m.def("rms_norm_train_backward", &rms_norm_train_backward, "RMSNorm's backward to x, frozen weight (train_elementwise.cpp)");
  m.def("q8q8_mm", &q8q8_mm, "Q8 (16-row tiles, per-row scale left to the caller) x Q8 (per 32) product");
}
