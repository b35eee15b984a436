// QGemm: the library's own exact 8-bit GEMM with Requantize fused (qgemm.cpp), and its onnxruntime custom op
// (qgemm_op.cpp, domain ai.ivit.engine; written only by the onnxruntime engine's compile step).
//
//   y[m, n] = Requantize(MatMulInteger(A, B, za, zb)[m, n], zx[n], b[n], c[n], zy; qmin, qmax)
//             (then table[y - qmin] for the table form: a Requantize chain tabulated, as RequantizeTable)
//
// with MatMulInteger's int32 accumulator (wrapping mod 2**32, as an int32 matmul does) and Requantize's
// int64 rescale, round half up (opset/requantize.py). A: int8 or uint8 [M, K]; B: int8 [K, N], constant,
// packed once; zb, zx, b, c per tensor (1 value) or per output column (N values); c in 0..62.
#pragma once

#include <cstdint>
#include <string>

#include "ort_abi.h"

extern "C" {
// Instruction-set paths: 0 the best this CPU has (or IVIT_GEMM_ISA=portable|avx2|vnni|neon|dotprod|i8mm),
// 1 portable C++, 2 AVX2 vpmaddwd, 3 AVX-512 VNNI vpdpbusd, 4 aarch64 NEON smlal, 5 aarch64 sdot (asimddp),
// 6 aarch64 smmla (i8mm).
int ivit_qgemm_supported(int isa);  // 1 if this CPU (and build) runs that path
int ivit_qgemm_usable(int isa);     // 1 if it does and the self-check (run here if not yet) did not refuse it
// A packed GEMM, or null with *err set (a static message). Dtype codes of kernels.h: a_code 0 int8 / 1 uint8;
// out_code 0..3; nzb / nch: 1 or n; table: null or qmax - qmin + 1 int32 values of the output type.
void* ivit_qgemm_create(int isa, int a_code, int64_t k, int64_t n, const int8_t* b, const int64_t* zb, int64_t nzb,
                        int64_t za, const int64_t* zx, const int64_t* mult, const int64_t* shift, int64_t nch,
                        int64_t zy, int64_t qmin, int64_t qmax, const int32_t* table, int out_code, const char** err);
int ivit_qgemm_isa(const void* g);  // the path a packed GEMM runs
// y[m, n] for m < rows of a (row-major [rows, k]); threads: on the caller's pool hook if set, else that many
int ivit_qgemm_run(const void* g, const void* a, int64_t rows, void* y, int threads);
// the same with row strides: A's rows lda >= k elements apart, y's ldy >= n (a view into a larger tensor)
int ivit_qgemm_run_strided(const void* g, const void* a, int64_t lda, int64_t rows, void* y, int64_t ldy,
                           int threads);
void ivit_qgemm_destroy(void* g);
// the roofline's ceiling: MACs done by `iters` rounds of the path's bare multiply-accumulate instruction on
// registers (12 independent chains; *sum keeps the loop), 0 for the portable path; the caller times it
int64_t ivit_qgemm_peak(int isa, int64_t iters, int32_t* sum);
}

namespace ivit {
// The QGemm op of domain ai.ivit.engine (and its table form, QGemmTable) for RegisterCustomOps.
const ort::CustomOp* qgemm_op(const ort::Api* api, bool table);
// The self-check of the QGemm paths (once per process): each path this CPU has, at the worst cases, against
// plain int64 loops; a path that differs is never picked. Returns the outcome, e.g. "vnni exact, avx2 exact,
// portable exact".
std::string check_qgemm();
}  // namespace ivit
