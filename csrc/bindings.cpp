// bindings.cpp: the pyinfer._C module, the only file that knows pybind11. Every kernel call
// releases the GIL; arrays are passed as pointers into NumPy buffers without copies.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "models/model.h"
#include "ops/attention.h"
#include "ops/kv_cache.h"
#include "ops/matmul.h"
#include "ops/ops.h"
#include "probes/bandwidth.h"
#include "probes/int8_peak.h"
#include "runtime/checked.h"
#include "runtime/cpu_features.h"
#include "runtime/isa.h"
#include "runtime/threadpool.h"

namespace py = pybind11;
using namespace pyinfer;

namespace {

// The interpreter's main thread, which runs its finalization at exit (set at import, and in a
// forked child to the thread that forked).
unsigned long main_thread_ident = 0;

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// The GIL released for a call into the kernels. Once the interpreter is finalizing, it ends a
// thread that takes the GIL back (a daemon thread still in a forward pass at exit) by unwinding
// it from PyEval_RestoreThread. So a thread other than the main one that returns from a kernel
// then waits, holding nothing, until the process exits. One that began to take the GIL back
// just before finalization began is ended as the interpreter means to: this destructor lets
// that unwinding pass instead of answering it with std::terminate (an abort at exit).
class GilReleased {
 public:
  GilReleased() : state_(PyEval_SaveThread()) {}
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;
  ~GilReleased() noexcept(false) {
    if (interpreter_finalizing() && PyThread_get_thread_ident() != main_thread_ident)
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    PyEval_RestoreThread(state_);
  }

