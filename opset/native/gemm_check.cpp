// The GEMM self-check run when the library is registered (ort_ops.cpp's RegisterCustomOps): picks an exact
// 8-bit GEMM path for the CPU the session runs on and proves it through the same kernels.
//
// The session-time rewrites hand onnxruntime uint8 x int8 and uint8 x uint8 MatMulIntegers, its fast forms.
// On x86 CPUs without VNNI its uint8 x int8 kernel adds pairs of products in int16 with saturation, so the
// library runs the probe of gemm_probe.h (each form at its worst case) in a session with a copy of the
// caller's options:
//   1. every fast form exact: nothing to do (VNNI, ARM, ...);
//   2. otherwise, with session.x64quantprecision=1 added (onnxruntime then stores constant int8 weights as
//      uint8 and takes its exact U8U8 kernels; it needs graph optimizations at ORT_ENABLE_EXTENDED or above),
//      exact: the caller's options get that entry too;
//   3. otherwise the fast forms cannot be trusted here: registration fails with one line naming the CPU, the
//      form and the fallback, unless the caller set ivit.int8_gemms=1 (its model runs the int8 x int8 GEMMs
//      as converted, which the probe then checks instead). ivit_onnx.InferenceSession does that by itself.
// The outcome is left in the caller's options as the config entry ivit.gemm_check. For tests on any CPU,
// IVIT_GEMM_PROBE_FAULT makes forms count as wrong: `saturate` the uint8 x int8 form unless
// session.x64quantprecision=1 (an AVX2 CPU), `uint8` every fast form, `all` every form.

#include "gemm_check.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gemm_probe.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace ivit {
namespace {

constexpr const char* PRECISION_KEY = "session.x64quantprecision";
constexpr const char* INT8_KEY = "ivit.int8_gemms";
constexpr const char* RESULT_KEY = "ivit.gemm_check";

struct Probe {
  const ort::Api* api;
  template <class Sig>
  Sig* fn(ort::Slot s) const { return api->fn<Sig>(s); }

  // An onnxruntime status as text (released), or "" for success.
  std::string text(ort::Status* s) const {
    if (!s) return "";
    std::string msg = fn<const char*(const ort::Status*)>(ort::GetErrorMessage)(s);
    fn<void(ort::Status*)>(ort::ReleaseStatus)(s);
    return msg.empty() ? "error" : msg;
  }

  std::string config(const ort::SessionOptions* o, const char* key) const {
    int has = 0;
    if (!text(fn<ort::Status*(const ort::SessionOptions*, const char*, int*)>(ort::HasSessionConfigEntry)(o, key, &has))
             .empty() || !has)
      return "";
    char value[64] = {0};
    size_t size = sizeof(value);
    if (!text(fn<ort::Status*(const ort::SessionOptions*, const char*, char*, size_t*)>(ort::GetSessionConfigEntry)(
                  o, key, value, &size)).empty())
      return "";
    return value;
  }

  std::string set(ort::SessionOptions* o, const char* key, const char* value) const {
    return text(fn<ort::Status*(ort::SessionOptions*, const char*, const char*)>(ort::AddSessionConfigEntry)(o, key,
                                                                                                               value));
  }

