// A decoder layer's two halves for decode rows (one token each, float32 residual stream, Q4 x Q8 weights),
// each one call instead of ~20 torch operations from Python: what a decode step of a small model spends
// besides reading weights is the fixed cost per operation (BENCHMARKS.md, issue 24). The arithmetic is the
// runner's own (model_runner.py `_layer`), in the same order and dtype:
//   pre:  x = RMSNorm(h); qkv = x W_qkv^T (+ b) (+ LoRA); q|k = q|k * cos + rotate_half(q|k) * sin
//   post: h += attn W_o^T (+ b) (+ LoRA); x = RMSNorm(h); gu = x W_gu^T (...); h += (silu(g) * u) W_d^T (...)
// LoRA terms: y[:, start : start + span] += (x A^T) B_t with A [rank, in], B_t [rank, span] (scale folded in), by
// lowrank_add below, which the general path's decode rows call too (lora.py `FusedLowRank.add_to`).
// Same order means bit for bit: each Q4 x Q8 product quantises its input to int8 per block of 32, so a one-ulp
// difference upstream can move a value across a rounding midpoint (x / dx = -59.5000038 against -59.4999886)
// and the output by a whole quantisation step, 1e-4 there and 0.0078 in a logit three layers later. Hence one
// implementation of the LoRA terms for both paths (they were torch GEMMs on the general path: another summation
// order, which one depending on the thread count), and the extension built with -ffp-contract=off
// (cpu_kernels.py), so the scalar code here rounds each multiply and add as torch's elementwise operations do
// (RoPE's x * cos + x' * sin compiled to one FMA with -mfma).
#include "kernels.h"
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <algorithm>
#include <cstring>
#include <vector>

namespace {

// A weight as float32: bfloat16 bits widened exactly (the same value a float32 copy of it holds).
inline float wide(float w) { return w; }
inline float wide(uint16_t w) { return c10::BFloat16(w, c10::BFloat16::from_bits()); }

template <typename W>
float dot(const float* a, const W* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * wide(b[i + l]);  // 16 lanes: the compiler's vector multiply-adds
  float s = 0.f;
  for (int l = 0; l < 16; ++l) s += acc[l];
  for (; i < n; ++i) s += a[i] * wide(b[i]);
  return s;
}

}  // namespace

namespace {

// yr[c] += sum over j of hr[j] * B_t[j][c] for columns c0..c1, j in order (B_t [r, span]).
template <typename W>
inline void add_terms(float* yr, const float* hr, const W* bs, int64_t r, int64_t span, int64_t c0, int64_t c1) {
  for (int64_t j = 0; j < r; ++j)
    for (int64_t c = c0; c < c1; ++c) yr[c] += hr[j] * wide(bs[j * span + c]);
}

// lowrank_add's loops over weights of type W (float32, or bfloat16 bits widened as they are read).
template <typename W>
void lowrank_rows(float* ys, int64_t ystride, const float* xs, const W* as, const W* bs, int64_t t, int64_t in,
                  int64_t r, int64_t span, int64_t start) {
  // Each value is computed by one thread in the serial order, so the result does not depend on the thread count.
  // With at least two rows a thread, rows split alone (one pass, each row whole on one thread: fewer regions).
  // Fewer rows: two passes, each split over the caller's threads: h = x A^T per (row, rank), then y += h B_t per
  // (row, chunk of columns). A one-row step reads all of A and B_t (the shipped adapter: ~1 MB of float32 a
  // layer, ~29 MB a token), which one thread streamed at ~3 ms a token while the other core waited.
  if (t >= 2 * at::get_num_threads()) {
    at::parallel_for(0, t, 1, [&](int64_t r0, int64_t r1) {
      std::vector<float> hr(r);
      for (int64_t row = r0; row < r1; ++row) {
        for (int64_t j = 0; j < r; ++j) hr[j] = dot(xs + row * in, as + j * in, in);
        add_terms(ys + row * ystride + start, hr.data(), bs, r, span, 0, span);
      }
    });
    return;
  }
  constexpr int64_t kCols = 64;
  std::vector<float> h(t * r);
  at::parallel_for(0, t * r, 8, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) h[i] = dot(xs + (i / r) * in, as + (i % r) * in, in);
  });
  const int64_t chunks = (span + kCols - 1) / kCols;
  at::parallel_for(0, t * chunks, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t row = i / chunks, c0 = (i % chunks) * kCols;
      add_terms(ys + row * ystride + start, h.data() + row * r, bs, r, span, c0, std::min(span, c0 + kCols));
    }
  });
}

}  // namespace

