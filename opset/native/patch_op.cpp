// QuantizePatches, domain ai.ivit.engine, which only the onnxruntime engine's compile step writes
// (ivit_onnx/engines/onnxruntime/patch_quantize.py): the input QuantizeLinear of a patch embedding and its
// im2col (Reshape, Transpose(0, 2, 4, 1, 3, 5), Reshape) in one pass over the image, on onnxruntime's pool.
//   QuantizePatches(x, y_scale, y_zero_point) -> y, attributes patch_h, patch_w:
//   x float [N, C, H, W] (H, W multiples of the patch), y_scale float and y_zero_point int8 or uint8 single
//   values, y [N, (H / patch_h) * (W / patch_w), C * patch_h * patch_w] of y_zero_point's type, with
//   y[n, ho * Wo + wo, (c * patch_h + i) * patch_w + j] = QuantizeLinear(x[n, c, ho * patch_h + i, wo * patch_w + j]).
// QuantizeLinear as onnxruntime's (MLAS; kernels.cpp's ivit_quantize_linear): x / y_scale in float, clipped to
// [qmin - zp, qmax - zp] with a NaN taking the lower bound, rounded half to even, plus zp. Division and rounding
// are IEEE operations, so every CPU gives the same bytes.

#include <cstring>
#include <string>
#include <vector>

#include "kernels.h"
#include "ort_abi.h"
#include "ort_op.h"
#include "ort_tensor.h"

namespace {

using i64 = int64_t;
const ort::Api* g_api = nullptr;

using Error = ivit::OrtError;

void check(ort::Status* s) { ivit::ort_check(g_api, s); }

ivit::OrtTensor read(const ort::Value* v) { return ivit::read_tensor(g_api, v, check); }

struct Kernel {
  i64 ph, pw;
  std::string node;
};

struct Job {
  const float* x;
  uint8_t* y;
  i64 c, h, w, ph, pw, ho, wo, zp;
  float scale;
  int to;  // kernels.h's code of y: 0 int8, 1 uint8
};

// Task t: the patch row (n, ho) = divmod(t, Ho): each of its C * patch_h image rows quantized once
// (kernels.cpp), then cut into its Wo patches' rows.
void run_rows(void* data, size_t t) {
  const Job& j = *static_cast<const Job*>(data);
  const i64 n = static_cast<i64>(t) / j.ho, ho = static_cast<i64>(t) % j.ho, row = j.c * j.ph * j.pw;
  thread_local std::vector<uint8_t> buf;
  buf.resize(j.w);
  const uint8_t* q = buf.data();
  for (i64 c = 0; c < j.c; ++c) {
    for (i64 i = 0; i < j.ph; ++i) {
      ivit_quantize_linear(j.x + ((n * j.c + c) * j.h + ho * j.ph + i) * j.w, j.w, j.scale, j.zp, j.to, buf.data());
      uint8_t* dst = j.y + (n * j.ho + ho) * j.wo * row + (c * j.ph + i) * j.pw;
      if (j.pw == 16) {  // ViTs' patches: one 16-byte move each, not a call to memcpy
        for (i64 p = 0; p < j.wo; ++p) std::memcpy(dst + p * row, q + p * 16, 16);
      } else {
        for (i64 p = 0; p < j.wo; ++p) std::memcpy(dst + p * row, q + p * j.pw, j.pw);
      }
    }
  }
}

ort::Status* create(const ort::CustomOp*, const ort::Api*, const ort::KernelInfo* info, void** out) {
  const std::string node = ivit::ort_node_name(g_api, info);
  i64 p[2] = {0, 0};
  const char* names[2] = {"patch_h", "patch_w"};
  for (int i = 0; i < 2; ++i) {
    if (!ivit::ort_attribute(g_api, info, names[i], p[i]) || p[i] < 1)
      return ivit::ort_error(g_api, "ai.ivit.engine QuantizePatches node '" + node + "' refused: attribute " +
                                        names[i] + " must be at least 1");
  }
  *out = new Kernel{p[0], p[1], node};
  return nullptr;
}

ort::Status* compute(void* kernel, ort::KernelContext* ctx) {
  const Kernel& kn = *static_cast<const Kernel*>(kernel);
  try {
    const ivit::OrtTensor x = read(ivit::ort_input(g_api, ctx, 0)), s = read(ivit::ort_input(g_api, ctx, 1));
    const ivit::OrtTensor z = read(ivit::ort_input(g_api, ctx, 2));
    if (x.elem != ort::FLOAT || x.shape.size() != 4) throw Error{"x must be a float [N, C, H, W]"};
    if (s.elem != ort::FLOAT || s.size != 1) throw Error{"y_scale must be a single float"};
    if ((z.elem != ort::UINT8 && z.elem != ort::INT8) || z.size != 1)
      throw Error{"y_zero_point must be a single int8 or uint8"};
    Job j{};
    j.c = x.shape[1], j.h = x.shape[2], j.w = x.shape[3], j.ph = kn.ph, j.pw = kn.pw;
    if (j.h % j.ph || j.w % j.pw)
      throw Error{"the image's " + std::to_string(j.h) + " x " + std::to_string(j.w) + " is not whole " +
                  std::to_string(j.ph) + " x " + std::to_string(j.pw) + " patches"};
    j.ho = j.h / j.ph, j.wo = j.w / j.pw;
    j.scale = *static_cast<const float*>(s.data);
    j.zp = z.at(0), j.to = z.elem == ort::UINT8 ? 1 : 0;
    const i64 dims[3] = {x.shape[0], j.ho * j.wo, j.c * j.ph * j.pw};
    ort::Value* out = nullptr;
    check(g_api->fn<ort::Status*(ort::KernelContext*, size_t, const int64_t*, size_t, ort::Value**)>(
        ort::KernelContext_GetOutput)(ctx, 0, dims, 3, &out));
    j.x = static_cast<const float*>(x.data), j.y = static_cast<uint8_t*>(const_cast<void*>(read(out).data));
    ivit::ort_parallel_for(g_api, ctx, run_rows, static_cast<size_t>(x.shape[0] * j.ho), &j);
    return nullptr;
  } catch (const Error& e) {
    return ivit::ort_error(g_api, "ai.ivit.engine QuantizePatches node '" + kn.node + "': " + e.msg);
  }
}

}  // namespace

namespace ivit {

const ort::CustomOp* patch_op(const ort::Api* api) {
  g_api = api;
  static const ort::CustomOp op = [] {
    ort::CustomOp o = ort_custom_op();
    o.GetName = [](const ort::CustomOp*) { return "QuantizePatches"; };
    // x, y_scale float; y_zero_point and y the output's type (the last undefined input's)
    o.GetInputType = [](const ort::CustomOp*, size_t i) { return i < 2 ? ort::FLOAT : ort::UNDEFINED; };
    o.GetInputTypeCount = [](const ort::CustomOp*) -> size_t { return 3; };
    o.GetOutputType = [](const ort::CustomOp*, size_t) { return ort::UNDEFINED; };
    o.GetOutputTypeCount = [](const ort::CustomOp*) -> size_t { return 1; };
    o.KernelDestroy = [](void* k) { delete static_cast<Kernel*>(k); };
    o.CreateKernelV2 = create;
    o.KernelComputeV2 = compute;
    return o;
  }();
  return &op;
}

}  // namespace ivit
