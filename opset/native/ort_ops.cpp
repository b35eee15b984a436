// The ai.ivit custom-op library for onnxruntime, through its C ABI (ort_abi.h): no Python, no onnxruntime
// headers. onnxruntime loads this shared library (SessionOptions.register_custom_ops_library(path), or
// RegisterCustomOpsLibrary in C/C++) and calls RegisterCustomOps, which registers the ops of the
// private opset in their own domain, ai.ivit (opset/README.md), and two fused ops in ai.ivit.fused that
// only the session-time rewrite ivit_onnx/chain_fold.py writes.
//
// Each op runs the fused kernel of kernels.cpp where the call fits it (per-tensor or per-channel
// parameters, scalar zero points, the output shaped like x) with its chunks on onnxruntime's intra-op
// thread pool (KernelContext_ParallelFor), and otherwise a general loop over the broadcast shape with
// numpy's integer semantics (intmath.h). Both equal the numpy reference kernels bit for bit. Outputs are
// allocated by onnxruntime (KernelContext_GetOutput). Kernels keep no mutable state, so onnxruntime may
// run them concurrently. Dtypes outside the opset and attributes outside what the kernels compute are
// refused when the session is created, with a message naming the node.

#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gemm_check.h"
#include "intmath.h"
#include "kernels.h"
#include "ort_abi.h"
#include "parallel.h"
#include "poly_exp.h"
#include "ort_tensor.h"
#include "qgemm.h"

namespace ivit {
// qbatch_op.cpp: 0 int32, 1 Requantize, 2 table, 3 Shiftmax
const ort::CustomOp* qbatch_op(const ort::Api* api, int form);
// patch_op.cpp: QuantizePatches
const ort::CustomOp* patch_op(const ort::Api* api);
}

using ivit::i64;

