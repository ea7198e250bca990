// kv_cache.cpp: the KV cache's storage and append, and the attention driver over the
// per-ISA attention kernels (portable code: compiled with no ISA flags).
#include "ops/kv_cache.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "runtime/dispatch.h"
#include "runtime/threadpool.h"

namespace pyinfer {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Zeroed memory from calloc: large blocks come straight from the OS as untouched zero pages,
// so a cache sized for a long context costs memory only as positions are written.
uint8_t* zeroed(size_t n) {
  void* p = std::calloc(n == 0 ? 1 : n, 1);
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<uint8_t*>(p);
}

// Offset, in elements, of element d of position p's key in its (layer, head) region: in
// block p / kKeyBlock, at (d, p % kKeyBlock) when the block is complete, or row-major at
// (p % kKeyBlock, d) while it is the partial one.
inline int64_t key_at(int64_t p, int64_t d, int64_t hd, bool row_major) {
  const int64_t block = p / kKeyBlock * hd * kKeyBlock, r = p % kKeyBlock;
  return block + (row_major ? r * hd + d : d * kKeyBlock + r);
}

// Rows 0..n-1 of a row-major key block, transposed into out [hd][kKeyBlock].
template <typename T>
void transpose_keys(const T* rows, int64_t n, int64_t hd, T* out) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < hd; ++d) out[d * kKeyBlock + r] = rows[r * hd + d];
}

// Moves the first n positions of one key block [kKeyBlock * hd] to the other layout.
template <typename T>
void relayout_keys(T* block, int64_t n, int64_t hd, bool to_row_major) {
  const std::vector<T> was(block, block + hd * kKeyBlock);
  if (!to_row_major) {
    transpose_keys(was.data(), n, hd, block);
    return;
  }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < hd; ++d) block[r * hd + d] = was[static_cast<size_t>(d * kKeyBlock + r)];
}

template <typename T>
void put_key(T* region, int64_t p, const T* src, int64_t hd, bool row_major) {
  T* at = region + key_at(p, 0, hd, row_major);
  if (row_major) {
    std::memcpy(at, src, static_cast<size_t>(hd) * sizeof(T));
  } else {
    for (int64_t d = 0; d < hd; ++d) at[d * kKeyBlock] = src[d];
  }
}

}  // namespace

void KVCache::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

KVCache::KVCache(int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t n_ctx, KvType type)
    : n_layer_(n_layer), n_head_kv_(n_head_kv), head_dim_(head_dim), n_ctx_(n_ctx), type_(type) {
  if (n_layer < 1 || n_head_kv < 1 || head_dim < 1 || n_ctx < 1)
    throw std::invalid_argument("KVCache needs n_layer, n_head_kv, head_dim and n_ctx >= 1; got " +
                                str(n_layer) + ", " + str(n_head_kv) + ", " + str(head_dim) + ", " +
                                str(n_ctx));
  if (type != KV_F32 && type != KV_F16) throw std::invalid_argument("KVCache: unknown element type");
  // Overflow guard for the size product: every factor is < 2^20 in any real model.
  const double elems = static_cast<double>(n_layer) * n_head_kv * head_dim * n_ctx;
  if (elems * elem_size() > 9.0e18) throw std::invalid_argument("KVCache: size overflows");
  bytes_ = static_cast<size_t>(n_layer * n_head_kv * head_dim * n_ctx) * elem_size();
  k_.reset(zeroed(static_cast<size_t>(n_layer * n_head_kv * n_blk() * kKeyBlock * head_dim) * elem_size()));
  v_.reset(zeroed(bytes_));
  n_pos_.assign(static_cast<size_t>(n_layer), 0);
}

void KVCache::check_layer(int64_t layer) const {
  if (layer < 0 || layer >= n_layer_)
    throw std::invalid_argument("layer " + str(layer) + " out of range [0, " + str(n_layer_) + ")");
}

int64_t KVCache::n_pos(int64_t layer) const {
  check_layer(layer);
  return n_pos_[static_cast<size_t>(layer)];
}

void KVCache::clear() { n_pos_.assign(n_pos_.size(), 0); }

