// kv_cache.cpp: the KV cache's storage, append and key read-out (portable code: compiled
// with no ISA flags).
#include "ops/kv_cache.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "runtime/checked.h"
#include "runtime/dispatch.h"
#include "runtime/huge_pages.h"

namespace pyinfer {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Zeroed memory that becomes resident only as it is written. On Linux an array of 2 MiB or
// more (keys, values, and a long q8_0 cache's scales) goes on huge pages: attention streams
// them whole on every decode step, and over 4 KiB pages it stalled on the page walks
// (docs/tuning.md, "the KV cache on huge pages"). A cache's regions of one (layer, KV head) are
// shorter than a huge page for all but long contexts, so after its first position most of such a
// cache is resident, as if allocated up front (as the serving engine's memory budget already
// counts it). Smaller arrays, and every array elsewhere, come from calloc.
uint8_t* zeroed(size_t n, const char* what) {
#if defined(__linux__)
  if (n >= kHugePage) return huge_page_alloc(n, true, what);
#endif
  void* p = std::calloc(n == 0 ? 1 : n, 1);
  if (p == nullptr) throw AllocationError(n, what);
  return static_cast<uint8_t*>(p);
}

// Offset, in elements, of element d of position p's key in its (layer, head) region: in
// block p / kKeyBlock, at (d, p % kKeyBlock) when the block is complete, or row-major at
// (p % kKeyBlock, d) while it is the partial one.
inline int64_t key_at(int64_t p, int64_t d, int64_t hd, bool row_major) {
  const int64_t block = p / kKeyBlock * hd * kKeyBlock, r = p % kKeyBlock;
  return block + (row_major ? r * hd + d : d * kKeyBlock + r);
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

// Q8_0: x[n] (n a multiple of kKvQ8Chunk) as int8 q[n] and one scale per chunk of
// kKvQ8Chunk, chunk c's at s[c * s_stride]: s = max |x| / 127, q = x / s rounded to nearest
// (ties to even), so |q| <= 127. A chunk with a NaN or an infinity gets the scale NaN (and
// q = 0): it reads back as NaN, as the float caches would carry it.
void quantize_q8(const float* x, int64_t n, int8_t* q, float* s, int64_t s_stride) {
  for (int64_t c = 0; c * kKvQ8Chunk < n; ++c) {
    const float* xc = x + c * kKvQ8Chunk;
    int8_t* qc = q + c * kKvQ8Chunk;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < kKvQ8Chunk; ++i) {
      finite = finite && std::isfinite(xc[i]);
      amax = std::fabs(xc[i]) > amax ? std::fabs(xc[i]) : amax;
    }
    const float d = finite ? amax / 127.0f : NAN;
    const float id = finite && d > 0.0f ? 1.0f / d : 0.0f;
    for (int64_t i = 0; i < kKvQ8Chunk; ++i) {
      float r = std::nearbyint(xc[i] * id);  // |x * id| <= 127 up to rounding: clamp
      r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
      qc[i] = finite ? static_cast<int8_t>(r) : int8_t{0};
    }
    s[c * s_stride] = d;
  }
}

float* zeroed_floats(size_t n_bytes, const char* what) { return reinterpret_cast<float*>(zeroed(n_bytes, what)); }

}  // namespace

void KVCache::FreeDeleter::operator()(void* p) const { std::free(p); }

