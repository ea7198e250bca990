// bindings.cpp: the pyinfer._C module, the only file that knows pybind11. Every kernel call
// releases the GIL; arrays are passed as pointers into NumPy buffers without copies.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "bandwidth.h"
#include "cpu_features.h"
#include "dispatch.h"

namespace py = pybind11;
using namespace pyinfer;

namespace {

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
  out["isa"] = isa_name(kernels().isa);
  return out;
}

// Dequantize a 1-D uint8 array of raw GGUF blocks into a new float32 array of n elements.
py::array_t<float> dequantize(uint32_t type, py::array_t<uint8_t, py::array::c_style> raw,
                              int64_t n) {
  const TypeSize ts = type_size(type);
  if (ts.block_elems == 0) throw py::value_error("unsupported tensor type id " + std::to_string(type));
  const DequantRowFn fn = type < GGML_TYPE_SLOTS ? kernels().dequant_row[type] : nullptr;
  if (fn == nullptr) throw py::value_error("no dequantization kernel for type id " + std::to_string(type));
  if (n < 0 || n % ts.block_elems != 0)
    throw py::value_error("n=" + std::to_string(n) + " is not a multiple of the block size " +
                          std::to_string(ts.block_elems));
  const int64_t need = n / ts.block_elems * ts.block_bytes;
  if (raw.ndim() != 1 || raw.shape(0) != need)
    throw py::value_error("raw must be a 1-D uint8 array of " + std::to_string(need) + " bytes for " +
                          std::to_string(n) + " elements");
  py::array_t<float> out(n);
  const void* src = raw.data();
  float* dst = out.mutable_data();
  {
    py::gil_scoped_release release;
    fn(src, dst, n);
  }
  return out;
}

py::dict read_bandwidth(size_t n_bytes, int n_threads, int repeats) {
  BandwidthResult r;
  {
    py::gil_scoped_release release;
    r = measure_read_bandwidth(n_bytes, n_threads, repeats);
  }
  py::dict out;
  out["n_bytes"] = r.n_bytes;
  out["n_threads"] = r.n_threads;
  out["seconds"] = r.seconds;
  out["checksum"] = r.checksum;
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "pyinfer's C++ kernels";
  // Resolve PYINFER_ISA now: a bad value fails the import with its message, not a later call.
  (void)kernels();

  m.def("cpu_info", &cpu_info, "Detected CPU features, compiled and available ISA paths, the active one.");
  m.def("get_isa", [] { return std::string(isa_name(kernels().isa)); }, "The active ISA path.");
  m.def("set_isa", [](const std::string& name) { set_isa(parse_isa(name)); }, py::arg("name"),
        "Switch the active ISA path: 'scalar', 'avx2' or 'avx512'.");
  m.def("dequantize", &dequantize, py::arg("type"), py::arg("raw"), py::arg("n"),
        "Dequantize n elements of raw GGUF blocks of the given type id to float32.");
  m.def("read_bandwidth", &read_bandwidth, py::arg("n_bytes") = size_t(512) << 20,
        py::arg("n_threads") = 1, py::arg("repeats") = 10,
        "Time `repeats` passes reading an n_bytes array with n_threads threads.");
}
