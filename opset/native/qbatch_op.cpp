// Attention's activation x activation GEMMs (Q·Kᵀ, P·V) on the library's own exact kernel (qgemm.h), as
// onnxruntime custom ops of domain ai.ivit.engine, which only the onnxruntime engine's compile step writes
// (ivit_onnx/engines/onnxruntime/attn_fold.py):
//   QBatchMatMul(A, B, a_zero_point?, b_zero_point?) -> int32 y = MatMulInteger(A, B, za, zb), bit for bit
//   QBatchMatMulRequantize(A, B, za?, zb?, x_zero_point, multiplier, shift, y_zero_point) -> Requantize(that)
//   QBatchMatMulTable(..., y_zero_point, table) -> table[Requantize(that) - qmin]  (RequantizeTable)
//   QBatchMatMulShiftmax(..., y_zero_point, table, out_zero_point) -> RequantizeShiftmax(int32 y, ...): the
//     Requantize to the table's index in the GEMM's epilogue (bytes: a table of at most 256 entries, non-
//     decreasing), then each row's Shiftmax from E[max k][k] = shift_exp(table[k] - table[max k]), as
//     kernels.cpp's ivit_requantize_shiftmax computes it (attributes x0, n, bits too; per-tensor parameters)
//   QBatchMatMulShiftmaxTable(..., out_zero_point, post) -> post[that - out_zero_point]: a Requantize after the
//     Shiftmax tabulated over its 2**bits + 1 values (bits <= 16), post's type the output's
// attributes qmin, qmax (the Requantize forms), trans_b (B given as [..., N, K]: a Transpose of its last two
// axes absorbed). A [..., M, K], B [..., K, N]: int8 or uint8, batch axes broadcast as MatMul's; zero points
// single values; the Requantize parameters 1 or N values. Every input is read when the node runs.
// Head views (attention's head split and merge absorbed, ivit_onnx/engines/onnxruntime/head_views.py):
//   a_heads H > 0: A is given as any X of B * S * C elements (S = a_seq, C = a_channels; as a Reshape to
//   [B, S, C] reads it), read as [B, H, S, a_dim] with A[b, h, s, d] = X[(b * S + s) * C + a_offset + h * a_dim
//   + d]; b_heads likewise for B (as given, before trans_b); y_heads H > 0: the output's last batch axis (H) is
//   merged into its columns, y[..., m, h * N + n] (a Transpose to [..., M, H, N] and a Reshape), with M
//   checked against y_seq where that is not 0 (the Reshape's rows).
//
// Each GEMM repacks its B into a packed GEMM kept from earlier runs (ivit_qgemm_repack: O(K N) against the
// O(M K N) of the GEMM; ivit_qgemm_create per GEMM cost more than the GEMM at attention's sizes): a uint8 B
// with zero point zb is the int8 B ^ 0x80 with zero point zb - 128, exactly. The GEMMs are split over
// onnxruntime's intra-op pool (one thread: one core); with fewer than 8, each runs on the pool.

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ort_abi.h"
#include "ort_op.h"
#include "ort_tensor.h"
#include "intmath.h"
#include "kernels.h"
#include "qgemm.h"

// qgemm.cpp: a new B (b[k * ldk + n * ldn] ^ flip, zero point zb) for a packed GEMM of the same K and N
extern "C" void ivit_qgemm_repack(void* g, const uint8_t* b, int64_t ldk, int64_t ldn, int flip, int64_t zb);