void KVCache::append(int64_t layer, const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                     int64_t pos, int64_t m) {
  check_layer(layer);
  const int64_t have = n_pos_[static_cast<size_t>(layer)];
  if (m < 0) throw std::invalid_argument("append: negative number of positions");
  if (pos < 0 || pos > have)
    throw std::invalid_argument("append at position " + str(pos) + ": layer " + str(layer) + " holds " +
                                str(have) + " positions, so pos must be in [0, " + str(have) + "]");
  if (pos + m > n_ctx_)
    throw std::invalid_argument("KV cache full: appending " + str(m) + " positions at " + str(pos) +
                                " needs " + str(pos + m) + ", capacity is n_ctx=" + str(n_ctx_));
  const F32ToF16Fn to_f16 = kernels().f32_to_f16;
  const size_t row_bytes = static_cast<size_t>(head_dim_) * elem_size();
  const int64_t end = pos + m, block_elems = head_dim_ * kKeyBlock;
  // Blocks below `full` are complete after this append; block `full` (if it holds any
  // positions) is the partial one, row-major. pos's block changes layout, with the positions
  // before pos in it, when this append fills it or writes into it from inside a complete one.
  const int64_t full = end / kKeyBlock, b = pos / kKeyBlock;
  const bool was_rows = b >= have / kKeyBlock, now_rows = b >= full;
  const bool move = pos % kKeyBlock != 0 && was_rows != now_rows;
  std::vector<fp16_t> kh(type_ == KV_F16 ? static_cast<size_t>(head_dim_) : 0);
  for (int64_t h = 0; h < n_head_kv_; ++h) {
    uint8_t* kd = k_.get() + k_offset(layer, h);
    uint8_t* vd = v_.get() + v_offset(layer, h);
    if (move && type_ == KV_F16)
      relayout_keys(reinterpret_cast<fp16_t*>(kd) + b * block_elems, pos % kKeyBlock, head_dim_, now_rows);
    else if (move)
      relayout_keys(reinterpret_cast<float*>(kd) + b * block_elems, pos % kKeyBlock, head_dim_, now_rows);
    for (int64_t t = 0; t < m; ++t) {
      const float* ks = k + t * k_stride + h * head_dim_;
      const float* vs = v + t * v_stride + h * head_dim_;
      const int64_t p = pos + t;
      const bool rows = p / kKeyBlock >= full;
      uint8_t* vr = vd + static_cast<size_t>(p) * row_bytes;
      if (type_ == KV_F16) {
        to_f16(ks, kh.data(), head_dim_);
        put_key(reinterpret_cast<fp16_t*>(kd), p, kh.data(), head_dim_, rows);
        to_f16(vs, reinterpret_cast<fp16_t*>(vr), head_dim_);
      } else {
        put_key(reinterpret_cast<float*>(kd), p, ks, head_dim_, rows);
        std::memcpy(vr, vs, row_bytes);
      }
    }
  }
  n_pos_[static_cast<size_t>(layer)] = end;
}

void KVCache::copy_keys(int64_t layer, void* dst) const {
  check_layer(layer);
  const size_t es = elem_size();
  const int64_t partial = n_pos_[static_cast<size_t>(layer)] / kKeyBlock;
  for (int64_t h = 0; h < n_head_kv_; ++h) {
    const uint8_t* kd = k_.get() + k_offset(layer, h);
    uint8_t* out = static_cast<uint8_t*>(dst) + static_cast<size_t>(h * n_ctx_ * head_dim_) * es;
    for (int64_t p = 0; p < n_ctx_; ++p)
      for (int64_t d = 0; d < head_dim_; ++d)
        std::memcpy(out + static_cast<size_t>(p * head_dim_ + d) * es,
                    kd + static_cast<size_t>(key_at(p, d, head_dim_, p / kKeyBlock == partial)) * es, es);
  }
}

void attention_check(const AttentionArgs& a) {
  const KVCache& c = *a.cache;
  const int64_t have = c.n_pos(a.layer);  // checks the layer
  if (a.n_head < 1 || a.n_head % c.n_head_kv() != 0)
    throw std::invalid_argument("n_head=" + str(a.n_head) +
                                " must be a positive multiple of the cache's n_head_kv=" + str(c.n_head_kv()));
  if (a.n_q < 1) throw std::invalid_argument("attention needs at least one query row");
  if (a.pos < 0 || a.pos + a.n_q > have)
    throw std::invalid_argument("queries at positions " + str(a.pos) + ".." + str(a.pos + a.n_q - 1) +
                                " need them in the cache, whose layer " + str(a.layer) + " holds " + str(have) +
                                " positions: append K and V first");
  if (a.window < 0) throw std::invalid_argument("window must be >= 0");
  if (!std::isfinite(a.scale)) throw std::invalid_argument("scale must be finite");
}

