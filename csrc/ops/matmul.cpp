// matmul.cpp: splits a matmul over the thread pool and feeds the active ISA's row kernels.
#include "ops/matmul.h"

#include <array>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cstring>

#include "kernels/packed16.h"
#include "runtime/checked.h"
#include "runtime/dispatch.h"
#include "runtime/threadpool.h"

namespace pyinfer {
namespace {

// Rows of W per scheduling unit: a multiple of every kernel's row tile, so row groups (and
// with them every bit of the result) are the same whatever the thread count.
constexpr int64_t kRowGrain = 16;
// Activation rows per kernel call: the quantized (or float) rows of one call stay in L2
// while a thread's rows of W stream past them.
constexpr int64_t kRowsM = 64;
// Rows of a quantized W dequantized at a time in exact mode (16 x K floats of scratch).
constexpr int64_t kDequantRows = 16;
// From this many activation rows on, exact mode multiplies a quantized W through rows
// dequantized into scratch even where the ISA has an exact kernel for its type: that kernel
// dequantizes in registers, again for each tile of activation rows. Both take the dequant
// kernels' values, so the results are the same (NaN outputs in the same places; the multiply-
// adds' operand order, the compiler's, may pick another NaN operand's sign and payload).
constexpr int64_t kExactDequantMinM = 3;

// The kernel for float32 rows against M activation rows: the GEMM's tiling from
// kExactDequantMinM rows on, the same values either way.
MatmulExactFn f32_rows_kernel(const KernelTable& kt, int64_t M) {
  return M >= kExactDequantMinM ? kt.matmul_exact_f32_many : kt.matmul_exact[GGML_F32];
}

// y = x[M, K] @ W^T for n_rows rows of a quantized W (as stored), kDequantRows rows at a time
// dequantized (the same kernels as pyinfer.dequantize, so exactly pyinfer.quants.dequantize's
// values) and multiplied as float32 rows; each group of rows serves all M activation rows.
// The type has a dequant kernel (matmul_part_kernel's promise for both kinds that come here,
// and every packable type's).
void exact_dequantized(const KernelTable& kt, uint32_t w_type, const uint8_t* w, int64_t row_bytes, const float* x,
                       int64_t M, int64_t K, int64_t n_rows, float* y, int64_t ldy) {
  const DequantRowFn dq = kt.dequant_row[w_type];
  const MatmulExactFn f32 = f32_rows_kernel(kt, M);
  thread_local std::vector<float> rows;  // [kDequantRows, K], kept for the thread's next call
  rows.resize(static_cast<size_t>(kDequantRows * K));
  for (int64_t r0 = 0; r0 < n_rows; r0 += kDequantRows) {
    const int64_t nr = n_rows - r0 < kDequantRows ? n_rows - r0 : kDequantRows;
    for (int64_t r = 0; r < nr; ++r) dq(w + (r0 + r) * row_bytes, rows.data() + r * K, K);
    f32(rows.data(), K * static_cast<int64_t>(sizeof(float)), x, M, K, nr, y + r0, ldy);
  }
}

// W's rows per chunk: one contiguous share per thread, since every new run of rows a thread
// starts costs a ramp-up of the hardware prefetchers and a cold first group (measured:
// docs/tuning.md, "one contiguous row share per thread"). Where the activations come in
// several blocks of kRowsM rows, each block passes over the chunk, so the chunk is also capped
// to stay in L2 meanwhile (kChunkBytes of W).
constexpr int64_t kChunkBytes = int64_t{512} << 10;
int64_t row_chunk(int64_t N, int n_threads, int64_t M, int64_t row_bytes) {
  int64_t c = (N + n_threads - 1) / n_threads;
  if (M > kRowsM && c * row_bytes > kChunkBytes) c = kChunkBytes / row_bytes;
  c = (c + kRowGrain - 1) / kRowGrain * kRowGrain;
  return c < kRowGrain ? kRowGrain : c;
}

// " (Q4_K)" after a type id in a message; empty for an id pyinfer does not know.
std::string type_label(uint32_t type) {
  const char* name = type_traits(type).name;
  return name != nullptr ? std::string(" (") + name + ")" : std::string();
}

}  // namespace

int64_t matmul_row_bytes(uint32_t w_type, int64_t K) {
  // Every ISA's table starts from the scalar one, so the types taken are the same on each.
  const KernelTable& kt = kernels();
  if (w_type >= GGML_TYPE_SLOTS || (kt.matmul_exact[w_type] == nullptr && kt.dequant_row[w_type] == nullptr)) return -1;
  const TypeTraits& tt = type_traits(w_type);
  if (K <= 0 || K % QK8_A != 0 || K % tt.block_elems != 0) return -1;
  return checked_mul(K / tt.block_elems, tt.block_bytes, "a weight row's bytes (blocks * block bytes)");
}

namespace {

// Fast mode's activations: each row of x[M, K] quantized once to K/32 blocks (rows split over
// the threads).
std::unique_ptr<block_q8a[]> quantize_rows(const KernelTable& kt, const float* x, int64_t M, int64_t K, int n_threads) {
  const int64_t nb = K / QK8_A;
  // Not zeroed: quantize_act writes every field of every block.
  std::unique_ptr<block_q8a[]> xq(new block_q8a[static_cast<size_t>(M * nb)]);  // [M, K/32]
  parallel_for(n_threads, M, 8, [&](int64_t m0, int64_t m1, int) {
    for (int64_t m = m0; m < m1; ++m) kt.quantize_act(x + m * K, xq.get() + m * nb, K);
  });
  return xq;
}

}  // namespace

void matmul(const float* x, int64_t M, int64_t K, const void* w, uint32_t w_type, int64_t N, float* y,
            Precision precision, int n_threads) {
  const int64_t row_bytes = matmul_row_bytes(w_type, K);
  if (row_bytes < 0)
    throw std::invalid_argument("matmul: weight type id " + std::to_string(w_type) + type_label(w_type) +
                                " with K=" + std::to_string(K) +
                                " is not supported (a type with a matmul or dequantization kernel; "
                                "K a positive multiple of 32 and of the type's block size)");
  if (M < 0 || N < 0) throw std::invalid_argument("matmul: negative M or N");
  if (M == 0 || N == 0) return;
  const MatmulPart part{w, w_type, N, y, N, false};
  matmul_parts(x, M, K, &part, 1, precision, n_threads);
}

int64_t packed_bytes(uint32_t w_type, int64_t N, int64_t K) {
  if (packed_block_bytes(w_type) == 0 || N < 0) return -1;
  const int64_t row_bytes = matmul_row_bytes(w_type, K);
  if (row_bytes < 0) return -1;
  return checked_mul(checked_round_up(N, kPackRows, "rows rounded up to 16-row groups"), row_bytes,
                     "packed weight bytes (rows in whole 16-row groups * row bytes)");
}

namespace {

void check_packable(uint32_t w_type, int64_t N, int64_t K) {
  if (packed_bytes(w_type, N, K) < 0)
    throw std::invalid_argument(
        "the 16-row packed layout takes Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K weights "
        "with K a positive multiple of the type's block size; got type id " +
        std::to_string(w_type) + type_label(w_type) + ", K=" + std::to_string(K));
}

// Row r's block blk (as stored; nullptr for a padding row) into its place in group-block gb
// (packed16.h). A padding row gets zero bytes (Q8_0's quants as q + 128), so zero scales.
// The type is a template argument: its layout is then a constant, and each unit is one move
// of 2 or 4 bytes, not a library call for a copy of run-time size (docs/tuning.md, "the
// repack's copies of fixed size").
template <uint32_t T>
void block_to_packed(const uint8_t* blk, int r, uint8_t* gb) {
  constexpr PackLayout l = pack_layout(T);
  int go = 0;
  for (int i = 0; i < l.n_fields; ++i) {
    const PackField& f = l.f[i];
    for (int u = 0; u < f.units; ++u) {
      uint8_t* d = gb + go + (u * kPackRows + r) * f.unit_bytes;
      if (f.unit_bytes == 2) {
        uint16_t h = 0;
        if (blk != nullptr) std::memcpy(&h, blk + f.offset + u * 2, 2);
        std::memcpy(d, &h, 2);
        continue;
      }
      uint32_t v = 0;
      if (blk != nullptr) std::memcpy(&v, blk + f.offset + u * 4, 4);
      if (f.transform == PACK_FLIP) v ^= 0x80808080u;
      if (f.transform == PACK_QH_T) v = qh_transpose(v);
      std::memcpy(d, &v, 4);  // little-endian, as the file
    }
    go += kPackRows * f.units * f.unit_bytes;
  }
}

template <uint32_t T>
void repack_groups(const uint8_t* w, int64_t N, int64_t row_bytes, int64_t nb, uint8_t* out) {
  constexpr int bb = packed_block_bytes(T);
  const int64_t n_groups = (N + kPackRows - 1) / kPackRows;
  for (int64_t g = 0; g < n_groups; ++g) {
    uint8_t* group = out + g * kPackRows * row_bytes;
    const int rows = N - g * kPackRows < kPackRows ? static_cast<int>(N - g * kPackRows) : kPackRows;
    for (int r = 0; r < kPackRows; ++r) {
      const uint8_t* row = r < rows ? w + (g * kPackRows + r) * row_bytes : nullptr;
      for (int64_t ib = 0; ib < nb; ++ib)
        block_to_packed<T>(row != nullptr ? row + ib * bb : nullptr, r, group + ib * kPackRows * bb);
    }
  }
}

using RepackFn = void (*)(const uint8_t* w, int64_t N, int64_t row_bytes, int64_t nb, uint8_t* out);

// Type id T's repack, or nullptr where T has no packed layout (only the packable types are
// instantiated).
template <uint32_t T>
constexpr RepackFn repack_fn() {
  if constexpr (packs16(T))
    return repack_groups<T>;
  else
    return nullptr;
}

template <uint32_t... T>
constexpr std::array<RepackFn, sizeof...(T)> repack_table(std::integer_sequence<uint32_t, T...>) {
  return {repack_fn<T>()...};
}

// Each type id's repack, made from the packed layouts themselves: a type given a layout in
// packed16.h has its repack here with nothing else to list.
constexpr std::array<RepackFn, GGML_TYPE_SLOTS> kRepack =
    repack_table(std::make_integer_sequence<uint32_t, GGML_TYPE_SLOTS>());

}  // namespace

void repack16(const void* w, uint32_t w_type, int64_t N, int64_t K, void* packed) {
  check_packable(w_type, N, K);  // a packable type: its slot of kRepack is set
  const int64_t row_bytes = matmul_row_bytes(w_type, K), nb = K / type_traits(w_type).block_elems;
  kRepack[w_type](static_cast<const uint8_t*>(w), N, row_bytes, nb, static_cast<uint8_t*>(packed));
}

void unpack16(const void* packed, uint32_t w_type, int64_t N, int64_t K, void* w) {
  check_packable(w_type, N, K);
  const int64_t row_bytes = matmul_row_bytes(w_type, K), nb = K / type_traits(w_type).block_elems;
  const int bb = packed_block_bytes(w_type);
  for (int64_t n = 0; n < N; ++n) {
    uint8_t* row = static_cast<uint8_t*>(w) + n * row_bytes;
    const uint8_t* group = static_cast<const uint8_t*>(packed) + (n / kPackRows) * kPackRows * row_bytes;
    for (int64_t ib = 0; ib < nb; ++ib)
      packed_to_block(w_type, group + ib * kPackRows * bb, static_cast<int>(n % kPackRows), row + ib * bb);
  }
}

MatmulKernel matmul_part_kernel(uint32_t w_type, bool packed, Precision precision) {
  if (w_type >= GGML_TYPE_SLOTS) return MatmulKernel::none;
  const KernelTable& kt = kernels();
  const bool fast = precision == Precision::fast;
  if (packed) return fast && kt.matmul_fast_packed[w_type] != nullptr ? MatmulKernel::fast_packed : MatmulKernel::none;
  if (fast && kt.matmul_fast[w_type] != nullptr) return MatmulKernel::fast;
  if (kt.matmul_exact[w_type] != nullptr) return MatmulKernel::exact;
  return kt.dequant_row[w_type] != nullptr ? MatmulKernel::dequantized : MatmulKernel::none;
}

void matmul_parts(const float* x, int64_t M, int64_t K, const MatmulPart* parts, int n_parts, Precision precision,
                  int n_threads) {
  if (M < 0) throw std::invalid_argument("matmul: negative M");
  if (n_parts < 1 || n_parts > kMaxMatmulParts)
    throw std::invalid_argument("matmul: 1 to " + std::to_string(kMaxMatmulParts) + " parts, got " +
                                std::to_string(n_parts));
  const KernelTable& kt = kernels();
  // Each part's rows in 16-row groups, laid end to end: where the part starts (in bytes), its
  // row bytes and its kernel.
  struct Plan {
    int64_t start, row_bytes;
    MatmulKernel kind;
  } plan[kMaxMatmulParts];
  int64_t total = 0;
  bool quantized = false;
  for (int i = 0; i < n_parts; ++i) {
    const MatmulPart& p = parts[i];
    const int64_t row_bytes = matmul_row_bytes(p.w_type, K);
    if (p.N < 0 || p.ldy < p.N) throw std::invalid_argument("matmul: negative N or a row stride below N");
    const MatmulKernel kind = row_bytes < 0 ? MatmulKernel::none : matmul_part_kernel(p.w_type, p.packed, precision);
    if (kind == MatmulKernel::none)
      throw std::invalid_argument("matmul: no " + std::string(precision == Precision::fast ? "fast" : "exact") +
                                  " kernel of its own for " + (p.packed ? "packed " : "") + "weight type id " +
                                  std::to_string(p.w_type) + type_label(p.w_type) + " with K=" + std::to_string(K));
    plan[i] = {total, row_bytes, kind};
    quantized = quantized || kind == MatmulKernel::fast || kind == MatmulKernel::fast_packed;
    total = checked_add(
        total, checked_mul(checked_round_up(p.N, kPackRows, "rows in 16-row groups"), row_bytes, "a part's bytes"),
        "the parts' bytes");
  }
  if (M == 0 || total == 0) return;
  if (n_threads < 1) n_threads = 1;
  const int64_t nb = K / QK8_A;
  const std::unique_ptr<block_q8a[]> xq = quantized ? quantize_rows(kt, x, M, K, n_threads) : nullptr;
  // One contiguous share of the bytes per thread; where the activations come in several
  // blocks of kRowsM rows, shares of at most kChunkBytes, so a share stays in L2 while each
  // block passes over it, as many for each thread. A group goes to the share its first byte
  // falls in; groups are whole, so every row's result is the same on any thread count.
  int64_t n_chunks = n_threads;
  if (M > kRowsM) n_chunks *= (total + kChunkBytes * n_threads - 1) / (kChunkBytes * n_threads);
  parallel_for(n_threads, n_chunks, 1, [&](int64_t c0, int64_t c1, int) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t lo = total * c / n_chunks, hi = total * (c + 1) / n_chunks;
      for (int i = 0; i < n_parts; ++i) {
        const MatmulPart& p = parts[i];
        const int64_t row_bytes = plan[i].row_bytes, gb = kPackRows * row_bytes;
        const int64_t a = plan[i].start, b = i + 1 < n_parts ? plan[i + 1].start : total;
        if (hi <= a || lo >= b) continue;
        const int64_t g0 = lo <= a ? 0 : (lo - a + gb - 1) / gb, g1 = hi >= b ? (b - a) / gb : (hi - a + gb - 1) / gb;
        const int64_t n0 = g0 * kPackRows, n1 = g1 * kPackRows < p.N ? g1 * kPackRows : p.N;
        if (n0 >= n1) continue;
        const auto* w = static_cast<const uint8_t*>(p.w) + g0 * gb;  // packed or not, group g0's first byte
        if (plan[i].kind == MatmulKernel::dequantized ||
            (plan[i].kind == MatmulKernel::exact && M >= kExactDequantMinM && type_traits(p.w_type).block_elems > 1)) {
          exact_dequantized(kt, p.w_type, w, row_bytes, x, M, K, n1 - n0, p.y + n0, p.ldy);  // each row once
          continue;
        }
        for (int64_t m0 = 0; m0 < M; m0 += kRowsM) {
          const int64_t mc = M - m0 < kRowsM ? M - m0 : kRowsM;
          float* y = p.y + m0 * p.ldy + n0;
          switch (plan[i].kind) {
            case MatmulKernel::fast_packed:
              kt.matmul_fast_packed[p.w_type](w, row_bytes, xq.get() + m0 * nb, mc, K, n1 - n0, y, p.ldy);
              break;
            case MatmulKernel::fast:
              kt.matmul_fast[p.w_type](w, row_bytes, xq.get() + m0 * nb, mc, K, n1 - n0, y, p.ldy);
              break;
            default:
              (p.w_type == GGML_F32 ? f32_rows_kernel(kt, mc) : kt.matmul_exact[p.w_type])(w, row_bytes, x + m0 * K, mc,
                                                                                           K, n1 - n0, y, p.ldy);
          }
        }
      }
    }
  });
}

