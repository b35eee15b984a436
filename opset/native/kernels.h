// The C entry points of the native kernels (kernels.cpp), for the onnxruntime custom ops (ort_ops.cpp).
// Dtype codes: 0 int8, 1 uint8, 2 int16, 3 int32. Each returns 0, or 1 for a dtype code it does not know.
#pragma once

#include <cstdint>

extern "C" {
int ivit_requantize(const void* x, int ti, int64_t outer, int64_t nc, int64_t inner, int64_t zx, const int64_t* b,
                    const int64_t* c, int64_t zy, int64_t qmin, int64_t qmax, void* y, int to, int threads);
int ivit_requantize_pc(const void* x, int ti, int64_t outer, int64_t nc, int64_t inner, const int64_t* zx,
                       const int64_t* b, const int64_t* c, int64_t zy, int64_t qmin, int64_t qmax, void* y, int to,
                       int threads);
int ivit_requantize_table(const void* x, int ti, int64_t outer, int64_t nc, int64_t inner, const int64_t* zx,
                          const int64_t* b, const int64_t* c, int64_t zy, int64_t qmin, int64_t qmax,
                          const void* table, void* y, int to, int threads);
int ivit_requantize_shiftmax(const void* x, int ti, int64_t rows, int64_t len, int64_t zx, int64_t b, int64_t c,
                             int64_t zy, int64_t qmin, int64_t qmax, const int32_t* table, int64_t y_zp,
                             int64_t x0, int64_t n, int64_t bits, void* y, int to, int threads);
// the same, then post[value - y_zp] (2**bits + 1 entries of the output's type, as that type; null: none): a
// Requantize after
// the Shiftmax, tabulated over its values (chain_fold's RequantizeShiftmaxTable)
int ivit_requantize_shiftmax_table(const void* x, int ti, int64_t rows, int64_t len, int64_t zx, int64_t b,
                                   int64_t c, int64_t zy, int64_t qmin, int64_t qmax, const int32_t* table,
                                   int64_t y_zp, int64_t x0, int64_t n, int64_t bits, void* y, int to, int threads,
                                   const void* post);
int ivit_isqrt(const int64_t* v, int64_t* r, int64_t n);
// y[k] = QuantizeLinear(x[k]) as onnxruntime's (x / scale, clip, round half to even, + zp), y int8 (to 0) or
// uint8 (to 1)
int ivit_quantize_linear(const float* x, int64_t n, float scale, int64_t zp, int to, void* y);
int ivit_exp_planes(const int64_t* e_rows, int64_t nq, uint8_t* planes);
int ivit_index_shiftmax_rows(const uint8_t* k, int64_t rows, int64_t len, const int64_t* e_rows, int64_t nq,
                             const uint8_t* planes, int64_t np, int64_t y_zp, int64_t bits, void* y, int to,
                             const void* post);
int ivit_shiftmax_vbmi();
int ivit_iadd(const void* a, int ta, const void* b, int tb, int64_t n, int64_t nb, int64_t za, int64_t zb,
              int64_t ma, int64_t mb, int64_t c, int64_t zy, int64_t qmin, int64_t qmax, void* y, int to,
              int threads);
int ivit_shiftmax(const void* x, int ti, int64_t rows, int64_t len, int64_t zy, int64_t x0, int64_t n, int64_t bits,
                  void* y, int to, int threads);
int ivit_shiftgelu(const void* x, int ti, int64_t outer, int64_t nc, int64_t inner, const int64_t* b, const int64_t* c,
                   int64_t zy, int64_t x0, int64_t n, int64_t bits, int64_t qmin, int64_t qmax, void* y, int to,
                   int threads);
int ivit_ilayernorm(const void* x, int ti, int64_t rows, int64_t len, const int64_t* b, const int64_t* c,
                    const int64_t* bias, int64_t nc, int64_t zy, int64_t shift_in, int64_t p, int64_t qmin,
                    int64_t qmax, void* y, int to, int threads);
// IL2Norm (#27: cosine attention's F.normalize); b, c per tensor (nc == 1) or per channel of the last axis
int ivit_il2norm(const void* x, int ti, int64_t rows, int64_t len, const int64_t* b, const int64_t* c, int64_t nc,
                 int64_t zx, int64_t zy, int64_t shift_in, int64_t eps, int64_t p, int64_t qmin, int64_t qmax,
                 void* y, int to, int threads);
// the ablation's alternatives (paper Table 2): I-BERT's i-GELU, Fully-8bit's L1 LayerNorm
int ivit_ibertgelu(const void* x, int ti, int64_t outer, int64_t nc, int64_t inner, const int64_t* b, const int64_t* c,
                   int64_t zy, int64_t clip, int64_t coeff, int64_t k, int64_t qmin, int64_t qmax, void* y, int to,
                   int threads);
int ivit_l1layernorm(const void* x, int ti, int64_t rows, int64_t len, const int64_t* b, const int64_t* c,
                     const int64_t* bias, int64_t nc, int64_t zy, int64_t shift_in, int64_t p, int64_t qmin,
                     int64_t qmax, void* y, int to, int threads);
int ivit_ibert_softmax(const void* x, int ti, int64_t rows, int64_t len, int64_t zy, int64_t x0, int64_t qb,
                       int64_t qc, int64_t n, int64_t bits, void* y, int to, int threads);
int ivit_log_int_softmax(const void* x, int ti, int64_t rows, int64_t len, int64_t zy, int64_t x0, int64_t qb,
                         int64_t qc, int64_t n, int64_t bits, int64_t log_bits, void* y, int to, int threads);
}