namespace {

const ort::Api* g_api = nullptr;  // set once by RegisterCustomOps (the same table for every call)

struct Error : std::exception {
  std::string msg;
  explicit Error(std::string m) : msg(std::move(m)) {}
  const char* what() const noexcept override { return msg.c_str(); }
};

template <class Sig>
Sig* api(ort::Slot s) { return g_api->fn<Sig>(s); }

ort::Status* make_status(const std::string& msg) {
  return api<ort::Status*(ort::ErrorCode, const char*)>(ort::CreateStatus)(ort::INVALID_ARGUMENT, msg.c_str());
}

// Throw an onnxruntime error status as an Error (its message copied, the status released).
void check(ort::Status* s) {
  if (!s) return;
  std::string msg = api<const char*(const ort::Status*)>(ort::GetErrorMessage)(s);
  api<void(ort::Status*)>(ort::ReleaseStatus)(s);
  throw Error(msg);
}

// ------------------------------------------------------------------------------------------ the ops

// int8/uint8/int16/int32 input; int64 input; the output zero point; a lookup table (1-D, not broadcast)
// of the output type; an int32 lookup table
enum Port { INT, I64, OUT, TABLE_OUT, TABLE_I32 };
enum Op {
  REQUANTIZE, IADD, SHIFTMAX, SHIFTGELU, ILAYERNORM, REQUANTIZE_TABLE, REQUANTIZE_SHIFTMAX, REQUANTIZE_SHIFTMAX_TABLE,
  IBERT_SOFTMAX, LOG_INT_SOFTMAX, IBERTGELU, L1LAYERNORM,  // the paper's ablation alternatives (Table 2)
  IL2NORM,
};

struct OpDef {
  const char* domain;
  const char* name;
  Op op;
  std::vector<Port> ports;
  std::vector<const char*> attrs;
};

// The private opset, and the fused ops that ivit_onnx/chain_fold.py writes at session time for this library
// only (a Requantize and the elementwise ops after it, tabulated over the Requantize's outputs).
constexpr const char* OPSET = "ai.ivit";
constexpr const char* FUSED = "ai.ivit.fused";
const OpDef OPS[] = {
    {OPSET, "Requantize", REQUANTIZE, {INT, INT, I64, I64, OUT}, {"qmin", "qmax"}},
    {OPSET, "IAdd", IADD, {INT, INT, INT, INT, I64, I64, I64, OUT}, {"qmin", "qmax"}},
    {OPSET, "Shiftmax", SHIFTMAX, {INT, OUT}, {"x0", "n", "bits"}},
    {OPSET, "ShiftGELU", SHIFTGELU, {INT, I64, I64, OUT}, {"x0", "n", "bits", "qmin", "qmax"}},
    {OPSET, "ILayerNorm", ILAYERNORM, {INT, I64, I64, I64, OUT}, {"shift_in", "p", "qmin", "qmax"}},
    {FUSED, "RequantizeTable", REQUANTIZE_TABLE, {INT, INT, I64, I64, INT, TABLE_OUT}, {"qmin", "qmax"}},
    {FUSED, "RequantizeShiftmax", REQUANTIZE_SHIFTMAX, {INT, INT, I64, I64, INT, TABLE_I32, OUT},
     {"qmin", "qmax", "x0", "n", "bits"}},
    // the same, then a Requantize after the Shiftmax as a table over its 2**bits + 1 values (the output's type)
    {FUSED, "RequantizeShiftmaxTable", REQUANTIZE_SHIFTMAX_TABLE, {INT, INT, I64, I64, INT, TABLE_I32, INT, TABLE_OUT},
     {"qmin", "qmax", "x0", "n", "bits"}},
    // the paper's ablation alternatives (Table 2)
    {OPSET, "IBertGELU", IBERTGELU, {INT, I64, I64, OUT}, {"clip", "coeff", "k", "qmin", "qmax"}},
    {OPSET, "L1LayerNorm", L1LAYERNORM, {INT, I64, I64, I64, OUT}, {"shift_in", "p", "qmin", "qmax"}},
    {OPSET, "IBertSoftmax", IBERT_SOFTMAX, {INT, OUT}, {"x0", "qb", "qc", "n", "bits"}},
    {OPSET, "LogIntSoftmax", LOG_INT_SOFTMAX, {INT, OUT}, {"x0", "qb", "qc", "n", "bits", "log_bits"}},
    {OPSET, "IL2Norm", IL2NORM, {INT, INT, I64, I64, OUT}, {"shift_in", "eps", "p", "qmin", "qmax"}},
};
constexpr int N_OPS = sizeof(OPS) / sizeof(OPS[0]);

using ivit::kernel_code;

const char* elem_name(int elem) {
  static const char* names[] = {"undefined", "float", "uint8", "int8", "uint16", "int16", "int32", "int64"};
  return elem >= 0 && elem < 8 ? names[elem] : "a non-integer type";
}

using Shape = std::vector<i64>;

using Tensor = ivit::OrtTensor;

i64 numel(const Shape& s) {
  i64 n = 1;
  for (i64 d : s) n *= d;
  return n;
}

// numpy's broadcast of two shapes; false if they do not broadcast
bool broadcast(const Shape& a, const Shape& b, Shape& out) {
  const size_t r = std::max(a.size(), b.size());
  out.assign(r, 1);
  for (size_t k = 0; k < r; ++k) {
    const i64 da = k < r - a.size() ? 1 : a[k - (r - a.size())];
    const i64 db = k < r - b.size() ? 1 : b[k - (r - b.size())];
    if (da != db && da != 1 && db != 1) return false;
    out[k] = da == 1 ? db : da;
  }
  return true;
}

std::string shape_str(const Shape& s) {
  std::string t = "[";
  for (size_t k = 0; k < s.size(); ++k) t += (k ? "," : "") + std::to_string(s[k]);
  return t + "]";
}

// t's elements broadcast to `out` (numpy rules; t's shape broadcasts to out), as int64
std::vector<i64> expand(const Tensor& t, const Shape& out) {
  const size_t r = out.size(), off = r - t.shape.size();
  Shape stride(r, 0);
  for (i64 k = static_cast<i64>(t.shape.size()) - 1, s = 1; k >= 0; --k) {
    stride[off + k] = t.shape[k] == 1 ? 0 : s;
    s *= t.shape[k];
  }
  const i64 n = numel(out);
  std::vector<i64> v(n);
  Shape idx(r, 0);
  i64 src = 0;
  for (i64 i = 0; i < n; ++i) {
    v[i] = t.at(src);
    for (i64 k = static_cast<i64>(r) - 1; k >= 0; --k) {  // odometer step
      if (++idx[k] < out[k]) {
        src += stride[k];
        break;
      }
      src -= stride[k] * (out[k] - 1);
      idx[k] = 0;
    }
  }
  return v;
}

void store(void* y, int elem, i64 i, i64 v) {  // the cast of numpy's astype: wraps
  switch (elem) {
    case ort::INT8: static_cast<int8_t*>(y)[i] = static_cast<int8_t>(v); break;
    case ort::UINT8: static_cast<uint8_t*>(y)[i] = static_cast<uint8_t>(v); break;
    case ort::INT16: static_cast<int16_t*>(y)[i] = static_cast<int16_t>(v); break;
    default: static_cast<int32_t*>(y)[i] = static_cast<int32_t>(v); break;
  }
}

// Parameters that vary along at most one axis of `out`: (outer, nc, inner) and each one's nc values.
struct Channels {
  i64 outer = 1, nc = 1, inner = 1;
  int axis = -1;  // -1: every parameter is a single value
  std::vector<std::vector<i64>> values;
};

bool channels(const Shape& out, std::initializer_list<const Tensor*> params, Channels& ch) {
  const size_t r = out.size();
  for (const Tensor* p : params) {
    if (p->shape.size() > r) return false;
    const size_t off = r - p->shape.size();
    for (size_t k = 0; k < p->shape.size(); ++k) {
      if (p->shape[k] == 1) continue;
      const int axis = static_cast<int>(off + k);
      if (ch.axis != -1 && ch.axis != axis) return false;
      ch.axis = axis;
    }
  }
  if (ch.axis >= 0) {
    ch.nc = out[ch.axis];
    for (int k = 0; k < ch.axis; ++k) ch.outer *= out[k];
    for (size_t k = ch.axis + 1; k < r; ++k) ch.inner *= out[k];
  } else {
    ch.outer = numel(out);
  }
  for (const Tensor* p : params) {
    std::vector<i64> v(ch.nc);
    for (i64 k = 0; k < ch.nc; ++k) v[k] = p->at(p->size == 1 ? 0 : k);
    ch.values.push_back(std::move(v));
  }
  return true;
}

bool shifts_ok(const std::vector<i64>& c) {
  for (i64 v : c)
    if (v < 0 || v > 62) return false;
  return true;
}

struct SessionKernels;

struct Kernel {
  const OpDef* def;
  std::string node;
  i64 attr[8];  // in the order of def->attrs
  SessionKernels* session;  // this kernel's session, for the plain route's hint
};

// The calling thread's kernels run their chunks on onnxruntime's pool while this is alive.
struct PoolScope {
  ivit::ParallelHook old;
  explicit PoolScope(ort::KernelContext* ctx) : old(ivit::set_parallel_hook({&run, ctx})) {}
  ~PoolScope() { ivit::set_parallel_hook(old); }
  static void run(void* ctx, void (*fn)(void*, size_t), size_t total, void* data) {
    using ParallelFor = ort::Status*(const ort::KernelContext*, void (*)(void*, size_t), size_t, size_t, void*);
    ort::Status* s = api<ParallelFor>(ort::KernelContext_ParallelFor)(static_cast<ort::KernelContext*>(ctx), fn,
                                                                      total, 0, data);
    if (s) {  // no pool from this build of onnxruntime: run the chunks here
      api<void(ort::Status*)>(ort::ReleaseStatus)(s);
      for (size_t t = 0; t < total; ++t) fn(data, t);
    }
  }
};

// --------------------------------------------------------------------------- the computations

struct Call {  // one node execution: inputs, output, attributes
  const Kernel& k;
  std::vector<Tensor> in;
  Shape out;
  void* y = nullptr;
  int y_elem = 0;
  i64 a(int i) const { return k.attr[i]; }
  int code(int i) const { return kernel_code(in[i].elem); }
  bool full(int i) const { return in[i].shape == out; }
  bool scalar(int i) const { return in[i].size == 1; }
};

void fail_if(bool bad, const char* what) {
  if (bad) throw Error(what);
}

void saturate_all(Call& c, const std::vector<i64>& t, const std::vector<i64>& shift, const std::vector<i64>& zy,
                  i64 qmin, i64 qmax) {
  for (size_t i = 0; i < t.size(); ++i)
    store(c.y, c.y_elem, i, ivit::clip_any(ivit::round_shift_any(t[i], shift[i]) + zy[i], qmin, qmax));
}

void requantize(Call& c) {
  const i64 qmin = c.a(0), qmax = c.a(1);
  Channels ch;
  if (c.full(0) && c.scalar(4) && channels(c.out, {&c.in[1], &c.in[2], &c.in[3]}, ch) &&
      shifts_ok(ch.values[2])) {  // zero point, multiplier and shift per tensor or along one axis
    ivit_requantize_pc(c.in[0].data, c.code(0), ch.outer, ch.nc, ch.inner, ch.values[0].data(),
                       ch.values[1].data(), ch.values[2].data(), c.in[4].at(0), qmin, qmax, c.y,
                       kernel_code(c.y_elem), 0);
    return;
  }
  const auto x = expand(c.in[0], c.out), zx = expand(c.in[1], c.out), b = expand(c.in[2], c.out);
  std::vector<i64> t(x.size());
  for (size_t i = 0; i < t.size(); ++i) t[i] = (x[i] - zx[i]) * b[i];
  saturate_all(c, t, expand(c.in[3], c.out), expand(c.in[4], c.out), qmin, qmax);
}

// b's shape without leading 1s is a suffix of `out` (b repeats along the leading axes)
bool periodic(const Shape& b, const Shape& out) {
  size_t lead = 0;
  while (lead < b.size() && b[lead] == 1) ++lead;
  const size_t n = b.size() - lead;
  return n <= out.size() && std::equal(b.begin() + lead, b.end(), out.end() - n);
}

void iadd(Call& c) {
  const i64 qmin = c.a(0), qmax = c.a(1);
  bool scalars = true;
  for (int i = 2; i < 8; ++i) scalars = scalars && c.scalar(i);
  const i64 shift = c.in[6].at(0);
  if (scalars && shift >= 0 && shift <= 62 && numel(c.out) > 0) {
    const int f = c.full(0) ? 0 : 1, p = 1 - f;  // the full operand, and the repeating one
    if (c.full(f) && periodic(c.in[p].shape, c.out)) {
      ivit_iadd(c.in[f].data, c.code(f), c.in[p].data, c.code(p), numel(c.out), c.in[p].size, c.in[2 + f].at(0),
                c.in[2 + p].at(0), c.in[4 + f].at(0), c.in[4 + p].at(0), shift, c.in[7].at(0), qmin, qmax, c.y,
                kernel_code(c.y_elem), 0);
      return;
    }
  }
  const auto a = expand(c.in[0], c.out), b = expand(c.in[1], c.out), za = expand(c.in[2], c.out);
  const auto zb = expand(c.in[3], c.out), ma = expand(c.in[4], c.out), mb = expand(c.in[5], c.out);
  std::vector<i64> t(a.size());
  for (size_t i = 0; i < t.size(); ++i) t[i] = (a[i] - za[i]) * ma[i] + (b[i] - zb[i]) * mb[i];
  saturate_all(c, t, expand(c.in[6], c.out), expand(c.in[7], c.out), qmin, qmax);
}

Tensor view(const std::vector<i64>& v, const Shape& shape) { return Tensor{ort::INT64, shape, v.data(), numel(shape)}; }

// A softmax over the last axis, y = p + zy (no clip): kernel(rows, len, zy, y, to) writes p + zy into y of dtype
// code `to`. In one call where x has the output's shape and zy is a scalar; else the probabilities (< 2**bits
// <= 2**30) into int32 with zero point 0, then + y_zero_point broadcast.
template <class Kernel>
void row_softmax(Call& c, Kernel kernel) {
  const Tensor& x = c.in[0];
  fail_if(x.shape.empty(), "x must have at least one axis (the softmax works along the last one)");
  const i64 len = x.shape.back(), rows = len ? x.size / len : 0;
  if (c.full(0) && c.scalar(1)) {
    kernel(rows, len, c.in[1].at(0), c.y, kernel_code(c.y_elem));
    return;
  }
  std::vector<int32_t> p(x.size);
  if (x.size) kernel(rows, len, 0, p.data(), 3);
  const auto pv = expand(Tensor{ort::INT32, x.shape, p.data(), x.size}, c.out), zy = expand(c.in[1], c.out);
  for (size_t i = 0; i < pv.size(); ++i) store(c.y, c.y_elem, i, pv[i] + zy[i]);
}

void shiftmax(Call& c) {
  row_softmax(c, [&](i64 rows, i64 len, i64 zy, void* y, int to) {
    ivit_shiftmax(c.in[0].data, c.code(0), rows, len, zy, c.a(0), c.a(1), c.a(2), y, to, 0);
  });
}

void ibert_softmax(Call& c) {
  row_softmax(c, [&](i64 rows, i64 len, i64 zy, void* y, int to) {
    ivit_ibert_softmax(c.in[0].data, c.code(0), rows, len, zy, c.a(0), c.a(1), c.a(2), c.a(3), c.a(4), y, to, 0);
  });
}

void log_int_softmax(Call& c) {
  row_softmax(c, [&](i64 rows, i64 len, i64 zy, void* y, int to) {
    ivit_log_int_softmax(c.in[0].data, c.code(0), rows, len, zy, c.a(0), c.a(1), c.a(2), c.a(3), c.a(4), c.a(5), y,
                         to, 0);
  });
}

// ShiftGELU and IBertGELU (inputs x, multiplier, shift, y_zero_point; three attributes of their own, then qmin,
// qmax): the fused kernel where the call fits it (fused(x, ti, outer, nc, inner, b, c, zy, qmin, qmax, y, to)),
// else y = clip(round_shift(x * g(x) * b, c) + zy, qmin, qmax) over the broadcast shape
template <class Fused, class G>
void gelu(Call& c, Fused fused, G g) {
  const i64 qmin = c.a(3), qmax = c.a(4);
  Channels ch;
  if (c.full(0) && c.scalar(3) && channels(c.out, {&c.in[1], &c.in[2]}, ch) && shifts_ok(ch.values[1])) {
    fused(c.in[0].data, c.code(0), ch.outer, ch.nc, ch.inner, ch.values[0].data(), ch.values[1].data(),
          c.in[3].at(0), qmin, qmax, c.y, kernel_code(c.y_elem));
    return;
  }
  const auto x = expand(c.in[0], c.out), b = expand(c.in[1], c.out);
  std::vector<i64> t(x.size());
  for (size_t i = 0; i < t.size(); ++i) t[i] = x[i] * g(x[i]) * b[i];
  saturate_all(c, t, expand(c.in[2], c.out), expand(c.in[3], c.out), qmin, qmax);
}

void shiftgelu(Call& c) {
  const i64 x0 = c.a(0), n = c.a(1), bits = c.a(2);
  const ivit::Exp exp(x0, n);
  const i64 top = exp(0), sh = 62 - bits;
  gelu(
      c,
      [&](const void* x, int ti, i64 outer, i64 nc, i64 inner, const i64* b, const i64* cs, i64 zy, i64 qmin,
          i64 qmax, void* y, int to) {
        ivit_shiftgelu(x, ti, outer, nc, inner, b, cs, zy, x0, n, bits, qmin, qmax, y, to, 0);
      },
      [&](i64 v) { return ivit::shift_sigmoid(exp, top, sh, v); });
}

// ILayerNorm and L1LayerNorm: the fused kernel `fused` where the call fits it, else row by row over x (d
// centred, u = d * floor(2**61 / root(max(sum(norm(d)), 1))) scaled to 2**p), then the rescale over the
// broadcast shape
template <class Fused, class Norm, class Root>
void layernorm(Call& c, Fused fused, Norm norm, Root root) {
  const Tensor& x = c.in[0];
  fail_if(x.shape.empty(), "x must have at least one axis (the op works along the last one)");
  const i64 shift_in = c.a(0), p = c.a(1), qmin = c.a(2), qmax = c.a(3);
  const i64 len = x.shape.back(), rows = len ? x.size / len : 0;
  Channels ch;
  if (c.full(0) && c.scalar(4) && channels(c.out, {&c.in[1], &c.in[2], &c.in[3]}, ch) &&
      (ch.axis == -1 || ch.axis == static_cast<int>(c.out.size()) - 1) && shifts_ok(ch.values[1])) {
    fused(x.data, c.code(0), rows, len, ch.values[0].data(), ch.values[1].data(), ch.values[2].data(), ch.nc,
          c.in[4].at(0), shift_in, p, qmin, qmax, c.y, kernel_code(c.y_elem), 0);
    return;
  }
  std::vector<i64> u(x.size), d(len);
  const i64 scale = ivit::shl(1, shift_in);
  for (i64 r = 0; r < rows; ++r) {
    i64 sum = 0, acc = 0;
    for (i64 j = 0; j < len; ++j) sum += x.at(r * len + j);
    const i64 mean = ivit::floor_div(sum * scale, len);
    for (i64 j = 0; j < len; ++j) {
      d[j] = x.at(r * len + j) * scale - mean;
      acc += norm(d[j]);
    }
    const i64 f = ivit::floor_div(i64(1) << 61, root(std::max<i64>(acc, 1)));
    for (i64 j = 0; j < len; ++j) u[r * len + j] = ivit::shr(d[j] * f, 61 - p);
  }
  const auto uv = expand(view(u, x.shape), c.out), b = expand(c.in[1], c.out), bias = expand(c.in[3], c.out);
  std::vector<i64> t(uv.size());
  for (size_t i = 0; i < t.size(); ++i) t[i] = uv[i] * b[i] + bias[i];
  saturate_all(c, t, expand(c.in[2], c.out), expand(c.in[4], c.out), qmin, qmax);
}

void ilayernorm(Call& c) {
  layernorm(c, ivit_ilayernorm, [](i64 d) { return d * d; }, [](i64 v) { return ivit::isqrt(v); });
}

void l1layernorm(Call& c) {
  layernorm(c, ivit_l1layernorm, [](i64 d) { return d < 0 ? -d : d; }, [](i64 v) { return v; });
}

// IL2Norm (inputs x, x_zero_point, multiplier, shift, y_zero_point): the fused kernel where the call fits it, else
// row by row over x (d = (x - zx) * 2**shift_in, u = d * floor(2**61 / max(isqrt(max(sum(d*d), 1)), eps)) scaled to
// 2**p), then the rescale over the broadcast shape
void il2norm(Call& c) {
  const Tensor& x = c.in[0];
  fail_if(x.shape.empty(), "x must have at least one axis (the op works along the last one)");
  fail_if(!c.scalar(1), "x_zero_point must be a scalar");
  const i64 shift_in = c.a(0), eps = c.a(1), p = c.a(2), qmin = c.a(3), qmax = c.a(4), zx = c.in[1].at(0);
  const i64 len = x.shape.back(), rows = len ? x.size / len : 0;
  Channels ch;
  if (c.full(0) && c.scalar(4) && channels(c.out, {&c.in[2], &c.in[3]}, ch) &&
      (ch.axis == -1 || ch.axis == static_cast<int>(c.out.size()) - 1) && shifts_ok(ch.values[1])) {
    ivit_il2norm(x.data, c.code(0), rows, len, ch.values[0].data(), ch.values[1].data(), ch.nc, zx, c.in[4].at(0),
                 shift_in, eps, p, qmin, qmax, c.y, kernel_code(c.y_elem), 0);
    return;
  }
  std::vector<i64> u(x.size), d(len);
  const i64 scale = ivit::shl(1, shift_in);
  for (i64 r = 0; r < rows; ++r) {
    i64 acc = 0;
    for (i64 j = 0; j < len; ++j) {
      d[j] = (x.at(r * len + j) - zx) * scale;
      acc += d[j] * d[j];
    }
    const i64 f = ivit::floor_div(i64(1) << 61, std::max<i64>(ivit::isqrt(std::max<i64>(acc, 1)), eps));
    for (i64 j = 0; j < len; ++j) u[r * len + j] = ivit::shr(d[j] * f, 61 - p);
  }
  const auto uv = expand(view(u, x.shape), c.out), b = expand(c.in[2], c.out);
  std::vector<i64> t(uv.size());
  for (size_t i = 0; i < t.size(); ++i) t[i] = uv[i] * b[i];
  saturate_all(c, t, expand(c.in[3], c.out), expand(c.in[4], c.out), qmin, qmax);
}

void ibertgelu(Call& c) {
  const i64 clip = c.a(0), coeff = c.a(1), k = c.a(2);
  const ivit::IBertErf erf(clip, coeff, k);
  gelu(
      c,
      [&](const void* x, int ti, i64 outer, i64 nc, i64 inner, const i64* b, const i64* cs, i64 zy, i64 qmin,
          i64 qmax, void* y, int to) {
        ivit_ibertgelu(x, ti, outer, nc, inner, b, cs, zy, clip, coeff, k, qmin, qmax, y, to, 0);
      },
      erf);
}

// The fused ops take what the session-time rewrite writes: x shaped like the output, a scalar zero point
// for the Requantize stage, its other parameters per tensor or along one axis (RequantizeShiftmax: per
// tensor), and a table of qmax - qmin + 1 entries.
const Tensor& table_of(const Call& c, int i) {
  const Tensor& t = c.in[i];
  fail_if(c.a(0) > c.a(1) || t.shape.size() != 1 || t.size != c.a(1) - c.a(0) + 1,
          "the table must be 1-D with qmax - qmin + 1 entries");
  fail_if(!c.full(0), "x must have the output's shape");
  return t;
}

void requantize_table(Call& c) {
  const Tensor& table = table_of(c, 5);
  Channels ch;
  fail_if(!c.scalar(4) || !channels(c.out, {&c.in[1], &c.in[2], &c.in[3]}, ch) || !shifts_ok(ch.values[2]),
          "y_zero_point must be a scalar, the other parameters per tensor or along one axis, shifts in 0..62");
  ivit_requantize_table(c.in[0].data, c.code(0), ch.outer, ch.nc, ch.inner, ch.values[0].data(),
                        ch.values[1].data(), ch.values[2].data(), c.in[4].at(0), c.a(0), c.a(1), table.data, c.y,
                        kernel_code(c.y_elem), 0);
}

void requantize_shiftmax(Call& c) {
  const Tensor& table = table_of(c, 5);
  const Tensor& x = c.in[0];
  fail_if(x.shape.empty(), "x must have at least one axis (Shiftmax works along the last one)");
  bool scalars = true;
  for (int i : {1, 2, 3, 4, 6}) scalars = scalars && c.scalar(i);
  const i64 shift = c.in[3].at(0);
  fail_if(!scalars || shift < 0 || shift > 62, "the parameters must be scalars, the shift in 0..62");
  const i64 len = x.shape.back(), rows = len ? x.size / len : 0;
  const void* post = nullptr;  // of the output's type (the op's last input)
  if (c.k.def->op == REQUANTIZE_SHIFTMAX_TABLE) {
    const Tensor& p = c.in[7];
    fail_if(p.shape.size() != 1 || p.size != (i64(1) << c.a(4)) + 1,
            "the table after the Shiftmax must be 1-D with 2**bits + 1 entries");
    post = p.data;
  }
  ivit_requantize_shiftmax_table(x.data, c.code(0), rows, len, c.in[1].at(0), c.in[2].at(0), shift, c.in[4].at(0),
                                 c.a(0), c.a(1), static_cast<const int32_t*>(table.data), c.in[6].at(0), c.a(2), c.a(3),
                                 c.a(4), c.y, kernel_code(c.y_elem), 0, post);
}

void run_op(Call& c) {
  switch (c.k.def->op) {
    case REQUANTIZE: return requantize(c);
    case IADD: return iadd(c);
    case SHIFTMAX: return shiftmax(c);
    case SHIFTGELU: return shiftgelu(c);
    case ILAYERNORM: return ilayernorm(c);
    case REQUANTIZE_TABLE: return requantize_table(c);
    case REQUANTIZE_SHIFTMAX:
    case REQUANTIZE_SHIFTMAX_TABLE: return requantize_shiftmax(c);
    case IBERTGELU: return ibertgelu(c);
    case L1LAYERNORM: return l1layernorm(c);
    case IBERT_SOFTMAX: return ibert_softmax(c);
    case LOG_INT_SOFTMAX: return log_int_softmax(c);
    case IL2NORM: return il2norm(c);
  }
}

// ------------------------------------------------------------------------- the OrtCustomOp callbacks

Tensor read_value(const ort::Value* v) { return ivit::read_tensor(g_api, v, check); }

void hint_once(SessionKernels* session);

ort::Status* compute(void* kernel, ort::KernelContext* ctx) {
  const Kernel& k = *static_cast<const Kernel*>(kernel);
  hint_once(k.session);
  try {
    Call c{k, {}, {}};
    size_t n = 0;
    check(api<ort::Status*(const ort::KernelContext*, size_t*)>(ort::KernelContext_GetInputCount)(ctx, &n));
    for (size_t i = 0; i < n; ++i) {
      const ort::Value* v = nullptr;
      check(api<ort::Status*(const ort::KernelContext*, size_t, const ort::Value**)>(ort::KernelContext_GetInput)(
          ctx, i, &v));
      c.in.push_back(read_value(v));
      const Port port = k.def->ports[i];
      if (port == TABLE_OUT || port == TABLE_I32) continue;  // looked up, not broadcast
      Shape b;
      if (!broadcast(c.out, c.in.back().shape, b))
        throw Error("input " + std::to_string(i) + " of shape " + shape_str(c.in.back().shape) +
                    " does not broadcast with " + shape_str(c.out));
      c.out = b;
    }
    ort::Value* out = nullptr;
    check(api<ort::Status*(ort::KernelContext*, size_t, const int64_t*, size_t, ort::Value**)>(
        ort::KernelContext_GetOutput)(ctx, 0, c.out.data(), c.out.size(), &out));
    const Tensor y = read_value(out);
    c.y = const_cast<void*>(y.data);
    c.y_elem = y.elem;
    fail_if(y.elem != c.in.back().elem, "the output type must be y_zero_point's type");
    if (numel(c.out) == 0) return nullptr;
    PoolScope pool(ctx);
    run_op(c);
    return nullptr;
  } catch (const std::exception& e) {
    return make_status(std::string(k.def->domain) + " " + k.def->name + " node '" + k.node + "': " + e.what());
  }
}

std::string node_name(const ort::KernelInfo* info) {
  char buf[512];
  size_t size = sizeof(buf);
  ort::Status* s = api<ort::Status*(const ort::KernelInfo*, char*, size_t*)>(ort::KernelInfo_GetNodeName)(info, buf, &size);
  if (s) {
    api<void(ort::Status*)>(ort::ReleaseStatus)(s);
    return "?";
  }
  return std::string(buf);
}

int input_elem(const ort::KernelInfo* info, size_t i) {
  ort::TypeInfo* ti = nullptr;
  check(api<ort::Status*(const ort::KernelInfo*, size_t, ort::TypeInfo**)>(ort::KernelInfo_GetInputTypeInfo)(info, i, &ti));
  const ort::TensorInfo* tensor = nullptr;
  ort::ElemType elem = ort::UNDEFINED;
  ort::Status* s = api<ort::Status*(const ort::TypeInfo*, const ort::TensorInfo**)>(ort::CastTypeInfoToTensorInfo)(ti, &tensor);
  if (!s && tensor) s = api<ort::Status*(const ort::TensorInfo*, ort::ElemType*)>(ort::GetTensorElementType)(tensor, &elem);
  api<void(ort::TypeInfo*)>(ort::ReleaseTypeInfo)(ti);
  check(s);
  return elem;
}

// The attribute ranges the kernels compute (the opset's preconditions, opset/README.md).
void check_attrs(const Kernel& k) {
  auto need = [&](int i, i64 lo, i64 hi) {
    if (k.attr[i] < lo || k.attr[i] > hi)
      throw Error(std::string("attribute ") + k.def->attrs[i] + "=" + std::to_string(k.attr[i]) + " is outside " +
                  std::to_string(lo) + ".." + std::to_string(hi));
  };
  switch (k.def->op) {
    case SHIFTMAX: need(0, 1, i64(1) << 52), need(1, 0, 62), need(2, 1, 30); break;
    case REQUANTIZE_SHIFTMAX: need(2, 1, i64(1) << 52), need(3, 0, 62), need(4, 1, 30); break;
    case REQUANTIZE_SHIFTMAX_TABLE: need(2, 1, i64(1) << 52), need(3, 0, 62), need(4, 1, 16); break;
    case SHIFTGELU: need(0, 1, i64(1) << 52), need(1, 0, 62), need(2, 0, 62); break;
    case ILAYERNORM: need(0, 0, 62), need(1, 0, 61); break;
    case L1LAYERNORM: need(0, 0, 62), need(1, 0, 61); break;
    case IL2NORM: need(0, 0, 62), need(1, 1, (i64(1) << 62) - 1), need(2, 0, 61); break;
    case IBERTGELU: need(0, 0, (i64(1) << 31) - 1), need(1, 0, (i64(1) << 62) - 1), need(2, 0, 62); break;
    case LOG_INT_SOFTMAX: need(5, 1, 5); [[fallthrough]];
    case IBERT_SOFTMAX: {
      need(4, 1, 30);
      const char* why = ivit::poly_exp_refusal(k.attr[0], k.attr[1], k.attr[2], k.attr[3]);
      if (why)
        throw Error("attributes x0=" + std::to_string(k.attr[0]) + ", qb=" + std::to_string(k.attr[1]) + ", qc=" +
                    std::to_string(k.attr[2]) + ", n=" + std::to_string(k.attr[3]) + ": the exp " + why);
      break;
    }
    default: break;
  }
}

// The plain route's hint (docs/library.md): a model as converted (int.onnx) runs in a plain session with the
// library registered, exactly but ~3x slower than the engine's artifact, whose compile step writes the fused
// ops. A session's kernels are counted (keyed by the session's logger, KernelInfo_GetLogger); at its first
// kernel run, if a registration came from outside ivit-onnx's own sessions (no config entry ivit.session=1)
// and the session has a softmax kernel but no fused op (every compiled attention model has them), the
// library says once per process, on stderr, how to get the fast route.
constexpr const char* SESSION_KEY = "ivit.session";
std::atomic<bool> g_plain{false}, g_hinted{false};

struct SessionKernels {
  std::atomic<int> fused{0}, softmax{0};
  std::atomic<bool> decided{false};
};

SessionKernels* session_of(const ort::KernelInfo* info) {
  const void* logger = nullptr;  // the session's logger; null (one shared entry) where it cannot be had
  ort::Status* s = api<ort::Status*(const ort::KernelInfo*, const void**)>(ort::KernelInfo_GetLogger)(info, &logger);
  if (s) api<void(ort::Status*)>(ort::ReleaseStatus)(s), logger = nullptr;
  static std::mutex lock;
  static std::map<const void*, SessionKernels*> sessions;  // a few bytes per session, kept for the process
  std::lock_guard<std::mutex> guard(lock);
  SessionKernels*& entry = sessions[logger];
  if (!entry) entry = new SessionKernels();
  return entry;
}

void count_kernel(SessionKernels* session, const OpDef& def) {
  if (std::strcmp(def.domain, FUSED) == 0) session->fused.fetch_add(1);
  if (def.op == SHIFTMAX || def.op == IBERT_SOFTMAX || def.op == LOG_INT_SOFTMAX) session->softmax.fetch_add(1);
}

void hint_once(SessionKernels* session) {
  if (session->decided.load(std::memory_order_relaxed) || session->decided.exchange(true)) return;
  if (g_plain.load() && session->softmax.load() > 0 && session->fused.load() == 0 && !g_hinted.exchange(true))
    std::fprintf(stderr,
                 "ai.ivit custom-op library: hint: this model runs as converted (int8 GEMMs, unfused ops), about 3x "
                 "slower than the onnxruntime engine's artifact with the same bits: run `ivit-onnx compile int.onnx "
                 "-o int.ort.onnx` and load int.ort.onnx, or use ivit_onnx.InferenceSession\n");
}

bool plain_registration(const ort::Api* table, const ort::SessionOptions* options) {
  int has = 0;
  ort::Status* s = table->fn<ort::Status*(const ort::SessionOptions*, const char*, int*)>(ort::HasSessionConfigEntry)(
      options, SESSION_KEY, &has);
  if (s) {
    table->fn<void(ort::Status*)>(ort::ReleaseStatus)(s);
    return true;
  }
  return !has;
}

// An OrtCustomOp and the op it registers (the callbacks get the OrtCustomOp pointer back).
struct IvitOp {
  ort::CustomOp base;
  const OpDef* def;
};

const OpDef& def_of(const ort::CustomOp* op) { return *reinterpret_cast<const IvitOp*>(op)->def; }

ort::Status* create_kernel(const ort::CustomOp* op, const ort::Api*, const ort::KernelInfo* info, void** out) {
  const OpDef& def = def_of(op);
  Kernel k{&def, node_name(info), {}, nullptr};
  try {
    size_t n = 0;
    check(api<ort::Status*(const ort::KernelInfo*, size_t*)>(ort::KernelInfo_GetInputCount)(info, &n));
    if (n != def.ports.size())
      throw Error("takes " + std::to_string(def.ports.size()) + " inputs, the node has " + std::to_string(n));
    for (size_t i = 0; i < n; ++i) {
      const int elem = input_elem(info, i);
      const Port port = def.ports[i];
      const int need = port == I64 ? ort::INT64 : port == TABLE_I32 ? ort::INT32 : 0;  // 0: any int type
      if (need ? elem != need : kernel_code(elem) < 0)
        throw Error("input " + std::to_string(i) + " is " + elem_name(elem) + ", the opset allows " +
                    (need ? elem_name(need) : "int8, uint8, int16 or int32"));
    }
    for (size_t i = 0; i < def.attrs.size(); ++i) {
      ort::Status* s = api<ort::Status*(const ort::KernelInfo*, const char*, int64_t*)>(
          ort::KernelInfoGetAttribute_int64)(info, def.attrs[i], &k.attr[i]);
      if (s) {
        api<void(ort::Status*)>(ort::ReleaseStatus)(s);
        throw Error(std::string("missing int attribute '") + def.attrs[i] + "'");
      }
    }
    check_attrs(k);
    k.session = session_of(info);
    count_kernel(k.session, def);
    *out = new Kernel(k);
    return nullptr;
  } catch (const std::exception& e) {
    return make_status(std::string(def.domain) + " " + def.name + " node '" + k.node + "' refused: " + e.what());
  }
}

IvitOp make_op(const OpDef& def) {
  ort::CustomOp o{};
  o.version = ort::API_VERSION;
  o.CreateKernel = [](const ort::CustomOp*, const ort::Api*, const ort::KernelInfo*) -> void* { return nullptr; };
  o.GetName = [](const ort::CustomOp* op) { return def_of(op).name; };
  o.GetExecutionProviderType = [](const ort::CustomOp*) -> const char* { return nullptr; };  // CPU
  o.GetInputType = [](const ort::CustomOp* op, size_t i) {
    const Port port = def_of(op).ports[i];  // undefined: any type, checked in create_kernel
    return port == I64 ? ort::INT64 : port == TABLE_I32 ? ort::INT32 : ort::UNDEFINED;
  };
  o.GetInputTypeCount = [](const ort::CustomOp* op) { return def_of(op).ports.size(); };
  o.GetOutputType = [](const ort::CustomOp*, size_t) { return ort::UNDEFINED; };
  o.GetOutputTypeCount = [](const ort::CustomOp*) -> size_t { return 1; };
  o.KernelCompute = [](void*, ort::KernelContext*) {};  // not called: KernelComputeV2 is set
  o.KernelDestroy = [](void* k) { delete static_cast<Kernel*>(k); };
  o.GetInputCharacteristic = [](const ort::CustomOp*, size_t) { return ort::REQUIRED; };
  // OPTIONAL only because onnxruntime insists that a REQUIRED output of undefined type has exactly one
  // input of undefined type; every node has this output, and its type is y_zero_point's.
  o.GetOutputCharacteristic = [](const ort::CustomOp*, size_t) { return ort::OPTIONAL; };
  o.GetInputMemoryType = [](const ort::CustomOp*, size_t) { return 0; };  // OrtMemTypeDefault
  o.GetVariadicInputMinArity = [](const ort::CustomOp*) { return 1; };
  o.GetVariadicInputHomogeneity = [](const ort::CustomOp*) { return 0; };
  o.GetVariadicOutputMinArity = [](const ort::CustomOp*) { return 1; };
  o.GetVariadicOutputHomogeneity = [](const ort::CustomOp*) { return 0; };
  o.CreateKernelV2 = create_kernel;
  o.KernelComputeV2 = compute;
  // No InferOutputShapeFn: onnxruntime's own inference gives the output y_zero_point's type (the last input
  // of undefined type); the shape is left to the run, since an input of unknown rank reads as a scalar here.
  o.GetStartVersion = [](const ort::CustomOp*) { return 1; };
  o.GetEndVersion = [](const ort::CustomOp*) { return 1; };
  return IvitOp{o, &def};
}

IvitOp* ops() {
  static std::vector<IvitOp> table = [] {
    std::vector<IvitOp> t;
    for (const OpDef& def : OPS) t.push_back(make_op(def));
    return t;
  }();
  return table.data();
}

}  // namespace

