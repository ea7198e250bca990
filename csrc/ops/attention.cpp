// attention.cpp: the attention driver: tiles of query rows and heads handed to the per-ISA
// attention kernels over the thread pool (portable code: compiled with no ISA flags).
#include "ops/attention.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/dispatch.h"
#include "runtime/threadpool.h"

namespace pyinfer {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

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
  tile.k_scale_stride = c.k_scale_stride();
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
      with_kv_elem(c.type(), [&](auto e) {
        using T = decltype(e);
        transpose_keys(static_cast<const T*>(tile.k_last), rows, hd, reinterpret_cast<T*>(scratch));
      });
      tile.k_last = scratch;
    }
    tile.v = c.v(a.layer, g);
    tile.k_scale = c.k_scale(a.layer, g);
    tile.v_scale = c.v_scale(a.layer, g);
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
