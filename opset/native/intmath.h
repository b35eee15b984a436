// Integer primitives shared by the native kernels (kernels.cpp) and the onnxruntime custom ops
// (ort_ops.cpp): int64 with numpy's semantics -- wrap-around (built with -fwrapv), `>>` is floor, shifts
// by counts outside [0, 63] give 0 (left) or the sign (right), floor division by zero gives 0 -- so that
// every expression equals the numpy reference kernels' (opset/_int.py, opset/shift_exp.py) bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ivit {

using i64 = int64_t;
using u64 = uint64_t;

inline i64 shl(i64 a, i64 b) { return static_cast<u64>(b) < 64 ? static_cast<i64>(static_cast<u64>(a) << b) : 0; }

inline i64 shr(i64 a, i64 b) { return static_cast<u64>(b) < 64 ? (a >> b) : (a < 0 ? -1 : 0); }

// numpy's floor_divide on int64 (b == 0 gives 0; INT64_MIN / -1 wraps).
inline i64 floor_div(i64 a, i64 b) {
  if (b == 0) return 0;
  if (b == -1) return static_cast<i64>(0 - static_cast<u64>(a));
  i64 q = a / b, r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) --q;
  return q;
}

// floor(a / b) for 0 <= a < 2**52 and 1 <= b, from a double estimate `a * inv_b` (inv_b = 1.0 / b):
// the estimate is within 1 of the quotient, and one remainder test makes it exact.
inline i64 floor_div_small(i64 a, i64 b, double inv_b) {
  i64 q = static_cast<i64>(static_cast<double>(a) * inv_b);
  i64 r = a - q * b;
  q -= (r < 0);
  q += (r >= b);
  return q;
}

// floor(a / b) with the double shortcut where it is exact, numpy's floor division elsewhere.
inline i64 div_by(i64 a, i64 b, double inv_b) {
  if (a >= 0 && b > 0 && a < (i64(1) << 52)) {
    if (b >= (i64(1) << 52)) return 0;  // then a < b
    return floor_div_small(a, b, inv_b);
  }
  return floor_div(a, b);
}

constexpr i64 RECIP_M = (i64(1) << 62) - 1;

// floor((2**62 - 1) / s): for 2**14 <= s < 2**61 a double quotient (< 2**48, error < 1) corrected once.
inline i64 recip(i64 s) {
  if (s < (i64(1) << 14) || s >= (i64(1) << 61)) return floor_div(RECIP_M, s);
  i64 q = static_cast<i64>(4611686018427387904.0 / static_cast<double>(s));
  i64 r = RECIP_M - q * s;  // |r| <= 2 s, no wrap for s < 2**61
  q -= (r < 0);
  q += (r >= s);
  return q;
}

inline i64 round_shift(i64 t, i64 c) { return shr(t + shr(shl(1, c), 1), c); }

inline i64 clip(i64 y, i64 lo, i64 hi) { return y < lo ? lo : (y > hi ? hi : y); }

struct Exp {  // shift_exp(d) = (x0 + floor(-r/2)) * 2**(n - q) of opset/shift_exp.py
  i64 x0, n, nx0;
  double inv_x0;
  bool small;  // -p <= n*x0 < 2**52: the quotient by x0 comes from a double product, exactly
  Exp(i64 x0_, i64 n_)
      : x0(x0_), n(n_), nx0(n_ * x0_), inv_x0(1.0 / static_cast<double>(x0_)), small(n_ * x0_ < (i64(1) << 52)) {}
  static i64 p_of(i64 d) { return d + shr(d, 1) - shr(d, 4); }
  i64 operator()(i64 d) const {
    const i64 a = -std::max(p_of(d), -nx0);
    const i64 q = small && a >= 0 ? floor_div_small(a, x0, inv_x0) : div_by(a, x0, inv_x0);
    const i64 r = a - q * x0;
    return (x0 + shr(-r, 1)) * shl(1, n - q);
  }
  // operator()(-a) for a >= 0 when `small`, without branches (so that loops over it vectorize)
  i64 fast(i64 a) const {
    const i64 m = -std::max(p_of(-a), -nx0);  // in [0, n*x0], n*x0 < 2**52
    i64 q = static_cast<i64>(static_cast<double>(m) * inv_x0);
    i64 r = m - q * x0;
    const i64 lo = r < 0, hi = r >= x0;  // the estimate is within 1 of the quotient
    q += hi - lo;
    r += (lo - hi) * x0;
    return (x0 + ((-r) >> 1)) << (n - q);
  }
  // The smallest a >= 0 from which shift_exp(-a) is clamped (p <= -n*x0): p(-a) is non-increasing in a,
  // so every larger a gives the same value.
  i64 clamp_point() const {
    i64 a = nx0 / 2;  // p(-a) >= -1.5 a - 1 > -n*x0 below this
    while (p_of(-a) > -nx0) a += std::max<i64>(1, (p_of(-a) + nx0) / 2);
    while (a > 0 && p_of(-(a - 1)) <= -nx0) --a;
    return a;
  }
};