namespace {

using i64 = int64_t;
const ort::Api* g_api = nullptr;

enum Form : int { INT32 = 0, REQUANTIZE = 1, TABLE = 2, SHIFTMAX = 3, SHIFTMAX_TABLE = 4 };
const char* const NAMES[] = {"QBatchMatMul", "QBatchMatMulRequantize", "QBatchMatMulTable", "QBatchMatMulShiftmax",
                             "QBatchMatMulShiftmaxTable"};

using Error = ivit::OrtError;  // what check and the kernel throw

void check(ort::Status* s) { ivit::ort_check(g_api, s); }

ivit::OrtTensor read(const ort::Value* v) { return ivit::read_tensor(g_api, v, check); }

// Packed GEMMs of one node, kept across runs for their buffers and epilogue (only B changes between the
// GEMMs of a run): one per GEMM running at a time; all dropped when the parameters (key) change.
struct Cache {
  std::mutex lock;
  std::vector<i64> key;
  i64 generation = 0;
  std::vector<void*> free;
  ~Cache() {
    for (void* g : free) ivit_qgemm_destroy(g);
  }
};

// a head view (see the top): X as [B, seq, channels] read as [B, heads, seq, dim] from channel offset on;
// heads 0: none
struct View {
  i64 heads, dim, offset, seq, channels;
};

// The Shiftmax form's rows of exps, E[km][k] = shift_exp(table[k] - table[km]) for k <= km (the only ones a row
// whose largest index is km reads), all built when the table or x0, n change (at most 256 x 256: once per node
// in practice), so that the rows read them with no synchronisation.
struct ExpRows {
  std::mutex lock;
  std::vector<i64> key;
  i64 nq = 0, np = 0;
  std::vector<i64> e;
  std::vector<uint8_t> planes;  // E as byte planes for the VBMI rows (ivit_exp_planes; np 0: none)
  void prepare(const std::vector<int32_t>& t, i64 x0, i64 n) {
    std::vector<i64> k = {x0, n};
    k.insert(k.end(), t.begin(), t.end());
    std::lock_guard<std::mutex> guard(lock);
    if (k == key) return;
    const ivit::Exp exp(x0, n);
    nq = static_cast<i64>(t.size());
    e.assign(nq * nq, 0);
    for (i64 km = 0; km < nq; ++km)
      for (i64 j = 0; j <= km; ++j) e[km * nq + j] = exp(-(i64(t[km]) - t[j]));
    planes.assign(nq <= 256 ? nq * 8 * 256 : 0, 0);  // room for the most planes, then only those E needs
    np = planes.empty() ? 0 : ivit_exp_planes(e.data(), nq, planes.data());
    planes.resize(np * nq * 256);
    key = std::move(k);
  }
};

struct Kernel {
  int form;
  i64 qmin, qmax, trans_b;
  View av, bv;
  i64 y_heads, y_seq;
  i64 x0, n, bits;  // the Shiftmax form's
  std::string node;
  Cache cache;
  ExpRows exps;
};

struct BatchOp {
  ort::CustomOp base;
  int form;
};

int form_of(const ort::CustomOp* op) { return reinterpret_cast<const BatchOp*>(op)->form; }

i64 attribute(const ort::KernelInfo* info, const char* name, i64 otherwise) {
  int64_t v = 0;
  if (ivit::ort_attribute(g_api, info, name, v)) return v;
  if (otherwise == INT64_MIN) throw Error{std::string("attribute ") + name + " is required"};
  return otherwise;
}

ort::Status* create(const ort::CustomOp* op, const ort::Api*, const ort::KernelInfo* info, void** out) {
  const int form = form_of(op);
  const std::string node = ivit::ort_node_name(g_api, info);
  try {
    const bool rq = form != INT32, sm = form == SHIFTMAX || form == SHIFTMAX_TABLE;
    const i64 qmin = rq ? attribute(info, "qmin", INT64_MIN) : INT32_MIN;
    const i64 qmax = rq ? attribute(info, "qmax", INT64_MIN) : INT32_MAX;
    if (qmin > qmax) throw Error{"qmin must not exceed qmax"};
    auto view = [&](const char* p) {
      const std::string s(p);
      auto at = [&](const char* name) { return attribute(info, (s + name).c_str(), 0); };
      const View v{at("_heads"), at("_dim"), at("_offset"), at("_seq"), at("_channels")};
      const bool bad = v.dim < 1 || v.offset < 0 || v.seq < 1 || v.offset + v.heads * v.dim > v.channels;
      if (v.heads < 0 || (v.heads > 0 && bad)) throw Error{s + "'s head view is invalid"};
      return v;
    };
    const i64 y_heads = attribute(info, "y_heads", 0), y_seq = attribute(info, "y_seq", 0);
    if (y_heads < 0 || y_seq < 0) throw Error{"y_heads and y_seq must not be negative"};
    const i64 bits = sm ? attribute(info, "bits", INT64_MIN) : 0;
    const i64 x0 = sm ? attribute(info, "x0", INT64_MIN) : 1, n = sm ? attribute(info, "n", INT64_MIN) : 0;
    if (sm && (bits < 0 || bits > 62 || x0 < 1 || n < 0 || n > 62)) throw Error{"bits, x0 or n out of range"};
    if (sm && (qmax - qmin > 255 || y_heads)) throw Error{"the table must have at most 256 entries, no y_heads"};
    *out = new Kernel{form, qmin, qmax, attribute(info, "trans_b", 0), view("a"), view("b"), y_heads, y_seq,
                      x0, n, bits, node, {}, {}};
    return nullptr;
  } catch (const Error& e) {
    return ivit::ort_error(g_api, std::string("ai.ivit.engine ") + NAMES[form] + " node '" + node +
                                      "' refused: " + e.msg);
  }
}

// One node run's shared view: the operands, their batch offsets and the epilogue's parameters.
struct Job {
  const uint8_t* a;
  const uint8_t* b;
  uint8_t* y;
  i64 m, k, n, ysize;  // ysize: bytes per output element
  i64 lda, ldk, ldn, ldy;  // A's row stride, B's k and n strides, y's row stride (elements)
  bool a_u8, b_u8, trans_b;
  std::vector<i64> a_off, b_off, y_off;  // per GEMM, in elements
  i64 za, zb;
  std::vector<i64> zx, mult, shift;
  std::vector<int32_t> table;
  const void* post = nullptr;  // QBatchMatMulShiftmaxTable's table after the Shiftmax (the output's type)
  i64 zy, qmin, qmax;
  int out_code;
  Cache* cache;
  i64 generation;
  const char* err = nullptr;  // a refusal of ivit_qgemm_create
  // the Shiftmax form: the rows' exps, the output's zero point, bits and type
  ExpRows* exps = nullptr;
  i64 sm_zy = 0, sm_bits = 0;
  int sm_code = 0;
};

// A packed GEMM of the job's shape and parameters (its B arbitrary), from the cache or new; null on a refusal.
void* acquire(Job& j) {
  {
    std::lock_guard<std::mutex> guard(j.cache->lock);
    if (!j.cache->free.empty()) {
      void* g = j.cache->free.back();
      j.cache->free.pop_back();
      return g;
    }
  }
  thread_local std::vector<int8_t> zeros;
  zeros.assign(j.k * j.n, 0);
  const i64 zb = 0, nch = static_cast<i64>(j.zx.size());
  const char* err = nullptr;
  void* g = ivit_qgemm_create(0, j.a_u8 ? 1 : 0, j.k, j.n, zeros.data(), &zb, 1, j.za, j.zx.data(), j.mult.data(),
                              j.shift.data(), nch, j.zy, j.qmin, j.qmax, j.table.empty() ? nullptr : j.table.data(),
                              j.out_code, &err);
  if (!g) j.err = err;
  return g;
}

void release(Job& j, void* g) {
  std::lock_guard<std::mutex> guard(j.cache->lock);
  if (j.cache->generation == j.generation) j.cache->free.push_back(g); else ivit_qgemm_destroy(g);
}

// GEMM g of the job: its B packed (uint8 re-encoded, trans_b read transposed), then the rows of A.
void run_one(void* data, size_t g) {
  Job& j = *static_cast<Job*>(data);
  void* gemm = acquire(j);
  if (!gemm) return;
  ivit_qgemm_repack(gemm, j.b + j.b_off[g], j.ldk, j.ldn, j.b_u8 ? 0x80 : 0, j.b_u8 ? j.zb - 128 : j.zb);
  if (j.exps) {  // the indices, then each row's Shiftmax (kernels.cpp)
    thread_local std::vector<uint8_t> k;
    k.resize(j.m * j.n);
    ivit_qgemm_run_strided(gemm, j.a + j.a_off[g], j.lda, j.m, k.data(), j.n, 1);
    ivit_index_shiftmax_rows(k.data(), j.m, j.n, j.exps->e.data(), j.exps->nq, j.exps->planes.data(), j.exps->np,
                             j.sm_zy, j.sm_bits, j.y + j.y_off[g] * j.ysize, j.sm_code, j.post);
  } else {
    ivit_qgemm_run_strided(gemm, j.a + j.a_off[g], j.lda, j.m, j.y + j.y_off[g] * j.ysize, j.ldy, 1);
  }
  release(j, gemm);
}

i64 single(const ort::Value* v, const char* what) {
  if (!v) return 0;
  const ivit::OrtTensor t = read(v);
  if (t.size != 1) throw Error{std::string(what) + " must be a single value"};
  return t.at(0);
}

std::vector<i64> per_column(const ort::Value* v, i64 n, const char* what) {
  const ivit::OrtTensor t = read(v);
  if (t.shape.size() > 1 || (t.size != 1 && t.size != n)) throw Error{std::string(what) + " must have 1 or N values"};
  std::vector<i64> out(t.size);
  for (i64 i = 0; i < t.size; ++i) out[i] = t.at(i);
  return out;
}

ort::Status* compute(void* kernel, ort::KernelContext* ctx) {
  const Kernel& kn = *static_cast<const Kernel*>(kernel);
  try {
    auto input = [&](size_t i) { return ivit::ort_input(g_api, ctx, i); };
    const ivit::OrtTensor a = read(input(0)), b = read(input(1));
    for (const auto* t : {&a, &b}) {
      if (t->elem != ort::INT8 && t->elem != ort::UINT8) throw Error{"A and B must be int8 or uint8"};
      if (t->shape.empty()) throw Error{"A and B must have at least 1 axis"};
    }
    Job j{};
    j.trans_b = kn.trans_b != 0;
    // each operand's logical shape and strides (elements): as given, or a head view [B, H, S, dim] of X [B, S, C]
    auto logical = [](const ivit::OrtTensor& t, const View& v, const char* what, std::vector<i64>& shape,
                      std::vector<i64>& strides, i64& base) {
      shape = t.shape, base = 0;
      if (v.heads == 0) {
        strides.assign(shape.size(), 1);
        for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
        return;
      }
      const i64 s = v.seq, c = v.channels;
      if (t.size % (s * c))
        throw Error{std::string(what) + "'s " + std::to_string(t.size) + " elements are not [B, " +
                    std::to_string(s) + ", " + std::to_string(c) + "]"};
      shape = {t.size / (s * c), v.heads, s, v.dim}, strides = {s * c, v.dim, c, 1}, base = v.offset;
    };
    std::vector<i64> as, bs, sta, stb;
    i64 base_a, base_b;
    logical(a, kn.av, "A", as, sta, base_a);
    logical(b, kn.bv, "B", bs, stb, base_b);
    // a 1-D A is one row [1, K], a 1-D B one column [K, 1] (MatMul's promotion; the axis is dropped after)
    const bool a_row = as.size() == 1, b_col = bs.size() == 1;
    if (a_row) as.insert(as.begin(), 1), sta.insert(sta.begin(), 0);
    if (b_col) {
      if (j.trans_b) throw Error{"trans_b needs a B of at least 2 axes"};
      bs.push_back(1), stb.push_back(1);
    }
    const size_t ra = as.size(), rb = bs.size(), r = std::max(ra, rb);
    j.m = as[ra - 2], j.k = as[ra - 1];
    j.lda = a_row ? j.k : sta[ra - 2];
    const i64 kb = bs[rb - (j.trans_b ? 1 : 2)];
    j.n = bs[rb - (j.trans_b ? 2 : 1)];
    j.ldk = stb[rb - (j.trans_b ? 1 : 2)], j.ldn = stb[rb - (j.trans_b ? 2 : 1)];
    if (kb != j.k) throw Error{"A's K = " + std::to_string(j.k) + " differs from B's " + std::to_string(kb)};
    if (sta[ra - 1] != 1) throw Error{"A's rows must be contiguous"};
    // the batch axes, broadcast; each GEMM's offset into A and B
    std::vector<i64> shape(r - 2), sa(r - 2, 0), sb(r - 2, 0);
    for (size_t i = r - 2; i-- > 0;) {
      const bool in_a = i + ra >= r, in_b = i + rb >= r;
      const i64 da = in_a ? as[i + ra - r] : 1, db = in_b ? bs[i + rb - r] : 1;
      if (da != db && da != 1 && db != 1) throw Error{"the batch axes of A and B do not broadcast"};
      shape[i] = da == 1 ? db : da;
      sa[i] = da == 1 ? 0 : sta[i + ra - r], sb[i] = db == 1 ? 0 : stb[i + rb - r];
    }
    i64 count = 1;
    for (i64 d : shape) count *= d;
    // the output: [batch..., M, N], or with y_heads the last batch axis merged into the columns
    const i64 yh = kn.y_heads;
    if (yh > 0 && (shape.empty() || shape.back() != yh || a_row || b_col))
      throw Error{"y_heads = " + std::to_string(yh) + " is not the output's last batch axis"};
    if (yh > 0 && kn.y_seq > 0 && kn.y_seq != j.m)
      throw Error{"the merged output's rows are " + std::to_string(j.m) + ", not y_seq = " + std::to_string(kn.y_seq)};
    j.ldy = yh > 0 ? yh * j.n : j.n;
    j.a_off.resize(count), j.b_off.resize(count), j.y_off.resize(count);
    for (i64 g = 0; g < count; ++g) {
      i64 rest = g, oa = base_a, ob = base_b;
      for (size_t i = shape.size(); i-- > 0;) {
        const i64 idx = rest % shape[i];
        rest /= shape[i];
        oa += idx * sa[i], ob += idx * sb[i];
      }
      j.a_off[g] = oa, j.b_off[g] = ob;
      j.y_off[g] = yh > 0 ? (g / yh) * j.m * j.ldy + (g % yh) * j.n : g * j.m * j.n;
    }
    j.a = static_cast<const uint8_t*>(a.data), j.b = static_cast<const uint8_t*>(b.data);
    j.a_u8 = a.elem == ort::UINT8, j.b_u8 = b.elem == ort::UINT8;
    j.za = single(input(2), "a_zero_point"), j.zb = single(input(3), "b_zero_point");
    j.qmin = kn.qmin, j.qmax = kn.qmax;
    int out_elem = ort::INT32, sm_elem = ort::UNDEFINED;  // sm_elem: the Shiftmax form's output type
    if (kn.form == INT32) {
      j.zx = {0}, j.mult = {1}, j.shift = {0}, j.zy = 0;
    } else {
      j.zx = per_column(input(4), j.n, "x_zero_point");
      j.mult = per_column(input(5), j.n, "multiplier");
      j.shift = per_column(input(6), j.n, "shift");
      const ivit::OrtTensor zy = read(input(7));
      if (zy.size != 1) throw Error{"y_zero_point must be a single value"};
      j.zy = zy.at(0), out_elem = zy.elem;
      // the per-column parameters as N values where any one is (ivit_qgemm_create takes one count)
      const bool wide = j.zx.size() > 1 || j.mult.size() > 1 || j.shift.size() > 1;
      for (auto* v : {&j.zx, &j.mult, &j.shift})
        if (wide && v->size() == 1) v->assign(j.n, v->front());
      if (kn.form == TABLE) {
        const ivit::OrtTensor t = read(input(8));
        if (t.shape.size() != 1 || t.size != kn.qmax - kn.qmin + 1)
          throw Error{"the table must be 1-D with qmax - qmin + 1 entries"};
        for (i64 i = 0; i < t.size; ++i) j.table.push_back(static_cast<int32_t>(t.at(i)));
        out_elem = t.elem;
      }
      if (kn.form == SHIFTMAX || kn.form == SHIFTMAX_TABLE) {  // the GEMM writes the table's index (bytes); the
                                                               // rows go through ExpRows
        const ivit::OrtTensor t = read(input(8)), zo = read(input(9));
        if (t.elem != ort::INT32 || t.shape.size() != 1 || t.size != kn.qmax - kn.qmin + 1)
          throw Error{"the table must be 1-D int32 with qmax - qmin + 1 entries"};
        if (zo.size != 1) throw Error{"out_zero_point must be a single value"};
        if (j.zx.size() > 1 || j.mult.size() > 1 || j.shift.size() > 1) throw Error{"the parameters must be scalars"};
        std::vector<int32_t> table(static_cast<const int32_t*>(t.data), static_cast<const int32_t*>(t.data) + t.size);
        if (!std::is_sorted(table.begin(), table.end())) throw Error{"the table must be non-decreasing"};
        Kernel& mut = *static_cast<Kernel*>(kernel);
        mut.exps.prepare(table, kn.x0, kn.n);
        j.exps = &mut.exps, j.sm_zy = zo.at(0), j.sm_bits = kn.bits, j.sm_code = ivit::kernel_code(zo.elem);
        sm_elem = zo.elem;
        if (kn.form == SHIFTMAX_TABLE) {
          const ivit::OrtTensor p = read(input(10));
          if (kn.bits > 16 || p.shape.size() != 1 || p.size != (i64(1) << kn.bits) + 1)
            throw Error{"the table after the Shiftmax must be 1-D with 2**bits + 1 entries (bits <= 16)"};
          j.post = p.data;  // read in place: the input lives as long as this run
          sm_elem = p.elem, j.sm_code = ivit::kernel_code(p.elem);
        }
        j.zy -= kn.qmin, j.qmin = 0, j.qmax = kn.qmax - kn.qmin;
        out_elem = ort::UINT8;
      }
    }
    j.out_code = ivit::kernel_code(out_elem);
    if (j.out_code < 0 || (j.exps && j.sm_code < 0)) throw Error{"the output must be int8, uint8, int16 or int32"};
    const int y_code = j.exps ? j.sm_code : j.out_code;
    j.ysize = y_code == 3 ? 4 : y_code == 2 ? 2 : 1;
    if (j.exps) out_elem = sm_elem;
    if (yh > 0) shape.back() = j.m, shape.push_back(j.ldy);
    else {
      if (!a_row) shape.push_back(j.m);
      if (!b_col) shape.push_back(j.n);
    }
    ort::Value* out = nullptr;
    check(g_api->fn<ort::Status*(ort::KernelContext*, size_t, const int64_t*, size_t, ort::Value**)>(
        ort::KernelContext_GetOutput)(ctx, 0, shape.data(), shape.size(), &out));
    const ivit::OrtTensor y = read(out);
    if (y.elem != out_elem) throw Error{"the output's type differs from y_zero_point's"};
    j.y = static_cast<uint8_t*>(const_cast<void*>(y.data));
    if (count == 0 || j.m == 0 || j.n == 0) return nullptr;
    if (j.k == 0) throw Error{"K must be at least 1"};
    // the packed GEMMs of earlier runs serve where the parameters are the same
    std::vector<i64> key = {j.a_u8, j.k, j.n, j.za, j.zy, j.qmin, j.qmax, j.out_code};
    for (const auto* v : {&j.zx, &j.mult, &j.shift}) key.insert(key.end(), v->begin(), v->end());
    key.insert(key.end(), j.table.begin(), j.table.end());
    Kernel& mut = *static_cast<Kernel*>(kernel);
    j.cache = &mut.cache;
    {
      std::lock_guard<std::mutex> guard(mut.cache.lock);
      if (mut.cache.key != key) {
        for (void* g : mut.cache.free) ivit_qgemm_destroy(g);
        mut.cache.free.clear();
        mut.cache.key = std::move(key);
        ++mut.cache.generation;
      }
      j.generation = mut.cache.generation;
    }
    // many GEMMs: one per task on the pool; few: one after another, each on the pool
    if (count >= 8) {
      ivit::ort_parallel_for(g_api, ctx, run_one, static_cast<size_t>(count), &j);
    } else {
      ivit::OrtPoolScope pool(g_api, ctx);
      for (i64 g = 0; g < count; ++g) run_one(&j, static_cast<size_t>(g));
    }
    if (j.err) throw Error{j.err};
    return nullptr;
  } catch (const Error& e) {
    return ivit::ort_error(g_api, std::string("ai.ivit.engine ") + NAMES[kn.form] + " node '" + kn.node + "': " + e.msg);
  }
}

BatchOp make(int form) {
  ort::CustomOp o = ivit::ort_custom_op();
  o.GetName = [](const ort::CustomOp* op) { return NAMES[form_of(op)]; };
  // A, B, a_zero_point, b_zero_point: int8 or uint8; x_zero_point int32; multiplier, shift int64; y_zero_point
  // and the table: the output's type (onnxruntime gives the output the last undefined input's type); the
  // Shiftmax form: y_zero_point the index Requantize's, the table int32, out_zero_point the output's type
  o.GetInputType = [](const ort::CustomOp* op, size_t i) {
    static const ort::ElemType types[] = {ort::UNDEFINED, ort::UNDEFINED, ort::UNDEFINED, ort::UNDEFINED, ort::INT32,
                                          ort::INT64,     ort::INT64,     ort::UNDEFINED, ort::UNDEFINED, ort::UNDEFINED};
    return i == 8 && form_of(op) >= SHIFTMAX ? ort::INT32 : (i < 10 ? types[i] : ort::UNDEFINED);
  };
  o.GetInputTypeCount = [](const ort::CustomOp* op) -> size_t {
    const int f = form_of(op);
    return f == INT32 ? 4 : f == REQUANTIZE ? 8 : f == TABLE ? 9 : f == SHIFTMAX ? 10 : 11;
  };
  o.GetInputCharacteristic = [](const ort::CustomOp*, size_t i) {
    return i == 2 || i == 3 ? ort::OPTIONAL : ort::REQUIRED;
  };
  o.GetOutputType = [](const ort::CustomOp* op, size_t) {
    return form_of(op) == INT32 ? ort::INT32 : ort::UNDEFINED;
  };
  o.GetOutputTypeCount = [](const ort::CustomOp*) -> size_t { return 1; };
  o.KernelDestroy = [](void* k) { delete static_cast<Kernel*>(k); };
  o.CreateKernelV2 = create;
  o.KernelComputeV2 = compute;
  return BatchOp{o, form};
}

}  // namespace

namespace ivit {

const ort::CustomOp* qbatch_op(const ort::Api* api, int form) {
  g_api = api;
  static const BatchOp ops[5] = {make(INT32), make(REQUANTIZE), make(TABLE), make(SHIFTMAX), make(SHIFTMAX_TABLE)};
  return &ops[form].base;
}

}  // namespace ivit
