// The GEMM self-check run when the library is registered (ort_ops.cpp's RegisterCustomOps): picks an exact
// 8-bit GEMM path for the CPU the session runs on and proves it through the same kernels.
//
// The session-time rewrites hand onnxruntime uint8 x int8 and uint8 x uint8 MatMulIntegers and uint8 x uint8
// ConvIntegers, its fast forms.
// On x86 CPUs without VNNI its uint8 x int8 kernel adds pairs of products in int16 with saturation, so the
// library runs the probe of gemm_probe.h (each form at its worst case) in a session with a copy of the
// caller's options:
//   1. every fast form exact: nothing to do (VNNI, ARM, ...);
//   2. otherwise, with session.x64quantprecision=1 added (onnxruntime then stores constant int8 weights as
//      uint8 and takes its exact U8U8 kernels; it needs graph optimizations at ORT_ENABLE_EXTENDED or above),
//      exact: the caller's options get that entry too;
//   3. then it refuses only where a form the caller's model runs is inexact, in one line naming the CPU (on ARM
//      its core, from the MIDR in /proc/cpuinfo), the forms and the exact alternative if there is one. Which
//      forms run is the session config entry ivit.int8_gemms: "1" the model as converted (int8 x int8; the
//      fallback where the uint8 forms are inexact), "0" a compiled artifact's uint8 forms (the way out where
//      int8 x int8 wraps: ARM cores without a dot product), unset either (every form must be exact).
//      ivit_onnx.InferenceSession sets it, and picks the exact forms by itself.
// The outcome and what the probe found for each form are left in the caller's options as the config entry
// ivit.gemm_check ("<outcome>; forms: u8s8 exact, ..."), refused or not. For tests on any CPU,
// IVIT_GEMM_PROBE_FAULT makes forms count as wrong: `saturate` the uint8 x int8 form unless
// session.x64quantprecision=1 (an AVX2 CPU), `wrap` the int8 x int8 forms (a Cortex-A72), `uint8` every fast
// form, `all` every form.

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
      const bool faulty = fault == "all" || (fault == "uint8" && form.fast) || (fault == "wrap" && !form.fast) ||
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

// What the probe found for each form: "" (exact) or "gave X instead of Y".
std::vector<std::string> findings(const std::vector<std::string>& wrong) {
  std::vector<std::string> out;
  for (const auto& f : ivit_probe::FORMS) {
    std::string found;
    for (const auto& w : wrong)
      if (w.rfind(std::string(f.name) + " ", 0) == 0) found = w.substr(std::strlen(f.name) + 1);
    out.push_back(found);
  }
  return out;
}

// "; "-joined "form gave X instead of Y" for the inexact forms of one family (fast: the uint8 forms).
std::string inexact(const std::vector<std::string>& found, bool fast) {
  std::string out;
  for (size_t i = 0; i < found.size(); ++i)
    if (ivit_probe::FORMS[i].fast == fast && !found[i].empty())
      out += (out.empty() ? "" : "; ") + std::string(ivit_probe::FORMS[i].name) + " " + found[i];
  return out;
}

// The record of every form: "u8s8 exact, u8u8 exact, s8s8_const inexact (gave X instead of Y), ...".
std::string record(const std::vector<std::string>& found) {
  std::string out;
  for (size_t i = 0; i < found.size(); ++i)
    out += (i ? ", " : "") + std::string(ivit_probe::FORMS[i].name) +
           (found[i].empty() ? " exact" : " inexact (" + found[i] + ")");
  return out;
}

#if defined(__aarch64__)
// ARM cores by MIDR implementer and part number (the same table as ivit_onnx/cpu.py's ARM_CORES).
struct Core { unsigned implementer, part; const char* name; };
constexpr Core ARM_CORES[] = {
    {0x41, 0xd03, "Cortex-A53"}, {0x41, 0xd04, "Cortex-A35"}, {0x41, 0xd05, "Cortex-A55"},
    {0x41, 0xd07, "Cortex-A57"}, {0x41, 0xd08, "Cortex-A72"}, {0x41, 0xd09, "Cortex-A73"},
    {0x41, 0xd0a, "Cortex-A75"}, {0x41, 0xd0b, "Cortex-A76"}, {0x41, 0xd0c, "Neoverse-N1"},
    {0x41, 0xd0d, "Cortex-A77"}, {0x41, 0xd40, "Neoverse-V1"}, {0x41, 0xd41, "Cortex-A78"},
    {0x41, 0xd44, "Cortex-X1"}, {0x41, 0xd46, "Cortex-A510"}, {0x41, 0xd47, "Cortex-A710"},
    {0x41, 0xd48, "Cortex-X2"}, {0x41, 0xd49, "Neoverse-N2"}, {0x41, 0xd4f, "Neoverse-V2"},
    {0x41, 0xd80, "Cortex-A520"}, {0x41, 0xd81, "Cortex-A720"}, {0x41, 0xd82, "Cortex-X4"},
    {0x41, 0xd84, "Neoverse-V3"}, {0x41, 0xd8e, "Neoverse-N3"}, {0x46, 0x001, "A64FX"},
    {0x61, 0x022, "Apple M1"}, {0x61, 0x023, "Apple M1"}, {0x61, 0x032, "Apple M2"}, {0x61, 0x033, "Apple M2"},
    {0xc0, 0xac3, "Ampere-1"},
};

