// Stored document KV into a request's KV blocks in one pass (the load path of issue 24): one layer's keys or
// values of one document (kv_rows_into) or of every document of a load in one call (kv_rows_many: the work split in
// chunks of rows over the caller's torch threads, so the Python per document and the copy on one core no longer
// bound the load), read from any buffer (an LMDB page of the memory map, Redis bytes, a tensor's memory), token-major
// [n, H, D] (importance-ordered records) or head-major [H, n, D], written into an [H, n, D] view of the blocks; keys
// are optionally rotated on the way (RoPE), so the blocks are written once and never re-read to rotate them.
//
// The rotation is linking/rope.py's apply_rope on float32 tables, operation for operation:
//   out[d] = round(x[d] * cos[d] + r[d] * sin[d]),  r = rotate_half(x) = [-x2, x1],
// each product and the sum rounded to float32 (the extension is built with -ffp-contract=off, so no FMA fuses
// them), then rounded to the output dtype (bfloat16: to nearest even, as torch's copy), so the bytes equal
// apply_rope(x.float(), cos, sin).to(dtype)'s.
#include "kernels.h"

#include <c10/util/BFloat16.h>

#include <immintrin.h>

#include <cstring>
#include <stdexcept>

namespace {

// Copy one row of n bytes to dst with non-temporal stores where the row is whole vectors at an aligned address:
// the blocks are read again only by later forwards (after every layer of the load), so writing them around the
// caches saves the read-for-ownership of each destination line (~1.6x a memcpy's speed here); else a memcpy.
inline void put_row(void* dst, const void* src, int64_t n) {
#if defined(__AVX512F__)
  constexpr int64_t kVec = 64;
#elif defined(__AVX2__)
  constexpr int64_t kVec = 32;
#else
  constexpr int64_t kVec = 0;
#endif
  if (kVec == 0 || n % kVec != 0 || reinterpret_cast<uintptr_t>(dst) % kVec != 0) {
    std::memcpy(dst, src, n);
    return;
  }
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  for (int64_t i = 0; i < n; i += kVec) {
#if defined(__AVX512F__)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_loadu_si512(s + i));
#elif defined(__AVX2__)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
#endif
  }
}

template <typename T>
inline float widen(T x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return static_cast<float>(c10::BFloat16(x, c10::BFloat16::from_bits()));
}

template <typename T>
inline T narrow(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return c10::BFloat16(x).x;  // round to nearest even, as torch's copy
}

#if defined(__AVX512F__)
// 16 lanes of x (bfloat16 bits or float32) as float32.
inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

// float32 -> bfloat16 bits, rounded to nearest even (NaN -> 0x7FC0), as c10::BFloat16's round_to_nearest_even.
inline void store16(uint16_t* p, __m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }

// The rotation of one row, 16 lanes at a time: lanes d of the first half and d + half of the second together,
// each product and the sum rounded apart (mul, mul, add: no FMA), as the scalar loop below.
template <typename T>
inline void rotate16(T* y, const T* src, int64_t half, const float* cos, const float* sin) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t d = 0; d < half; d += 16) {
    const __m512 lo = load16(src + d), hi = load16(src + d + half);
    const __m512 a = _mm512_mul_ps(lo, _mm512_loadu_ps(cos + d));
    const __m512 b = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(hi), _mm512_castps_si512(sign))),
                                   _mm512_loadu_ps(sin + d));
    const __m512 c = _mm512_mul_ps(hi, _mm512_loadu_ps(cos + d + half));
    const __m512 e = _mm512_mul_ps(lo, _mm512_loadu_ps(sin + d + half));
    store16(y + d, _mm512_add_ps(a, b));
    store16(y + d + half, _mm512_add_ps(c, e));
  }
}
#elif defined(__AVX2__)
// 8 lanes of x (bfloat16 bits or float32) as float32.
inline __m256 load8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

// float32 -> bfloat16 bits, rounded to nearest even (NaN -> 0x7FC0), as c10::BFloat16's round_to_nearest_even.
inline void store8(uint16_t* p, __m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
  // every lane holds 0..0xFFFF: the unsigned saturating pack keeps it (per 128-bit half, so the halves go apart)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}
inline void store8(float* p, __m256 x) { _mm256_storeu_ps(p, x); }

// rotate16's AVX2 twin, 8 lanes at a time (mul, mul, add: no FMA).
template <typename T>
inline void rotate8(T* y, const T* src, int64_t half, const float* cos, const float* sin) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t d = 0; d < half; d += 8) {
    const __m256 lo = load8(src + d), hi = load8(src + d + half);
    const __m256 a = _mm256_mul_ps(lo, _mm256_loadu_ps(cos + d));
    const __m256 b = _mm256_mul_ps(_mm256_xor_ps(hi, sign), _mm256_loadu_ps(sin + d));
    const __m256 c = _mm256_mul_ps(hi, _mm256_loadu_ps(cos + d + half));
    const __m256 e = _mm256_mul_ps(lo, _mm256_loadu_ps(sin + d + half));
    store8(y + d, _mm256_add_ps(a, b));
    store8(y + d + half, _mm256_add_ps(c, e));
  }
}
#endif

