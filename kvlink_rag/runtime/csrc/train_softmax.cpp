// Softmax over bfloat16 attention scores with an additive float32 mask, forward and backward, in place: the
// elementwise part of training's link-and-question attention (training/cached_attention.py).
//
// There the scores of ~75 new tokens per example against ~1,500 cached ones are bfloat16 GEMM outputs; in torch
// ops the softmax and its backward were cast to float32, masked, normalised and cast back in separate passes over
// ~4M scores a layer, and those passes (casts, the softmax backward and a concatenation) took over half of a
// packed bfloat16 step (docs/bench/train-forward-2026-12-06). Here each row is read once and written once per
// direction, its arithmetic in float32 (the maximum exact, exp by kvlink::exp16, Cephes' expf):
//   forward   p = softmax(s + mask) per row, bfloat16 out (round to nearest even), masked keys (<= -1e30) 0;
//   backward  gs = p * (gp - sum_j gp_j p_j) per row (the softmax's Jacobian-vector product), bfloat16 out.
// Rows are [R, L] contiguous; row r = ((b * H + h) * Q + t) takes mask row (b or 0) * Q + t of [B or 1, Q, L].
#include "kernels.h"
#include <ATen/Parallel.h>
#include <cmath>
#include <cstdint>

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include "bf16.h"
#include "isa.h"
#include "scratch.h"

namespace {

using kvlink::first;
using kvlink::mask16;
using kvlink::store_bf16;

void softmax_row(uint16_t* s, const float* mask, int64_t n) {
  float* x = kvlink::scratch<float, 4>(n);
  const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
  __m512 vmax = minus_inf;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = first(n - j);
    const __m512 v = _mm512_add_ps(mask16(s + j, m), mask16(mask + j, m));
    _mm512_mask_storeu_ps(x + j, m, v);
    vmax = _mm512_mask_max_ps(vmax, m, vmax, v);
  }
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  const __m512 floor = _mm512_set1_ps(-1e30f);  // at or below: a masked key (finfo.min or -inf added)
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = first(n - j);
    const __m512 v = mask16(x + j, m);
    const __mmask16 keep = _mm512_mask_cmp_ps_mask(m, v, floor, _CMP_GT_OQ);
    const __m512 e = _mm512_maskz_mov_ps(keep, kvlink::exp16(_mm512_sub_ps(v, mx)));
    _mm512_mask_storeu_ps(x + j, m, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  const float sum = _mm512_reduce_add_ps(vsum);
  const __m512 inv = _mm512_set1_ps(sum > 0.f ? 1.f / sum : 0.f);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = first(n - j);
    store_bf16(s + j, _mm512_mul_ps(mask16(x + j, m), inv), m);
  }
}

void softmax_backward_row(uint16_t* g, const uint16_t* p, int64_t n) {
  __m512 vdot = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = first(n - j);
    vdot = _mm512_fmadd_ps(mask16(g + j, m), mask16(p + j, m), vdot);
  }
  const __m512 dot = _mm512_set1_ps(_mm512_reduce_add_ps(vdot));
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = first(n - j);
    store_bf16(g + j, _mm512_mul_ps(mask16(p + j, m), _mm512_sub_ps(mask16(g + j, m), dot)), m);
  }
}

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == torch::kBFloat16 && t.is_contiguous() && t.dim() >= 2,
              name, " must be contiguous bfloat16 rows [..., L]");
}

}  // namespace

bool train_softmax_available() { return true; }

void masked_softmax_bf16_(torch::Tensor s, torch::Tensor mask, int64_t heads) {
  check_rows(s, "scores");
  TORCH_CHECK(mask.scalar_type() == torch::kFloat32 && mask.is_contiguous() && mask.dim() == 3,
              "mask must be contiguous float32 [B or 1, Q, L]");
  const int64_t n = s.size(-1), q = mask.size(1), rows = s.numel() / n;
  TORCH_CHECK(mask.size(2) == n && heads > 0 && rows % (heads * q) == 0, "mask [B or 1, Q, L] does not fit the scores");
  const int64_t batch = rows / (heads * q);
  TORCH_CHECK(mask.size(0) == 1 || mask.size(0) == batch, "mask batch must be 1 or the scores' batch");
  uint16_t* sp = reinterpret_cast<uint16_t*>(s.data_ptr());
  const float* mp = mask.data_ptr<float>();
  const bool shared = mask.size(0) == 1;
  at::parallel_for(0, rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = shared ? 0 : r / (heads * q), t = r % q;
      softmax_row(sp + r * n, mp + (b * q + t) * n, n);
    }
  });
}

void softmax_backward_bf16_(torch::Tensor grad, torch::Tensor probs) {
  check_rows(grad, "grad");
  check_rows(probs, "probs");
  TORCH_CHECK(grad.sizes() == probs.sizes(), "grad and probs must have one shape");
  const int64_t n = grad.size(-1), rows = grad.numel() / n;
  uint16_t* gp = reinterpret_cast<uint16_t*>(grad.data_ptr());
  const uint16_t* pp = reinterpret_cast<const uint16_t*>(probs.data_ptr());
  at::parallel_for(0, rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) softmax_backward_row(gp + r * n, pp + r * n, n);
  });
}

#else

bool train_softmax_available() { return false; }

void masked_softmax_bf16_(torch::Tensor, torch::Tensor, int64_t) {
  TORCH_CHECK(false, "masked_softmax_bf16_ needs AVX512-BF16 (not compiled in)");
}

void softmax_backward_bf16_(torch::Tensor, torch::Tensor) {
  TORCH_CHECK(false, "softmax_backward_bf16_ needs AVX512-BF16 (not compiled in)");
}

#endif