  // Run the probe with a copy of `options`; fills `wrong` with "form gave X instead of Y" for each inexact form.
  // Returns "" or why the probe could not run.
  std::string run(const ort::SessionOptions* options, std::vector<std::string>& wrong) const {
    ort::SessionOptions* clone = nullptr;
    ort::Env* env = nullptr;
    ort::Session* session = nullptr;
    ort::MemoryInfo* mem = nullptr;
    constexpr size_t N_IN = sizeof(ivit_probe::FEEDS) / sizeof(ivit_probe::FEEDS[0]);
    constexpr size_t N_OUT = sizeof(ivit_probe::FORMS) / sizeof(ivit_probe::FORMS[0]);
    ort::Value* inputs[N_IN] = {};
    ort::Value* outputs[N_OUT] = {};
    std::vector<std::vector<int8_t>> data(N_IN);
    std::string err = text(fn<ort::Status*(const ort::SessionOptions*, ort::SessionOptions**)>(ort::CloneSessionOptions)(
        options, &clone));
    // the copy must not write the caller's files (profile, optimized model) or start the caller's thread count
    if (err.empty()) err = text(fn<ort::Status*(ort::SessionOptions*)>(ort::DisableProfiling)(clone));
#ifndef _WIN32
    if (err.empty())
      err = text(fn<ort::Status*(ort::SessionOptions*, const char*)>(ort::SetOptimizedModelFilePath)(clone, ""));
#endif
    if (err.empty()) err = text(fn<ort::Status*(ort::SessionOptions*, int)>(ort::SetIntraOpNumThreads)(clone, 1));
    if (err.empty())  // the process's environment when there is one (onnxruntime keeps a single one)
      err = text(fn<ort::Status*(int, const char*, ort::Env**)>(ort::CreateEnv)(3, "ivit-gemm-check", &env));
    if (err.empty())
      err = text(fn<ort::Status*(const ort::Env*, const void*, size_t, const ort::SessionOptions*, ort::Session**)>(
          ort::CreateSessionFromArray)(env, ivit_probe::MODEL, sizeof(ivit_probe::MODEL), clone, &session));
    if (err.empty()) err = text(fn<ort::Status*(int, int, ort::MemoryInfo**)>(ort::CreateCpuMemoryInfo)(1, 0, &mem));
    const char* in_names[N_IN];
    const char* out_names[N_OUT];
    for (size_t i = 0; i < N_IN && err.empty(); ++i) {
      const auto& f = ivit_probe::FEEDS[i];
      size_t count = 1;
      for (size_t d = 0; d < f.rank; ++d) count *= static_cast<size_t>(f.dims[d]);
      data[i].assign(count, static_cast<int8_t>(f.value));  // one byte per element: uint8 and int8 alike
      in_names[i] = f.name;
      err = text(fn<ort::Status*(const ort::MemoryInfo*, void*, size_t, const int64_t*, size_t, ort::ElemType,
                                 ort::Value**)>(ort::CreateTensorWithDataAsOrtValue)(
          mem, data[i].data(), count, f.dims, f.rank, static_cast<ort::ElemType>(f.elem), &inputs[i]));
    }
    for (size_t i = 0; i < N_OUT; ++i) out_names[i] = ivit_probe::FORMS[i].name;
    if (err.empty())
      err = text(fn<ort::Status*(ort::Session*, const void*, const char* const*, const ort::Value* const*, size_t,
                                 const char* const*, size_t, ort::Value**)>(ort::Run)(
          session, nullptr, in_names, inputs, N_IN, out_names, N_OUT, outputs));
    const std::string fault = std::getenv("IVIT_GEMM_PROBE_FAULT") ? std::getenv("IVIT_GEMM_PROBE_FAULT") : "";
    const bool precise = config(options, PRECISION_KEY) == "1";
    for (size_t i = 0; i < N_OUT && err.empty(); ++i) {
      const auto& form = ivit_probe::FORMS[i];
      void* raw = nullptr;
      err = text(fn<ort::Status*(ort::Value*, void**)>(ort::GetTensorMutableData)(outputs[i], &raw));
      if (!err.empty()) break;
      const int32_t* y = static_cast<const int32_t*>(raw);
      const bool faulty = fault == "all" || (fault == "uint8" && form.fast) ||
                          (fault == "saturate" && !precise && std::strcmp(form.name, "u8s8") == 0);
      for (int k = 0; k < ivit_probe::M * ivit_probe::N; ++k) {
        const int32_t want = form.expect[k % ivit_probe::N];
        if (y[k] != want || faulty) {
          wrong.push_back(std::string(form.name) + " gave " + std::to_string(y[k]) + " instead of " +
                          std::to_string(want) + (faulty ? " (IVIT_GEMM_PROBE_FAULT)" : ""));
          break;
        }
      }
    }
    for (auto* v : outputs)
      if (v) fn<void(ort::Value*)>(ort::ReleaseValue)(v);
    for (auto* v : inputs)
      if (v) fn<void(ort::Value*)>(ort::ReleaseValue)(v);
    if (mem) fn<void(ort::MemoryInfo*)>(ort::ReleaseMemoryInfo)(mem);
    if (session) fn<void(ort::Session*)>(ort::ReleaseSession)(session);
    if (env) fn<void(ort::Env*)>(ort::ReleaseEnv)(env);
    if (clone) fn<void(ort::SessionOptions*)>(ort::ReleaseSessionOptions)(clone);
    return err;
  }
};

bool is_fast(const std::string& wrong) {
  for (const auto& f : ivit_probe::FORMS)
    if (wrong.rfind(std::string(f.name) + " ", 0) == 0) return f.fast;
  return false;
}

std::string join(const std::vector<std::string>& v, bool fast) {
  std::string out;
  for (const auto& w : v)
    if (is_fast(w) == fast) out += (out.empty() ? "" : "; ") + w;
  return out;
}

}  // namespace