KVCache::KVCache(int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t n_ctx, KvType type)
    : n_layer_(n_layer), n_head_kv_(n_head_kv), head_dim_(head_dim), n_ctx_(n_ctx), type_(type) {
  if (n_layer < 1 || n_head_kv < 1 || head_dim < 1 || n_ctx < 1)
    throw std::invalid_argument("KVCache needs n_layer, n_head_kv, head_dim and n_ctx >= 1; got " + str(n_layer) +
                                ", " + str(n_head_kv) + ", " + str(head_dim) + ", " + str(n_ctx));
  if (type != KV_F32 && type != KV_F16 && type != KV_Q8_0) throw std::invalid_argument("KVCache: unknown element type");
  // Its scores take the query in int16 per chunk, held beside the kernels (kernels/kv_query.h).
  if (type == KV_Q8_0 && (head_dim % kKvQ8Chunk != 0 || head_dim > kRopeMaxDim))
    throw std::invalid_argument("a Q8_0 KV cache needs head_dim a multiple of " + str(kKvQ8Chunk) + " and at most " +
                                str(kRopeMaxDim) + "; got " + str(head_dim));
  // Both sizes checked before either is allocated; K's rounds n_ctx up to whole blocks.
  const auto es = static_cast<int64_t>(elem_size());
  const int64_t v_bytes =
      checked_product({n_layer, n_head_kv, head_dim, n_ctx, es},
                      "KV cache bytes of V (n_layer * n_head_kv * head_dim * n_ctx * element size)");
  const int64_t k_bytes = checked_product(
      {n_layer, n_head_kv, checked_round_up(n_ctx, kKeyBlock, "KV cache positions rounded to key blocks"), head_dim,
       es},
      "KV cache bytes of K (n_layer * n_head_kv * n_ctx in whole key blocks * head_dim * element size)");
  const int64_t kv_bytes = checked_add(k_bytes, v_bytes, "KV cache bytes (K + V)");
  int64_t ks_bytes = 0, vs_bytes = 0;
  if (type == KV_Q8_0) {  // a float scale per kKvQ8Chunk one-byte elements
    vs_bytes = v_bytes / kKvQ8Chunk * static_cast<int64_t>(sizeof(float));
    ks_bytes = k_bytes / kKvQ8Chunk * static_cast<int64_t>(sizeof(float));
    checked_add(kv_bytes, ks_bytes + vs_bytes, "KV cache bytes (K + V and their scales)");
  }
  bytes_ = to_size(v_bytes, "KV cache bytes of V");
  scale_bytes_ = to_size(vs_bytes, "KV cache bytes of V's scales");
  k_.reset(zeroed(to_size(k_bytes, "KV cache bytes of K"), "the KV cache's keys"));
  v_.reset(zeroed(bytes_, "the KV cache's values"));
  if (type == KV_Q8_0) {
    ks_.reset(zeroed_floats(to_size(ks_bytes, "KV cache bytes of K's scales"), "the KV cache's key scales"));
    vs_.reset(zeroed_floats(scale_bytes_, "the KV cache's value scales"));
  }
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

void KVCache::append(int64_t layer, const float* k, int64_t k_stride, const float* v, int64_t v_stride, int64_t pos,
                     int64_t m) {
  check_layer(layer);
  const int64_t have = n_pos_[static_cast<size_t>(layer)];
  if (m < 0) throw std::invalid_argument("append: negative number of positions");
  if (pos < 0 || pos > have)
    throw std::invalid_argument("append at position " + str(pos) + ": layer " + str(layer) + " holds " + str(have) +
                                " positions, so pos must be in [0, " + str(have) + "]");
  if (pos + m > n_ctx_)
    throw std::invalid_argument("KV cache full: appending " + str(m) + " positions at " + str(pos) + " needs " +
                                str(pos + m) + ", capacity is n_ctx=" + str(n_ctx_));
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
  std::vector<int8_t> k8(type_ == KV_Q8_0 ? static_cast<size_t>(head_dim_) : 0);
  const int64_t nc = head_dim_ / kKvQ8Chunk;
  for (int64_t h = 0; h < n_head_kv_; ++h) {
    uint8_t* kd = k_.get() + k_offset(layer, h);
    uint8_t* vd = v_.get() + v_offset(layer, h);
    if (move)
      with_kv_elem(type_, [&](auto e) {
        using T = decltype(e);
        relayout_keys(reinterpret_cast<T*>(kd) + b * block_elems, pos % kKeyBlock, head_dim_, now_rows);
      });
    float* kscale = type_ == KV_Q8_0 ? ks_.get() + scale_offset(layer, h, k_scale_stride()) : nullptr;
    float* vscale = type_ == KV_Q8_0 ? vs_.get() + scale_offset(layer, h, n_ctx_) : nullptr;
    for (int64_t t = 0; t < m; ++t) {
      const float* ks = k + t * k_stride + h * head_dim_;
      const float* vs = v + t * v_stride + h * head_dim_;
      const int64_t p = pos + t;
      const bool rows = p / kKeyBlock >= full;
      uint8_t* vr = vd + static_cast<size_t>(p) * row_bytes;
      if (type_ == KV_Q8_0) {
        quantize_q8(ks, head_dim_, k8.data(), kscale + p, k_scale_stride());
        put_key(reinterpret_cast<int8_t*>(kd), p, k8.data(), head_dim_, rows);
        quantize_q8(vs, head_dim_, reinterpret_cast<int8_t*>(vr), vscale + p * nc, 1);
      } else if (type_ == KV_F16) {
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

void KVCache::dequantize_q8(int64_t layer, bool values, float* dst) const {
  check_layer(layer);
  if (type_ != KV_Q8_0) throw std::invalid_argument("dequantize_q8: the cache is not Q8_0");
  const int64_t per_head = n_ctx_ * head_dim_, nc = head_dim_ / kKvQ8Chunk;
  std::vector<int8_t> keys;
  if (!values) {
    keys.resize(static_cast<size_t>(n_head_kv_ * per_head));
    copy_keys(layer, keys.data());
  }
  for (int64_t h = 0; h < n_head_kv_; ++h) {
    const int8_t* src =
        values ? reinterpret_cast<const int8_t*>(v_.get() + v_offset(layer, h)) : keys.data() + h * per_head;
    const float* sc = values ? v_scale(layer, h) : k_scale(layer, h);
    float* out = dst + h * per_head;
    for (int64_t p = 0; p < n_ctx_; ++p)
      for (int64_t c = 0; c < nc; ++c) {
        const float s = values ? sc[p * nc + c] : sc[c * k_scale_stride() + p];
        for (int64_t i = c * kKvQ8Chunk; i < (c + 1) * kKvQ8Chunk; ++i)
          out[p * head_dim_ + i] = static_cast<float>(src[p * head_dim_ + i]) * s;
      }
  }
}

void KVCache::copy_prefix(const KVCache& src, int64_t n) {
  if (src.n_layer_ != n_layer_ || src.n_head_kv_ != n_head_kv_ || src.head_dim_ != head_dim_ || src.type_ != type_)
    throw std::invalid_argument("copy_prefix: the source cache has another shape or element type");
  if (n < 0 || n > n_ctx_)
    throw std::invalid_argument("copy_prefix: " + str(n) + " positions do not fit n_ctx=" + str(n_ctx_));
  for (int64_t il = 0; il < n_layer_; ++il)
    if (src.n_pos(il) < n)
      throw std::invalid_argument("copy_prefix: layer " + str(il) + " of the source holds " + str(src.n_pos(il)) +
                                  " positions, fewer than " + str(n));
  if (&src == this) return;  // the positions are there; the sequence forgets the later ones
  const size_t es = elem_size();
  const int64_t full = n / kKeyBlock, rest = n % kKeyBlock, block_elems = head_dim_ * kKeyBlock;
  for (int64_t il = 0; il < n_layer_; ++il) {
    // The source's block `full` is row-major while it is its partial block, else complete
    // (transposed); here it becomes this cache's partial block, row-major.
    const bool src_rows = full >= src.n_pos_[static_cast<size_t>(il)] / kKeyBlock;
    for (int64_t h = 0; h < n_head_kv_; ++h) {
      const uint8_t* sk = src.k_.get() + src.k_offset(il, h);
      uint8_t* dk = k_.get() + k_offset(il, h);
      std::memcpy(v_.get() + v_offset(il, h), src.v_.get() + src.v_offset(il, h),
                  static_cast<size_t>(n * head_dim_) * es);
      std::memcpy(dk, sk, static_cast<size_t>(full * block_elems) * es);
      if (type_ == KV_Q8_0) {
        const int64_t nc = head_dim_ / kKvQ8Chunk;
        std::memcpy(vs_.get() + scale_offset(il, h, n_ctx_), src.v_scale(il, h),
                    static_cast<size_t>(n * nc) * sizeof(float));
        for (int64_t c = 0; c < nc; ++c)  // the strides differ where the two n_ctx do
          std::memcpy(ks_.get() + scale_offset(il, h, k_scale_stride()) + c * k_scale_stride(),
                      src.k_scale(il, h) + c * src.k_scale_stride(), static_cast<size_t>(n) * sizeof(float));
      }
      const uint8_t* sb = sk + static_cast<size_t>(full * block_elems) * es;
      uint8_t* db = dk + static_cast<size_t>(full * block_elems) * es;
      if (src_rows) {
        std::memcpy(db, sb, static_cast<size_t>(rest * head_dim_) * es);
        continue;
      }
      for (int64_t r = 0; r < rest; ++r)
        for (int64_t d = 0; d < head_dim_; ++d)
          std::memcpy(db + static_cast<size_t>(r * head_dim_ + d) * es,
                      sb + static_cast<size_t>(d * kKeyBlock + r) * es, es);
    }
  }
  n_pos_.assign(n_pos_.size(), n);
}

}  // namespace pyinfer