void matmul_packed(const float* x, int64_t M, int64_t K, const void* packed, uint32_t w_type, int64_t N, float* y,
                   Precision precision, int n_threads) {
  check_packable(w_type, N, K);
  if (M < 0 || N < 0) throw std::invalid_argument("matmul: negative M or N");
  if (M == 0 || N == 0) return;
  if (n_threads < 1) n_threads = 1;
  const KernelTable& kt = kernels();
  const int64_t row_bytes = matmul_row_bytes(w_type, K);
  const int64_t group_bytes = kPackRows * row_bytes;
  const auto* wp = static_cast<const uint8_t*>(packed);
  if (precision == Precision::fast) {
    const MatmulPart part{packed, w_type, N, y, N, true};
    matmul_parts(x, M, K, &part, 1, precision, n_threads);
    return;
  }
  // Exact mode: unpack a group to blocks as stored, then multiply them as matmul does the
  // quantized rows it dequantizes into scratch.
  // Chunks are a multiple of kPackRows rows.
  parallel_for(n_threads, N, row_chunk(N, n_threads, M, row_bytes), [&](int64_t n0, int64_t n1, int) {
    std::vector<uint8_t> raw(static_cast<size_t>(group_bytes));  // [16 rows, row_bytes]
    for (int64_t r0 = n0; r0 < n1; r0 += kPackRows) {
      const int64_t nr = n1 - r0 < kPackRows ? n1 - r0 : kPackRows;
      unpack16(wp + r0 / kPackRows * group_bytes, w_type, nr, K, raw.data());
      exact_dequantized(kt, w_type, raw.data(), row_bytes, x, M, K, nr, y + r0, N);
    }
  });
}

void quantize_activations(const float* x, int64_t M, int64_t K, int8_t* q, float* d, int32_t* sum, int8_t* h,
                          int32_t* jo) {
  if (K <= 0 || K % QK8_A != 0)
    throw std::invalid_argument("quantize_activations: K must be a positive multiple of 32");
  const int64_t nb = K / QK8_A;
  std::vector<block_q8a> row(static_cast<size_t>(nb));  // [K/32]
  for (int64_t m = 0; m < M; ++m) {
    kernels().quantize_act(x + m * K, row.data(), K);
    for (int64_t ib = 0; ib < nb; ++ib) {
      const block_q8a& b = row[ib];
      for (int j = 0; j < QK8_A; ++j) q[m * K + ib * QK8_A + j] = b.qs[j];
      d[m * nb + ib] = b.d;
      sum[m * nb + ib] = b.sum;
      h[m * nb + ib] = static_cast<int8_t>(act_h(b));
      jo[m * nb + ib] = b.jo;
    }
  }
}

}  // namespace pyinfer
