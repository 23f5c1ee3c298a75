// A grow-only buffer of the calling thread, per (element type, tag): the same pages serve every call (a fresh
// allocation of a few hundred KB is a fresh mapping, and its first writes page-fault: that was half of
// prefill_attention's time at 16 query rows). Tags in use: prefill_attention.cpp 0-3, train_softmax.cpp 4.
#pragma once
#include <cstddef>
#include <vector>

namespace kvlink {

template <typename T, int Tag>
T* scratch(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace kvlink
