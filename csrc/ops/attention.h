// attention.h: causal grouped-query attention of M new queries against a KV cache, split into
// tiles and work items over the thread pool and the active ISA's attention kernel.
#pragma once
#include <cstdint>

#include "ops/kv_cache.h"

namespace pyinfer {

// Causal grouped-query attention of n_q new queries at positions pos..pos+n_q-1, which the
// cache's layer already holds. Query head h reads KV head h / (n_head / n_head_kv); query t
// sees positions 0..pos+t, or the last `window` of them when window > 0.
struct AttentionArgs {
  const float* q;  // [n_q][q_stride], head h at h * head_dim
  int64_t q_stride;
  float* out;  // [n_q][out_stride], same head layout as q
  int64_t out_stride;
  const KVCache* cache;
  int64_t layer;
  int64_t pos;
  int64_t n_q;
  int64_t n_head;
  float scale;     // usually 1 / sqrt(head_dim)
  int64_t window;  // 0: full causal attention
};

// Checks the arguments against the cache; throws std::invalid_argument.
void attention_check(const AttentionArgs& a);
// Query rows per tile: 1, or a few when a KV head has fewer than three query heads.
int64_t attention_rows(const AttentionArgs& a);
// Work items are (tile of attention_rows(a) query rows, head h) pairs numbered
// tile * n_head + h; there are attention_items(a) of them.
int64_t attention_items(const AttentionArgs& a);
// Computes items [begin, end) with the active ISA's kernel, one call per run of heads that
// share a KV head, so that they share each load of K and V. scratch: attention_scratch(a) floats.
void attention_range(const AttentionArgs& a, int64_t begin, int64_t end, float* scratch);
// Scratch floats attention_range needs: the scores, and room to transpose a partial key block.
int64_t attention_scratch(const AttentionArgs& a);
// The parallel_for chunk for n_items items in runs of `group` heads sharing a KV head.
int64_t attention_chunk(int64_t n_items, int64_t group, int n_threads);
// All items, split into chunks over n_threads threads (results do not depend on the split).
void attention(const AttentionArgs& a, int n_threads);

}  // namespace pyinfer
