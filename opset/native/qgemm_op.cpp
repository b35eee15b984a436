// The onnxruntime custom ops of QGemm (qgemm.h), domain ai.ivit.engine, which only the onnxruntime engine's
// compile step writes (ivit_onnx/engines/onnxruntime/qgemm_fold.py):
//   QGemm(A, a_zero_point, B, b_zero_point, x_zero_point, multiplier, shift, y_zero_point) -> y
//   QGemmTable(..., y_zero_point, table) -> table[y - qmin]
//   QGemmAdd(<QGemm's inputs>, r, v_zero_point, r_zero_point, v_multiplier, r_multiplier, shift, sum_zero_point)
//   QGemmTableAdd(<QGemmTable's inputs>, r, ...) -> IAdd(v, r) of that y as v (resid_fold.py), in one epilogue
//   QGemmAddTable(<QGemmAdd's inputs>, post), QGemmTableAddTable(<QGemmTableAdd's inputs>, post) ->
//   post[sum - add_qmin]: a Requantize chain after the IAdd, tabulated over the sum's values (resid_fold.py)
// attributes qmin, qmax (and the IAdd's add_qmin, add_qmax). Every input but A (and r) must be a constant
// initializer: B is packed, and the parameters expanded per column, once, when onnxruntime creates the kernel;
// the kernel is then immutable, so onnxruntime may run it concurrently. r is constant (1 or N values: the
// last axis) or an activation whose shape, leading 1s dropped, ends y's (rows repeating). The rows run on
// onnxruntime's intra-op pool (one thread: one core).

#include <algorithm>
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
  int r_code;  // the residual activation's type (kernels.h's codes), -1 if none or constant
  bool table, add, post;
};

struct QOp {
  ort::CustomOp base;
  bool table, add, post;
};

bool has_table(const ort::CustomOp* op) { return reinterpret_cast<const QOp*>(op)->table; }
bool has_add(const ort::CustomOp* op) { return reinterpret_cast<const QOp*>(op)->add; }
bool has_post(const ort::CustomOp* op) { return reinterpret_cast<const QOp*>(op)->post; }

const char* name_of(bool table, bool add, bool post) {
  if (post) return table ? "QGemmTableAddTable" : "QGemmAddTable";
  return add ? (table ? "QGemmTableAdd" : "QGemmAdd") : (table ? "QGemmTable" : "QGemm");
}

// the index of the residual r, the first of the IAdd's inputs
size_t residual_input(bool table) { return table ? 9 : 8; }

// input i's value where it is a constant initializer, else null
const ort::Value* maybe_constant(const ort::KernelInfo* info, size_t i) {
  int is_const = 0;
  const ort::Value* v = nullptr;
  check(api<ort::Status*(const ort::KernelInfo*, size_t, int*, const ort::Value**)>(
      static_cast<ort::Slot>(CONSTANT_INPUT_SLOT))(info, i, &is_const, &v));
  return is_const ? v : nullptr;
}

Tensor constant(const ort::KernelInfo* info, size_t i) {
  const ort::Value* v = maybe_constant(info, i);
  if (!v) throw Error{"input " + std::to_string(i) + " must be a constant initializer"};
  return read(v);
}

// a scalar parameter of the residual stage
i64 single(const Tensor& t, const char* what) {
  if (t.size != 1) throw Error{std::string(what) + " must be a single value"};
  return t.at(0);
}

// a parameter with 1 or n values, as n int64
std::vector<i64> per_column(const Tensor& t, i64 n, const char* what) {
  if (t.size != 1 && t.size != n) throw Error{std::string(what) + " must have 1 or N values"};
  std::vector<i64> v(n);
  for (i64 j = 0; j < n; ++j) v[j] = t.at(t.size == 1 ? 0 : j);
  return v;
}