extern "C" {

// The name every custom-op library exports: check onnxruntime's 8-bit GEMMs on this CPU (gemm_check.cpp), then
// register the ai.ivit and ai.ivit.fused domains with the session options.
__attribute__((visibility("default"))) ort::Status* RegisterCustomOps(ort::SessionOptions* options,
                                                                     const ort::ApiBase* base) {
  const ort::Api* table = base->GetApi(ort::API_VERSION);
  if (!table) {
    // GetApi(1) has CreateStatus at the same position in every onnxruntime: report through it
    const char* version = base->GetVersionString ? base->GetVersionString() : "(unknown)";
    char msg[400];
    std::snprintf(msg, sizeof(msg),
                  "ai.ivit custom-op library: onnxruntime %s does not serve ORT API version %u, which this library "
                  "was built for (it needs onnxruntime >= 1.%u with API version %u still available); rebuild the "
                  "library against this onnxruntime or use a matching one",
                  version, ort::API_VERSION, ort::API_VERSION, ort::API_VERSION);
    const ort::Api* v1 = base->GetApi(1);
    if (!v1) {
      std::fprintf(stderr, "%s\n", msg);
      return nullptr;
    }
    return v1->fn<ort::Status*(ort::ErrorCode, const char*)>(ort::CreateStatus)(ort::FAIL, msg);
  }
  static std::mutex lock;
  std::lock_guard<std::mutex> guard(lock);
  g_api = table;
  if (plain_registration(table, options)) g_plain.store(true);
  // An exact 8-bit GEMM path for this CPU with these options, proven by a probe session (gemm_check.cpp).
  const std::string refused = ivit::check_gemms(table, options);
  if (!refused.empty()) return table->fn<ort::Status*(ort::ErrorCode, const char*)>(ort::CreateStatus)(ort::FAIL,
                                                                                                       refused.c_str());
  // Each domain once per session options, kept for the life of the process (sessions use them after this
  // returns).
  static std::vector<ort::CustomOpDomain*> domains;
  ort::Status* s = nullptr;
  for (const char* name : {OPSET, FUSED}) {
    ort::CustomOpDomain* domain = nullptr;
    if (!s) s = api<ort::Status*(const char*, ort::CustomOpDomain**)>(ort::CreateCustomOpDomain)(name, &domain);
    for (int i = 0; i < N_OPS && !s; ++i)
      if (std::strcmp(OPS[i].domain, name) == 0)
        s = api<ort::Status*(ort::CustomOpDomain*, const ort::CustomOp*)>(ort::CustomOpDomain_Add)(domain,
                                                                                                   &ops()[i].base);
    if (!s) s = api<ort::Status*(ort::SessionOptions*, ort::CustomOpDomain*)>(ort::AddCustomOpDomain)(options, domain);
    if (domain) domains.push_back(domain);
  }
  // the compile step's QGemm ops (qgemm_op.cpp), whose paths the self-check probes first (qgemm.cpp)
  if (!s) s = api<ort::Status*(ort::SessionOptions*, const char*, const char*)>(ort::AddSessionConfigEntry)(
              options, "ivit.qgemm_check", ivit::check_qgemm().c_str());
  ort::CustomOpDomain* engine = nullptr;
  if (!s) s = api<ort::Status*(const char*, ort::CustomOpDomain**)>(ort::CreateCustomOpDomain)("ai.ivit.engine", &engine);
  // QGemm, QGemmTable; with one or two IAdd stages (QGemmAdd, QGemmAddAdd, ...), each with a table after it or
  // not (QGemmAddTable, ...)
  for (int adds = 0; adds < 3; ++adds)
    for (bool post : {false, true})
      for (bool table : {false, true})
        if (!s && (adds || !post))
          s = api<ort::Status*(ort::CustomOpDomain*, const ort::CustomOp*)>(ort::CustomOpDomain_Add)(
              engine, ivit::qgemm_op(g_api, table, adds, post));
  for (int form = 0; form < 5; ++form)  // attention's batched GEMMs on the same kernel (qbatch_op.cpp)
    if (!s) s = api<ort::Status*(ort::CustomOpDomain*, const ort::CustomOp*)>(ort::CustomOpDomain_Add)(
                engine, ivit::qbatch_op(g_api, form));
  // the patch embedding's input QuantizeLinear and im2col (patch_op.cpp)
  if (!s) s = api<ort::Status*(ort::CustomOpDomain*, const ort::CustomOp*)>(ort::CustomOpDomain_Add)(
              engine, ivit::patch_op(g_api));
  if (!s) s = api<ort::Status*(ort::SessionOptions*, ort::CustomOpDomain*)>(ort::AddCustomOpDomain)(options, engine);
  if (engine) domains.push_back(engine);
  return s;
}

}  // extern "C"