// One row of D elements: src -> dst, rotated by the row's angles (cos/sin: D floats) when cos is not null.
template <typename T>
inline void row(T* dst, const T* src, int64_t D, const float* cos, const float* sin) {
  if (cos == nullptr) {
    put_row(dst, src, D * sizeof(T));
    return;
  }
  const int64_t half = D / 2;
#if defined(__AVX512F__)
  if (half % 16 == 0) {
    alignas(64) T y[256];
    rotate16<T>(y, src, half, cos, sin);
    put_row(dst, y, D * sizeof(T));
    return;
  }
#elif defined(__AVX2__)
  if (half % 8 == 0) {
    alignas(64) T y[256];
    rotate8<T>(y, src, half, cos, sin);
    put_row(dst, y, D * sizeof(T));
    return;
  }
#endif
  alignas(64) float x[256];
  alignas(64) T y[256];
  for (int64_t d = 0; d < D; ++d) x[d] = widen(src[d]);
  for (int64_t d = 0; d < half; ++d) {
    const float a = x[d] * cos[d], b = -x[d + half] * sin[d];
    y[d] = narrow<T>(a + b);
  }
  for (int64_t d = half; d < D; ++d) {
    const float a = x[d] * cos[d], b = x[d - half] * sin[d];
    y[d] = narrow<T>(a + b);
  }
  put_row(dst, y, D * sizeof(T));
}

// One head's n rows: src row t at src + t * src_row (elements) -> o + t * sn, rotated by cos/sin rows when cos is not null.
template <typename T>
void head_rows(T* o, int64_t sn, int64_t n, int64_t D, const T* src, int64_t src_row, const float* cos, const float* sin) {
  if (cos == nullptr && sn == D && src_row == D) {  // one run
    put_row(o, src, n * D * sizeof(T));
    return;
  }
  for (int64_t t = 0; t < n; ++t)
    row<T>(o + t * sn, src + t * src_row, D, cos == nullptr ? nullptr : cos + t * D, sin == nullptr ? nullptr : sin + t * D);
}

// The checks every entry point makes on out ([H, N, D] CPU view, contiguous rows, bfloat16 or float32).
void check_out(const torch::Tensor& out) {
  TORCH_CHECK(out.device().is_cpu() && out.dim() == 3 && out.stride(2) == 1, "out must be a CPU [H, n, D] view with contiguous rows");
  const auto dtype = out.scalar_type();
  TORCH_CHECK(dtype == torch::kBFloat16 || dtype == torch::kFloat32, "out must be bfloat16 or float32");
  TORCH_CHECK(out.size(2) % 2 == 0 && out.size(2) <= 256, "head_dim must be even and at most 256");
}

// The rows a stored tensor holds (its bytes over a row's H * D elements), after checking that it is one C-contiguous
// run of bytes and holds whole rows.
int64_t buffer_rows(const pybind11::buffer_info& info, int64_t row_bytes) {
  int64_t stride = info.itemsize;
  for (int64_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] != 1 && info.strides[i] != stride) throw std::invalid_argument("the stored tensor is not contiguous");
    stride *= info.shape[i];
  }
  const int64_t bytes = info.size * info.itemsize;
  if (bytes % row_bytes != 0)
    throw std::invalid_argument("the stored tensor holds " + std::to_string(bytes) + " bytes, not whole rows of " +
                                std::to_string(row_bytes));
  return bytes / row_bytes;
}

// cos/sin (float32 [rows, D], contiguous) covering rows start..start + n: their first row's pointers, or nulls.
std::pair<const float*, const float*> angles(const std::optional<torch::Tensor>& cos, const std::optional<torch::Tensor>& sin,
                                             int64_t D, int64_t start, int64_t n) {
  if (!cos.has_value()) return {nullptr, nullptr};
  TORCH_CHECK(sin.has_value() && cos->scalar_type() == torch::kFloat32 && sin->scalar_type() == torch::kFloat32 &&
                  cos->is_contiguous() && sin->is_contiguous() && cos->dim() == 2 && cos->size(1) == D &&
                  sin->sizes() == cos->sizes() && start >= 0 && start + n <= cos->size(0),
              "cos/sin must be float32 [rows, head_dim] tables covering rows start..start + n");
  return {cos->data_ptr<float>() + start * D, sin->data_ptr<float>() + start * D};
}

