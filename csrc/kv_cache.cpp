// kv_cache.cpp: the KV cache's storage and append, and the attention driver over the
// per-ISA row kernels (portable code: compiled with no ISA flags).
#include "kv_cache.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "threadpool.h"

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
  k_.reset(zeroed(bytes_));
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
  for (int64_t h = 0; h < n_head_kv_; ++h) {
    uint8_t* kd = k_.get() + block_offset(layer, h);
    uint8_t* vd = v_.get() + block_offset(layer, h);
    for (int64_t t = 0; t < m; ++t) {
      const float* ks = k + t * k_stride + h * head_dim_;
      const float* vs = v + t * v_stride + h * head_dim_;
      uint8_t* kr = kd + static_cast<size_t>(pos + t) * row_bytes;
      uint8_t* vr = vd + static_cast<size_t>(pos + t) * row_bytes;
      if (type_ == KV_F16) {
        to_f16(ks, reinterpret_cast<fp16_t*>(kr), head_dim_);
        to_f16(vs, reinterpret_cast<fp16_t*>(vr), head_dim_);
      } else {
        std::memcpy(kr, ks, row_bytes);
        std::memcpy(vr, vs, row_bytes);
      }
    }
  }
  n_pos_[static_cast<size_t>(layer)] = pos + m;
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

void attention_range(const AttentionArgs& a, int64_t begin, int64_t end, float* scores) {
  const KVCache& c = *a.cache;
  const int64_t hd = c.head_dim();
  const int64_t group = a.n_head / c.n_head_kv();
  const size_t row_bytes = static_cast<size_t>(hd) * c.elem_size();
  const AttnRowFn row = kernels().attn_row[c.type()];
  for (int64_t item = begin; item < end; ++item) {
    const int64_t t = item / a.n_head, h = item % a.n_head, g = h / group;
    const int64_t last = a.pos + t;  // the query's own position: keys 0..last
    const int64_t first = a.window > 0 && last + 1 > a.window ? last + 1 - a.window : 0;
    const auto* k = static_cast<const uint8_t*>(c.k(a.layer, g)) + static_cast<size_t>(first) * row_bytes;
    const auto* v = static_cast<const uint8_t*>(c.v(a.layer, g)) + static_cast<size_t>(first) * row_bytes;
    row(a.q + t * a.q_stride + h * hd, k, v, last + 1 - first, hd, a.scale, scores,
        a.out + t * a.out_stride + h * hd);
  }
}

void attention(const AttentionArgs& a, int n_threads) {
  attention_check(a);
  const int64_t n_items = a.n_q * a.n_head;
  const int64_t n_scores = a.pos + a.n_q;
  if (n_threads < 1) n_threads = 1;
  // One scratch row of scores per thread; each item is computed alone, so any split of the
  // items over threads gives the same bits.
  std::vector<float> scratch(static_cast<size_t>(n_scores) * static_cast<size_t>(n_threads));
  parallel_for(n_threads, n_items, 1, [&](int64_t begin, int64_t end, int tid) {
    attention_range(a, begin, end, scratch.data() + static_cast<size_t>(tid) * n_scores);
  });
}

}  // namespace pyinfer
