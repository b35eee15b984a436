// The onnxruntime custom ops of QGemm (qgemm.h), domain ai.ivit.engine, which only the onnxruntime engine's
// compile step writes (ivit_onnx/engines/onnxruntime/qgemm_fold.py):
//   QGemm(A, a_zero_point, B, b_zero_point, x_zero_point, multiplier, shift, y_zero_point) -> y
//   QGemmTable(..., y_zero_point, table) -> table[y - qmin]
// attributes qmin, qmax. Every input but A must be a constant initializer: B is packed, and the parameters
// expanded per column, once, when onnxruntime creates the kernel; the kernel is then immutable, so onnxruntime
// may run it concurrently. The rows run on onnxruntime's intra-op pool (one thread: one core).

#include <string>
#include <vector>

#include "ort_abi.h"
#include "ort_op.h"
#include "ort_tensor.h"
#include "qgemm.h"

namespace {

using i64 = int64_t;
const ort::Api* g_api = nullptr;

template <class Sig>
Sig* api(ort::Slot s) { return g_api->fn<Sig>(s); }

// KernelInfoGetConstantInput_tensor (API version 15): Status*(const KernelInfo*, size_t, int* is_constant,
// const Value** out); not in ort_abi.h's list, which other parts of the library share.
constexpr int CONSTANT_INPUT_SLOT = 249;

using Error = ivit::OrtError;  // what check and the kernel throw

void check(ort::Status* s) { ivit::ort_check(g_api, s); }

ort::Status* status(const std::string& msg) { return ivit::ort_error(g_api, msg); }

using Tensor = ivit::OrtTensor;

Tensor read(const ort::Value* v) { return ivit::read_tensor(g_api, v, check); }

int code(int elem) { return ivit::kernel_code(elem); }

struct Kernel {
  void* gemm;
  i64 k, n;
  std::string node;
};

struct QOp {
  ort::CustomOp base;
  bool table;
};

bool has_table(const ort::CustomOp* op) { return reinterpret_cast<const QOp*>(op)->table; }

const char* name_of(bool table) { return table ? "QGemmTable" : "QGemm"; }

Tensor constant(const ort::KernelInfo* info, size_t i) {
  int is_const = 0;
  const ort::Value* v = nullptr;
  check(api<ort::Status*(const ort::KernelInfo*, size_t, int*, const ort::Value**)>(
      static_cast<ort::Slot>(CONSTANT_INPUT_SLOT))(info, i, &is_const, &v));
  if (!is_const || !v) throw Error{"input " + std::to_string(i) + " must be a constant initializer"};
  return read(v);
}

// a parameter with 1 or n values, as n int64
std::vector<i64> per_column(const Tensor& t, i64 n, const char* what) {
  if (t.size != 1 && t.size != n) throw Error{std::string(what) + " must have 1 or N values"};
  std::vector<i64> v(n);
  for (i64 j = 0; j < n; ++j) v[j] = t.at(t.size == 1 ? 0 : j);
  return v;
}

ort::Status* create(const ort::CustomOp* op, const ort::Api*, const ort::KernelInfo* info, void** out) {
  const bool table = has_table(op);
  const std::string node = ivit::ort_node_name(g_api, info);
  try {
    i64 attr[2];
    const char* names[2] = {"qmin", "qmax"};
    for (int i = 0; i < 2; ++i)
      check(api<ort::Status*(const ort::KernelInfo*, const char*, int64_t*)>(ort::KernelInfoGetAttribute_int64)(
          info, names[i], &attr[i]));
    const Tensor za = constant(info, 1), b = constant(info, 2), zb = constant(info, 3), zx = constant(info, 4);
    const Tensor mult = constant(info, 5), shift = constant(info, 6), zy = constant(info, 7);
    if (b.shape.size() != 2 || b.elem != ort::INT8) throw Error{"B must be 2-D int8"};
    const i64 k = b.shape[0], n = b.shape[1];
    if (za.size != 1 || zy.size != 1) throw Error{"the zero points of A and y must be single values"};
    const int a_code = code(za.elem);
    std::vector<int32_t> tab;
    int out_code = code(zy.elem);
    if (table) {
      const Tensor t = constant(info, 8);
      if (t.shape.size() != 1 || t.size != attr[1] - attr[0] + 1)
        throw Error{"the table must be 1-D with qmax - qmin + 1 entries"};
      for (i64 i = 0; i < t.size; ++i) tab.push_back(static_cast<int32_t>(t.at(i)));
      out_code = code(t.elem);
    }
    const auto zbs = per_column(zb, n, "b_zero_point"), zxs = per_column(zx, n, "x_zero_point");
    const auto ms = per_column(mult, n, "multiplier"), cs = per_column(shift, n, "shift");
    const char* err = nullptr;
    void* g = ivit_qgemm_create(0, a_code, k, n, static_cast<const int8_t*>(b.data), zbs.data(), n, za.at(0),
                                zxs.data(), ms.data(), cs.data(), n, zy.at(0), attr[0], attr[1],
                                table ? tab.data() : nullptr, out_code, &err);
    if (!g) throw Error{err};
    *out = new Kernel{g, k, n, node};
    return nullptr;
  } catch (const Error& e) {
    return status(std::string("ai.ivit.engine ") + name_of(table) + " node '" + node + "' refused: " + e.msg);
  }
}

ort::Status* compute(void* kernel, ort::KernelContext* ctx) {
  const Kernel& k = *static_cast<const Kernel*>(kernel);
  try {
    const ort::Value* v = nullptr;
    check(api<ort::Status*(const ort::KernelContext*, size_t, const ort::Value**)>(ort::KernelContext_GetInput)(
        ctx, 0, &v));
    const Tensor a = read(v);
    if (a.shape.empty() || a.shape.back() != k.k)
      throw Error{"A's last axis must be B's K = " + std::to_string(k.k)};
    std::vector<i64> shape = a.shape;
    shape.back() = k.n;
    ort::Value* out = nullptr;
    check(api<ort::Status*(ort::KernelContext*, size_t, const int64_t*, size_t, ort::Value**)>(
        ort::KernelContext_GetOutput)(ctx, 0, shape.data(), shape.size(), &out));
    const Tensor y = read(out);
    const i64 rows = a.size / k.k;
    if (rows == 0) return nullptr;
    ivit::OrtPoolScope pool(g_api, ctx);
    ivit_qgemm_run(k.gemm, a.data, rows, const_cast<void*>(y.data), 1);
    return nullptr;
  } catch (const Error& e) {
    return status("ai.ivit.engine QGemm node '" + k.node + "': " + e.msg);
  }
}

QOp make(bool table) {
  ort::CustomOp o = ivit::ort_custom_op();
  o.GetName = [](const ort::CustomOp* op) { return name_of(has_table(op)); };
  // A, a_zero_point: int8 or uint8; B, b_zero_point int8; x_zero_point int32; multiplier, shift int64;
  // y_zero_point and the table: the output's type (undefined: checked when the kernel is created)
  o.GetInputType = [](const ort::CustomOp*, size_t i) {
    static const ort::ElemType types[] = {ort::UNDEFINED, ort::UNDEFINED, ort::INT8,      ort::INT8,     ort::INT32,
                                          ort::INT64,     ort::INT64,     ort::UNDEFINED, ort::UNDEFINED};
    return types[i];
  };
  o.GetInputTypeCount = [](const ort::CustomOp* op) -> size_t { return has_table(op) ? 9 : 8; };
  o.GetOutputType = [](const ort::CustomOp*, size_t) { return ort::UNDEFINED; };
  o.GetOutputTypeCount = [](const ort::CustomOp*) -> size_t { return 1; };
  o.KernelDestroy = [](void* k) {
    ivit_qgemm_destroy(static_cast<Kernel*>(k)->gemm);
    delete static_cast<Kernel*>(k);
  };
  o.CreateKernelV2 = create;
  o.KernelComputeV2 = compute;
  return QOp{o, table};
}

}  // namespace

namespace ivit {

const ort::CustomOp* qgemm_op(const ort::Api* api, bool table) {
  g_api = api;
  static const QOp ops[2] = {make(false), make(true)};
  return &ops[table ? 1 : 0].base;
}

}  // namespace ivit