// ShiftGELU's sg(v) = int_div(e1, e1 + e2, bits) (sh = 62 - bits, top = exp(0) = x0 * 2**n): with
// m = max(v, 0) one of e1 = shift_exp(v - m), e2 = shift_exp(-m) is `top`, the other shift_exp(-|v|).
inline i64 shift_sigmoid(const Exp& exp, i64 top, i64 sh, i64 v) {
  const i64 other = exp(v < 0 ? v : -v);
  const i64 e1 = v >= 0 ? top : other, e2 = v >= 0 ? other : top;
  return shr(e1 * recip(e1 + e2), sh);
}

// IBertGELU's g(v) of opset/ibertgelu.py: D - e for v < 0, else D + e, with
// e = round_shift(coeff - max(clip - |v|, 0)**2, k) and D = round_shift(coeff, k); 0 <= k <= 62, |v| < 2**62.
struct IBertErf {
  i64 clip, coeff, k, half, d;
  IBertErf(i64 clip_, i64 coeff_, i64 k_)
      : clip(clip_), coeff(coeff_), k(k_), half(shl(1, k_) >> 1), d((coeff_ + (shl(1, k_) >> 1)) >> k_) {}
  i64 operator()(i64 v) const {
    const i64 t = std::max<i64>(clip - (v < 0 ? -v : v), 0);
    const i64 e = (coeff - t * t + half) >> k;
    return v < 0 ? d - e : d + e;
  }
};

// isqrt of opset/ilayernorm.py for v >= 1: start 2**((bits(v)+1)//2), 10 Newton steps r <- min(r, (r + v//r)//2)
inline i64 isqrt_newton(i64 v) {
  i64 nbits = 0;
  for (int k = 0; k < 63; ++k) nbits += v >= (i64(1) << k);
  i64 root = shl(1, floor_div(nbits + 1, 2));
  for (int s = 0; s < 10; ++s) root = std::min(root, floor_div(root + floor_div(v, root), 2));
  return root;
}

// The same value, fast: for 1 <= v < 2**62 the Newton isqrt is math.isqrt (opset/README.md; tests/opset/
// test_isqrt.py), which is a double square root corrected to the exact floor (r < 2**31: no overflow).
inline i64 isqrt(i64 v) {
  if (v < 1 || v >= (i64(1) << 62)) return isqrt_newton(v);
  i64 r = static_cast<i64>(std::sqrt(static_cast<double>(v)));
  while (r * r > v) --r;
  while ((r + 1) * (r + 1) <= v) ++r;
  return r;
}

// numpy's round_shift of opset/_int.py for any c: floor((t + floor(2**c / 2)) / 2**c) with 2**c = shl(1, c)
// (0 outside [0, 63], so the division gives 0 as numpy's does); round_shift above is the same for 0..62.
inline i64 round_shift_any(i64 t, i64 c) {
  const i64 p = shl(1, c);
  return floor_div(t + floor_div(p, 2), p);
}

// numpy's clip(y, lo, hi) = minimum(maximum(y, lo), hi), also when lo > hi
inline i64 clip_any(i64 y, i64 lo, i64 hi) { return std::min(std::max(y, lo), hi); }

}  // namespace ivit
