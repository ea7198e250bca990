// checked.h: overflow-checked size arithmetic. Every size or offset computed from file metadata
// or a caller's parameters (tensor bytes, KV cache and scratch sizes, packed layouts) goes
// through these, so that a product that would wrap (and then pass a size check as a small
// number, or allocate too little) is an error naming the quantity, raised before anything is
// allocated or indexed with it. Errors: std::invalid_argument for a negative factor,
// std::length_error for a result past int64 (both ValueError in Python).
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace pyinfer {

namespace checked_detail {

inline std::string join(std::initializer_list<int64_t> f, const char* op) {
  std::string s;
  for (const int64_t v : f) s += (s.empty() ? "" : op) + std::to_string(v);
  return s;
}

// Folds non-negative terms with step (a builtin that reports overflow), from init.
template <class Step>
int64_t fold(std::initializer_list<int64_t> terms, int64_t init, const char* what, const char* op, Step step) {
  int64_t r = init;
  for (const int64_t t : terms) {
    if (t < 0) throw std::invalid_argument(std::string(what) + ": a negative term in " + join(terms, op));
    if (step(r, t, &r)) throw std::length_error(std::string(what) + " overflows 64 bits: " + join(terms, op));
  }
  return r;
}

}  // namespace checked_detail

// The product of non-negative factors; `what` names the quantity and its formula, e.g.
// "KV cache bytes (n_layer * n_head_kv * head_dim * n_ctx * element size)".
inline int64_t checked_product(std::initializer_list<int64_t> factors, const char* what) {
  return checked_detail::fold(factors, 1, what, " * ",
                              [](int64_t a, int64_t b, int64_t* r) { return __builtin_mul_overflow(a, b, r); });
}

inline int64_t checked_mul(int64_t a, int64_t b, const char* what) { return checked_product({a, b}, what); }

// The sum of non-negative terms.
inline int64_t checked_sum(std::initializer_list<int64_t> terms, const char* what) {
  return checked_detail::fold(terms, 0, what, " + ",
                              [](int64_t a, int64_t b, int64_t* r) { return __builtin_add_overflow(a, b, r); });
}

inline int64_t checked_add(int64_t a, int64_t b, const char* what) { return checked_sum({a, b}, what); }

// n rounded up to a multiple of m (m >= 1), checked.
inline int64_t checked_round_up(int64_t n, int64_t m, const char* what) { return checked_add(n, m - 1, what) / m * m; }

// An allocation the system refused: MemoryError in Python, with the bytes and what they were
// for (a bare std::bad_alloc says neither).
struct AllocationError : std::runtime_error {
  AllocationError(size_t bytes, const char* what)
      : std::runtime_error("cannot allocate " + std::to_string(bytes) + " bytes for " + what) {}
};

// A checked count as the size_t an allocation takes.
inline size_t to_size(int64_t n, const char* what) {
  if (n < 0) throw std::invalid_argument(std::string(what) + ": negative size " + std::to_string(n));
  return static_cast<size_t>(n);
}

}  // namespace pyinfer
