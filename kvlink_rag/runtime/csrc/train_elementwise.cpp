// The elementwise parts of training's packed bfloat16 step around its GEMMs, forward and backward, each one pass
// over its rows (training/elementwise.py; a profile of the step had them at ~15% of it in torch ops:
// docs/bench/train-elementwise-2026-12-07h):
//   silu_mul     act = silu(gate) * up from the gate|up GEMM's bfloat16 output [T, 2I], float32 out [T, I]
//                (the values torch computes from the same bfloat16 GEMM output converted to float32);
//   its backward d_gate = d_act * up * s * (1 + gate * (1 - s)), d_up = d_act * silu(gate), s = sigmoid(gate),
//                written as the bfloat16 [T, 2I] the GEMM's backward reads (torch: float32, then converted);
//   rms_norm     y = w * (x * r), r = 1 / sqrt(mean(x^2) + eps) per row of float32 [T, H], r kept for backward;
//   its backward dx = r * (g * w) - x * r^3 * mean(g * w * x) (the weight is frozen: no gradient for it).
// Arithmetic in float32; sigmoid by kvlink::exp16 (Cephes' expf, its argument clamped to [-87.3, 88]).
#include "kernels.h"
#include <ATen/Parallel.h>
#include <cmath>
#include <cstdint>

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include "bf16.h"
#include "isa.h"

namespace {

using kvlink::first;
using kvlink::mask16;
using kvlink::store_bf16;

inline __m512 sigmoid16(__m512 x) {
  const __m512 e = kvlink::exp16(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), x), _mm512_set1_ps(88.f)));
  return _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_add_ps(_mm512_set1_ps(1.f), e));
}

void check(const torch::Tensor& t, c10::ScalarType dtype, int64_t cols, const char* what) {
  TORCH_CHECK(t.scalar_type() == dtype && t.is_contiguous() && t.dim() == 2 && t.size(1) == cols, what);
}

}  // namespace

bool train_elementwise_available() { return true; }

torch::Tensor silu_mul_bf16(torch::Tensor gu, int64_t inter) {
  check(gu, torch::kBFloat16, 2 * inter, "gate|up must be contiguous bfloat16 [T, 2 * intermediate]");
  const int64_t t = gu.size(0);
  auto act = torch::empty({t, inter}, gu.options().dtype(torch::kFloat32));
  const uint16_t* src = reinterpret_cast<const uint16_t*>(gu.data_ptr());
  float* dst = act.data_ptr<float>();
  at::parallel_for(0, t, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint16_t *g = src + r * 2 * inter, *u = g + inter;
      for (int64_t j = 0; j < inter; j += 16) {
        const __mmask16 m = first(inter - j);
        const __m512 gv = mask16(g + j, m);
        const __m512 silu = _mm512_mul_ps(gv, sigmoid16(gv));
        _mm512_mask_storeu_ps(dst + r * inter + j, m, _mm512_mul_ps(silu, mask16(u + j, m)));
      }
    }
  });
  return act;
}

torch::Tensor silu_mul_backward_bf16(torch::Tensor grad, torch::Tensor gu) {
  const int64_t inter = grad.size(-1);
  check(grad, torch::kFloat32, inter, "grad must be contiguous float32 [T, intermediate]");
  check(gu, torch::kBFloat16, 2 * inter, "gate|up must be contiguous bfloat16 [T, 2 * intermediate]");
  TORCH_CHECK(grad.size(0) == gu.size(0), "grad and gate|up must have one row count");
  auto out = torch::empty_like(gu);
  const uint16_t* src = reinterpret_cast<const uint16_t*>(gu.data_ptr());
  uint16_t* dst = reinterpret_cast<uint16_t*>(out.data_ptr());
  const float* gp = grad.data_ptr<float>();
  const __m512 one = _mm512_set1_ps(1.f);
  at::parallel_for(0, gu.size(0), 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint16_t *g = src + r * 2 * inter, *u = g + inter;
      uint16_t *dg = dst + r * 2 * inter, *du = dg + inter;
      for (int64_t j = 0; j < inter; j += 16) {
        const __mmask16 m = first(inter - j);
        const __m512 gv = mask16(g + j, m), uv = mask16(u + j, m), d = mask16(gp + r * inter + j, m);
        const __m512 s = sigmoid16(gv);
        const __m512 dsilu = _mm512_mul_ps(s, _mm512_fmadd_ps(gv, _mm512_sub_ps(one, s), one));
        store_bf16(dg + j, _mm512_mul_ps(_mm512_mul_ps(d, uv), dsilu), m);
        store_bf16(du + j, _mm512_mul_ps(d, _mm512_mul_ps(gv, s)), m);
      }
    }
  });
  return out;
}

