// The GEMM self-check of the custom-op library (gemm_check.cpp): an exact 8-bit GEMM path for this CPU, proven.
#pragma once

#include <string>

#include "ort_abi.h"

namespace ivit {
// Probe onnxruntime's 8-bit GEMMs with a copy of `options`, add session.x64quantprecision=1 to them where that
// makes them exact, record the outcome as the entry ivit.gemm_check; "" or the one-line reason to refuse.
std::string check_gemms(const ort::Api* api, ort::SessionOptions* options);
// The CPU's brand string (cpuid on x86), for messages.
std::string cpu_name();
}  // namespace ivit
