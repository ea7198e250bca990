// int8_peak.h: the compute ceiling of the fast kernels: the rate of the active ISA's int8
// dot-product instruction on one core.
#pragma once

namespace pyinfer {

// Multiply-adds per second of the active ISA's int8 dot-product instruction on the calling
// thread (probe_kernels.h, Int8PeakFn), timed over about min_seconds: the compute ceiling of
// the fast kernels. 0 when the ISA has no such instruction (the scalar path).
double int8_peak_rate(double min_seconds);

}  // namespace pyinfer
