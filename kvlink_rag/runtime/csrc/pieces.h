// One query token's KV pieces for attend_group (isa_*.h): per piece its base pointers, length, token and head
// strides (elements). Shared by decode_attention (cpu_kernels.cpp: pieces [kv_heads, tokens, 64]) and
// decode_rows (decode_rows.cpp: a layer of [layers, kv_heads, tokens, 64] buffers).
#pragma once
#include <cstdint>
#include <vector>

#include "isa.h"

namespace kvlink {

struct Pieces {
  std::vector<const void*> k, v;
  std::vector<int64_t> lens, tstrides, hstrides;
  int64_t total = 0;

  // The first n tokens of a piece whose KV head 0, token 0 starts at k0 / v0.
  void add(const void* k0, const void* v0, int64_t n, int64_t tstride, int64_t hstride) {
    k.push_back(k0), v.push_back(v0), lens.push_back(n), tstrides.push_back(tstride), hstrides.push_back(hstride);
    total += n;
  }

  // Attention of KV head h's group of g queries q [g, 64] float32 over every piece, into out [g, 64].
  template <typename T>
  void attend(int64_t h, const float* q, int64_t g, float scale, float* out) const {
    std::vector<const T*> kp, vp;
    for (size_t j = 0; j < k.size(); ++j) {
      kp.push_back(static_cast<const T*>(k[j]) + h * hstrides[j]);
      vp.push_back(static_cast<const T*>(v[j]) + h * hstrides[j]);
    }
    attend_group<T>(q, g, kp, vp, lens, tstrides, scale, total, out);
  }
};

}  // namespace kvlink
