// The onnxruntime custom ops of QGemm (qgemm.h), domain ai.ivit.engine, which only the onnxruntime engine's
// compile step writes (ivit_onnx/engines/onnxruntime/qgemm_fold.py):
//   QGemm(A, a_zero_point, B, b_zero_point, x_zero_point, multiplier, shift, y_zero_point) -> y
//   QGemmTable(..., y_zero_point, table) -> table[y - qmin]
//   QGemmAdd(<QGemm's inputs>, r, v_zero_point, r_zero_point, v_multiplier, r_multiplier, shift, sum_zero_point)
//   QGemmTableAdd(<QGemmTable's inputs>, r, ...) -> IAdd(v, r) of that y as v (resid_fold.py), in one epilogue
//   QGemmAddTable(<QGemmAdd's inputs>, post), QGemmTableAddTable(<QGemmTableAdd's inputs>, post) ->
//   post[sum - add_qmin]: a Requantize chain after the IAdd, tabulated over the sum's values (resid_fold.py)
//   QGemmAddAdd(<QGemmAdd's inputs>, <a second IAdd's 7: r2, ...>) (QGemmTableAddAdd, and either with ...Table
//   and post): a second IAdd on the first's sum (quantize_static's bias, then the residual), attributes
//   add2_qmin, add2_qmax; at most one of r, r2 an activation
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
  int r_code;      // the residual activation's type (kernels.h's codes), -1 if none or constant
  size_t r_input;  // its input index
  bool table;
  int adds;
  bool post;
};

struct QOp {
  ort::CustomOp base;
  bool table;
  int adds;  // IAdd stages: 0, 1, 2
  bool post;
};

bool has_table(const ort::CustomOp* op) { return reinterpret_cast<const QOp*>(op)->table; }
int adds_of(const ort::CustomOp* op) { return reinterpret_cast<const QOp*>(op)->adds; }
bool has_post(const ort::CustomOp* op) { return reinterpret_cast<const QOp*>(op)->post; }