ort::Status* create(const ort::CustomOp* op, const ort::Api*, const ort::KernelInfo* info, void** out) {
  const bool table = has_table(op), add = has_add(op), post = has_post(op);
  const std::string node = ivit::ort_node_name(g_api, info);
  try {
    i64 attr[4];
    const char* names[4] = {"qmin", "qmax", "add_qmin", "add_qmax"};
    for (int i = 0; i < (add ? 4 : 2); ++i)
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
    IvitQGemmAdd res{};
    std::vector<i64> r_values;
    std::vector<int32_t> post_values;
    int r_code = -1;
    if (add) {
      const size_t first = residual_input(table);
      const Tensor zv = constant(info, first + 1), zr = constant(info, first + 2), sum_zy = constant(info, first + 6);
      res.zv = single(zv, "v_zero_point"), res.zr = single(zr, "r_zero_point");
      res.mv = single(constant(info, first + 3), "v_multiplier");
      res.mr = single(constant(info, first + 4), "r_multiplier");
      res.shift = single(constant(info, first + 5), "the residual's shift");
      res.zy = single(sum_zy, "sum_zero_point");
      res.qmin = attr[2], res.qmax = attr[3], res.out_code = code(sum_zy.elem);
      if (zv.elem != (table ? constant(info, 8).elem : zy.elem))
        throw Error{"v_zero_point must have the type of the GEMM's output"};
      if (const ort::Value* rc = maybe_constant(info, first)) {
        const Tensor r = read(rc);
        r_values = per_column(r, n, "a constant residual");
        if (r.size != 1 && r.shape.back() != n) throw Error{"a constant residual must lie along the last axis"};
        res.r_code = -1, res.r_const = r_values.data(), res.r_size = n;
      } else {
        res.r_code = code(zr.elem);
        r_code = res.r_code;
      }
      if (post) {
        const Tensor t = constant(info, first + 7);
        if (t.shape.size() != 1 || t.size != res.qmax - res.qmin + 1)
          throw Error{"the table after the sum must be 1-D with add_qmax - add_qmin + 1 entries"};
        for (i64 i = 0; i < t.size; ++i) post_values.push_back(static_cast<int32_t>(t.at(i)));
        res.post = post_values.data(), res.post_code = code(t.elem);
      }
    }
    const char* err = nullptr;
    void* g = ivit_qgemm_create_add(0, a_code, k, n, static_cast<const int8_t*>(b.data), zbs.data(), n, za.at(0),
                                    zxs.data(), ms.data(), cs.data(), n, zy.at(0), attr[0], attr[1],
                                    table ? tab.data() : nullptr, out_code, add ? &res : nullptr, &err);
    if (!g) throw Error{err};
    *out = new Kernel{g, k, n, node, r_code, table, add, post};
    return nullptr;
  } catch (const Error& e) {
    return status(std::string("ai.ivit.engine ") + name_of(table, add, post) + " node '" + node +
                  "' refused: " + e.msg);
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
    const void* r = nullptr;
    i64 r_rows = 0;
    if (k.r_code >= 0) {  // its shape, leading 1s dropped, ends y's: row m of y reads row m % r_rows
      const ort::Value* rv = nullptr;
      const size_t first = residual_input(k.table);
      check(api<ort::Status*(const ort::KernelContext*, size_t, const ort::Value**)>(ort::KernelContext_GetInput)(
          ctx, first, &rv));
      const Tensor rt = read(rv);
      if (code(rt.elem) != k.r_code) throw Error{"the residual must have r_zero_point's type"};
      size_t lead = 0;
      while (lead < rt.shape.size() && rt.shape[lead] == 1) ++lead;
      const size_t nr = rt.shape.size() - lead;
      if (rt.shape.empty() || rt.shape.back() != k.n || nr > shape.size() ||
          !std::equal(rt.shape.begin() + lead, rt.shape.end(), shape.end() - nr))
        throw Error{"the residual's shape must end the output's"};
      r = rt.data, r_rows = rt.size / k.n;
    }
    ivit::OrtPoolScope pool(g_api, ctx);
    if (ivit_qgemm_run_add(k.gemm, a.data, rows, r, r_rows, const_cast<void*>(y.data), 1))
      throw Error{"the residual does not fit the GEMM"};
    return nullptr;
  } catch (const Error& e) {
    return status(std::string("ai.ivit.engine ") + name_of(k.table, k.add, k.post) + " node '" + k.node + "': " +
                  e.msg);
  }
}

QOp make(bool table, bool add, bool post = false) {
  ort::CustomOp o = ivit::ort_custom_op();
  o.GetName = [](const ort::CustomOp* op) { return name_of(has_table(op), has_add(op), has_post(op)); };
  // A, a_zero_point: int8 or uint8; B, b_zero_point int8; x_zero_point int32; multiplier, shift int64;
  // y_zero_point and the table: the output's type (undefined: checked when the kernel is created)
  // the residual stage: r, v_zero_point, r_zero_point: the types of r and v; v_multiplier, r_multiplier,
  // shift int64; sum_zero_point the sum's type; the table after it (post): the output's type
  o.GetInputType = [](const ort::CustomOp* op, size_t i) {
    static const ort::ElemType types[] = {ort::UNDEFINED, ort::UNDEFINED, ort::INT8,      ort::INT8,     ort::INT32,
                                          ort::INT64,     ort::INT64,     ort::UNDEFINED, ort::UNDEFINED};
    static const ort::ElemType resid[] = {ort::UNDEFINED, ort::UNDEFINED, ort::UNDEFINED, ort::INT64,
                                          ort::INT64,     ort::INT64,     ort::UNDEFINED, ort::UNDEFINED};
    const size_t first = residual_input(has_table(op));
    return i < first ? types[i] : resid[i - first];
  };
  o.GetInputTypeCount = [](const ort::CustomOp* op) -> size_t {
    return residual_input(has_table(op)) + (has_add(op) ? 7 : 0) + (has_post(op) ? 1 : 0);
  };
  o.GetOutputType = [](const ort::CustomOp*, size_t) { return ort::UNDEFINED; };
  o.GetOutputTypeCount = [](const ort::CustomOp*) -> size_t { return 1; };
  o.KernelDestroy = [](void* k) {
    ivit_qgemm_destroy(static_cast<Kernel*>(k)->gemm);
    delete static_cast<Kernel*>(k);
  };
  o.CreateKernelV2 = create;
  o.KernelComputeV2 = compute;
  return QOp{o, table, add, post};
}

}  // namespace

namespace ivit {

const ort::CustomOp* qgemm_op(const ort::Api* api, bool table, bool add, bool post) {
  g_api = api;
  static const QOp ops[6] = {make(false, false), make(true, false),      make(false, true),
                             make(true, true),   make(false, true, true), make(true, true, true)};
  return &ops[post ? 4 + (table ? 1 : 0) : (table ? 1 : 0) + (add ? 2 : 0)].base;
}

}  // namespace ivit