std::string arm_core() {
  FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (!f) return "an ARM64 CPU";
  char line[512];
  long implementer = -1, part = -1;
  while (std::fgets(line, sizeof(line), f) && (implementer < 0 || part < 0)) {
    const char* colon = std::strchr(line, ':');
    if (!colon) continue;
    if (std::strncmp(line, "CPU implementer", 15) == 0) implementer = std::strtol(colon + 1, nullptr, 0);
    if (std::strncmp(line, "CPU part", 8) == 0) part = std::strtol(colon + 1, nullptr, 0);
  }
  std::fclose(f);
  for (const Core& c : ARM_CORES)
    if (static_cast<long>(c.implementer) == implementer && static_cast<long>(c.part) == part) return c.name;
  if (implementer < 0 || part < 0) return "an ARM64 CPU";
  char name[80];
  std::snprintf(name, sizeof(name), "an ARM64 CPU (MIDR implementer 0x%02lx, part 0x%03lx)", implementer, part);
  return name;
}
#endif

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
  return arm_core();
#else
  return "this CPU";
#endif
}

std::string check_gemms(const ort::Api* api, ort::SessionOptions* options) {
  const Probe p{api};
  // the forms the caller's model runs: "1" int8 x int8 (as converted), "0" the uint8 forms (a compiled
  // artifact), unset: unknown (a converted model or an artifact), so every form must be exact
  const std::string declared = p.config(options, INT8_KEY);
  const bool runs_int8 = declared != "0", runs_uint8 = declared != "1";
  std::vector<std::string> wrong;
  std::string err = p.run(options, wrong);
  bool added = false;
  if (err.empty() && !inexact(findings(wrong), true).empty() && p.config(options, PRECISION_KEY) != "1") {
    std::vector<std::string> again;
    ort::SessionOptions* clone = nullptr;
    err = p.text(api->fn<ort::Status*(const ort::SessionOptions*, ort::SessionOptions**)>(ort::CloneSessionOptions)(
        options, &clone));
    if (err.empty()) err = p.set(clone, PRECISION_KEY, "1");
    if (err.empty()) err = p.run(clone, again);
    if (clone) api->fn<void(ort::SessionOptions*)>(ort::ReleaseSessionOptions)(clone);
    if (err.empty() && inexact(findings(again), true).empty()) {
      err = p.set(options, PRECISION_KEY, "1");
      added = true;
    }
    if (err.empty()) wrong = again;
  }
  if (!err.empty())
    return "ai.ivit custom-op library: the GEMM self-check could not run on " + cpu_name() + " (" + err +
           "), so onnxruntime's 8-bit GEMMs cannot be trusted with these session options";
  const std::vector<std::string> found = findings(wrong);
  const std::string fast = inexact(found, true), slow = inexact(found, false);
  const std::string forms = "; forms: " + record(found);
  std::string result;
  if (!runs_uint8)
    result = !slow.empty() ? "int8 GEMMs inexact"
             : fast.empty() ? "int8 GEMMs exact, uint8 forms exact too" : "int8 GEMMs exact, uint8 forms inexact";
  else if (!fast.empty())
    result = "uint8 GEMMs inexact";
  else if (added)
    result = "uint8 GEMMs exact with session.x64quantprecision=1, as uint8 x int8 saturates on " + cpu_name();
  else
    result = "uint8 GEMMs exact";
  // left in the caller's options whatever the outcome, so a refusal's reader sees every form too
  err = p.set(options, RESULT_KEY, (result + forms).c_str());
  if (!err.empty()) return "ai.ivit custom-op library: " + err;
  const std::string head = "ai.ivit custom-op library: onnxruntime's ";
  if (runs_uint8 && !fast.empty()) {
    const std::string why = head + "uint8 GEMMs are not exact on " + cpu_name() +
                            " with these session options, even with session.x64quantprecision=1 (which needs graph "
                            "optimizations at ORT_ENABLE_EXTENDED or above): " + fast + ". ";
    if (!slow.empty()) return why + "The int8 x int8 GEMMs are not exact either (" + slow + "): no exact integer path "
                                    "is known here";
    return why + "Fallback: run the model as converted (int8 GEMMs, exact) with the session config entry "
                 "ivit.int8_gemms=1 set before registering the library; ivit_onnx.InferenceSession does this by itself";
  }
  if (runs_int8 && !slow.empty()) {
    const std::string why = head + "int8 x int8 GEMM is not exact on " + cpu_name() + " (" + slow + "). ";
    if (!fast.empty()) return why + "The uint8 forms are not exact either (" + fast + "): no exact integer path is "
                                    "known here";
    return why + "Exact alternative: the uint8 GEMMs of a compiled artifact (ivit-onnx compile), with the session "
                 "config entry ivit.int8_gemms=0 set before registering the library; ivit_onnx.InferenceSession does "
                 "this by itself";
  }
  return "";
}

}  // namespace ivit
