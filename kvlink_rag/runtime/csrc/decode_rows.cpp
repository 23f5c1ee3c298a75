// One layer of a step of decode rows, after q|k|v and RoPE: each row's new key and value written into its own
// KV buffer, then its one-token GQA attention over its pieces (shared chunks, then its own tokens), all rows
// in one call and one parallel loop over (row, KV head). The runner's per-row Python (model_runner.py
// `_attend_rows`: a write, the pieces and a kernel call per row and layer) cost ~40 ms of a 16-row step's
// ~100 ms (BENCHMARKS.md, issue 24). The arithmetic is the general path's: keys and values stored in the
// buffers' dtype (round to nearest even), the query rounded to that dtype first and the output after, the
// attention itself attend_group's (cpu_kernels.cpp's decode_attention).
#include "kernels.h"
#include "pieces.h"
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <vector>

namespace {

using namespace kvlink;

// The first n tokens of `layer` of a buffer pair [layers, kv_heads, tokens, 64] as one of a row's pieces.
void add_layer(Pieces& p, const torch::Tensor& kt, const torch::Tensor& vt, int64_t layer, int64_t n) {
  TORCH_CHECK(kt.strides() == vt.strides() && kt.stride(3) == 1 && n <= kt.size(2), "keys and values differ in layout");
  p.add(static_cast<const char*>(kt.data_ptr()) + layer * kt.stride(0) * kt.element_size(),
        static_cast<const char*>(vt.data_ptr()) + layer * vt.stride(0) * vt.element_size(), n, kt.stride(2), kt.stride(1));
}

template <typename T>
T cast(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return c10::BFloat16(x).x;  // round to nearest even, as torch's copy
}

template <typename T>
float widen(T x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return static_cast<float>(c10::BFloat16(x, c10::BFloat16::from_bits()));
}

template <typename T>
void run(const torch::Tensor& qkv, int64_t heads, int64_t kv, int64_t layer, const std::vector<torch::Tensor>& own_k,
         const std::vector<torch::Tensor>& own_v, const std::vector<int64_t>& pos, const std::vector<Pieces>& rows,
         float scale, float* out) {
  constexpr int D = 64;
  const int64_t n = static_cast<int64_t>(rows.size()), g = heads / kv, width = qkv.size(1);
  const float* src = qkv.data_ptr<float>();
  std::vector<float> q(n * heads * D);
  for (int64_t r = 0; r < n; ++r) {
    const float* x = src + r * width;
    for (int64_t i = 0; i < heads * D; ++i) q[r * heads * D + i] = widen<T>(cast<T>(x[i]));
    T* kd = reinterpret_cast<T*>(own_k[r].data_ptr()) + layer * own_k[r].stride(0) + pos[r] * own_k[r].stride(2);
    T* vd = reinterpret_cast<T*>(own_v[r].data_ptr()) + layer * own_v[r].stride(0) + pos[r] * own_v[r].stride(2);
    for (int64_t h = 0; h < kv; ++h)
      for (int d = 0; d < D; ++d) {
        kd[h * own_k[r].stride(1) + d] = cast<T>(x[(heads + h) * D + d]);
        vd[h * own_v[r].stride(1) + d] = cast<T>(x[(heads + kv + h) * D + d]);
      }
  }
  at::parallel_for(0, n * kv, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / kv, h = i % kv;
      float* o = out + r * heads * D + h * g * D;
      rows[r].attend<T>(h, q.data() + r * heads * D + h * g * D, g, scale, o);
      for (int64_t j = 0; j < g * D; ++j) o[j] = widen<T>(cast<T>(o[j]));
    }
  });
}

}  // namespace

// qkv: [T, (heads + 2 kv_heads) * 64] float32 after RoPE, row r a decode token of request r; own_k[r], own_v[r]:
// its KV buffers [layers, kv_heads, capacity, 64] (bfloat16 or float32), its new token written at pos[r] of
// `layer`; chunk_k[r], chunk_v[r]: its shared chunks [layers, kv_heads, tokens, 64] in order. Each row attends
// to its chunks, then own tokens 0..pos[r]. Returns [T, heads * 64] float32.
torch::Tensor decode_rows(torch::Tensor qkv, int64_t heads, int64_t layer, std::vector<torch::Tensor> own_k,
                          std::vector<torch::Tensor> own_v, std::vector<int64_t> pos,
                          std::vector<std::vector<torch::Tensor>> chunk_k, std::vector<std::vector<torch::Tensor>> chunk_v,
                          double scale) {
  const int64_t n = qkv.size(0);
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == torch::kFloat32 && qkv.stride(1) == 1, "qkv must be [T, *] float32");
  TORCH_CHECK(static_cast<int64_t>(own_k.size()) == n && own_v.size() == own_k.size() && pos.size() == own_k.size() &&
              chunk_k.size() == own_k.size() && chunk_v.size() == own_k.size(), "one buffer, position and chunk list per row");
  const auto dtype = own_k[0].scalar_type();
  const int64_t kv = own_k[0].size(1);
  TORCH_CHECK(dtype == torch::kBFloat16 || dtype == torch::kFloat32, "KV must be bfloat16 or float32");
  TORCH_CHECK(heads % kv == 0 && qkv.size(1) == (heads + 2 * kv) * 64, "qkv must hold heads + 2 kv_heads of 64");
  std::vector<Pieces> rows(n);
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(chunk_k[r].size() == chunk_v[r].size(), "one value chunk per key chunk");
    for (size_t j = 0; j < chunk_k[r].size(); ++j) {
      TORCH_CHECK(chunk_k[r][j].scalar_type() == dtype && chunk_k[r][j].size(1) == kv && chunk_k[r][j].size(3) == 64,
                  "chunks must be [layers, kv_heads, tokens, 64] in the buffers' dtype");
      add_layer(rows[r], chunk_k[r][j], chunk_v[r][j], layer, chunk_k[r][j].size(2));
    }
    TORCH_CHECK(own_k[r].scalar_type() == dtype && own_k[r].size(1) == kv && own_k[r].size(3) == 64 &&
                pos[r] >= 0 && pos[r] < own_k[r].size(2) && layer < own_k[r].size(0), "a buffer without room at pos");
    add_layer(rows[r], own_k[r], own_v[r], layer, pos[r] + 1);
  }
  auto out = torch::empty({n, heads * 64}, qkv.options());
  if (dtype == torch::kBFloat16) run<uint16_t>(qkv, heads, kv, layer, own_k, own_v, pos, rows, scale, out.data_ptr<float>());
  else run<float>(qkv, heads, kv, layer, own_k, own_v, pos, rows, scale, out.data_ptr<float>());
  return out;
}
