// Stored document KV into a request's KV blocks in one pass (the load path of issue 24): one layer's keys or
// values of one document (kv_rows_into) or of every document of a load in one call (kv_rows_many: the work split in
// chunks of rows over the caller's torch threads, so the Python per document and the copy on one core no longer
// bound the load), read from any buffer (an LMDB page of the memory map, Redis bytes, a tensor's memory), token-major
// [n, H, D] (importance-ordered records) or head-major [H, n, D], written into an [H, n, D] view of the blocks; keys
// are optionally rotated on the way (RoPE), and bfloat16 rows optionally widened into float32 blocks (the KV dtype
// on CPUs without native bfloat16), so the blocks are written once and never re-read. The row itself: kv_row.h.
#include "kernels.h"
#include "kv_row.h"

#include <stdexcept>

namespace {

using kv_row::put_row;
using kv_row::row;

// One head's n rows: src row t at src + t * src_row (elements) -> o + t * sn, rotated by cos/sin rows when cos is not null.
template <typename S, typename T>
void head_rows(T* o, int64_t sn, int64_t n, int64_t D, const S* src, int64_t src_row, const float* cos, const float* sin) {
  if (std::is_same_v<S, T> && cos == nullptr && sn == D && src_row == D) {  // one run
    put_row(o, src, n * D * sizeof(T));
    return;
  }
  for (int64_t t = 0; t < n; ++t)
    row<S, T>(o + t * sn, src + t * src_row, D, cos == nullptr ? nullptr : cos + t * D, sin == nullptr ? nullptr : sin + t * D);
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

// Rows t0..t1 of a document (n rows of S at src, token-major [n, H, D] or head-major [H, n, D]), every head, into
// out's rows start + t0..start + t1 (of T: out's dtype), rotated by the rows' angles c/s (the document's first
// row's) when c is not null. The token-major source is read in order (each stored row holds every head).
template <typename S, typename T>
void rows_of(const torch::Tensor& out, int64_t start, int64_t n, int64_t t0, int64_t t1, const S* src, bool token_major,
             const float* c, const float* s) {
  const int64_t H = out.size(0), D = out.size(2), sh = out.stride(0), sn = out.stride(1);
  T* base = static_cast<T*>(out.data_ptr()) + (start + t0) * sn;
  const float* ct = c == nullptr ? nullptr : c + t0 * D;
  const float* st = s == nullptr ? nullptr : s + t0 * D;
  if (!token_major) {  // head-major: one run of rows per head
    for (int64_t h = 0; h < H; ++h) head_rows<S, T>(base + h * sh, sn, t1 - t0, D, src + (h * n + t0) * D, D, ct, st);
    return;
  }
  for (int64_t t = t0; t < t1; ++t) {
    const float* cr = c == nullptr ? nullptr : c + t * D;
    const float* sr = s == nullptr ? nullptr : s + t * D;
    for (int64_t h = 0; h < H; ++h) row<S, T>(base + h * sh + (t - t0) * sn, src + (t * H + h) * D, D, cr, sr);
  }
}

// rows_of for out's dtype, the source bfloat16 bits when widen (out then float32) else out's dtype.
void document_rows(const torch::Tensor& out, int64_t start, int64_t n, int64_t t0, int64_t t1, const char* src,
                   bool token_major, bool widen, const float* c, const float* s) {
  if (out.scalar_type() == torch::kBFloat16)
    rows_of<uint16_t, uint16_t>(out, start, n, t0, t1, reinterpret_cast<const uint16_t*>(src), token_major, c, s);
  else if (widen)
    rows_of<uint16_t, float>(out, start, n, t0, t1, reinterpret_cast<const uint16_t*>(src), token_major, c, s);
  else
    rows_of<float, float>(out, start, n, t0, t1, reinterpret_cast<const float*>(src), token_major, c, s);
}

// The bytes of one stored element: 2 for bfloat16 rows widened into float32 blocks, else out's.
int64_t src_size(const torch::Tensor& out, bool widen) {
  if (widen && out.scalar_type() != torch::kFloat32)
    throw std::invalid_argument("only bfloat16 rows widen, into float32 blocks");
  return widen ? 2 : out.element_size();
}

}  // namespace

void kv_rows_into(torch::Tensor out, pybind11::buffer src, bool token_major, std::optional<torch::Tensor> cos,
                  std::optional<torch::Tensor> sin, int64_t start) {
  check_out(out);
  const int64_t H = out.size(0), n = out.size(1), D = out.size(2), es = out.element_size();
  const pybind11::buffer_info info = src.request();
  const int64_t want = H * n * D * es;
  if (info.size * info.itemsize != want)
    throw std::invalid_argument("the stored tensor holds " + std::to_string(info.size * info.itemsize) + " bytes, the output " +
                                std::to_string(want));
  buffer_rows(info, H * D * es);
  const auto [c, s] = angles(cos, sin, D, start, n);
  const char* p = static_cast<const char*>(info.ptr);
  pybind11::gil_scoped_release release;  // a reader thread's copy leaves the interpreter to others
  document_rows(out, 0, n, 0, n, p, token_major, false, c, s);
  _mm_sfence();  // the streamed stores are visible before the caller reads the blocks
}

void kv_rows_many(torch::Tensor out, std::vector<pybind11::buffer> srcs, std::vector<bool> token_major,
                  std::vector<int64_t> starts, std::optional<torch::Tensor> cos, std::optional<torch::Tensor> sin,
                  std::vector<bool> widen) {
  check_out(out);
  const size_t m = srcs.size();
  if (widen.empty()) widen.assign(m, false);
  TORCH_CHECK(token_major.size() == m && starts.size() == m && widen.size() == m,
              "srcs, token_major, starts and widen must have one entry per document");
  const int64_t H = out.size(0), N = out.size(1), D = out.size(2);
  std::vector<pybind11::buffer_info> infos;  // held until the copies are done: each keeps its buffer exported
  std::vector<int64_t> rows(m);
  std::vector<std::pair<const float*, const float*>> tables(m);
  infos.reserve(m);
  for (size_t j = 0; j < m; ++j) {
    infos.push_back(srcs[j].request());
    rows[j] = buffer_rows(infos[j], H * D * src_size(out, widen[j]));
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
                  token_major[j], widen[j], tables[j].first, tables[j].second);
    _mm_sfence();  // this thread's streamed stores are visible before any thread reads the blocks
  }
}
