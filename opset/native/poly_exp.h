// I-BERT's polynomial exp of opset/poly_exp.py, shared by the IBertSoftmax and LogIntSoftmax kernels
// (kernels.cpp) and the onnxruntime custom ops (ort_ops.cpp): the exp itself and the attribute ranges it
// computes exactly.
#pragma once

#include <algorithm>
#include <cstdint>

#include "intmath.h"

namespace ivit {

// Why attributes x0, qb, qc, n lie outside what the kernels compute (the opset's preconditions with rows of
// one element: 1 <= x0 <= qb <= 2**30, 0 <= qc <= 2**60, (qb**2 + qc) * 2**n < 2**61), or nullptr.
inline const char* poly_exp_refusal(i64 x0, i64 qb, i64 qc, i64 n) {
  if (x0 < 1 || qb < x0 || qb > (i64(1) << 30)) return "needs 1 <= x0 <= qb <= 2**30";
  if (qc < 0 || qc > (i64(1) << 60)) return "needs 0 <= qc <= 2**60";
  if (n < 0 || n > 60 || qb * qb + qc >= (i64(1) << (61 - n))) return "needs (qb**2 + qc) * 2**n < 2**61";
  return nullptr;
}

// floor(poly_exp(-a) / 2**k) with poly_exp(-a) = ((qb - r)**2 + qc) * 2**(n - q) for a >= 0: a clamped at n*x0,
// q = floor(a / x0), r = a - q*x0. For attributes poly_exp_refusal accepts, n*x0 < 2**36: the quotient comes
// from a double product, exactly, and nothing branches (loops over it vectorize).
struct PolyExp {
  i64 x0, qb, qc, n, k, nx0;
  double inv_x0;
  PolyExp(i64 x0_, i64 qb_, i64 qc_, i64 n_, i64 k_ = 0)
      : x0(x0_), qb(qb_), qc(qc_), n(n_), k(k_), nx0(n_ * x0_), inv_x0(1.0 / static_cast<double>(x0_)) {}
  i64 operator()(i64 a) const {
    const i64 c = std::min(a, nx0);
    const i64 q = floor_div_small(c, x0, inv_x0);
    const i64 t = qb - (c - q * x0);
    return ((t * t + qc) << (n - q)) >> k;
  }
  i64 clamp_point() const { return nx0; }  // every a from here on gives the same value
};

// IBertSoftmax's k = max(n + bits(qb**2 + qc) - 31, 0) (opset/poly_exp.py norm_shift; qb**2 + qc >= 1)
inline i64 norm_shift(i64 qb, i64 qc, i64 n) {
  const i64 length = 64 - __builtin_clzll(static_cast<unsigned long long>(qb * qb + qc));
  return std::max<i64>(n + length - 31, 0);
}

// LogIntSoftmax's levels (opset/log_int_softmax.py): K = min(2**log_bits, bits + 1), and the divisors
// D_1 = 3, D_k = 3 * 2**(k-1) - 1 of its per-row thresholds floor(2 S / D_k).
inline i64 lis_levels(i64 bits, i64 log_bits) { return std::min<i64>(i64(1) << log_bits, bits + 1); }
inline i64 lis_divisor(i64 k) { return k == 1 ? 3 : 3 * (i64(1) << (k - 1)) - 1; }

// The output integer of level q = 0..K (K: beyond the last level, 0), zero point excluded.
inline i64 lis_value(i64 q, i64 k, i64 bits) {
  return q < k ? std::min<i64>(i64(1) << std::max<i64>(bits - q, 0), (i64(1) << bits) - 1) : 0;
}

}  // namespace ivit
