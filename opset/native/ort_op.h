// The plumbing every custom op of the library repeats around onnxruntime's C API: error statuses as
// exceptions, the node's name, an int64 attribute, an input (null where an optional one is absent),
// onnxruntime's intra-op pool, and the OrtCustomOp fields that are the same for every op (qgemm_op.cpp,
// qbatch_op.cpp, patch_op.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ort_abi.h"
#include "parallel.h"

namespace ivit {

struct OrtError {
  std::string msg;
};

// Throws a non-null status as an OrtError (its message copied, the status released).
inline void ort_check(const ort::Api* api, ort::Status* s) {
  if (!s) return;
  std::string msg = api->fn<const char*(const ort::Status*)>(ort::GetErrorMessage)(s);
  api->fn<void(ort::Status*)>(ort::ReleaseStatus)(s);
  throw OrtError{msg};
}

inline ort::Status* ort_error(const ort::Api* api, const std::string& msg) {
  return api->fn<ort::Status*(ort::ErrorCode, const char*)>(ort::CreateStatus)(ort::INVALID_ARGUMENT, msg.c_str());
}

inline std::string ort_node_name(const ort::Api* api, const ort::KernelInfo* info) {
  char buf[512];
  size_t size = sizeof(buf);
  ort::Status* s = api->fn<ort::Status*(const ort::KernelInfo*, char*, size_t*)>(ort::KernelInfo_GetNodeName)(
      info, buf, &size);
  if (s) {
    api->fn<void(ort::Status*)>(ort::ReleaseStatus)(s);
    return "?";
  }
  return buf;
}

// The node's int64 attribute ``name`` into out; false where the node has none.
inline bool ort_attribute(const ort::Api* api, const ort::KernelInfo* info, const char* name, int64_t& out) {
  ort::Status* s = api->fn<ort::Status*(const ort::KernelInfo*, const char*, int64_t*)>(
      ort::KernelInfoGetAttribute_int64)(info, name, &out);
  if (s) api->fn<void(ort::Status*)>(ort::ReleaseStatus)(s);
  return !s;
}

// Input i of the running node; null where it is an absent optional input (or past the node's inputs).
inline const ort::Value* ort_input(const ort::Api* api, ort::KernelContext* ctx, size_t i) {
  size_t count = 0;
  ort_check(api, api->fn<ort::Status*(const ort::KernelContext*, size_t*)>(ort::KernelContext_GetInputCount)(ctx,
                                                                                                          &count));
  if (i >= count) return nullptr;
  const ort::Value* v = nullptr;
  ort_check(api, api->fn<ort::Status*(const ort::KernelContext*, size_t, const ort::Value**)>(
                     ort::KernelContext_GetInput)(ctx, i, &v));
  return v;
}

// fn(data, i) for every i < total on onnxruntime's intra-op pool (on the calling thread where it has none).
inline void ort_parallel_for(const ort::Api* api, ort::KernelContext* ctx, void (*fn)(void*, size_t), size_t total,
                             void* data) {
  using ParallelFor = ort::Status*(const ort::KernelContext*, void (*)(void*, size_t), size_t, size_t, void*);
  ort::Status* s = total > 1 ? api->fn<ParallelFor>(ort::KernelContext_ParallelFor)(ctx, fn, total, 0, data)
                             : api->fn<ort::Status*(ort::ErrorCode, const char*)>(ort::CreateStatus)(ort::FAIL, "");
  if (s) {
    api->fn<void(ort::Status*)>(ort::ReleaseStatus)(s);
    for (size_t t = 0; t < total; ++t) fn(data, t);
  }
}

// While alive, the native kernels called on this thread hand their chunks to onnxruntime's pool (parallel.h).
struct OrtPoolScope {
  struct Ctx {
    const ort::Api* api;
    ort::KernelContext* ctx;
  } c;
  ParallelHook old;
  OrtPoolScope(const ort::Api* api, ort::KernelContext* ctx) : c{api, ctx}, old(set_parallel_hook({&run, &c})) {}
  ~OrtPoolScope() { set_parallel_hook(old); }
  OrtPoolScope(const OrtPoolScope&) = delete;
  OrtPoolScope& operator=(const OrtPoolScope&) = delete;
  static void run(void* p, void (*fn)(void*, size_t), size_t total, void* data) {
    const Ctx& c = *static_cast<const Ctx*>(p);
    ort_parallel_for(c.api, c.ctx, fn, total, data);
  }
};

// An OrtCustomOp with the fields every op of the library sets alike (version, CPU, inputs required, outputs
// optional as ort_ops.cpp's, no variadics, opset version 1); the caller sets names, types and kernels.
inline ort::CustomOp ort_custom_op() {
  ort::CustomOp o{};
  o.version = ort::API_VERSION;
  o.CreateKernel = [](const ort::CustomOp*, const ort::Api*, const ort::KernelInfo*) -> void* { return nullptr; };
  o.GetExecutionProviderType = [](const ort::CustomOp*) -> const char* { return nullptr; };
  o.GetOutputCharacteristic = [](const ort::CustomOp*, size_t) { return ort::OPTIONAL; };
  o.GetInputCharacteristic = [](const ort::CustomOp*, size_t) { return ort::REQUIRED; };
  o.KernelCompute = [](void*, ort::KernelContext*) {};
  o.GetInputMemoryType = [](const ort::CustomOp*, size_t) { return 0; };
  o.GetVariadicInputMinArity = [](const ort::CustomOp*) { return 1; };
  o.GetVariadicInputHomogeneity = [](const ort::CustomOp*) { return 0; };
  o.GetVariadicOutputMinArity = [](const ort::CustomOp*) { return 1; };
  o.GetVariadicOutputHomogeneity = [](const ort::CustomOp*) { return 0; };
  o.GetStartVersion = [](const ort::CustomOp*) { return 1; };
  o.GetEndVersion = [](const ort::CustomOp*) { return 1; };
  return o;
}

}  // namespace ivit