// Rows t0..t1 of a document (n rows at src, token-major [n, H, D] or head-major [H, n, D]), every head, into out's
// rows start + t0..start + t1, rotated by the rows' angles c/s (the document's first row's) when c is not null. The
// token-major source is read in order (each stored row holds every head).
void document_rows(const torch::Tensor& out, int64_t start, int64_t n, int64_t t0, int64_t t1, const char* src,
                   bool token_major, const float* c, const float* s) {
  const int64_t H = out.size(0), D = out.size(2), es = out.element_size(), sh = out.stride(0), sn = out.stride(1);
  const bool bf16 = out.scalar_type() == torch::kBFloat16;
  char* base = static_cast<char*>(out.data_ptr()) + (start + t0) * sn * es;
  const float* ct = c == nullptr ? nullptr : c + t0 * D;
  const float* st = s == nullptr ? nullptr : s + t0 * D;
  if (!token_major) {  // head-major: one run of rows per head
    for (int64_t h = 0; h < H; ++h) {
      const char* first = src + (h * n + t0) * D * es;
      char* o = base + h * sh * es;
      if (bf16) head_rows<uint16_t>(reinterpret_cast<uint16_t*>(o), sn, t1 - t0, D, reinterpret_cast<const uint16_t*>(first), D, ct, st);
      else head_rows<float>(reinterpret_cast<float*>(o), sn, t1 - t0, D, reinterpret_cast<const float*>(first), D, ct, st);
    }
    return;
  }
  for (int64_t t = t0; t < t1; ++t) {
    const float* cr = c == nullptr ? nullptr : c + t * D;
    const float* sr = s == nullptr ? nullptr : s + t * D;
    for (int64_t h = 0; h < H; ++h) {
      const char* r = src + (t * H + h) * D * es;
      char* o = base + (h * sh + (t - t0) * sn) * es;
      if (bf16) row<uint16_t>(reinterpret_cast<uint16_t*>(o), reinterpret_cast<const uint16_t*>(r), D, cr, sr);
      else row<float>(reinterpret_cast<float*>(o), reinterpret_cast<const float*>(r), D, cr, sr);
    }
  }
}

}  // namespace

void kv_rows_into(torch::Tensor out, pybind11::buffer src, bool token_major, std::optional<torch::Tensor> cos,
                  std::optional<torch::Tensor> sin, int64_t start) {
  check_out(out);
  const int64_t H = out.size(0), n = out.size(1), D = out.size(2);
  const pybind11::buffer_info info = src.request();
  const int64_t want = H * n * D * static_cast<int64_t>(out.element_size());
  if (info.size * info.itemsize != want)
    throw std::invalid_argument("the stored tensor holds " + std::to_string(info.size * info.itemsize) + " bytes, the output " +
                                std::to_string(want));
  buffer_rows(info, H * D * out.element_size());
  const auto [c, s] = angles(cos, sin, D, start, n);
  const char* p = static_cast<const char*>(info.ptr);
  pybind11::gil_scoped_release release;  // a reader thread's copy leaves the interpreter to others
  document_rows(out, 0, n, 0, n, p, token_major, c, s);
  _mm_sfence();  // the streamed stores are visible before the caller reads the blocks
}

void kv_rows_many(torch::Tensor out, std::vector<pybind11::buffer> srcs, std::vector<bool> token_major,
                  std::vector<int64_t> starts, std::optional<torch::Tensor> cos, std::optional<torch::Tensor> sin) {
  check_out(out);
  const size_t m = srcs.size();
  TORCH_CHECK(token_major.size() == m && starts.size() == m, "srcs, token_major and starts must have one entry per document");
  const int64_t H = out.size(0), N = out.size(1), D = out.size(2);
  std::vector<pybind11::buffer_info> infos;  // held until the copies are done: each keeps its buffer exported
  std::vector<int64_t> rows(m);
  std::vector<std::pair<const float*, const float*>> tables(m);
  infos.reserve(m);
  for (size_t j = 0; j < m; ++j) {
    infos.push_back(srcs[j].request());
    rows[j] = buffer_rows(infos[j], H * D * out.element_size());
    if (starts[j] < 0 || starts[j] + rows[j] > N)
      throw std::invalid_argument("document " + std::to_string(j) + "'s rows " + std::to_string(starts[j]) + ".." +
                                  std::to_string(starts[j] + rows[j]) + " fall outside the output's " + std::to_string(N));
    tables[j] = angles(cos, sin, D, starts[j], rows[j]);
  }
  // work items of at most kChunk rows of one document, every head: the threads of the caller's team share them
  constexpr int64_t kChunk = 64;
  std::vector<std::pair<int64_t, int64_t>> items;  // (document, first row)
  for (size_t j = 0; j < m; ++j)
    for (int64_t t = 0; t < rows[j]; t += kChunk) items.emplace_back(static_cast<int64_t>(j), t);
  // torch's thread count for this thread (1 in the store's reader threads: kvlink_rag.omp_pool.serial_thread)
  const int threads = at::get_num_threads();
  const int64_t count = static_cast<int64_t>(items.size());
  pybind11::gil_scoped_release release;
#pragma omp parallel for schedule(static) num_threads(threads) if (count > 1 && threads > 1)
  for (int64_t w = 0; w < count; ++w) {
    const auto [j, t0] = items[w];
    document_rows(out, starts[j], rows[j], t0, std::min(t0 + kChunk, rows[j]), static_cast<const char*>(infos[j].ptr),
                  token_major[j], tables[j].first, tables[j].second);
    _mm_sfence();  // this thread's streamed stores are visible before any thread reads the blocks
  }
}