std::vector<torch::Tensor> rms_norm_train(torch::Tensor x, torch::Tensor w, double eps) {
  const int64_t h = w.numel();
  check(x, torch::kFloat32, h, "x must be contiguous float32 [T, hidden]");
  TORCH_CHECK(w.scalar_type() == torch::kFloat32 && w.is_contiguous(), "weight must be contiguous float32 [hidden]");
  const int64_t t = x.size(0);
  auto y = torch::empty_like(x);
  auto rstd = torch::empty({t}, x.options());
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float *yp = y.data_ptr<float>(), *rp = rstd.data_ptr<float>();
  at::parallel_for(0, t, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* a = xp + r * h;
      __m512 ss = _mm512_setzero_ps();
      for (int64_t j = 0; j < h; j += 16) {
        const __m512 v = mask16(a + j, first(h - j));
        ss = _mm512_fmadd_ps(v, v, ss);
      }
      const float inv = 1.f / std::sqrt(_mm512_reduce_add_ps(ss) / static_cast<float>(h) + static_cast<float>(eps));
      rp[r] = inv;
      const __m512 iv = _mm512_set1_ps(inv);
      for (int64_t j = 0; j < h; j += 16) {
        const __mmask16 m = first(h - j);
        _mm512_mask_storeu_ps(yp + r * h + j, m, _mm512_mul_ps(mask16(wp + j, m), _mm512_mul_ps(mask16(a + j, m), iv)));
      }
    }
  });
  return {y, rstd};
}

torch::Tensor rms_norm_train_backward(torch::Tensor grad, torch::Tensor x, torch::Tensor w, torch::Tensor rstd) {
  const int64_t h = w.numel();
  check(grad, torch::kFloat32, h, "grad must be contiguous float32 [T, hidden]");
  check(x, torch::kFloat32, h, "x must be contiguous float32 [T, hidden]");
  TORCH_CHECK(grad.size(0) == x.size(0) && rstd.numel() == x.size(0) && rstd.is_contiguous() &&
              rstd.scalar_type() == torch::kFloat32, "rstd must be float32 [T], one per row of x");
  TORCH_CHECK(w.scalar_type() == torch::kFloat32 && w.is_contiguous(), "weight must be contiguous float32 [hidden]");
  auto dx = torch::empty_like(x);
  const float *gp = grad.data_ptr<float>(), *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  const float* rp = rstd.data_ptr<float>();
  float* dp = dx.data_ptr<float>();
  at::parallel_for(0, x.size(0), 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *g = gp + r * h, *a = xp + r * h;
      __m512 dot = _mm512_setzero_ps();
      for (int64_t j = 0; j < h; j += 16) {
        const __mmask16 m = first(h - j);
        dot = _mm512_fmadd_ps(_mm512_mul_ps(mask16(g + j, m), mask16(wp + j, m)), mask16(a + j, m), dot);
      }
      const float inv = rp[r];
      const __m512 iv = _mm512_set1_ps(inv);
      const __m512 c = _mm512_set1_ps(inv * inv * inv * _mm512_reduce_add_ps(dot) / static_cast<float>(h));
      for (int64_t j = 0; j < h; j += 16) {
        const __mmask16 m = first(h - j);
        const __m512 gw = _mm512_mul_ps(mask16(g + j, m), mask16(wp + j, m));
        _mm512_mask_storeu_ps(dp + r * h + j, m, _mm512_sub_ps(_mm512_mul_ps(gw, iv), _mm512_mul_ps(mask16(a + j, m), c)));
      }
    }
  });
  return dx;
}

#else

bool train_elementwise_available() { return false; }

torch::Tensor silu_mul_bf16(torch::Tensor, int64_t) {
  TORCH_CHECK(false, "silu_mul_bf16 needs AVX512-BF16 (not compiled in)");
}

torch::Tensor silu_mul_backward_bf16(torch::Tensor, torch::Tensor) {
  TORCH_CHECK(false, "silu_mul_backward_bf16 needs AVX512-BF16 (not compiled in)");
}

std::vector<torch::Tensor> rms_norm_train(torch::Tensor, torch::Tensor, double) {
  TORCH_CHECK(false, "rms_norm_train needs AVX512-BF16 (not compiled in)");
}

torch::Tensor rms_norm_train_backward(torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor) {
  TORCH_CHECK(false, "rms_norm_train_backward needs AVX512-BF16 (not compiled in)");
}

#endif
