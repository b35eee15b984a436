// QGemm: the library's own exact 8-bit GEMM with Requantize fused (qgemm.cpp), and its onnxruntime custom op
// (qgemm_op.cpp, domain ai.ivit.engine; written only by the onnxruntime engine's compile step).
//
//   y[m, n] = Requantize(MatMulInteger(A, B, za, zb)[m, n], zx[n], b[n], c[n], zy; qmin, qmax)
//             (then table[y - qmin] for the table form: a Requantize chain tabulated, as RequantizeTable)
//
// with MatMulInteger's int32 accumulator (wrapping mod 2**32, as an int32 matmul does) and Requantize's
// int64 rescale, round half up (opset/requantize.py). A: int8 or uint8 [M, K]; B: int8 [K, N], constant,
// packed once; zb, zx, b, c per tensor (1 value) or per output column (N values); c in 0..62.
//
// QGemmAdd (and QGemmTableAdd) add the residual IAdd (opset/README.md "## IAdd") to the epilogue: v = y[m, n]
// above, as its type, is one addend and r the other, an activation [rows, N] (rows repeating) or constants
// (1 or N values):
//   out[m, n] = clip(floor(((v - zv) * mv + (r - zr) * mr + floor(2**c/2)) / 2**c) + zy, qmin, qmax)
// in int64 (mod 2**64, as the IAdd kernel), the multipliers, shift and zero points scalars. QGemmAddTable (and
// QGemmTableAddTable) then look the sum up in a table (a Requantize chain after the IAdd, tabulated over the
// sum's qmin..qmax): y = post[out - qmin].
#pragma once

#include <cstdint>
#include <string>

#include "ort_abi.h"

extern "C" {
// Instruction-set paths: 0 the best this CPU has (or IVIT_GEMM_ISA=portable|avx2|vnni|amx|neon|dotprod|i8mm),
// 1 portable C++, 2 AVX2 vpmaddwd, 3 AVX-512 VNNI vpdpbusd, 4 aarch64 NEON smlal, 5 aarch64 sdot (asimddp),
// 6 aarch64 smmla (i8mm), 7 AMX tdpbusd (amx: Linux, Sapphire Rapids and later).
int ivit_qgemm_supported(int isa);  // 1 if this CPU (and build) runs that path
int ivit_qgemm_usable(int isa);     // 1 if it does and the self-check (run here if not yet) did not refuse it
// A packed GEMM, or null with *err set (a static message). Dtype codes of kernels.h: a_code 0 int8 / 1 uint8;
// out_code 0..3; nzb / nch: 1 or n; table: null or qmax - qmin + 1 int32 values of the output type.
void* ivit_qgemm_create(int isa, int a_code, int64_t k, int64_t n, const int8_t* b, const int64_t* zb, int64_t nzb,
                        int64_t za, const int64_t* zx, const int64_t* mult, const int64_t* shift, int64_t nch,
                        int64_t zy, int64_t qmin, int64_t qmax, const int32_t* table, int out_code, const char** err);
// The residual stage of ivit_qgemm_create_add (qgemm.h's QGemmAdd): r_code 0..3 for an activation r (passed to
// ivit_qgemm_run_add), -1 for the constants r_const (r_size: 1 or n values); out_code the sum's type; post
// null, or the table after it (qmax - qmin + 1 values of the type post_code, the output's then).
struct IvitQGemmAdd {
  int r_code;
  const int64_t* r_const;
  int64_t r_size, zv, mv, zr, mr, shift, zy, qmin, qmax;
  int out_code;
  const int32_t* post;
  int post_code;
  // null, or a second stage reading this one's sum as its v (QGemmAddAdd: quantize_static's bias IAdd, then
  // the residual IAdd); at most one of the two reads an activation, a table only after the last
  const IvitQGemmAdd* then;
};
// ivit_qgemm_create with the residual stage (add null: none); out_code stays the Requantize's (table's) type
void* ivit_qgemm_create_add(int isa, int a_code, int64_t k, int64_t n, const int8_t* b, const int64_t* zb,
                            int64_t nzb, int64_t za, const int64_t* zx, const int64_t* mult, const int64_t* shift,
                            int64_t nch, int64_t zy, int64_t qmin, int64_t qmax, const int32_t* table,
                            int out_code, const IvitQGemmAdd* add, const char** err);
int ivit_qgemm_isa(const void* g);  // the path a packed GEMM runs
// the x86 vector epilogue's int32-lane forms a packed GEMM takes (bits: 1 the Requantize's hi32, 2 the residual
// stages' hadd, 4 a stage's power-of-two form, Stage::pow2, 8 byte outputs a row's 48 columns at a time; 0 on
// other paths), for the tests
int ivit_qgemm_epilogue(const void* g);
// y[m, n] for m < rows of a (row-major [rows, k]); threads: on the caller's pool hook if set, else that many
int ivit_qgemm_run(const void* g, const void* a, int64_t rows, void* y, int threads);
// the same with the residual activation r, [r_rows, N] row-major, row m reading row m % r_rows (rows a multiple
// of r_rows); r null for a GEMM without one. Returns 1 where r is missing or was not expected.
int ivit_qgemm_run_add(const void* g, const void* a, int64_t rows, const void* r, int64_t r_rows, void* y,
                       int threads);
// the same with row strides: A's rows lda >= k elements apart, y's ldy >= n (a view into a larger tensor)
int ivit_qgemm_run_strided(const void* g, const void* a, int64_t lda, int64_t rows, void* y, int64_t ldy,
                           int threads);
void ivit_qgemm_destroy(void* g);
// the roofline's ceiling: MACs done by `iters` rounds of the path's bare multiply-accumulate instruction on
// registers (independent chains; *sum keeps the loop), 0 for the portable path; the caller times it
int64_t ivit_qgemm_peak(int isa, int64_t iters, int32_t* sum);
}

namespace ivit {
// The QGemm op of domain ai.ivit.engine (and its table form, QGemmTable; with `adds` IAdd stages, QGemmAdd,
// QGemmTableAdd, QGemmAddAdd, QGemmTableAddAdd; with post too, the same names ending in Table) for
// RegisterCustomOps.
const ort::CustomOp* qgemm_op(const ort::Api* api, bool table, int adds = 0, bool post = false);
// The self-check of the QGemm paths (once per process): each path this CPU has, at the worst cases, against
// plain int64 loops; a path that differs is never picked. Returns the outcome, e.g. "vnni exact, avx2 exact,
// portable exact".
std::string check_qgemm();
}  // namespace ivit