int64_t attention_rows(const AttentionArgs& a) {
  // A register group of the kernels holds up to four queries sharing each K and V load: with
  // three or more query heads per KV head one row's heads fill it; with fewer (a KV head per
  // query head: plain multi-head attention), consecutive rows fill it, else every load would
  // feed one or two multiply-adds and the kernels would wait on the L2 cache.
  const int64_t group = a.n_head / a.cache->n_head_kv();
  return group >= 3 ? 1 : 4 / group;
}

int64_t attention_items(const AttentionArgs& a) {
  const int64_t rows = attention_rows(a);
  return (a.n_q + rows - 1) / rows * a.n_head;
}

void attention_range(const AttentionArgs& a, int64_t begin, int64_t end, float* scratch) {
  const KVCache& c = *a.cache;
  const int64_t hd = c.head_dim();
  const int64_t group = a.n_head / c.n_head_kv(), tile_rows = attention_rows(a);
  const int64_t partial = c.n_pos(a.layer) / kKeyBlock;  // the row-major block, if any
  const size_t block_bytes = static_cast<size_t>(hd * kKeyBlock) * c.elem_size();
  const AttnFn attn = kernels().attention[c.type()];
  AttnTile tile{};
  tile.q_stride = a.q_stride;
  tile.out_stride = a.out_stride;
  tile.window = a.window;
  tile.head_dim = hd;
  tile.scale = a.scale;
  tile.scores = scratch + hd * kKeyBlock;  // after room for one transposed key block
  for (int64_t item = begin; item < end;) {
    const int64_t row0 = item / a.n_head * tile_rows, h = item % a.n_head, g = h / group;
    // Heads h..h+n-1: the rest of h's group within the range, in one call.
    const int64_t group_end = (g + 1) * group, range_end = end - item / a.n_head * a.n_head;
    tile.n_heads = (group_end < range_end ? group_end : range_end) - h;
    tile.n_rows = a.n_q - row0 < tile_rows ? a.n_q - row0 : tile_rows;
    tile.q = a.q + row0 * a.q_stride + h * hd;
    tile.out = a.out + row0 * a.out_stride + h * hd;
    tile.last = a.pos + row0;  // row 0's own position: it sees keys up to there
    const int64_t last = tile.last + tile.n_rows - 1;
    tile.k = c.k(a.layer, g);
    tile.k_last = static_cast<const uint8_t*>(tile.k) + static_cast<size_t>(last / kKeyBlock) * block_bytes;
    if (last / kKeyBlock == partial) {
      // The kernels read blocks transposed: the tile's rows of the partial block, in scratch.
      const int64_t rows = last % kKeyBlock + 1;
      if (c.type() == KV_F16)
        transpose_keys(static_cast<const fp16_t*>(tile.k_last), rows, hd, reinterpret_cast<fp16_t*>(scratch));
      else
        transpose_keys(static_cast<const float*>(tile.k_last), rows, hd, scratch);
      tile.k_last = scratch;
    }
    tile.v = c.v(a.layer, g);
    attn(tile);
    item += tile.n_heads;
  }
}

int64_t attention_scratch(const AttentionArgs& a) {
  const int64_t group = a.n_head / a.cache->n_head_kv();
  return a.cache->head_dim() * kKeyBlock + attention_rows(a) * group * attn_span(0, a.pos + a.n_q - 1);
}

int64_t attention_chunk(int64_t n_items, int64_t group, int n_threads) {
  if (n_threads < 1) n_threads = 1;
  // Whole groups, handed out on demand, when there are enough of them to even out the threads'
  // loads (prefill rows cost more the later they are); otherwise (a decode step over few KV
  // heads) one even share per thread, cutting groups where it must.
  if (n_items / group >= 4 * static_cast<int64_t>(n_threads)) return group;
  return (n_items + n_threads - 1) / n_threads;
}

void attention(const AttentionArgs& a, int n_threads) {
  attention_check(a);
  const int64_t n_items = attention_items(a);
  const int64_t n_scratch = attention_scratch(a);
  if (n_threads < 1) n_threads = 1;
  // Scratch per thread; each query's result does not depend on its tile (AttnFn), so any
  // split of the items over threads gives the same bits.
  std::vector<float> scratch(static_cast<size_t>(n_scratch) * static_cast<size_t>(n_threads));
  const int64_t chunk = attention_chunk(n_items, a.n_head / a.cache->n_head_kv(), n_threads);
  parallel_for(n_threads, n_items, chunk, [&](int64_t begin, int64_t end, int tid) {
    attention_range(a, begin, end, scratch.data() + static_cast<size_t>(tid) * n_scratch);
  });
}

}  // namespace pyinfer
