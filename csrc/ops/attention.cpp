// attention.cpp: the attention driver: tiles of query rows and heads handed to the per-ISA
// attention kernels over the thread pool (portable code: compiled with no ISA flags).
#include "ops/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/dispatch.h"
#include "runtime/threadpool.h"

namespace pyinfer {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// The tile of rows row0..row0 + n_rows - 1 and heads h..h + n_heads - 1 (all of one KV head),
// all but its scores. The kernels read key blocks transposed: when the tile's last block is
// the cache's row-major partial one, its rows are transposed into room (head_dim * kKeyBlock
// elements).
AttnTile tile_for(const AttentionArgs& a, int64_t row0, int64_t n_rows, int64_t h, int64_t n_heads, float* room) {
  const KVCache& c = *a.cache;
  const int64_t hd = c.head_dim(), g = h / (a.n_head / c.n_head_kv());
  AttnTile t{};
  t.q_stride = a.q_stride;
  t.out_stride = a.out_stride;
  t.n_rows = n_rows;
  t.n_heads = n_heads;
  t.last = a.pos + row0;  // row 0's own position: it sees keys up to there
  t.window = a.window;
  t.head_dim = hd;
  t.k_scale_stride = c.k_scale_stride();
  t.scale = a.scale;
  // One query row in the call (a decode step), its heads one register group: each key and value
  // is read once. Prefill's later rows, or a second group, read them again.
  t.reads_once = a.n_q == 1 && n_heads <= kAttnGroupQueries;
  t.q = a.q + row0 * a.q_stride + h * hd;
  t.out = a.out + row0 * a.out_stride + h * hd;
  const int64_t last = t.last + n_rows - 1;
  const size_t block_bytes = static_cast<size_t>(hd * kKeyBlock) * c.elem_size();
  t.k = c.k(a.layer, g);
  t.k_last = static_cast<const uint8_t*>(t.k) + static_cast<size_t>(last / kKeyBlock) * block_bytes;
  if (last / kKeyBlock == c.n_pos(a.layer) / kKeyBlock) {
    with_kv_elem(c.type(), [&](auto e) {
      using T = decltype(e);
      transpose_keys(static_cast<const T*>(t.k_last), last % kKeyBlock + 1, hd, reinterpret_cast<T*>(room));
    });
    t.k_last = room;
  }
  t.v = c.v(a.layer, g);
  t.k_scale = c.k_scale(a.layer, g);
  t.v_scale = c.v_scale(a.layer, g);
  return t;
}

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
  const int64_t group = a.n_head / a.cache->n_head_kv(), tile_rows = attention_rows(a);
  const AttnFn attn = kernels().attention[a.cache->type()];
  for (int64_t item = begin; item < end;) {
    const int64_t row0 = item / a.n_head * tile_rows, h = item % a.n_head, g = h / group;
    // Heads h..h+n-1: the rest of h's group within the range, in one call.
    const int64_t group_end = (g + 1) * group, range_end = end - item / a.n_head * a.n_head;
    const int64_t n_heads = (group_end < range_end ? group_end : range_end) - h;
    const int64_t n_rows = a.n_q - row0 < tile_rows ? a.n_q - row0 : tile_rows;
    AttnTile tile = tile_for(a, row0, n_rows, h, n_heads, scratch);
    tile.scores = scratch + a.cache->head_dim() * kKeyBlock;  // after room for one transposed key block
    attn(tile);
    item += n_heads;
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

namespace {

// The fewest positions a decode step needs to be split by steps, and the least and most key
// blocks a piece of the score step takes (256 and 1,024 positions).
constexpr int64_t kStepsMinPositions = 512;
constexpr int64_t kStepBlocksMin = 16, kStepBlocksMax = 64;

// The first position a decode step's query at a.pos sees (attn_first of its tile).
int64_t steps_first(const AttentionArgs& a) {
  AttnTile t{};
  t.last = a.pos;
  t.window = a.window;
  return attn_first(t, 0);
}

// One query row over one tile per KV head, its heads sharing the tile, in the kernels' three
// steps, spread over the pool in pieces: the scores by runs of key blocks, the softmax by KV
// head, the weighted values by 128-byte runs of each value row. Every thread reads a share of
// the keys and values instead of whole KV heads, so the threads stay even when there are
// fewer KV heads than threads or they do not divide evenly. The pieces are handed out in one
// job, in an order that lets a head's softmax and values start while the next head's scores
// are still being taken (scores 0, scores 1, head 0's softmax and values, scores 2, head 1's,
// ...): where each head's values make one piece, three heads over two threads would otherwise
// leave one thread idle through one head's values. A piece that needs another's result waits
// for it, and only on pieces handed out before it, so the earliest unfinished piece never
// waits: the job ends even when the caller runs every piece alone. A thread held up inside a
// score piece (its core busy elsewhere) holds the others at its head's softmax. The steps
// compute what the one-call kernel computes, query by query, so the bits are the same.
void attention_by_steps(const AttentionArgs& a, int n_threads, const AttnSteps& steps) {
  const KVCache& c = *a.cache;
  const int64_t hd = c.head_dim(), n_kv = c.n_head_kv(), group = a.n_head / n_kv;
  const int64_t first = steps_first(a), b0 = first / kKeyBlock, b1 = a.pos / kKeyBlock;
  const int64_t ls = attn_span(first, a.pos);
  // Per KV head: its queries' scores, their 1 / sums, room for the last key block transposed.
  const int64_t per_head = group * ls + group + hd * kKeyBlock;
  const std::unique_ptr<float[]> buf(new float[static_cast<size_t>(n_kv * per_head)]);  // not zeroed: all written first
  std::vector<AttnTile> tiles;
  tiles.reserve(static_cast<size_t>(n_kv));
  for (int64_t g = 0; g < n_kv; ++g) {
    float* mine = buf.get() + g * per_head;
    tiles.push_back(tile_for(a, 0, 1, g * group, group, mine + group * ls + group));
    tiles.back().scores = mine;
  }
  const auto inv = [&](int64_t g) { return buf.get() + g * per_head + group * ls; };
  // About four pieces of scores per thread, and the values in runs of 128 bytes of each row
  // (two lines, which the L2's pair prefetcher fetches together anyway: runs of one line were
  // slower than none).
  const int64_t n_blocks = b1 - b0 + 1;
  const int64_t piece = std::clamp<int64_t>(n_blocks * n_kv / (4 * n_threads), kStepBlocksMin, kStepBlocksMax);
  const int64_t n_pieces = (n_blocks + piece - 1) / piece;
  const int64_t run = 128 / static_cast<int64_t>(c.elem_size()), n_runs = (hd + run - 1) / run;
  // The pieces in the order they are handed out: step, KV head, index within the head's step.
  enum class Step : uint8_t { scores, softmax, values };
  struct Item {
    Step step;
    int64_t g, i;
  };
  std::vector<Item> order;
  order.reserve(static_cast<size_t>(n_kv * (n_pieces + 1 + n_runs)));
  const auto softmax_and_values = [&](int64_t g) {
    order.push_back({Step::softmax, g, 0});
    for (int64_t r = 0; r < n_runs; ++r) order.push_back({Step::values, g, r});
  };
  for (int64_t g = 0; g < n_kv; ++g) {
    for (int64_t i = 0; i < n_pieces; ++i) order.push_back({Step::scores, g, i});
    if (g > 0) softmax_and_values(g - 1);
  }
  softmax_and_values(n_kv - 1);
  // Per KV head: score pieces done, then 1 more once its softmax is.
  std::vector<std::atomic<int64_t>> done(static_cast<size_t>(n_kv));
  parallel_for(n_threads, static_cast<int64_t>(order.size()), 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t k = begin; k < end; ++k) {
      const Item it = order[static_cast<size_t>(k)];
      const AttnTile& t = tiles[static_cast<size_t>(it.g)];
      std::atomic<int64_t>& head_done = done[static_cast<size_t>(it.g)];
      if (it.step == Step::scores) {
        const int64_t bs = b0 + it.i * piece, be = std::min(bs + piece, b1 + 1);
        steps.scores(t, bs, be);
      } else if (it.step == Step::softmax) {
        pool_wait_for(head_done, n_pieces);
        steps.softmax(t, inv(it.g));
      } else {
        pool_wait_for(head_done, n_pieces + 1);
        const int64_t c0 = it.i * run;
        steps.weigh(t, inv(it.g), c0, std::min(c0 + run, hd));
        continue;
      }
      head_done.fetch_add(1, std::memory_order_release);
    }
  });
}

}  // namespace

void attention(const AttentionArgs& a, int n_threads) {
  attention_check(a);
  const AttnSteps& steps = kernels().attention_steps[a.cache->type()];
  if (n_threads > 1 && a.n_q == 1 && steps.scores != nullptr && a.pos + 1 - steps_first(a) >= kStepsMinPositions) {
    attention_by_steps(a, n_threads, steps);
    return;
  }
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