const char* name_of(bool table, int adds, bool post) {
  static const char* const names[2][3][2] = {
      {{"QGemm", "QGemm"}, {"QGemmAdd", "QGemmAddTable"}, {"QGemmAddAdd", "QGemmAddAddTable"}},
      {{"QGemmTable", "QGemmTable"}, {"QGemmTableAdd", "QGemmTableAddTable"},
       {"QGemmTableAddAdd", "QGemmTableAddAddTable"}}};
  return names[table ? 1 : 0][adds][post ? 1 : 0];
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
  const bool table = has_table(op), post = has_post(op);
  const int adds = adds_of(op);
  const std::string node = ivit::ort_node_name(g_api, info);
  try {
    i64 attr[6];
    const char* names[6] = {"qmin", "qmax", "add_qmin", "add_qmax", "add2_qmin", "add2_qmax"};
    for (int i = 0; i < 2 + 2 * adds; ++i)
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
    IvitQGemmAdd res[2] = {};
    std::vector<i64> r_values[2];
    std::vector<int32_t> post_values;
    int r_code = -1;
    size_t r_input = 0;
    int v_elem = table ? constant(info, 8).elem : zy.elem;  // each stage's v: the output before it
    for (int s = 0; s < adds; ++s) {
      IvitQGemmAdd& a = res[s];
      const size_t first = residual_input(table) + 7 * s;
      const Tensor zv = constant(info, first + 1), zr = constant(info, first + 2), sum_zy = constant(info, first + 6);
      a.zv = single(zv, "v_zero_point"), a.zr = single(zr, "r_zero_point");
      a.mv = single(constant(info, first + 3), "v_multiplier");
      a.mr = single(constant(info, first + 4), "r_multiplier");
      a.shift = single(constant(info, first + 5), "the residual's shift");
      a.zy = single(sum_zy, "sum_zero_point");
      a.qmin = attr[2 + 2 * s], a.qmax = attr[3 + 2 * s], a.out_code = code(sum_zy.elem);
      if (zv.elem != v_elem) throw Error{"v_zero_point must have the type of the output before the IAdd"};
      v_elem = sum_zy.elem;
      if (const ort::Value* rc = maybe_constant(info, first)) {
        const Tensor r = read(rc);
        r_values[s] = per_column(r, n, "a constant residual");
        if (r.size != 1 && r.shape.back() != n) throw Error{"a constant residual must lie along the last axis"};
        a.r_code = -1, a.r_const = r_values[s].data(), a.r_size = n;
      } else {
        if (r_code >= 0) throw Error{"one IAdd at most may read an activation"};
        a.r_code = code(zr.elem);
        r_code = a.r_code, r_input = first;
      }
      if (s) res[0].then = &res[1];
    }
    if (post) {
      IvitQGemmAdd& a = res[adds - 1];
      const Tensor t = constant(info, residual_input(table) + 7 * adds);
      if (t.shape.size() != 1 || t.size != a.qmax - a.qmin + 1)
        throw Error{"the table after the sum must be 1-D with add_qmax - add_qmin + 1 entries"};
      for (i64 i = 0; i < t.size; ++i) post_values.push_back(static_cast<int32_t>(t.at(i)));
      a.post = post_values.data(), a.post_code = code(t.elem);
    }
    const char* err = nullptr;
    void* g = ivit_qgemm_create_add(0, a_code, k, n, static_cast<const int8_t*>(b.data), zbs.data(), n, za.at(0),
                                    zxs.data(), ms.data(), cs.data(), n, zy.at(0), attr[0], attr[1],
                                    table ? tab.data() : nullptr, out_code, adds ? &res[0] : nullptr, &err);
    if (!g) throw Error{err};
    *out = new Kernel{g, k, n, node, r_code, r_input, table, adds, post};
    return nullptr;
  } catch (const Error& e) {
    return status(std::string("ai.ivit.engine ") + name_of(table, adds, post) + " node '" + node +
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
      check(api<ort::Status*(const ort::KernelContext*, size_t, const ort::Value**)>(ort::KernelContext_GetInput)(
          ctx, k.r_input, &rv));
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
    return status(std::string("ai.ivit.engine ") + name_of(k.table, k.adds, k.post) + " node '" + k.node + "': " +
                  e.msg);
  }
}

QOp make(bool table, int adds, bool post = false) {
  ort::CustomOp o = ivit::ort_custom_op();
  o.GetName = [](const ort::CustomOp* op) { return name_of(has_table(op), adds_of(op), has_post(op)); };
  // A, a_zero_point: int8 or uint8; B, b_zero_point int8; x_zero_point int32; multiplier, shift int64;
  // y_zero_point and the table: the output's type (undefined: checked when the kernel is created)
  // the residual stage: r, v_zero_point, r_zero_point: the types of r and v; v_multiplier, r_multiplier,
  // shift int64; sum_zero_point the sum's type; the table after it (post): the output's type
  o.GetInputType = [](const ort::CustomOp* op, size_t i) {
    static const ort::ElemType types[] = {ort::UNDEFINED, ort::UNDEFINED, ort::INT8,      ort::INT8,     ort::INT32,
                                          ort::INT64,     ort::INT64,     ort::UNDEFINED, ort::UNDEFINED};
    static const ort::ElemType resid[] = {ort::UNDEFINED, ort::UNDEFINED, ort::UNDEFINED, ort::INT64,
                                          ort::INT64,     ort::INT64,     ort::UNDEFINED};
    const size_t first = residual_input(has_table(op)), stages_end = first + 7 * adds_of(op);
    return i < first ? types[i] : i < stages_end ? resid[(i - first) % 7] : ort::UNDEFINED;  // then post
  };
  o.GetInputTypeCount = [](const ort::CustomOp* op) -> size_t {
    return residual_input(has_table(op)) + 7 * adds_of(op) + (has_post(op) ? 1 : 0);
  };
  o.GetOutputType = [](const ort::CustomOp*, size_t) { return ort::UNDEFINED; };
  o.GetOutputTypeCount = [](const ort::CustomOp*) -> size_t { return 1; };
  o.KernelDestroy = [](void* k) {
    ivit_qgemm_destroy(static_cast<Kernel*>(k)->gemm);
    delete static_cast<Kernel*>(k);
  };
  o.CreateKernelV2 = create;
  o.KernelComputeV2 = compute;
  return QOp{o, table, adds, post};
}

}  // namespace

namespace ivit {

const ort::CustomOp* qgemm_op(const ort::Api* api, bool table, int adds, bool post) {
  g_api = api;
  static const QOp ops[2][3][2] = {
      {{make(false, 0), make(false, 0)}, {make(false, 1), make(false, 1, true)}, {make(false, 2), make(false, 2, true)}},
      {{make(true, 0), make(true, 0)}, {make(true, 1), make(true, 1, true)}, {make(true, 2), make(true, 2, true)}}};
  return &ops[table ? 1 : 0][adds][post && adds ? 1 : 0].base;
}

}  // namespace ivit
