// bfloat16 stores of float32 vectors for the AVX512-BF16 kernels (training's softmax and elementwise steps).
#pragma once
#if defined(__AVX512BF16__)
#include <immintrin.h>
#include <cstdint>

namespace kvlink {

// The `m` lanes of x rounded to bfloat16 (nearest even) into p.
inline void store_bf16(uint16_t* p, __m512 x, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(x));
}

}  // namespace kvlink
#endif
