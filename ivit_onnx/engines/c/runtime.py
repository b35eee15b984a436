"""The integer primitives every generated ``model.c`` starts with: the arithmetic of ``opset/_int.py`` and
``opset/shift_exp.py`` in C99 on ``int64_t``, with numpy's semantics (wrap-around products and sums, floor
division and floor shifts of negative numbers), so each kernel matches its reference bit for bit.

Wrap-around goes through ``uint64_t`` (defined in C, where signed overflow is not); the floor shift of a
negative number is written as ``~(~x >> c)`` (a right shift of a non-negative value), so nothing depends on
the compiler's choice for signed shifts. No float, no libm, no division by anything but a checked divisor.
"""

RUNTIME = r"""
typedef int64_t ivit_i64;

static inline ivit_i64 ivit_add(ivit_i64 a, ivit_i64 b) { return (ivit_i64)((uint64_t)a + (uint64_t)b); }
static inline ivit_i64 ivit_sub(ivit_i64 a, ivit_i64 b) { return (ivit_i64)((uint64_t)a - (uint64_t)b); }
static inline ivit_i64 ivit_mul(ivit_i64 a, ivit_i64 b) { return (ivit_i64)((uint64_t)a * (uint64_t)b); }

/* floor(a / b); numpy's floor_divide: 0 for b == 0, INT64_MIN // -1 wraps */
static inline ivit_i64 ivit_fdiv(ivit_i64 a, ivit_i64 b) {
  ivit_i64 q, r;
  if (b == 0) return 0;
  if (b == -1) return ivit_sub(0, a);
  q = a / b;
  r = a - q * b;
  if (r != 0 && ((r < 0) != (b < 0))) q -= 1;
  return q;
}

/* floor(x / 2**c) for 0 <= c <= 63 */
static inline ivit_i64 ivit_asr(ivit_i64 x, ivit_i64 c) {
  if (x >= 0) return (ivit_i64)((uint64_t)x >> c);
  return (ivit_i64)(~((~(uint64_t)x) >> c));
}

/* 2**c for 0 <= c <= 62 */
static inline ivit_i64 ivit_pow2(ivit_i64 c) { return (ivit_i64)((uint64_t)1 << c); }

/* a / b truncated toward zero (ONNX's integer Div); 0 for b == 0 */
static inline ivit_i64 ivit_tdiv(ivit_i64 a, ivit_i64 b) {
  ivit_i64 q = ivit_fdiv(a, b);
  return (b != 0 && ivit_sub(a, ivit_mul(q, b)) != 0 && ((a < 0) != (b < 0))) ? q + 1 : q;
}

/* floor((t + floor(2**c / 2)) / 2**c): round half up, the rounding of every rescale */
static inline ivit_i64 ivit_round_shift(ivit_i64 t, ivit_i64 c) {
  return ivit_asr(ivit_add(t, c > 0 ? ivit_pow2(c - 1) : 0), c);
}

static inline ivit_i64 ivit_clip(ivit_i64 y, ivit_i64 lo, ivit_i64 hi) {
  return y < lo ? lo : (y > hi ? hi : y);
}
static inline int ivit_neg(ivit_i64 a) { return a < 0; }
static inline int ivit_lt(ivit_i64 a, ivit_i64 b) { return a < b; }
static inline int ivit_eq(ivit_i64 a, ivit_i64 b) { return a == b; }
static inline ivit_i64 ivit_abs(ivit_i64 a) { return a < 0 ? ivit_sub(0, a) : a; }
static inline ivit_i64 ivit_max(ivit_i64 a, ivit_i64 b) { return a > b ? a : b; }
static inline ivit_i64 ivit_min(ivit_i64 a, ivit_i64 b) { return a < b ? a : b; }

/* ShiftExp (opset/shift_exp.py) of d <= 0 */
static inline ivit_i64 ivit_shift_exp(ivit_i64 d, ivit_i64 x0, ivit_i64 n) {
  ivit_i64 p = ivit_sub(ivit_add(d, ivit_fdiv(d, 2)), ivit_fdiv(d, 16));
  ivit_i64 q, r;
  p = ivit_max(p, ivit_sub(0, ivit_mul(n, x0)));
  q = ivit_fdiv(ivit_sub(0, p), x0);
  r = ivit_sub(ivit_sub(0, p), ivit_mul(q, x0));
  return ivit_mul(ivit_add(x0, ivit_fdiv(ivit_sub(0, r), 2)), ivit_pow2(ivit_sub(n, q)));
}

/* IntDiv (opset/shift_exp.py): floor(e * floor((2**62 - 1) / s) / 2**(62 - bits)) */
static inline ivit_i64 ivit_int_div(ivit_i64 e, ivit_i64 s, ivit_i64 bits) {
  ivit_i64 f = ivit_fdiv((ivit_i64)0x3FFFFFFFFFFFFFFF, s);
  return ivit_asr(ivit_mul(e, f), 62 - bits);
}

/* exact floor(sqrt(v)) for 1 <= v < 2**62: ILayerNorm's fixed-step Newton iteration (opset/ilayernorm.py) */
static inline ivit_i64 ivit_isqrt(ivit_i64 v) {
  ivit_i64 nbits = 0, r;
  int k;
  for (k = 0; k < 63; k++) nbits += v >= ivit_pow2(k);
  r = ivit_pow2(ivit_fdiv(nbits + 1, 2));
  for (k = 0; k < 10; k++) r = ivit_min(r, ivit_fdiv(ivit_add(r, ivit_fdiv(v, r)), 2));
  return r;
}
"""