// y[:, start : start + span] += (x A^T) B_t in place, each value in the same order on any thread count: y [T, *]
// float32 (unit column stride), x [T, in] float32, A [rank, in], B_t [rank, span] contiguous, both float32 or
// both bfloat16 (widened exactly as read: the same sums as float32 copies of those values, from half the bytes).
// A decode step's LoRA terms are a few thousand multiply-adds a row; as two torch GEMMs each they cost ~15 us of
// dispatch apiece, 240 of them a step (~4 ms at one row, BENCHMARKS.md).
void lowrank_add(torch::Tensor y, torch::Tensor x, torch::Tensor a, torch::Tensor bt, int64_t start) {
  const auto wt = a.scalar_type();
  TORCH_CHECK((wt == torch::kFloat32 || wt == torch::kBFloat16) && bt.scalar_type() == wt && a.is_contiguous() &&
              bt.is_contiguous() && a.dim() == 2 && bt.dim() == 2 && a.size(1) == x.size(1) && bt.size(0) == a.size(0) &&
              start >= 0 && start + bt.size(1) <= y.size(1),
              "LoRA terms must be float32 or bfloat16 A [rank, in] and B_t [rank, span] inside y");
  TORCH_CHECK(x.dim() == 2 && y.dim() == 2 && x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32 &&
              x.is_contiguous() && y.stride(1) == 1 && x.size(0) == y.size(0), "x [T, in] and y [T, *] must be float32 rows");
  const int64_t t = x.size(0), in = x.size(1), r = a.size(0), span = bt.size(1);
  if (wt == torch::kFloat32)
    lowrank_rows<float>(y.data_ptr<float>(), y.stride(0), x.data_ptr<float>(), a.data_ptr<float>(), bt.data_ptr<float>(),
                        t, in, r, span, start);
  else
    lowrank_rows<uint16_t>(y.data_ptr<float>(), y.stride(0), x.data_ptr<float>(),
                           reinterpret_cast<const uint16_t*>(a.data_ptr()), reinterpret_cast<const uint16_t*>(bt.data_ptr()),
                           t, in, r, span, start);
}

namespace {

torch::Tensor project(const torch::Tensor& x, const torch::Tensor& packed, const std::optional<torch::Tensor>& bias,
                      const std::optional<torch::Tensor>& a, const std::optional<torch::Tensor>& bt, int64_t start) {
  torch::Tensor y = q4q8_mm(x, packed);
  if (bias) y.add_(*bias);
  if (a) lowrank_add(y, x.contiguous(), *a, *bt, start);
  return y;
}

// In place on cols [0, rope_cols) of qkv [T, *] (heads of 64 side by side): x * cos + roll(x, 32) * sin, with
// rotate_half's sign folded into sin ([T, 64] each).
void rope_inplace(torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin, int64_t rope_cols) {
  constexpr int D = 64, H = 32;
  const int64_t t = qkv.size(0), stride = qkv.stride(0);
  float* y = qkv.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  for (int64_t r = 0; r < t; ++r)
    for (int64_t h0 = 0; h0 < rope_cols; h0 += D) {
      float* x = y + r * stride + h0;
      float tmp[D];
      for (int j = 0; j < D; ++j) tmp[j] = x[j] * c[r * D + j] + x[(j + H) % D] * s[r * D + j];
      std::memcpy(x, tmp, sizeof(tmp));
    }
}

}  // namespace

// h: [T, hidden] float32; qkv: packed Q4 x Q8 weight; cos, sin: [T, 64] float32; rope_cols: (heads + kv_heads)
// * 64. Returns qkv [T, (heads + 2 kv_heads) * 64] float32 with RoPE applied to q and k.
torch::Tensor decode_pre(torch::Tensor h, torch::Tensor norm, double eps, torch::Tensor qkv,
                         std::optional<torch::Tensor> bias, std::optional<torch::Tensor> lora_a,
                         std::optional<torch::Tensor> lora_bt, int64_t lora_start, torch::Tensor cos,
                         torch::Tensor sin, int64_t rope_cols) {
  TORCH_CHECK(cos.scalar_type() == torch::kFloat32 && cos.size(1) == 64 && sin.sizes() == cos.sizes() &&
              cos.size(0) == h.size(0), "cos and sin must be [T, 64] float32");
  const torch::Tensor x = rms_norm(h, norm, eps);
  torch::Tensor y = project(x, qkv, bias, lora_a, lora_bt, lora_start);
  TORCH_CHECK(rope_cols % 64 == 0 && rope_cols <= y.size(1), "rope_cols must be whole heads of the projection");
  rope_inplace(y, cos.contiguous(), sin.contiguous(), rope_cols);
  return y;
}

// h: [T, hidden] and attn: [T, heads * 64] float32; packed, biases, LoRA: of o, gate|up, down in that order.
// Returns the layer's output h' [T, hidden] float32.
torch::Tensor decode_post(torch::Tensor h, torch::Tensor attn, std::vector<torch::Tensor> packed,
                          std::vector<std::optional<torch::Tensor>> biases, std::vector<std::optional<torch::Tensor>> lora_a,
                          std::vector<std::optional<torch::Tensor>> lora_bt, std::vector<int64_t> lora_start,
                          torch::Tensor norm, double eps, int64_t intermediate) {
  TORCH_CHECK(packed.size() == 3 && biases.size() == 3 && lora_a.size() == 3 && lora_bt.size() == 3 &&
              lora_start.size() == 3, "three projections: o, gate|up, down");
  torch::Tensor r = h + project(attn, packed[0], biases[0], lora_a[0], lora_bt[0], lora_start[0]);
  const torch::Tensor x = rms_norm(r, norm, eps);
  const torch::Tensor gu = project(x, packed[1], biases[1], lora_a[1], lora_bt[1], lora_start[1]);
  const torch::Tensor a = at::silu(gu.narrow(1, 0, intermediate)) * gu.narrow(1, intermediate, intermediate);
  return r + project(a, packed[2], biases[2], lora_a[2], lora_bt[2], lora_start[2]);
}
