// kv_cache.h: a per-sequence KV cache laid out for the attention kernels (ops/attention.h
// drives them over it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/abi.h"

namespace pyinfer {

// K and V of every layer, float32, float16 or Q8_0 (int8 elements, each 32 consecutive ones of
// a row with one float scale, kernels/abi.h's AttnTile; head_dim a multiple of 32; scales kept
// beside the elements, those of keys [n_layer][n_head_kv][head_dim / 32][n_ctx in whole key
// blocks], those of values [n_layer][n_head_kv][n_ctx][head_dim / 32]; an element is stored
// as round(x / s) with s = max |x| / 127 over its 32, and a chunk holding NaN or infinity
// reads as NaN). V is stored [n_layer][n_head_kv][n_ctx][head_dim];
// K in blocks of kKeyBlock positions, [n_layer][n_head_kv][n_blk][kKeyBlock * head_dim] with
// n_blk = n_ctx / kKeyBlock rounded up. A complete block (below n_pos(layer) / kKeyBlock) is
// [head_dim][kKeyBlock], kKeyBlock positions side by side for each dimension, so a query's
// scores against it come from whole-vector multiply-adds (kernels/abi.h, AttnFn). The partial
// block at n_pos / kKeyBlock is held row-major, [kKeyBlock][head_dim], and transposed once when
// it fills: a decode step's append then writes one row of K, not one element in each of
// head_dim cache lines. One (layer, KV head) is a contiguous region of each, so attention
// streams its keys and values in position order. Positions 0..n_pos(layer)-1 of a layer hold
// data; appends continue from there or overwrite from an earlier position (which drops the
// later ones). Errors throw std::invalid_argument with a message naming the bad value.
// Rows 0..n-1 of a row-major key block (the partial one), transposed into out [hd][kKeyBlock],
// the layout of a complete block.
template <typename T>
void transpose_keys(const T* rows, int64_t n, int64_t hd, T* out) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < hd; ++d) out[d * kKeyBlock + r] = rows[r * hd + d];
}

// f(T{}) with T the element type a cache of `type` stores: float, fp16_t or (Q8_0) int8_t.
template <class F>
void with_kv_elem(KvType type, const F& f) {
  if (type == KV_F16)
    f(fp16_t{});
  else if (type == KV_Q8_0)
    f(int8_t{});
  else
    f(float{});
}

class KVCache {
 public:
  KVCache(int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t n_ctx, KvType type);

  // Write m new positions pos..pos+m-1 of one layer: k, v [m][stride] rows holding n_head_kv
  // heads of head_dim floats each (K already rotated). Needs pos <= n_pos(layer) and
  // pos + m <= n_ctx.
  void append(int64_t layer, const float* k, int64_t k_stride, const float* v, int64_t v_stride, int64_t pos,
              int64_t m);

  // Start of the key blocks (see above) and of the values ([n_ctx][head_dim]) of (layer, KV head).
  const void* k(int64_t layer, int64_t head) const { return k_.get() + k_offset(layer, head); }
  const void* v(int64_t layer, int64_t head) const { return v_.get() + v_offset(layer, head); }
  // Q8_0 only: the scales of (layer, KV head)'s keys ([head_dim / 32][k_scale_stride()]) and
  // values ([n_ctx][head_dim / 32]); nullptr for the other types.
  const float* k_scale(int64_t layer, int64_t head) const {
    return ks_ ? ks_.get() + scale_offset(layer, head, k_scale_stride()) : nullptr;
  }
  const float* v_scale(int64_t layer, int64_t head) const {
    return vs_ ? vs_.get() + scale_offset(layer, head, n_ctx_) : nullptr;
  }
  int64_t k_scale_stride() const { return n_blk() * kKeyBlock; }
  // One layer's keys in position order, [n_head_kv][n_ctx][head_dim] elements of the cache's
  // type (positions from n_pos(layer) on hold whatever their storage holds).
  void copy_keys(int64_t layer, void* dst) const;
  // Q8_0 only: one layer's keys or values in position order as float32,
  // [n_head_kv][n_ctx][head_dim], each int8 times its scale (the values as the attention
  // kernels weigh them; the scores take the int8 keys and their scales apart, kernels/abi.h).
  void dequantize_q8(int64_t layer, bool values, float* dst) const;

  // Every layer holds the first n positions of src's (a cache of the same shape and type,
  // of any n_ctx >= n, holding at least n positions in every layer), and no more: a shared
  // prompt prefix computed once serves another sequence. The copy is exact. src may be this
  // cache (nothing moves: the owner forgets positions >= n, as for a truncation).
  void copy_prefix(const KVCache& src, int64_t n);

  int64_t n_pos(int64_t layer) const;
  void clear();  // every layer back to 0 positions (the data stays until overwritten)

  int64_t n_layer() const { return n_layer_; }
  int64_t n_head_kv() const { return n_head_kv_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t n_ctx() const { return n_ctx_; }
  KvType type() const { return type_; }
  size_t elem_size() const { return static_cast<size_t>(kv_elem_bytes(type_)); }
  // K and V together, n_ctx positions of each, with Q8_0's scales (K's storage also holds up
  // to kKeyBlock - 1 positions of padding per layer and head, left out here).
  size_t nbytes() const { return 2 * bytes_ + 2 * scale_bytes_; }

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  int64_t n_blk() const { return (n_ctx_ + kKeyBlock - 1) / kKeyBlock; }
  size_t k_offset(int64_t layer, int64_t head) const {
    return static_cast<size_t>((layer * n_head_kv_ + head) * n_blk() * kKeyBlock * head_dim_) * elem_size();
  }
  size_t v_offset(int64_t layer, int64_t head) const {
    return static_cast<size_t>((layer * n_head_kv_ + head) * n_ctx_ * head_dim_) * elem_size();
  }
  size_t scale_offset(int64_t layer, int64_t head, int64_t positions) const {
    return static_cast<size_t>((layer * n_head_kv_ + head) * positions * (head_dim_ / kKvQ8Chunk));
  }
  void check_layer(int64_t layer) const;

  int64_t n_layer_, n_head_kv_, head_dim_, n_ctx_;
  KvType type_;
  size_t bytes_;        // of V (and of K's n_ctx positions)
  size_t scale_bytes_;  // of V's scales (and of K's n_ctx positions'), Q8_0; else 0
  std::unique_ptr<uint8_t, FreeDeleter> k_, v_;
  std::unique_ptr<float, FreeDeleter> ks_, vs_;  // Q8_0's scales, else empty
  std::vector<int64_t> n_pos_;                   // [n_layer]
};

}  // namespace pyinfer