std::string cpu_name() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned int regs[12] = {0};
  unsigned int max = __get_cpuid_max(0x80000000u, nullptr);
  if (max >= 0x80000004u) {
    for (unsigned int i = 0; i < 3; ++i)
      __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    std::string name(reinterpret_cast<const char*>(regs), sizeof(regs));
    name = name.c_str();  // up to the first NUL
    size_t a = name.find_first_not_of(' '), b = name.find_last_not_of(' ');
    if (a != std::string::npos) return name.substr(a, b - a + 1);
  }
  return "an x86 CPU";
#elif defined(__aarch64__)
  return "an arm64 CPU";
#else
  return "this CPU";
#endif
}

std::string check_gemms(const ort::Api* api, ort::SessionOptions* options) {
  const Probe p{api};
  const bool int8_only = p.config(options, INT8_KEY) == "1";
  std::vector<std::string> wrong;
  std::string err = p.run(options, wrong);
  bool added = false;
  if (err.empty() && !join(wrong, true).empty() && p.config(options, PRECISION_KEY) != "1") {
    std::vector<std::string> again;
    ort::SessionOptions* clone = nullptr;
    err = p.text(api->fn<ort::Status*(const ort::SessionOptions*, ort::SessionOptions**)>(ort::CloneSessionOptions)(
        options, &clone));
    if (err.empty()) err = p.set(clone, PRECISION_KEY, "1");
    if (err.empty()) err = p.run(clone, again);
    if (clone) api->fn<void(ort::SessionOptions*)>(ort::ReleaseSessionOptions)(clone);
    if (err.empty() && join(again, true).empty()) {
      err = p.set(options, PRECISION_KEY, "1");
      added = true;
    }
    if (err.empty()) wrong = again;
  }
  if (!err.empty())
    return "ai.ivit custom-op library: the GEMM self-check could not run on " + cpu_name() + " (" + err +
           "), so onnxruntime's 8-bit GEMMs cannot be trusted with these session options";
  const std::string fast = join(wrong, true), slow = join(wrong, false);
  std::string result;
  if (!slow.empty())
    return "ai.ivit custom-op library: onnxruntime's int8 x int8 GEMM is not exact on " + cpu_name() + " (" + slow +
           "); no exact integer path is known here";
  if (int8_only) {
    result = fast.empty() ? "int8 GEMMs exact, uint8 forms exact too" : "int8 GEMMs exact, uint8 forms inexact: " + fast;
  } else if (!fast.empty()) {
    return "ai.ivit custom-op library: onnxruntime's uint8 GEMMs are not exact on " + cpu_name() +
           " with these session options, even with session.x64quantprecision=1 (which needs graph optimizations at "
           "ORT_ENABLE_EXTENDED or above): " + fast + ". Fallback: run the model as converted (int8 GEMMs, exact) with "
           "the session config entry ivit.int8_gemms=1 set before registering the library; "
           "ivit_onnx.InferenceSession does this by itself";
  } else {
    result = added ? "uint8 GEMMs exact with session.x64quantprecision=1, as uint8 x int8 saturates on " + cpu_name()
                   : "uint8 GEMMs exact";
  }
  err = p.set(options, RESULT_KEY, result.c_str());
  return err.empty() ? "" : "ai.ivit custom-op library: " + err;
}

}  // namespace ivit