 private:
  PyThreadState* state_;
};

void set_main_thread() { main_thread_ident = PyThread_get_thread_ident(); }

py::dict cpu_info() {
  const CpuFeatures& f = cpu_features();
  py::dict features;
  features["sse4_2"] = f.sse42;
  features["avx"] = f.avx;
  features["avx2"] = f.avx2;
  features["fma"] = f.fma;
  features["f16c"] = f.f16c;
  features["avx512f"] = f.avx512f;
  features["avx512bw"] = f.avx512bw;
  features["avx512vl"] = f.avx512vl;
  features["avx512dq"] = f.avx512dq;
  features["avx512_vnni"] = f.avx512_vnni;
  features["avx512_bf16"] = f.avx512_bf16;
  features["avx_vnni"] = f.avx_vnni;
  features["vendor_intel"] = f.vendor_intel;
  features["os_avx"] = f.os_avx;
  features["os_avx512"] = f.os_avx512;
  py::list available;
  available.append("scalar");
#if PYINFER_X86
  if (f.can_avx2()) available.append("avx2");
  if (f.can_avx512()) available.append("avx512");
#endif
  py::list compiled;
  compiled.append("scalar");
#if PYINFER_X86
  compiled.append("avx2");
  compiled.append("avx512");
#endif
  py::dict out;
  out["features"] = features;
  out["compiled"] = compiled;
  out["available"] = available;
  out["isa"] = isa_name(active_isa());
  return out;
}

// The traits table (quant_blocks.h): {type id: {field: value}} for every id pyinfer knows.
py::dict type_traits_py() {
  py::dict out;
  for (uint32_t id = 0; id < GGML_TYPE_SLOTS; ++id) {
    const TypeTraits& t = type_traits(id);
    if (t.name == nullptr) continue;
    py::dict d;
    d["name"] = t.name;
    d["block_elems"] = t.block_elems;
    d["block_bytes"] = t.block_bytes;
    d["quant_bits"] = t.quant_bits;
    d["qs_offset"] = t.qs_offset;
    d["qs_bytes"] = t.qs_bytes;
    d["d_offset"] = t.d_offset;
    d["m_offset"] = t.m_offset;
    d["q_bias"] = t.q_bias;
    d["n_scales"] = t.n_scales;
    d["has_min"] = t.has_min;
    d["qs_signed"] = t.qs_signed;
    d["is_float"] = t.is_float;
    out[py::int_(id)] = d;
  }
  return out;
}

// Dequantize a 1-D uint8 array of raw GGUF blocks into a new float32 array of n elements.
py::array_t<float> dequantize(uint32_t type, py::array_t<uint8_t, py::array::c_style> raw, int64_t n) {
  const TypeSize ts = type_size(type);
  if (ts.block_elems == 0) throw py::value_error("unsupported tensor type id " + std::to_string(type));
  if (!has_dequant_kernel(type)) throw py::value_error("no dequantization kernel for type id " + std::to_string(type));
  if (n < 0 || n % ts.block_elems != 0)
    throw py::value_error("n=" + std::to_string(n) + " is not a multiple of the block size " +
                          std::to_string(ts.block_elems));
  const int64_t need = checked_mul(n / ts.block_elems, ts.block_bytes, "bytes of n elements (blocks * block bytes)");
  if (raw.ndim() != 1 || raw.shape(0) != need)
    throw py::value_error("raw must be a 1-D uint8 array of " + std::to_string(need) + " bytes for " +
                          std::to_string(n) + " elements");
  py::array_t<float> out(n);
  const void* src = raw.data();
  float* dst = out.mutable_data();
  {
    GilReleased release;
    dequantize_row(type, src, dst, n);
  }
  return out;
}

py::dict bandwidth_dict(const BandwidthResult& r) {
  py::dict out;
  out["n_bytes"] = r.n_bytes;
  out["n_threads"] = r.n_threads;
  out["seconds"] = r.seconds;
  out["checksum"] = r.checksum;
  return out;
}

py::dict read_bandwidth(size_t n_bytes, int n_threads, int repeats) {
  BandwidthResult r;
  {
    GilReleased release;
    r = measure_read_bandwidth(n_bytes, n_threads, repeats);
  }
  return bandwidth_dict(r);
}

double int8_peak_py(double min_seconds) {
  if (!(min_seconds > 0 && min_seconds < 60)) throw py::value_error("min_seconds must be in (0, 60)");
  double r;
  {
    GilReleased release;
    r = int8_peak_rate(min_seconds);
  }
  if (r <= 0)
    throw std::runtime_error(std::string("the active ISA (") + isa_name(active_isa()) +
                             ") has no int8 dot-product instruction");
  return r;
}

py::dict stream_bandwidth(const std::string& kernel, size_t n_bytes, int n_threads, int repeats) {
  if (kernel != "copy" && kernel != "triad")
    throw py::value_error("kernel must be 'copy' or 'triad', got '" + kernel + "'");
  const StreamKernel k = kernel == "copy" ? StreamKernel::copy : StreamKernel::triad;
  BandwidthResult r;
  {
    GilReleased release;
    r = measure_stream_bandwidth(k, n_bytes, n_threads, repeats);
  }
  return bandwidth_dict(r);
}

// "fast" or "exact", the word Python uses for the matmul path (Precision in ops/matmul.h).
Precision parse_precision(const std::string& precision) {
  if (precision == "fast") return Precision::fast;
  if (precision == "exact") return Precision::exact;
  throw py::value_error("precision must be 'fast' or 'exact', got '" + precision + "'");
}

// Bytes of n weight rows of K elements, as stored or (packed) in the 16-row layout; -1 for a
// type, K or n the layout does not take.
int64_t weight_bytes(uint32_t w_type, int64_t n, int64_t k, bool packed) {
  const int64_t row_bytes = matmul_row_bytes(w_type, k);
  if (row_bytes < 0 || n < 1) return -1;
  return packed ? packed_bytes(w_type, n, k) : checked_mul(n, row_bytes, "weight bytes (n * row bytes)");
}

// y[M, N] = x[M, K] @ W[N, K]^T. w is any C-contiguous array holding exactly N rows of the
// type's GGUF encoding (raw uint8 bytes, or e.g. float16 [N, K]); nothing is copied.
py::array_t<float> matmul_py(py::array x, py::array w, uint32_t w_type, int64_t n, int64_t k,
                             const std::string& precision, int n_threads, std::optional<py::array> out, bool packed) {
  const Precision p = parse_precision(precision);
  if (n_threads < 1) throw py::value_error("n_threads must be >= 1");
  const int64_t row_bytes = matmul_row_bytes(w_type, k);
  if (row_bytes < 0)
    throw py::value_error(
        "matmul takes weight types with a matmul or dequantization kernel, k a "
        "positive multiple of 32 and of the type's block size; got type id " +
        std::to_string(w_type) + ", k=" + std::to_string(k));
  if (n < 1) throw py::value_error("n must be >= 1");
  const auto c_contig = [](const py::array& a) { return (a.flags() & py::array::c_style) != 0; };
  if (!py::isinstance<py::array_t<float>>(x) || x.ndim() != 2 || !c_contig(x) || x.shape(1) != k)
    throw py::value_error("x must be a C-contiguous float32 array of shape (M, k=" + std::to_string(k) + ")");
  const int64_t w_bytes = weight_bytes(w_type, n, k, packed);  // < 0 only for a type without a packed layout
  if (w_bytes < 0)
    throw py::value_error("packed weights are Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K (from repack)");
  if (!c_contig(w) || w.nbytes() != w_bytes)
    throw py::value_error(std::string("w must be a C-contiguous array of exactly ") +
                          (packed ? "repack's " : "n rows of the type: ") + std::to_string(w_bytes) + " bytes, got " +
                          std::to_string(w.nbytes()));
  const int64_t M = x.shape(0);
  py::array_t<float> y;
  if (out) {
    if (!py::isinstance<py::array_t<float>>(*out) || out->ndim() != 2 || !c_contig(*out) || out->shape(0) != M ||
        out->shape(1) != n || !out->writeable())
      throw py::value_error("out must be a writeable C-contiguous float32 array of shape (M, n)");
    y = py::reinterpret_borrow<py::array_t<float>>(*out);
  } else {
    y = py::array_t<float>({M, n});
  }
  const auto* yb = reinterpret_cast<const char*>(y.data());
  const auto overlaps = [&](const py::array& a) {
    const auto* ab = static_cast<const char*>(a.data());
    return ab < yb + y.nbytes() && yb < ab + a.nbytes();
  };
  if (y.nbytes() > 0 && (overlaps(x) || overlaps(w))) throw py::value_error("out must not overlap x or w");
  const float* xp = static_cast<const float*>(x.data());
  const void* wp = w.data();
  float* yp = y.mutable_data();
  {
    GilReleased release;
    if (packed)
      matmul_packed(xp, M, k, wp, w_type, n, yp, p, n_threads);
    else
      matmul(xp, M, k, wp, w_type, n, yp, p, n_threads);
  }
  return y;
}

// Several matrices sharing x in one job: y[M, sum of n] holds each part's outputs side by
// side, as a model's projections do. parts: (w, w_type, n, packed) each.
py::array_t<float> matmul_parts_py(py::array x,
                                   const std::vector<std::tuple<py::array, uint32_t, int64_t, bool>>& parts, int64_t k,
                                   const std::string& precision, int n_threads) {
  const Precision p = parse_precision(precision);
  if (n_threads < 1) throw py::value_error("n_threads must be >= 1");
  if (parts.empty() || parts.size() > kMaxMatmulParts)
    throw py::value_error("parts must hold 1 to " + std::to_string(kMaxMatmulParts) + " matrices");
  if (!py::isinstance<py::array_t<float>>(x) || x.ndim() != 2 || (x.flags() & py::array::c_style) == 0 ||
      x.shape(1) != k)
    throw py::value_error("x must be a C-contiguous float32 array of shape (M, k=" + std::to_string(k) + ")");
  int64_t width = 0;
  for (const auto& [w, type, n, packed] : parts) {
    const int64_t bytes = weight_bytes(type, n, k, packed);
    if (bytes < 0 || (w.flags() & py::array::c_style) == 0 || w.nbytes() != bytes)
      throw py::value_error(
          "each part must be (C-contiguous weights of exactly n rows, as stored or packed by repack; "
          "a type id; n >= 1; packed)");
    width += n;
  }
  const int64_t M = x.shape(0);
  py::array_t<float> y({M, width});
  std::vector<MatmulPart> mp;
  int64_t at = 0;
  for (const auto& [w, type, n, packed] : parts) {
    mp.push_back({w.data(), type, n, y.mutable_data() + at, width, packed});
    at += n;
  }
  {
    GilReleased release;  // matmul_parts refuses a part without a kernel of its own
    matmul_parts(static_cast<const float*>(x.data()), M, k, mp.data(), static_cast<int>(mp.size()), p, n_threads);
  }
  return y;
}

// ---- small ops, KV cache, attention ------------------------------------------------------
// Arrays are checked, never converted: a silent copy would hide a wrong dtype or layout and
// make an `out=` write land in a temporary.

bool is_c_f32(const py::array& a) {
  return py::isinstance<py::array_t<float>>(a) && (a.flags() & py::array::c_style) != 0;
}

void require_f32(const py::array& a, const char* name) {
  if (!is_c_f32(a)) throw py::value_error(std::string(name) + " must be a C-contiguous float32 array");
}

std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

bool same_shape(const py::array& a, const py::array& b) {
  if (a.ndim() != b.ndim()) return false;
  for (py::ssize_t i = 0; i < a.ndim(); ++i)
    if (a.shape(i) != b.shape(i)) return false;
  return true;
}

// `out` if given (checked: float32, C-contiguous, writeable, the shape of `like`), else a new
// array of that shape.
py::array_t<float> out_like(const std::optional<py::array>& out, const py::array& like) {
  if (!out) return py::array_t<float>(std::vector<py::ssize_t>(like.shape(), like.shape() + like.ndim()));
  if (!is_c_f32(*out) || !out->writeable() || !same_shape(*out, like))
    throw py::value_error("out must be a writeable C-contiguous float32 array of shape " + shape_str(like) + ", got " +
                          shape_str(*out));
  return py::reinterpret_borrow<py::array_t<float>>(*out);
}

// Rows and row length of an array whose last axis is the row (a 0-d array is refused).
std::pair<int64_t, int64_t> rows_of(const py::array& a, const char* name) {
  if (a.ndim() < 1 || a.shape(a.ndim() - 1) < 1)
    throw py::value_error(std::string(name) + " must have at least one axis with a non-empty last axis");
  const int64_t n = a.shape(a.ndim() - 1);
  return {static_cast<int64_t>(a.size()) / n, n};
}

py::array_t<float> rms_norm_py(py::array x, py::array w, float eps, std::optional<py::array> out) {
  require_f32(x, "x");
  require_f32(w, "w");
  const auto [rows, n] = rows_of(x, "x");
  if (w.ndim() != 1 || w.shape(0) != n)
    throw py::value_error("w must have shape (" + std::to_string(n) + ",) to match x's last axis, got " + shape_str(w));
  if (!(eps >= 0.0f)) throw py::value_error("eps must be >= 0");
  py::array_t<float> y = out_like(out, x);
  const float* xp = static_cast<const float*>(x.data());
  const float* wp = static_cast<const float*>(w.data());
  float* yp = y.mutable_data();
  {
    GilReleased release;
    rms_norm_rows(xp, wp, yp, rows, n, eps);
  }
  return y;
}

py::array rope_py(py::array x, py::object pos, int64_t n_heads, int64_t head_dim, float base, bool neox,
                  float freq_scale, std::optional<py::array> factors) {
  require_f32(x, "x");
  if (!x.writeable()) throw py::value_error("x must be writeable: rope rotates it in place");
  if (head_dim < 2 || head_dim % 2 != 0 || head_dim > kRopeMaxDim)
    throw py::value_error("head_dim must be even and in [2, " + std::to_string(kRopeMaxDim) + "], got " +
                          std::to_string(head_dim));
  if (n_heads < 1) throw py::value_error("n_heads must be >= 1");
  if (!(base > 0.0f)) throw py::value_error("base must be > 0");
  if (!(freq_scale > 0.0f)) throw py::value_error("freq_scale must be > 0");
  RopeFreqs freqs{base, freq_scale, nullptr};
  if (factors) {
    require_f32(*factors, "factors");
    if (factors->ndim() != 1 || factors->shape(0) != head_dim / 2)
      throw py::value_error("factors must have shape (head_dim / 2 = " + std::to_string(head_dim / 2) + ",), got " +
                            shape_str(*factors));
    freqs.factors = static_cast<const float*>(factors->data());
    for (int64_t i = 0; i < head_dim / 2; ++i)
      if (!(freqs.factors[i] > 0.0f)) throw py::value_error("factors must be > 0");
  }
  const int64_t width = n_heads * head_dim;
  if (x.ndim() < 1 || x.ndim() > 2 || x.shape(x.ndim() - 1) != width)
    throw py::value_error("x must have shape (M, n_heads * head_dim = " + std::to_string(width) + ") or (" +
                          std::to_string(width) + ",), got " + shape_str(x));
  const int64_t m = x.ndim() == 2 ? x.shape(0) : 1;
  std::vector<int64_t> positions(static_cast<size_t>(m));
  if (py::isinstance<py::int_>(pos)) {
    const int64_t p0 = pos.cast<int64_t>();
    for (int64_t t = 0; t < m; ++t) positions[static_cast<size_t>(t)] = p0 + t;
  } else {
    const auto pa = py::array::ensure(pos);
    if (!pa || pa.ndim() != 1 || pa.shape(0) != m || (pa.dtype().kind() != 'i' && pa.dtype().kind() != 'u'))
      throw py::value_error("pos must be an int (positions pos..pos+M-1) or a 1-D integer array of M=" +
                            std::to_string(m) + " positions");
    const auto p64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(pa);
    for (int64_t t = 0; t < m; ++t) positions[static_cast<size_t>(t)] = p64.at(t);
  }
  for (int64_t p : positions)
    if (p < 0) throw py::value_error("positions must be >= 0, got " + std::to_string(p));
  float* xp = static_cast<float*>(x.mutable_data());
  {
    GilReleased release;
    std::vector<float> cos_sin(static_cast<size_t>(m * head_dim));
    rope_table(positions.data(), m, head_dim, freqs, cos_sin.data());
    rope_rows(xp, m, width, n_heads, head_dim, cos_sin.data(), neox);
  }
  return x;
}

// Elementwise out = fn(a, b) over two float32 arrays of one shape.
template <class Fn>
py::array_t<float> binary_py(py::array a, py::array b, std::optional<py::array> out, const char* an, const char* bn,
                             Fn fn) {
  require_f32(a, an);
  require_f32(b, bn);
  if (!same_shape(a, b))
    throw py::value_error(std::string(an) + " and " + bn + " must have one shape, got " + shape_str(a) + " and " +
                          shape_str(b));
  py::array_t<float> y = out_like(out, a);
  const float* ap = static_cast<const float*>(a.data());
  const float* bp = static_cast<const float*>(b.data());
  float* yp = y.mutable_data();
  const int64_t n = a.size();
  {
    GilReleased release;
    fn(ap, bp, yp, n);
  }
  return y;
}

py::array_t<float> softmax_py(py::array x, std::optional<py::array> out) {
  require_f32(x, "x");
  const auto [rows, n] = rows_of(x, "x");
  py::array_t<float> y = out_like(out, x);
  const float* xp = static_cast<const float*>(x.data());
  float* yp = y.mutable_data();
  {
    GilReleased release;
    softmax_rows(xp, yp, rows, n);
  }
  return y;
}

py::array_t<float> embedding_py(py::array table, uint32_t type, py::object ids, int64_t dim,
                                std::optional<py::array> out) {
  const int64_t row_bytes = embedding_row_bytes(type, dim);
  if (row_bytes < 0)
    throw py::value_error("embedding: no row kernel for type id " + std::to_string(type) + " with dim " +
                          std::to_string(dim) + " (dim must be a positive multiple of the block size)");
  if ((table.flags() & py::array::c_style) == 0) throw py::value_error("table must be C-contiguous");
  if (table.nbytes() % row_bytes != 0)
    throw py::value_error("table holds " + std::to_string(table.nbytes()) + " bytes, not a whole number of " +
                          std::to_string(row_bytes) + "-byte rows");
  const auto ia = py::array::ensure(ids);
  if (!ia || ia.ndim() != 1 || (ia.size() > 0 && ia.dtype().kind() != 'i' && ia.dtype().kind() != 'u'))
    throw py::value_error("ids must be a 1-D sequence of integers");
  const auto id64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(ia);
  const int64_t n_ids = id64.size();
  py::array_t<float> y;
  if (out) {
    if (!is_c_f32(*out) || !out->writeable() || out->ndim() != 2 || out->shape(0) != n_ids || out->shape(1) != dim)
      throw py::value_error("out must be a writeable C-contiguous float32 array of shape (" + std::to_string(n_ids) +
                            ", " + std::to_string(dim) + ")");
    y = py::reinterpret_borrow<py::array_t<float>>(*out);
  } else {
    y = py::array_t<float>({n_ids, dim});
  }
  const void* tp = table.data();
  const int64_t* ip = id64.data();
  float* yp = y.mutable_data();
  const int64_t n_rows = table.nbytes() / row_bytes;
  {
    GilReleased release;
    embedding(tp, type, n_rows, dim, ip, n_ids, yp);
  }
  return y;
}

// "q8_0", or a NumPy dtype (float32, float16).
KvType parse_kv_dtype(const py::object& dtype) {
  if (py::isinstance<py::str>(dtype) && dtype.cast<std::string>() == "q8_0") return KV_Q8_0;
  py::dtype dt;
  try {
    dt = py::dtype::from_args(dtype);
  } catch (const py::error_already_set&) {
    throw py::value_error("KVCache dtype must be float32, float16 or 'q8_0', got " +
                          py::repr(dtype).cast<std::string>());
  }
  if (dt.is(py::dtype::of<float>())) return KV_F32;
  if (dt.is(py::dtype("float16"))) return KV_F16;
  throw py::value_error("KVCache dtype must be float32, float16 or 'q8_0', got " + py::str(dt).cast<std::string>());
}

// The dtype of keys() and values(): a Q8_0 cache reads out as float32.
py::dtype kv_dtype(KvType t) { return t == KV_F16 ? py::dtype("float16") : py::dtype::of<float>(); }

// M rows of a cache's width from a (M, width) or (width,) float32 array.
int64_t kv_rows(const py::array& a, const char* name, int64_t width) {
  require_f32(a, name);
  if (a.ndim() < 1 || a.ndim() > 2 || a.shape(a.ndim() - 1) != width)
    throw py::value_error(std::string(name) + " must have shape (M, n_head_kv * head_dim = " + std::to_string(width) +
                          ") or (" + std::to_string(width) + ",), got " + shape_str(a));
  return a.ndim() == 2 ? a.shape(0) : 1;
}

void kv_append_py(KVCache& c, int64_t layer, py::array k, py::array v, int64_t pos) {
  const int64_t width = c.n_head_kv() * c.head_dim();
  const int64_t m = kv_rows(k, "k", width);
  if (kv_rows(v, "v", width) != m) throw py::value_error("k and v must have the same number of rows");
  const float* kp = static_cast<const float*>(k.data());
  const float* vp = static_cast<const float*>(v.data());
  GilReleased release;
  c.append(layer, kp, width, vp, width, pos, m);
}

// One layer's K or V as a read-only [n_head_kv, n_ctx, head_dim] array: values are a view that
// keeps the cache alive; keys, stored in position blocks, are copied out in position order.
py::array kv_view(py::object self, int64_t layer, bool values) {
  const KVCache& c = self.cast<const KVCache&>();
  (void)c.n_pos(layer);  // checks the layer
  const auto es = static_cast<py::ssize_t>(c.elem_size());
  const std::vector<py::ssize_t> shape{c.n_head_kv(), c.n_ctx(), c.head_dim()};
  py::array a;
  if (c.type() == KV_Q8_0) {  // int8 and scales: the elements they stand for, copied out
    a = py::array(kv_dtype(c.type()), shape);
    c.dequantize_q8(layer, values, static_cast<float*>(a.mutable_data()));
  } else if (values) {
    a = py::array(kv_dtype(c.type()), shape, {c.n_ctx() * c.head_dim() * es, c.head_dim() * es, es}, c.v(layer, 0),
                  self);
  } else {
    a = py::array(kv_dtype(c.type()), shape);
    c.copy_keys(layer, a.mutable_data());
  }
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

py::array_t<float> attention_py(py::array q, const KVCache& cache, int64_t layer, int64_t pos, int64_t n_head,
                                std::optional<float> scale, int64_t window, int n_threads,
                                std::optional<py::array> out) {
  if (n_threads < 1) throw py::value_error("n_threads must be >= 1");
  if (n_head < 1) throw py::value_error("n_head must be >= 1");
  const int64_t hd = cache.head_dim();
  const int64_t width = n_head * hd;
  require_f32(q, "q");
  if (q.ndim() < 1 || q.ndim() > 2 || q.shape(q.ndim() - 1) != width)
    throw py::value_error("q must have shape (M, n_head * head_dim = " + std::to_string(width) + ") or (" +
                          std::to_string(width) + ",), got " + shape_str(q));
  py::array_t<float> y = out_like(out, q);
  const auto* yb = reinterpret_cast<const char*>(y.data());
  const auto* qb = static_cast<const char*>(q.data());
  if (yb < qb + q.nbytes() && qb < yb + y.nbytes()) throw py::value_error("out must not overlap q");
  AttentionArgs a{};
  a.q = static_cast<const float*>(q.data());
  a.q_stride = width;
  a.out = y.mutable_data();
  a.out_stride = width;
  a.cache = &cache;
  a.layer = layer;
  a.pos = pos;
  a.n_q = q.ndim() == 2 ? q.shape(0) : 1;
  a.n_head = n_head;
  a.scale = scale ? *scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  a.window = window;
  attention_check(a);  // throws std::invalid_argument -> ValueError, with the GIL held
  {
    GilReleased release;
    attention(a, n_threads);
  }
  return y;
}

// The 16-row interleaved layout of the int8 fast types (repack16) and back (unpack16).
py::array_t<uint8_t> repack_py(py::array w, uint32_t w_type, int64_t n, int64_t k) {
  const int64_t total = packed_bytes(w_type, n, k);
  if (total < 0 || n < 1)
    throw py::value_error(
        "repack takes Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K weights, n >= 1, k a positive "
        "multiple of the type's block size");
  if (!(w.flags() & py::array::c_style) ||
      w.nbytes() != checked_mul(n, matmul_row_bytes(w_type, k), "weight bytes (n * row bytes)"))
    throw py::value_error("w must be a C-contiguous array of exactly n rows of the type");
  py::array_t<uint8_t> out(total);
  const void* src = w.data();
  void* dst = out.mutable_data();
  {
    GilReleased release;
    repack16(src, w_type, n, k, dst);
  }
  return out;
}

py::array_t<uint8_t> unpack_py(py::array packed, uint32_t w_type, int64_t n, int64_t k) {
  const int64_t total = packed_bytes(w_type, n, k);
  if (total < 0 || n < 1)
    throw py::value_error(
        "unpack takes Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K weights, n >= 1, k a positive "
        "multiple of the type's block size");
  if (!(packed.flags() & py::array::c_style) || packed.nbytes() != total)
    throw py::value_error("packed must be a C-contiguous array of " + std::to_string(total) + " bytes");
  py::array_t<uint8_t> out(checked_mul(n, matmul_row_bytes(w_type, k), "weight bytes (n * row bytes)"));
  const void* src = packed.data();
  void* dst = out.mutable_data();
  {
    GilReleased release;
    unpack16(src, w_type, n, k, dst);
  }
  return out;
}

py::tuple quantize_activations_py(py::array x) {
  if (!py::isinstance<py::array_t<float>>(x) || x.ndim() != 2 || !(x.flags() & py::array::c_style) ||
      x.shape(1) % 32 != 0 || x.shape(1) == 0)
    throw py::value_error("x must be a C-contiguous float32 array of shape (M, K), K a multiple of 32");
  const int64_t M = x.shape(0), K = x.shape(1);
  py::array_t<int8_t> q({M, K});
  py::array_t<float> d({M, K / 32});
  py::array_t<int32_t> sum({M, K / 32});
  py::array_t<int8_t> h({M, K / 32});
  py::array_t<int32_t> jo({M, K / 32});
  const float* xp = static_cast<const float*>(x.data());
  int8_t* qp = q.mutable_data();
  float* dp = d.mutable_data();
  int32_t* sp = sum.mutable_data();
  int8_t* hp = h.mutable_data();
  int32_t* jp = jo.mutable_data();
  {
    GilReleased release;
    quantize_activations(xp, M, K, qp, dp, sp, hp, jp);
  }
  return py::make_tuple(q, d, sum, h, jo);
}

// ---- models ---------------------------------------------------------------------------------

// A model and the NumPy arrays (views of the mapped GGUF file) its weights point into.
struct PyModel {
  std::shared_ptr<const Model> model;
  py::list keep_alive;
};

// tensors[name] = (array, ggml type, rows, cols): a C-contiguous array of exactly rows rows of
// the type's encoding. The architecture's own file knows which names it reads.
PyModel make_model_py(const std::string& arch, const py::dict& params, const py::dict& tensors, bool repack) {
  Params p;
  for (const auto& [k, v] : params) p.set(k.cast<std::string>(), v.cast<double>());
  PyModel out;
  TensorMap map;
  for (const auto& [k, v] : tensors) {
    const std::string name = k.cast<std::string>();
    const py::tuple t = v.cast<py::tuple>();
    if (t.size() != 4) throw py::value_error(name + ": expected (array, type, rows, cols)");
    const py::array a = t[0].cast<py::array>();
    const auto type = t[1].cast<uint32_t>();
    const auto rows = t[2].cast<int64_t>(), cols = t[3].cast<int64_t>();
    const TypeSize ts = type_size(type);
    if (ts.block_elems == 0 || rows < 1 || cols < 1 || cols % ts.block_elems != 0)
      throw py::value_error(name + ": unsupported type " + std::to_string(type) + " or shape");
    const std::string what = name + " bytes (rows * blocks per row * block bytes)";
    if (!(a.flags() & py::array::c_style) ||
        a.nbytes() != checked_product({rows, cols / ts.block_elems, ts.block_bytes}, what.c_str()))
      throw py::value_error(name + ": array is not C-contiguous or not " + std::to_string(rows) + " rows of " +
                            std::to_string(cols) + " elements of type " + std::to_string(type));
    out.keep_alive.append(a);
    map.add(name, WeightRef{a.data(), type, rows, cols});
  }
  {
    GilReleased release;  // repacking reads the whole file
    out.model = make_model(arch, p, map, repack);
  }
  return out;
}

// Runs ids (int32 [n]) through the context; out is float32 [n or 1, width] written in place:
// logits (width n_vocab), or with hidden the final hidden states (width n_embd).
void sequence_run_py(Sequence& ctx, py::array ids, py::array out, bool all_rows, const std::string& precision,
                     int n_threads, bool hidden) {
  if (ids.ndim() != 1 || !ids.dtype().is(py::dtype::of<int32_t>()) || !(ids.flags() & py::array::c_style))
    throw py::value_error("ids must be a 1-D C-contiguous int32 array");
  const int64_t n = ids.shape(0);
  const int64_t rows = all_rows ? n : 1;
  const int64_t width = hidden ? ctx.model()->dims().n_embd : ctx.n_vocab();
  const char* what = hidden ? "hidden" : "logits";
  if (!is_c_f32(out) || !out.writeable() || out.ndim() != 2 || out.shape(0) != rows || out.shape(1) != width)
    throw py::value_error(std::string(what) + " must be a writeable C-contiguous float32 array [" +
                          std::to_string(rows) + ", " + std::to_string(width) + "]");
  const Precision m = parse_precision(precision);
  const auto* p_ids = static_cast<const int32_t*>(ids.data());
  auto* p_out = static_cast<float*>(out.mutable_data());
  GilReleased release;
  if (hidden)
    ctx.embed(p_ids, n, p_out, all_rows, m, n_threads);
  else
    ctx.eval(p_ids, n, p_out, all_rows, m, n_threads);
}

// One step over len(contexts) sequences: counts int64 [n] tokens each, back to back in ids
// (int32 [sum(counts)]); out written in place: logits float32 [n, n_vocab], or with hidden the
// final hidden states of every token, float32 [sum(counts), n_embd].
void batch_run_py(Batch& batch, const std::vector<Sequence*>& contexts, py::array ids, py::array counts, py::array out,
                  const std::string& precision, int n_threads, bool hidden, const py::object& n_logits = py::none()) {
  const int64_t n = static_cast<int64_t>(contexts.size());
  if (counts.ndim() != 1 || !counts.dtype().is(py::dtype::of<int64_t>()) || !(counts.flags() & py::array::c_style) ||
      counts.shape(0) != n)
    throw py::value_error("counts must be a 1-D C-contiguous int64 array of one count per context (" +
                          std::to_string(n) + ")");
  const auto* p_counts = static_cast<const int64_t*>(counts.data());
  int64_t total = 0;
  for (int64_t b = 0; b < n; ++b) total += std::max<int64_t>(p_counts[b], 0);
  if (ids.ndim() != 1 || !ids.dtype().is(py::dtype::of<int32_t>()) || !(ids.flags() & py::array::c_style) ||
      ids.shape(0) != total)
    throw py::value_error("ids must be a 1-D C-contiguous int32 array of sum(counts) (" + std::to_string(total) +
                          ") ids");
  const int64_t* p_n_logits = nullptr;
  int64_t n_out = n;
  if (!n_logits.is_none()) {
    auto a = n_logits.cast<py::array>();
    if (a.ndim() != 1 || !a.dtype().is(py::dtype::of<int64_t>()) || !(a.flags() & py::array::c_style) ||
        a.shape(0) != n)
      throw py::value_error("n_logits must be a 1-D C-contiguous int64 array of one count per context (" +
                            std::to_string(n) + ")");
    p_n_logits = static_cast<const int64_t*>(a.data());
    n_out = 0;
    for (int64_t b = 0; b < n; ++b) n_out += std::max<int64_t>(p_n_logits[b], 0);
  }
  const Sequence* first = n > 0 ? contexts[0] : nullptr;
  const int64_t width = first == nullptr ? 0 : hidden ? first->model()->dims().n_embd : first->n_vocab();
  const int64_t rows = hidden ? total : n_out;
  const char* what = hidden ? "hidden" : "logits";
  if (!is_c_f32(out) || !out.writeable() || out.ndim() != 2 || out.shape(0) != rows || out.shape(1) != width)
    throw py::value_error(std::string(what) + " must be a writeable C-contiguous float32 array [" +
                          std::to_string(rows) + ", " + std::to_string(width) + "]");
  const Precision m = parse_precision(precision);
  const auto* p_ids = static_cast<const int32_t*>(ids.data());
  auto* p_out = static_cast<float*>(out.mutable_data());
  GilReleased release;
  if (hidden)
    batch.embed(contexts.data(), p_ids, p_counts, n, p_out, m, n_threads);
  else
    batch.step(contexts.data(), p_ids, p_counts, n, p_out, m, n_threads, p_n_logits);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "pyinfer's C++ kernels";
  main_thread_ident = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  py::module_::import("os").attr("register_at_fork")(py::arg("after_in_child") = py::cpp_function(&set_main_thread));
  // Resolve PYINFER_ISA now: a bad value fails the import with its message, not a later call.
  (void)active_isa();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const AllocationError& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    }
  });

  m.def("cpu_info", &cpu_info, "Detected CPU features, compiled and available ISA paths, the active one.");
  m.def("get_isa", [] { return std::string(isa_name(active_isa())); }, "The active ISA path.");
  m.def(
      "set_isa", [](const std::string& name) { set_isa(parse_isa(name)); }, py::arg("name"),
      "Switch the active ISA path: 'scalar', 'avx2' or 'avx512'.");
  m.def("type_traits", &type_traits_py, "The per-type traits table of the C++ code: {ggml type id: {field: value}}.");
  m.def("dequantize", &dequantize, py::arg("type"), py::arg("raw"), py::arg("n"),
        "Dequantize n elements of raw GGUF blocks of the given type id to float32.");
  m.def("read_bandwidth", &read_bandwidth, py::arg("n_bytes") = size_t(512) << 20, py::arg("n_threads") = 1,
        py::arg("repeats") = 10, "Time `repeats` passes reading an n_bytes array with n_threads threads.");
  m.def("stream_bandwidth", &stream_bandwidth, py::arg("kernel"), py::arg("n_bytes") = size_t(512) << 20,
        py::arg("n_threads") = 1, py::arg("repeats") = 10,
        "Time `repeats` passes of STREAM's copy or triad over arrays of about n_bytes in all; "
        "n_bytes in the result counts bytes read plus written per pass.");
  m.def("matmul", &matmul_py, py::arg("x"), py::arg("w"), py::arg("w_type"), py::arg("n"), py::arg("k"), py::kw_only(),
        py::arg("precision") = "fast", py::arg("n_threads") = 1, py::arg("out") = py::none(), py::arg("packed") = false,
        "y[M, n] = x[M, k] @ W[n, k]^T for W of a GGUF type id with a matmul or dequantization "
        "kernel, as stored; precision 'fast' (int8 activations, integer dots, for Q8_0, Q4_0, Q4_1, Q5_0, "
        "Q5_1, Q4_K, Q5_K and Q6_K; "
        "the exact path for other types) or 'exact' (float32).");
  m.def("matmul_parts", &matmul_parts_py, py::arg("x"), py::arg("parts"), py::arg("k"), py::kw_only(),
        py::arg("precision") = "fast", py::arg("n_threads") = 1,
        "Matrices sharing x, in one job: y[M, sum of n] with each part's outputs side by side; parts "
        "are (w, w_type, n, packed) tuples: packed weights in fast mode, or any type's rows as stored.");
  m.def("repack", &repack_py, py::arg("w"), py::arg("w_type"), py::arg("n"), py::arg("k"),
        "Weights of an int8 fast type, n rows -> the 16-row interleaved layout matmul(packed=True) "
        "takes (n padded to a multiple of 16).");
  m.def("unpack", &unpack_py, py::arg("packed"), py::arg("w_type"), py::arg("n"), py::arg("k"),
        "The inverse of repack: the n rows' blocks as stored in GGUF.");
  m.def("int8_peak", &int8_peak_py, py::arg("min_seconds") = 0.05,
        "Multiply-adds per second of the active ISA's int8 dot-product instruction on one core "
        "(12 independent accumulators): the compute ceiling of precision='fast'.");
  m.def("quantize_activations", &quantize_activations_py, py::arg("x"),
        "Fast-mode activation quantization of x[M, K]: (q int8 [M, K], d float32 [M, K/32], "
        "sum int32 [M, K/32], h int8 [M, K/32], jo int32 [M, K/32]).");
  m.def(
      "pool_size", [] { return pool_size(); },
      "Threads a kernel call can use without growing the pool (workers + the caller).");
  m.def(
      "set_pool_size",
      [](int n_threads) {
        if (n_threads < 1) throw py::value_error("n_threads must be >= 1");
        GilReleased release;
        pool_resize(n_threads);
      },
      py::arg("n_threads"), "Start or stop workers so the pool serves n_threads threads (the caller included).");

  // ---- small ops, KV cache, attention
  m.def("rms_norm", &rms_norm_py, py::arg("x"), py::arg("w"), py::arg("eps"), py::arg("out") = py::none(),
        "out = x / sqrt(mean(x^2, last axis) + eps) * w for float32 x[..., n], w[n]; out may be x.");
  m.def("rope", &rope_py, py::arg("x"), py::arg("pos"), py::arg("n_heads"), py::arg("head_dim"), py::arg("base"),
        py::arg("neox") = false, py::arg("freq_scale") = 1.0f, py::arg("factors") = py::none(),
        "Rotate x[M, n_heads * head_dim] (float32) in place for positions pos..pos+M-1 (pos an int) "
        "or pos[t] (an integer array); adjacent pairs (llama.cpp's normal mode) or, with neox, "
        "(i, i + head_dim/2). Pair i turns by pos * freq_scale * base^(-2i/head_dim) / factors[i] "
        "(factors: float32 [head_dim/2], default all 1). Returns x.");
  m.def(
      "swiglu",
      [](py::array gate, py::array up, std::optional<py::array> out) {
        return binary_py(gate, up, out, "gate", "up", swiglu_vec);
      },
      py::arg("gate"), py::arg("up"), py::arg("out") = py::none(),
      "out = silu(gate) * up, elementwise over float32 arrays of one shape.");
  m.def(
      "geglu",
      [](py::array gate, py::array up, std::optional<py::array> out) {
        return binary_py(gate, up, out, "gate", "up", geglu_vec);
      },
      py::arg("gate"), py::arg("up"), py::arg("out") = py::none(),
      "out = gelu_tanh(gate) * up (GELU's tanh approximation), elementwise over float32 arrays of one shape.");
  m.def(
      "add",
      [](py::array a, py::array b, std::optional<py::array> out) { return binary_py(a, b, out, "a", "b", add_vec); },
      py::arg("a"), py::arg("b"), py::arg("out") = py::none(),
      "out = a + b (the residual add), elementwise over float32 arrays of one shape.");
  m.def("softmax", &softmax_py, py::arg("x"), py::arg("out") = py::none(),
        "Softmax over the last axis of a float32 array; out may be x.");
  m.def("embedding", &embedding_py, py::arg("table"), py::arg("type"), py::arg("ids"), py::arg("dim"),
        py::arg("out") = py::none(),
        "Rows `ids` of a table of dim-element rows of a GGUF type id (raw bytes as stored, e.g. "
        "Q8_0, F16, F32), as float32 [len(ids), dim].");
  py::class_<KVCache>(m, "KVCache",
                      "Per-sequence K/V cache, float32, float16 or 'q8_0' (int8 with one float scale per 32 "
                      "elements of a row, as GGML's Q8_0; head_dim a multiple of 32): V stored "
                      "[n_layer][n_head_kv][n_ctx][head_dim], K in blocks of 16 positions, "
                      "[head_dim][16] each once complete. keys() and values() of a q8_0 cache are float32 "
                      "copies of the elements it stands for.")
      .def(py::init([](int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t n_ctx, py::object dtype) {
             return new KVCache(n_layer, n_head_kv, head_dim, n_ctx, parse_kv_dtype(dtype));
           }),
           py::arg("n_layer"), py::arg("n_head_kv"), py::arg("head_dim"), py::arg("n_ctx"),
           py::arg("dtype") = "float32")
      .def("append", &kv_append_py, py::arg("layer"), py::arg("k"), py::arg("v"), py::arg("pos"),
           "Write K (already rotated) and V, float32 [M, n_head_kv * head_dim], at positions pos..pos+M-1; "
           "pos must be <= n_pos(layer) and pos + M <= n_ctx.")
      .def(
          "keys", [](py::object self, int64_t layer) { return kv_view(self, layer, false); }, py::arg("layer"),
          "Read-only copy [n_head_kv, n_ctx, head_dim] of one layer's keys, in position order.")
      .def(
          "values", [](py::object self, int64_t layer) { return kv_view(self, layer, true); }, py::arg("layer"),
          "Read-only view [n_head_kv, n_ctx, head_dim] of one layer's values.")
      .def("n_pos", &KVCache::n_pos, py::arg("layer"), "Positions a layer holds.")
      .def("clear", &KVCache::clear, "Forget every position of every layer.")
      .def_property_readonly("n_layer", &KVCache::n_layer)
      .def_property_readonly("n_head_kv", &KVCache::n_head_kv)
      .def_property_readonly("head_dim", &KVCache::head_dim)
      .def_property_readonly("n_ctx", &KVCache::n_ctx)
      .def_property_readonly("nbytes", &KVCache::nbytes)
      .def_property_readonly("dtype", [](const KVCache& c) -> py::object {
        if (c.type() == KV_Q8_0) return py::str("q8_0");
        return kv_dtype(c.type());
      });
  m.def("attention", &attention_py, py::arg("q"), py::arg("cache"), py::arg("layer"), py::arg("pos"), py::arg("n_head"),
        py::arg("scale") = py::none(), py::arg("window") = 0, py::arg("n_threads") = 1, py::arg("out") = py::none(),
        "Causal grouped-query attention of q[M, n_head * head_dim] (float32) at positions pos..pos+M-1 "
        "against the cache's layer (which must hold them); scale defaults to 1/sqrt(head_dim); window > 0 "
        "limits each query to its last `window` keys. Returns [M, n_head * head_dim].");

  m.def("architectures", &architectures, "Names of the architectures the C++ forward pass implements.");
  py::class_<PyModel>(m, "Model", "Weights of a model of one architecture, shared by its sequences.")
      .def(py::init(&make_model_py), py::arg("architecture"), py::arg("params"), py::arg("tensors"),
           py::arg("repack") = true,
           "params: hyperparameters by name (numbers; the architecture's description says which); "
           "tensors: GGUF name -> (array, type, rows, cols), every one of which the architecture must "
           "read. repack: make the 16-row interleaved copy of quantized matrices once, for the fast path.")
      .def_property_readonly("repacked_bytes", [](const PyModel& p) { return p.model->repacked_bytes(); });
  py::class_<Sequence>(m, "Sequence", "One sequence: KV cache, position, scratch for n_batch tokens.")
      .def(py::init([](const PyModel& model, int64_t n_ctx, int64_t n_batch, py::object kv_dtype) {
             return new Sequence(model.model, n_ctx, n_batch, parse_kv_dtype(kv_dtype));
           }),
           py::arg("model"), py::arg("n_ctx"), py::arg("n_batch"), py::arg("kv_dtype") = "float32",
           py::keep_alive<1, 2>())  // the model's arrays (views of the mapped file) outlive the sequence
      .def(
          "eval",
          [](Sequence& c, py::array ids, py::array logits, bool all_logits, const std::string& precision,
             int n_threads) { sequence_run_py(c, ids, logits, all_logits, precision, n_threads, false); },
          py::arg("ids"), py::arg("logits"), py::arg("all_logits"), py::arg("precision"), py::arg("n_threads"),
          "Run int32 ids (1..n_batch of them) at the next positions; write the logits of every token "
          "(all_logits) or of the last into logits [rows, n_vocab].")
      .def(
          "embed",
          [](Sequence& c, py::array ids, py::array hidden, bool all_rows, const std::string& precision, int n_threads) {
            sequence_run_py(c, ids, hidden, all_rows, precision, n_threads, true);
          },
          py::arg("ids"), py::arg("hidden"), py::arg("all_rows"), py::arg("precision"), py::arg("n_threads"),
          "As eval, writing the final hidden states (after the output norm) of every token (all_rows) or of "
          "the last into hidden [rows, n_embd].")
      .def("truncate", &Sequence::truncate, py::arg("n"), "Forget positions >= n.")
      .def("copy_prefix", &Sequence::copy_prefix, py::arg("src"), py::arg("n"), py::call_guard<GilReleased>(),
           "Hold src's first n positions (an exact copy of its KV cache) and nothing after them.")
      .def_property_readonly("n_past", &Sequence::n_past)
      .def_property_readonly("n_ctx", &Sequence::n_ctx)
      .def_property_readonly("n_batch", &Sequence::n_batch)
      .def_property_readonly("kv_nbytes", [](const Sequence& c) { return c.cache().nbytes(); });
  py::class_<Batch>(m, "Batch", "Many sequences in one forward pass: up to n_rows token rows per step, all together.")
      .def(py::init([](const PyModel& model, int64_t n_rows) { return new Batch(model.model, n_rows); }),
           py::arg("model"), py::arg("n_rows"), py::keep_alive<1, 2>())
      .def(
          "step",
          [](Batch& b, const std::vector<Sequence*>& contexts, py::array ids, py::array counts, py::array logits,
             const std::string& precision, int n_threads, const py::object& n_logits) {
            batch_run_py(b, contexts, ids, counts, logits, precision, n_threads, false, n_logits);
          },
          py::arg("contexts"), py::arg("ids"), py::arg("counts"), py::arg("logits"), py::arg("precision"),
          py::arg("n_threads"), py::arg("n_logits") = py::none(),
          "Append counts[b] (int64 [n]) of the ids (int32, back to back) to contexts[b] (n distinct sequences "
          "of this model), every weight read once for all of them; write each one's next-token logits into "
          "logits [n, n_vocab], or with n_logits (int64 [n]) those after each one's last n_logits[b] tokens, "
          "back to back, [sum(n_logits), n_vocab].")
      .def(
          "embed",
          [](Batch& b, const std::vector<Sequence*>& contexts, py::array ids, py::array counts, py::array hidden,
             const std::string& precision,
             int n_threads) { batch_run_py(b, contexts, ids, counts, hidden, precision, n_threads, true); },
          py::arg("contexts"), py::arg("ids"), py::arg("counts"), py::arg("hidden"), py::arg("precision"),
          py::arg("n_threads"),
          "As step, writing the final hidden states (after the output norm) of every token, in the order of "
          "ids, into hidden [sum(counts), n_embd].")
      .def_property_readonly("n_rows", &Batch::n_rows);
}
