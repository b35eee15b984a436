// Native kernels of the private opset ai.ivit: the arithmetic of the numpy reference kernels
// (opset/<op>.py), fused into one pass per op and compiled, so the onnxruntime custom-op library
// runs at native speed. Plain C ABI, no onnxruntime or Python headers; loaded with ctypes by
// opset/native_kernels.py and called by the onnxruntime custom ops of ort_ops.cpp (same shared library). Every
// kernel must equal its reference bit for bit (tests/opset/test_native.py, tests/opset/test_native_ort.py).
//
// Integer semantics mirror numpy's int64: wrap-around (-fwrapv), `>>` is floor, shifts by counts
// outside [0, 63] give 0 (left) or the sign (right), floor division by zero gives 0. Divisions by
// a positive divisor with a small quotient go through double precision and one exact correction
// step (see floor_div_small), which is what makes the fused loops cheap.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "intmath.h"
#include "kernels.h"
#include "parallel.h"
#include "poly_exp.h"

// An explicit AVX2 path for the rescale of Requantize (f the identity; also fused with its table) and IAdd,
// chosen at run time on CPUs with AVX2 but without AVX-512 (there the v4 clones run as before). AVX2 has no
// 64-bit multiply or 64-bit arithmetic shift, which makes the compiler's vectorization of the int64 loops slow;
// with inputs of at most 32 bits and 32-bit multipliers (-2**31 <= b < 2**31) x * b is one exact vpmuldq (two
// for IAdd's wider ones, |m| < 2**62: see mul4), and the floor shift is a logical one on the sign-flipped sum
// (see flip_h). Off with -DIVIT_NO_CLONES, and at run time with IVIT_NO_AVX2=1.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(IVIT_NO_CLONES)
#define IVIT_AVX2_PATH 1
#define IVIT_AVX2 __attribute__((target("avx2")))
#include <immintrin.h>
#else
#define IVIT_AVX2_PATH 0
#endif

namespace {

using namespace ivit;  // i64, u64 and the integer primitives of intmath.h

enum Dtype : int { I8 = 0, U8 = 1, I16 = 2, I32 = 3 };


// Largest exp table (entries); beyond it, or where it would not pay for itself, exps are evaluated directly.
constexpr i64 LUT_MAX = 1 << 18;

template <class T>
const T* as(const void* p) { return static_cast<const T*>(p); }

// Run body(begin, end) over [0, n) in contiguous chunks: on the calling thread's pool hook when one is set
// (onnxruntime's intra-op pool, ivit::ParallelHook; up to MAX_TASKS chunks), else on up to `threads` threads
// started for the call (the caller's thread takes one).
template <class F>
void parallel_for(i64 n, int threads, i64 grain, F body) {
  const ivit::ParallelHook hook = ivit::parallel_hook();
  const i64 cap = hook.run ? ivit::MAX_TASKS : threads;
  int k = static_cast<int>(std::min<i64>(cap, std::max<i64>(1, n / std::max<i64>(grain, 1))));
  if (k <= 1) {
    body(i64(0), n);
    return;
  }
  i64 step = (n + k - 1) / k;
  if (hook.run) {
    struct Task {
      F* body;
      i64 step, n;
    } task{&body, step, n};
    hook.run(hook.ctx, [](void* data, size_t t) {
      const Task& tk = *static_cast<Task*>(data);
      const i64 b = static_cast<i64>(t) * tk.step, e = std::min(tk.n, b + tk.step);
      if (b < e) (*tk.body)(b, e);
    }, static_cast<size_t>(k), &task);
    return;
  }
  std::vector<std::thread> pool;
  for (int t = 1; t < k; ++t) {
    i64 b = t * step, e = std::min(n, b + step);
    if (b < e) pool.emplace_back(body, b, e);
  }
  body(i64(0), std::min(n, step));
  for (auto& th : pool) th.join();
}

// elements below which one thread does it all; onnxruntime's pool gets chunks of about this many, enough of
// them to balance its threads (a row kernel on DeiT-Tiny: 37 chunks, not 9)
constexpr i64 GRAIN = 1 << 13;

// Walk an (outer, nc, inner) tensor in parallel segments: fixed(start, len, ch) for runs of one channel,
// along(start) for a row of nc elements whose channel is the position in the row (inner == 1).
template <class Fixed, class Along>
void channel_segments(i64 outer, i64 nc, i64 inner, int threads, Fixed fixed, Along along) {
  if (nc == 1) {
    parallel_for(outer * inner, threads, GRAIN, [&](i64 lo, i64 hi) { fixed(lo, hi - lo, i64(0)); });
  } else if (inner == 1) {
    parallel_for(outer, threads, std::max<i64>(1, GRAIN / nc), [&](i64 lo, i64 hi) {
      for (i64 r = lo; r < hi; ++r) along(r * nc);
    });
  } else {
    parallel_for(outer * nc, threads, std::max<i64>(1, GRAIN / inner), [&](i64 lo, i64 hi) {
      for (i64 r = lo; r < hi; ++r) fixed(r * inner, inner, r % nc);
    });
  }
}

// Dispatch a generic lambda over the C++ types of two dtype codes.
template <class F>
bool with_types(int ti, int to, F f) {
  auto out = [&](auto in_tag) -> bool {
    using TI = decltype(in_tag);
    switch (to) {
      case I8: f(TI{}, int8_t{}); return true;
      case U8: f(TI{}, uint8_t{}); return true;
      case I16: f(TI{}, int16_t{}); return true;
      case I32: f(TI{}, int32_t{}); return true;
      default: return false;
    }
  };
  switch (ti) {
    case I8: return out(int8_t{});
    case U8: return out(uint8_t{});
    case I16: return out(int16_t{});
    case I32: return out(int32_t{});
    default: return false;
  }
}

// The innermost loops, compiled for several instruction sets and picked at load time by the CPU it runs
// on (GCC's target_clones, x86-64 with glibc): the portable build (-march=x86-64-v2 by default, setup.py)
// still gets AVX2 and AVX-512 (64-bit vector multiplies, variable shifts) where the CPU has them.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) && !defined(IVIT_NO_CLONES)
#define IVIT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define IVIT_CLONES
#endif

// Whether the AVX2 loops run (cached): an x86-64 CPU with AVX2 and without AVX-512F, unless IVIT_NO_AVX2 is
// set to anything but "" or "0".
inline bool avx2_path() {
#if IVIT_AVX2_PATH
  static const bool on = [] {
    __builtin_cpu_init();
    const char* off = std::getenv("IVIT_NO_AVX2");
    return __builtin_cpu_supports("avx2") && !__builtin_cpu_supports("avx512f") &&
           !(off && *off && std::strcmp(off, "0") != 0);
  }();
  return on;
#else
  return false;
#endif
}

// f(v) = v: the rescale f of Requantize, a type of its own so that the AVX2 path can tell it at compile time.
struct Identity {
  i64 operator()(i64 v) const { return v; }
};

// The AVX2 rescale computes clip(((t + h) >> c) + zy, lo, hi) for 0 <= c <= 63 as
// clip(((t + (h ^ 2**63)) >>> c) + (zy - 2**(63 - c)), lo, hi) (>>> logical; + and - wrap around): flipping
// the sign bit adds 2**63 mod 2**64, so the unsigned value shifted is t + h + 2**63 exactly, its floor
// quotient is floor((t + h) / 2**c) + 2**(63 - c) (2**c divides 2**63), and the constant takes it off again.
inline bool fits_i32(i64 m) { return m >= INT32_MIN && m <= INT32_MAX; }
inline i64 flip_h(i64 h) { return static_cast<i64>(static_cast<u64>(h) ^ (u64(1) << 63)); }
inline i64 shifted_zy(i64 zy, i64 c) { return static_cast<i64>(static_cast<u64>(zy) - (u64(1) << (63 - c))); }

// flip_h(h) and shifted_zy(zy, c) at a channel for the AVX2 loops, or nulls: the generic loops
struct Biased {
  const i64* h = nullptr;
  const i64* z = nullptr;
};

// Those of every channel of a Requantize, when its AVX2 loops apply: the CPU (avx2_path), every
// multiplier in int32 and every shift in 0..62.
struct FastRescale {
  std::vector<i64> h, z;
  bool on = false;
  FastRescale(const i64* b, const i64* half, const i64* c, i64 n, i64 zy) {
    if (!avx2_path()) return;
    for (i64 k = 0; k < n; ++k)
      if (!fits_i32(b[k]) || c[k] < 0 || c[k] > 62) return;
    h.resize(n);
    z.resize(n);
    for (i64 k = 0; k < n; ++k) {
      h[k] = flip_h(half[k]);
      z[k] = shifted_zy(zy, c[k]);
    }
    on = true;
  }
  Biased at(i64 ch) const { return on ? Biased{h.data() + ch, z.data() + ch} : Biased{}; }
};

#if IVIT_AVX2_PATH
// 4 elements of an int8..int32 array as int64
template <class T>
IVIT_AVX2 inline __m256i widen4(const T* p) {
  if constexpr (sizeof(T) == 4) {
    return _mm256_cvtepi32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (sizeof(T) == 2) {
    return _mm256_cvtepi16_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  } else {
    int32_t v;
    std::memcpy(&v, p, 4);
    if constexpr (std::is_signed_v<T>)
      return _mm256_cvtepi8_epi64(_mm_cvtsi32_si128(v));
    else
      return _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(v));
  }
}

IVIT_AVX2 inline __m256i load4(const i64* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// clip(y, lo, hi) as Rescale's: lo where y < lo, else hi where y > hi (also when lo > hi)
IVIT_AVX2 inline __m256i clip4(__m256i y, __m256i lo, __m256i hi) {
  const __m256i below = _mm256_cmpgt_epi64(lo, y), above = _mm256_cmpgt_epi64(y, hi);
  return _mm256_blendv_epi8(_mm256_blendv_epi8(y, hi, above), lo, below);
}

// The rescale's parameters: one for all lanes (Uniform) or one per element (PerElement: arrays along x);
// h is flip_h(h) and z shifted_zy(zy, c).
struct Uniform {
  __m256i b, h, z;
  __m128i c;
};
struct PerElement {
  const i64 *b, *h, *c, *z;
};

// ((x * b + h) >>> c) + z of the 4 elements at i (x: int32 lanes, sign-extended; b: int32)
IVIT_AVX2 inline __m256i rescale4(__m256i x, const Uniform& p, i64) {
  return _mm256_add_epi64(_mm256_srl_epi64(_mm256_add_epi64(_mm256_mul_epi32(x, p.b), p.h), p.c), p.z);
}
IVIT_AVX2 inline __m256i rescale4(__m256i x, const PerElement& p, i64 i) {
  const __m256i t = _mm256_add_epi64(_mm256_mul_epi32(x, load4(p.b + i)), load4(p.h + i));
  return _mm256_add_epi64(_mm256_srlv_epi64(t, load4(p.c + i)), load4(p.z + i));
}

// [a0, a1, b0, b1 | a2, a3, b2, b3]: the low halves (int32) of the int64 lanes of a and b
IVIT_AVX2 inline __m256i low32(__m256i a, __m256i b) {
  return _mm256_castps_si256(
      _mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), _MM_SHUFFLE(2, 0, 2, 0)));
}

// y[0..16) = static_cast<TO>(e), w01 = [e0 e1 e4 e5 | e2 e3 e6 e7] and w23 the same of e8..e15 (int32, as
// low32 pairs them), truncating as the scalar cast does
template <class TO>
IVIT_AVX2 inline void store16(TO* y, __m256i w01, __m256i w23) {
  if constexpr (sizeof(TO) == 4) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), _mm256_permute4x64_epi64(w01, _MM_SHUFFLE(3, 1, 2, 0)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + 8), _mm256_permute4x64_epi64(w23, _MM_SHUFFLE(3, 1, 2, 0)));
  } else {
    // the low 8 or 16 bits, zero-extended, so that the unsigned saturating packs keep them as they are
    const __m256i mask = _mm256_set1_epi32(sizeof(TO) == 2 ? 0xFFFF : 0xFF);
    // words e0 e1 e4 e5 e8 e9 e12 e13 | e2 e3 e6 e7 e10 e11 e14 e15
    const __m256i p = _mm256_packus_epi32(_mm256_and_si256(w01, mask), _mm256_and_si256(w23, mask));
    if constexpr (sizeof(TO) == 2) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y),
                          _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    } else {
      const __m256i q = _mm256_packus_epi16(p, p);  // the same order, in bytes, in each half's low 8
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y),
                       _mm_unpacklo_epi16(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
    }
  }
}

// y = clip(rescale4(x), lo, hi) over the first multiple of 16 of len, or with a table (tab: int32,
// tab[k] = static_cast<int32_t>(table[k]); lo <= hi) y = tab[that - lo]; returns how many it did.
template <class TI, class TO, class P>
IVIT_AVX2 i64 rescale_avx2(const TI* __restrict x, TO* __restrict y, i64 len, const P& p, i64 lo, i64 hi,
                           const int32_t* __restrict tab) {
  const __m256i vlo = _mm256_set1_epi64x(lo), vhi = _mm256_set1_epi64x(hi);
  const __m256i tlo = _mm256_set1_epi32(static_cast<int32_t>(lo));  // the indices, in [0, hi - lo], fit int32
  i64 j = 0;
  for (; j + 16 <= len; j += 16) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k) v[k] = clip4(rescale4(widen4(x + j + 4 * k), p, j + 4 * k), vlo, vhi);
    __m256i w01 = low32(v[0], v[1]), w23 = low32(v[2], v[3]);
    if (tab) {
      w01 = _mm256_i32gather_epi32(tab, _mm256_sub_epi32(w01, tlo), 4);
      w23 = _mm256_i32gather_epi32(tab, _mm256_sub_epi32(w23, tlo), 4);
    }
    store16(y + j, w01, w23);
  }
  return j;
}

// rescale_run with f the identity, |b| < 2**31, hf = flip_h(h), zs = shifted_zy(zy, c), 0 <= c <= 63
template <class TI, class TO>
IVIT_AVX2 i64 rescale_run_avx2(const TI* x, TO* y, i64 len, i64 b, i64 hf, i64 c, i64 zs, i64 lo, i64 hi,
                               const int32_t* tab = nullptr) {
  const Uniform p{_mm256_set1_epi64x(b), _mm256_set1_epi64x(hf), _mm256_set1_epi64x(zs), _mm_cvtsi64_si128(c)};
  return rescale_avx2(x, y, len, p, lo, hi, tab);
}

// rescale_row likewise: b, hf, c, zs per element
template <class TI, class TO>
IVIT_AVX2 i64 rescale_row_avx2(const TI* x, TO* y, i64 len, const i64* b, const i64* hf, const i64* c,
                               const i64* zs, i64 lo, i64 hi, const int32_t* tab = nullptr) {
  return rescale_avx2(x, y, len, PerElement{b, hf, c, zs}, lo, hi, tab);
}

// x * m (mod 2**64) of int32 lanes x: one signed 32 x 32-bit multiply where m is an int32 (WIDE false); else,
// for -2**62 <= m < 2**62, x * (m & (2**31 - 1)) + (x * (m >> 31)) * 2**31, both multipliers int32 (and the
// products exact: m = (m >> 31) * 2**31 + (m & (2**31 - 1)) with `>>` floor)
struct Mul {
  __m256i lo, hi;
};
template <bool WIDE>
IVIT_AVX2 inline Mul mul_of(i64 m) {
  if constexpr (WIDE) return Mul{_mm256_set1_epi64x(m & INT32_MAX), _mm256_set1_epi64x(m >> 31)};
  return Mul{_mm256_set1_epi64x(m), _mm256_setzero_si256()};
}
template <bool WIDE>
IVIT_AVX2 inline __m256i mul4(__m256i x, const Mul& m) {
  if constexpr (WIDE)
    return _mm256_add_epi64(_mm256_mul_epi32(x, m.lo), _mm256_slli_epi64(_mm256_mul_epi32(x, m.hi), 31));
  return _mm256_mul_epi32(x, m.lo);
}

// iadd_run with ma, mb as mul_of takes them, hf = flip_h(h - za * ma - zb * mb), zs = shifted_zy(zy, c): the
// same int64 as (a - za) * ma + (b - zb) * mb + h in wrap-around arithmetic
template <bool WIDE, class TA, class TB, class TO>
IVIT_AVX2 i64 iadd_run_avx2(const TA* __restrict a, const TB* __restrict b, TO* __restrict y, i64 len, i64 ma,
                            i64 mb, i64 hf, i64 c, i64 zs, i64 lo, i64 hi) {
  const Mul va = mul_of<WIDE>(ma), vb = mul_of<WIDE>(mb);
  const __m256i vh = _mm256_set1_epi64x(hf), vz = _mm256_set1_epi64x(zs);
  const __m256i vlo = _mm256_set1_epi64x(lo), vhi = _mm256_set1_epi64x(hi);
  const __m128i vc = _mm_cvtsi64_si128(c);
  i64 j = 0;
  for (; j + 16 <= len; j += 16) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k) {
      const i64 i = j + 4 * k;
      const __m256i t = _mm256_add_epi64(mul4<WIDE>(widen4(a + i), va), mul4<WIDE>(widen4(b + i), vb));
      v[k] = clip4(_mm256_add_epi64(_mm256_srl_epi64(_mm256_add_epi64(t, vh), vc), vz), vlo, vhi);
    }
    store16(y + j, low32(v[0], v[1]), low32(v[2], v[3]));
  }
  return j;
}
#endif

// max and min of n integers
template <class T>
IVIT_CLONES void min_max(const T* __restrict x, i64 n, i64& lo, i64& hi) {
  T mn = x[0], mx = x[0];
  for (i64 i = 1; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  lo = mn;
  hi = mx;
}

// Entries of a table over a = 0..span (span: the largest a looked up; past the clamp point every a reads
// the last entry), or 0 for "evaluate directly" (too big, or not paid for by `uses` lookups). E: Exp or PolyExp.
template <class E>
inline i64 table_size(const E& exp, i64 span, i64 uses) {
  const i64 size = std::min(std::max<i64>(span, 0), exp.clamp_point()) + 1;
  return (size <= LUT_MAX && size * 4 <= uses) ? size : 0;
}

// The inner loops take every parameter by value and their arrays __restrict: int8 stores may alias
// anything otherwise, which keeps the compiler from vectorizing.
struct Rescale {  // clip(((t + h) >> c) + zy, lo, hi)
  i64 zy, lo, hi;
  i64 operator()(i64 t, i64 h, i64 c) const { return clip(((t + h) >> c) + zy, lo, hi); }
};

// y = rs(f(x) * b): the one loop of Requantize (f(v) = v - zx) and ShiftGELU (f(v) = v * sg(v)).
template <class TI, class TO, class F>
IVIT_CLONES void rescale_run(const TI* __restrict x, TO* __restrict y, i64 len, F f, i64 b, i64 h, i64 c, Rescale rs) {
  for (i64 j = 0; j < len; ++j) y[j] = static_cast<TO>(rs(f(static_cast<i64>(x[j])) * b, h, c));
}

template <class TI, class TO, class F>
IVIT_CLONES void rescale_row(const TI* __restrict x, TO* __restrict y, i64 len, F f, const i64* __restrict b,
                 const i64* __restrict h, const i64* __restrict c, Rescale rs) {
  for (i64 j = 0; j < len; ++j) y[j] = static_cast<TO>(rs(f(static_cast<i64>(x[j])) * b[j], h[j], c[j]));
}

// rescale_run, through the AVX2 loop where it applies (f the identity, fast.h set): the same values
template <class TI, class TO, class F>
void rescale_span(const TI* x, TO* y, i64 len, F f, i64 b, i64 h, i64 c, Rescale rs, [[maybe_unused]] Biased fast) {
#if IVIT_AVX2_PATH
  if constexpr (std::is_same_v<F, Identity>) {
    if (fast.h) {
      const i64 done = rescale_run_avx2(x, y, len, b, *fast.h, c, *fast.z, rs.lo, rs.hi);
      x += done;
      y += done;
      len -= done;
    }
  }
#endif
  if (len > 0) rescale_run(x, y, len, f, b, h, c, rs);
}

// rescale_row likewise (fast.h, fast.z: per element, as b, h and c)
template <class TI, class TO, class F>
void rescale_row_span(const TI* x, TO* y, i64 len, F f, const i64* b, const i64* h, const i64* c, Rescale rs,
                      [[maybe_unused]] Biased fast) {
  i64 done = 0;
#if IVIT_AVX2_PATH
  if constexpr (std::is_same_v<F, Identity>) {
    if (fast.h) done = rescale_row_avx2(x, y, len, b, fast.h, c, fast.z, rs.lo, rs.hi);
  }
#endif
  if (done < len) rescale_row(x + done, y + done, len - done, f, b + done, h + done, c + done, rs);
}

// y = tab[v - lo] for the rescaled values v of rescale_run (ch_step 0: one channel, b/h/c point at it) or
// rescale_row (ch_step 1), a block at a time: the rescale vectorizes, the table lookups do not. With fast.h
// and `wide` (the table as int32, wide[k] = tab[k]; lo <= hi), the AVX2 loop does both, the lookups as gathers.
template <class TI, class TO, class TT, class F>
void rescale_lookup(const TI* x, TO* __restrict y, i64 len, F f, const i64* b, const i64* h, const i64* c,
                    int ch_step, Rescale rs, const TT* __restrict tab, Biased fast = {},
                    [[maybe_unused]] const int32_t* wide = nullptr) {
#if IVIT_AVX2_PATH
  if constexpr (std::is_same_v<F, Identity> && sizeof(TO) <= 4) {
    if (fast.h && wide) {
      const i64 done = ch_step ? rescale_row_avx2(x, y, len, b, fast.h, c, fast.z, rs.lo, rs.hi, wide)
                               : rescale_run_avx2(x, y, len, *b, *fast.h, *c, *fast.z, rs.lo, rs.hi, wide);
      x += done;
      y += done;
      len -= done;
      if (ch_step) {
        b += done;
        h += done;
        c += done;
        fast = Biased{fast.h + done, fast.z + done};
      }
    }
  }
#endif
  constexpr i64 BLOCK = 512;
  int32_t v[BLOCK];  // in [lo, hi], inside the int8..int32 type of the Requantize output
  for (i64 k = 0; k < len; k += BLOCK) {
    const i64 m = std::min(BLOCK, len - k);
    if (ch_step)
      rescale_row_span(x + k, v, m, f, b + k, h + k, c + k, rs,
                       fast.h ? Biased{fast.h + k, fast.z + k} : Biased{});
    else
      rescale_span(x + k, v, m, f, *b, *h, *c, rs, fast);
    for (i64 j = 0; j < m; ++j) y[k + j] = static_cast<TO>(tab[v[j] - rs.lo]);
  }
}

template <class TA, class TB, class TO>
IVIT_CLONES void iadd_run(const TA* __restrict a, const TB* __restrict b, TO* __restrict y, i64 len, i64 za, i64 zb,
              i64 ma, i64 mb, i64 h, i64 c, Rescale rs) {
  for (i64 j = 0; j < len; ++j)
    y[j] = static_cast<TO>(rs((static_cast<i64>(a[j]) - za) * ma + (static_cast<i64>(b[j]) - zb) * mb, h, c));
}

// The AVX2 loop of an IAdd: where it applies (the CPU, -2**62 <= ma, mb < 2**62, 0 <= c <= 62), whether it
// needs the wide multiplies, and its flip_h(h - za * ma - zb * mb), shifted_zy(zy, c).
struct FastIAdd {
  bool on = false, wide = false;
  i64 h = 0, z = 0;
  FastIAdd(i64 za, i64 zb, i64 ma, i64 mb, i64 h_, i64 c, i64 zy) {
    auto ok = [](i64 m) { return m >= -(i64(1) << 62) && m < (i64(1) << 62); };
    if (!avx2_path() || !ok(ma) || !ok(mb) || c < 0 || c > 62) return;
    on = true;
    wide = !fits_i32(ma) || !fits_i32(mb);
    h = flip_h(h_ - za * ma - zb * mb);
    z = shifted_zy(zy, c);
  }
};

// iadd_run, through the AVX2 loop where it applies
template <class TA, class TB, class TO>
void iadd_span(const TA* a, const TB* b, TO* y, i64 len, i64 za, i64 zb, i64 ma, i64 mb, i64 h, i64 c, Rescale rs,
               [[maybe_unused]] const FastIAdd& fast) {
  i64 done = 0;
#if IVIT_AVX2_PATH
  if (fast.on)
    done = fast.wide ? iadd_run_avx2<true>(a, b, y, len, ma, mb, fast.h, c, fast.z, rs.lo, rs.hi)
                     : iadd_run_avx2<false>(a, b, y, len, ma, mb, fast.h, c, fast.z, rs.lo, rs.hi);
#endif
  if (done < len) iadd_run(a + done, b + done, y + done, len - done, za, zb, ma, mb, h, c, rs);
}

// QuantizeLinear as onnxruntime's (MLAS): x / scale in float, clipped to [lo, hi] = [qmin - zp, qmax - zp] with a
// NaN taking lo, rounded half to even (the default rounding mode), plus zp, as the output's byte. Division and
// rounding are IEEE operations: every clone, and every CPU, gives the same bytes.
IVIT_CLONES void quantize_run(const float* __restrict x, uint8_t* __restrict q, i64 n, float scale, float lo,
                              float hi, int zp) {
  for (i64 k = 0; k < n; ++k) {
    float v = x[k] / scale;
    v = v >= lo ? v : lo;
    v = v <= hi ? v : hi;
    q[k] = static_cast<uint8_t>(static_cast<int>(std::nearbyint(v)) + zp);
  }
}

// e = exp_of(max - x) over a row, and its sum
template <class TI, class F>
IVIT_CLONES i64 softmax_exps(const TI* __restrict x, i64* __restrict e, i64 len, i64 mx, F exp_of) {
  i64 sum = 0;
  for (i64 j = 0; j < len; ++j) {
    e[j] = exp_of(mx - x[j]);
    sum += e[j];
  }
  return sum;
}

// e = row[k] over a row of indices, and its sum
inline i64 gather_sum(const int32_t* __restrict k, i64* __restrict e, i64 len, const i64* __restrict row) {
  i64 sum = 0;
  for (i64 j = 0; j < len; ++j) {
    e[j] = row[k[j]];
    sum += e[j];
  }
  return sum;
}

template <class TO>
IVIT_CLONES void softmax_out(const i64* __restrict e, TO* __restrict y, i64 len, i64 f, i64 sh, i64 zy) {
  for (i64 j = 0; j < len; ++j) y[j] = static_cast<TO>(((e[j] * f) >> sh) + zy);
}

// softmax_out's values less zy, (e * f) >> sh: in 0..2**bits (e <= sum(e), so e * f <= RECIP_M)
IVIT_CLONES void softmax_index(const i64* __restrict e, int32_t* __restrict k, i64 len, i64 f, i64 sh) {
  for (i64 j = 0; j < len; ++j) k[j] = static_cast<int32_t>((e[j] * f) >> sh);
}

// softmax_out through a table over its values, y = post[(e * f) >> sh] (post: 2**bits + 1 entries of TO), for
// the elementwise ops after the Shiftmax tabulated by chain_fold (post null: softmax_out itself). The indices
// come from a vector loop, then one load each from a table of the output's type (64 KiB at most for bytes).
template <class TO>
void softmax_post(const i64* __restrict e, TO* __restrict y, i64 len, i64 f, i64 sh, i64 zy, const void* post) {
  if (!post) return softmax_out(e, y, len, f, sh, zy);
  thread_local std::vector<int32_t> k;
  k.resize(len);
  softmax_index(e, k.data(), len, f, sh);
  const TO* __restrict table = static_cast<const TO*>(post);
  for (i64 j = 0; j < len; ++j) y[j] = table[k[j]];
}

// d = x * scale - mean over a row, and the sum of norm(d): d * d (ILayerNorm) or |d| (L1LayerNorm)
template <class TI, class Norm>
IVIT_CLONES i64 centre(const TI* __restrict x, i64* __restrict d, i64 len, i64 scale, i64 mean, Norm norm) {
  i64 v = 0;
  for (i64 j = 0; j < len; ++j) {
    d[j] = static_cast<i64>(x[j]) * scale - mean;
    v += norm(d[j]);
  }
  return v;
}

struct Square {
  i64 operator()(i64 d) const { return d * d; }
};
struct Abs {
  i64 operator()(i64 d) const { return d < 0 ? -d : d; }
};

template <class TO>
IVIT_CLONES void layernorm_out(const i64* __restrict d, TO* __restrict y, i64 len, i64 f, i64 ush, const i64* __restrict b,
                   const i64* __restrict bias, const i64* __restrict h, const i64* __restrict c, Rescale rs) {
  for (i64 j = 0; j < len; ++j) y[j] = static_cast<TO>(rs(((d[j] * f) >> ush) * b[j] + bias[j], h[j], c[j]));
}

std::vector<i64> halves(const i64* c, i64 n) {
  std::vector<i64> h(n);
  for (i64 k = 0; k < n; ++k) h[k] = (i64(1) << c[k]) >> 1;
  return h;
}

// y = clip(round_shift(f(x) * b[ch] + offset[ch], c[ch]) + zy, qmin, qmax) over an (outer, nc, inner)
// tensor, 0 <= c <= 62 (offset may be null: 0). setup(xs, total, run) picks f for the input (it may scan xs
// first) and calls run(f). With a table (of qmax - qmin + 1 entries of the output type `to`), y is
// table[that - qmin] instead.
template <class Setup>
int rescale_each(const void* x, int ti, i64 outer, i64 nc, i64 inner, const i64* b, const i64* c, i64 zy,
                 i64 qmin, i64 qmax, void* y, int to, int threads, Setup setup, const i64* offset = nullptr,
                 const void* table = nullptr) {
  std::vector<i64> half = halves(c, nc);
  for (i64 k = 0; offset && k < nc; ++k) half[k] += offset[k];
  const i64* h = half.data();
  const Rescale rs{zy, qmin, qmax};
  const FastRescale fast(b, h, c, nc, zy);  // used where f is the identity
  return with_types(ti, to, [&](auto ti_, auto to_) {
    using TI = decltype(ti_);
    using TO = decltype(to_);
    const TI* xs = as<TI>(x);
    TO* ys = static_cast<TO*>(y);
    const TO* tab = as<TO>(table);
    // the table as int32 for the AVX2 lookups (gathers), where it pays for its copy
    const i64 total = outer * nc * inner, entries = qmax - qmin + 1;
    std::vector<int32_t> copy;
    const int32_t* wide = nullptr;
    if (tab && fast.on && qmin <= qmax && entries <= INT32_MAX) {  // gather indices are int32
      if constexpr (std::is_same_v<TO, int32_t>) {
        wide = tab;
      } else if (entries <= std::max<i64>(total / 4, 4096)) {
        copy.assign(tab, tab + entries);
        wide = copy.data();
      }
    }
    setup(xs, total, [&](auto f) {
      channel_segments(
          outer, nc, inner, threads,
          [&](i64 i, i64 len, i64 ch) {
            if (tab)
              rescale_lookup(xs + i, ys + i, len, f, b + ch, h + ch, c + ch, 0, rs, tab, fast.at(ch), wide);
            else
              rescale_span(xs + i, ys + i, len, f, b[ch], h[ch], c[ch], rs, fast.at(ch));
          },
          [&](i64 i) {
            if (tab)
              rescale_lookup(xs + i, ys + i, nc, f, b, h, c, 1, rs, tab, fast.at(0), wide);
            else
              rescale_row_span(xs + i, ys + i, nc, f, b, h, c, rs, fast.at(0));
          });
    });
  }) ? 0 : 1;
}

// Shiftmax over rows of `len`: load(r, buf) points at row r's values (any integer type; it may fill buf,
// `len` int64s, and point there); every x - max(row) lies in [-span, 0].
template <class TO, class Load>
void shiftmax_rows(i64 rows, i64 len, i64 span, i64 x0, i64 n, i64 bits, i64 zy, TO* y, int threads, Load load,
                   const void* post = nullptr) {
  const Exp exp(x0, n);
  const i64 sh = 62 - bits;
  // exps from a table where one pays for itself, else directly (branch-free where exact: it vectorizes)
  const i64 size = table_size(exp, span, rows * len);
  std::vector<i64> table(size);
  for (i64 a = 0; a < size; ++a) table[a] = exp(-a);
  const i64* lut = table.data();
  parallel_for(rows, threads, std::max<i64>(1, GRAIN / len), [&](i64 r0, i64 r1) {
    std::vector<i64> e(len), buf(len);
    for (i64 r = r0; r < r1; ++r) {
      const auto* xr = load(r, buf.data());
      i64 mx = xr[0];
      for (i64 j = 1; j < len; ++j) mx = std::max<i64>(mx, xr[j]);
      i64 sum;
      if (size)
        sum = softmax_exps(xr, e.data(), len, mx, [lut, size](i64 a) { return lut[std::min<i64>(a, size - 1)]; });
      else if (exp.small)
        sum = softmax_exps(xr, e.data(), len, mx, [exp](i64 a) { return exp.fast(a); });
      else
        sum = softmax_exps(xr, e.data(), len, mx, [&exp](i64 a) { return exp(-a); });
      softmax_post(e.data(), y + r * len, len, floor_div(RECIP_M, sum), sh, zy, post);
    }
  });
}

// ---- Row kernels' fast paths (ILayerNorm, IL2Norm, RequantizeShiftmax): the same bits as the generic loops
// above (centre + layernorm_out; rescale_span + min_max + softmax_out), fewer passes and explicit vector loops.
//
// Everywhere (portable C++, vectorized by the compiler per target clone): a squared norm's sum comes from one
// pass of sums, sum((x*s - m)**2) = s*s*Sxx - 2*s*m*Sx + len*m*m, a polynomial identity that holds in int64's
// wrap-around arithmetic (Z/2**64) as well, so it equals centre's value for every input; the output reads x
// again instead of a stored d. RequantizeShiftmax's rescale to table indices keeps the row's max in the same
// pass.
// x86-64 with AVX2 but without AVX-512F (as avx2_path: for the rescales, the v4 clones of the portable loops,
// with vpmullq and vpsraq, are as fast as explicit AVX-512 loops, measured on Zen 4; its gathers are slower
// than scalar loads) and aarch64 (NEON): explicit loops, under preconditions that keep every lane exact (each
// proof at its loop); ILayerNorm's 8-bit rows on AVX-512 CPUs: an explicit AVX-512 loop too (its sums and a
// block of rows' divisions first: 1.6x the v4 clone on Zen 4); elsewhere, and in the tails, the portable
// loops. Switches, read once: IVIT_GENERIC_ROWS=1 runs the generic loops instead, IVIT_NO_AVX2=1 the portable
// ones on x86, IVIT_ROWS_AVX2=1 the AVX2 loops on AVX-512 CPUs too (the tests compare the bytes of each).
#if defined(__aarch64__) && defined(__ARM_NEON) && !defined(IVIT_NO_CLONES)
#define IVIT_NEON_PATH 1
#include <arm_neon.h>
#else
#define IVIT_NEON_PATH 0
#endif

inline bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

// Whether the row kernels' fast paths run at all (cached)
inline bool rows_fast() {
  static const bool on = !env_on("IVIT_GENERIC_ROWS");
  return on;
}

// Whether ILayerNorm's AVX-512 output loop runs (cached): rows_fast(), an x86-64 CPU with AVX-512 F, BW, DQ and
// VL, and neither IVIT_NO_AVX2 (the portable loops) nor IVIT_ROWS_AVX2 (the AVX2 loops) set.
inline bool rows_avx512() {
#if IVIT_AVX2_PATH
  static const bool on = [] {
    __builtin_cpu_init();
    return rows_fast() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && !env_on("IVIT_NO_AVX2") &&
           !env_on("IVIT_ROWS_AVX2");
  }();
  return on;
#else
  return false;
#endif
}

// Whether their explicit vector loops run (cached): rows_fast(), and on x86-64 a CPU with AVX2 and without
// AVX-512F (or IVIT_ROWS_AVX2 set), unless IVIT_NO_AVX2 is set; every aarch64 CPU (NEON).
inline bool rows_vector() {
#if IVIT_AVX2_PATH
  static const bool on = [] {
    __builtin_cpu_init();
    return rows_fast() && __builtin_cpu_supports("avx2") && !env_on("IVIT_NO_AVX2") &&
           (!__builtin_cpu_supports("avx512f") || env_on("IVIT_ROWS_AVX2"));
  }();
  return on;
#elif IVIT_NEON_PATH
  return rows_fast();
#else
  return false;
#endif
}

// Sx = sum(x), Sxx = sum(x*x) over a row, exact (int64's wrap-around for 32-bit inputs: a ring, as above). 8-bit
// inputs with len <= 2**15 add in int32 lanes: |x| <= 255, x*x < 2**16, so |Sx| < 2**23 and Sxx < 2**31.
template <class TI>
IVIT_CLONES void row_sums(const TI* __restrict x, i64 len, i64& sx, i64& sxx) {
  if (sizeof(TI) == 1 && len <= (i64(1) << 15)) {
    int32_t s = 0, q = 0;
    for (i64 j = 0; j < len; ++j) {
      const int32_t v = x[j];
      s += v;
      q += v * v;
    }
    sx = s;
    sxx = q;
    return;
  }
  i64 s = 0, q = 0;
  for (i64 j = 0; j < len; ++j) {
    const i64 v = x[j];
    s += v;
    q += v * v;
  }
  sx = s;
  sxx = q;
}

// centre's sum of d*d, d = x * s - m, from the row's sums: the identity above, in unsigned (wrap-around) int64
inline i64 sum_squares(i64 sx, i64 sxx, i64 len, i64 s, i64 m) {
  const u64 us = static_cast<u64>(s), um = static_cast<u64>(m);
  return static_cast<i64>(us * us * static_cast<u64>(sxx) - 2 * us * um * static_cast<u64>(sx) +
                          static_cast<u64>(len) * um * um);
}

// layernorm_out with d = x * 2**shift_in - mean computed again from x (the same int64: x * shl(1, s) wraps as
// x << s for 0 <= s <= 63), hb = h + bias (the rescale's sum in another order: the same in a ring); UNIFORM: b[0]
// and c[0] for every element
template <bool UNIFORM, class TI, class TO>
IVIT_CLONES void layernorm_out_x(const TI* __restrict x, TO* __restrict y, i64 len, i64 shift_in, i64 mean, i64 f,
                                 i64 ush, const i64* __restrict b, const i64* __restrict hb,
                                 const i64* __restrict c, Rescale rs) {
  const i64 b0 = b[0], c0 = c[0];
  for (i64 j = 0; j < len; ++j) {
    const i64 d = static_cast<i64>(static_cast<u64>(static_cast<i64>(x[j])) << shift_in) - mean;
    const i64 u = (d * f) >> ush;
    y[j] = static_cast<TO>(UNIFORM ? rs(u * b0, hb[j], c0) : rs(u * b[j], hb[j], c[j]));
  }
}

// ILayerNorm's output loop on the vector paths, for 8-bit x and parameters with
//   0 <= shift_in <= 22, len * (255 * 2**shift_in)**2 < 2**61 (in double: a margin), 31 <= ush = 61 - p <= 63,
//   every b[j] an int32, every c[j] in 0..62.
// Proof that the lanes are exact: m = floor(Sx * s / len) lies between min(x) * s and max(x) * s, so
// |d| <= 255 * s < 2**31 (d fits an int32 lane) and every d*d, their sum v < 2**62 (v is the true sum, no wrap,
// and d*d <= v). So |d| <= isqrt(v) = root < 2**31, and with f = floor(2**61 / root) (1 <= f <= 2**61):
// |d * f| <= root * f <= 2**61, computed exactly as two 32 x 32-bit products (Mul, WIDE); u = floor(d*f / 2**ush)
// is in [-2**p, 2**p], 2**p <= 2**30: an int32, so u * b[j] is one exact 32 x 32-bit product. The floor shifts are
// logical ones on sign-flipped values (flip_h, shifted_zy). hb[j] = h[j] + bias[j] (the rescale's sum in
// wrap-around order does not matter: a ring), z[j] = shifted_zy(zy, c[j]).
struct LnVector {
  bool on = false;
  std::vector<i64> hb, hf, z, negc;
  LnVector(int ti, i64 len, i64 shift_in, i64 p, const std::vector<i64>& b, const std::vector<i64>& c,
           const std::vector<i64>& half, const std::vector<i64>& bias, i64 zy) {
    if (!(rows_vector() || rows_avx512()) || (ti != I8 && ti != U8) || shift_in < 0 || shift_in > 22 || p > 30 ||
        p < -2)
      return;
    const i64 dmax = i64(255) << shift_in;  // < 2**30
    if (static_cast<double>(len) * static_cast<double>(dmax) * static_cast<double>(dmax) >= 0x1p61) return;
    for (i64 j = 0; j < len; ++j)
      if (!fits_i32(b[j]) || c[j] < 0 || c[j] > 62) return;
    hb.resize(len);
    hf.resize(len);
    z.resize(len);
    negc.resize(len);
    for (i64 j = 0; j < len; ++j) {
      hb[j] = half[j] + bias[j];
      hf[j] = flip_h(hb[j]);
      z[j] = shifted_zy(zy, c[j]);
      negc[j] = -c[j];
    }
    on = true;
  }
};

// y = clip(rs(x * b + h)) into table indices with the row's largest: the rescale_span + min_max of
// RequantizeShiftmax in one pass (portable)
template <class TI>
IVIT_CLONES i64 index_max(const TI* __restrict x, int32_t* __restrict k, i64 len, i64 b, i64 h, i64 c, Rescale rs,
                          i64 km) {
  for (i64 j = 0; j < len; ++j) {
    const i64 v = rs(static_cast<i64>(x[j]) * b, h, c);
    k[j] = static_cast<int32_t>(v);
    km = std::max(km, v);
  }
  return km;
}

// Its vector path: the rescale of a RequantizeShiftmax with an int32 multiplier b and 0 <= c <= 62 into indices
// 0..nq-1, nq <= 1024 (hf = flip_h(h), zs = shifted_zy(index zy, c)): x (at most 32 bits) * b is one exact
// 32 x 32-bit product, the floor shift a logical one on the flipped sum, as in rescale_avx2.
struct IndexVector {
  bool on = false;
  i64 hf = 0, zs = 0;
  IndexVector(i64 b, i64 h, i64 c, i64 zy) {
    if (!rows_vector() || !fits_i32(b) || c < 0 || c > 62) return;
    hf = flip_h(h);
    zs = shifted_zy(zy, c);
    on = true;
  }
};

#if IVIT_AVX2_PATH
// layernorm_out_x under LnVector's preconditions (its proof), 16 at a time; returns how many it did
template <class TI, class TO>
IVIT_AVX2 i64 layernorm_out_avx2(const TI* __restrict x, TO* __restrict y, i64 len, i64 shift_in, i64 mean, i64 f,
                                 i64 ush, const i64* b, const i64* c, const LnVector& v, i64 lo, i64 hi) {
  const __m256i vmean = _mm256_set1_epi64x(mean), flip = _mm256_set1_epi64x(INT64_MIN);
  const __m256i back = _mm256_set1_epi64x(shifted_zy(0, ush));  // (t ^ 2**63) >>> ush, + this: t >> ush
  const __m128i vs = _mm_cvtsi64_si128(shift_in), vu = _mm_cvtsi64_si128(ush);
  const Mul vf = mul_of<true>(f);
  const PerElement p{b, v.hf.data(), c, v.z.data()};
  const __m256i vlo = _mm256_set1_epi64x(lo), vhi = _mm256_set1_epi64x(hi);
  i64 j = 0;
  for (; j + 16 <= len; j += 16) {
    __m256i r[4];
    for (int k = 0; k < 4; ++k) {
      const i64 i = j + 4 * k;
      const __m256i d = _mm256_sub_epi64(_mm256_sll_epi64(widen4(x + i), vs), vmean);
      const __m256i t = mul4<true>(d, vf);
      const __m256i u = _mm256_add_epi64(_mm256_srl_epi64(_mm256_xor_si256(t, flip), vu), back);
      r[k] = clip4(rescale4(u, p, i), vlo, vhi);
    }
    store16(y + j, low32(r[0], r[1]), low32(r[2], r[3]));
  }
  return j;
}

#define IVIT_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

// layernorm_out_x under LnVector's preconditions (its proof) and TO's range holding [lo, hi] (lo <= hi), in int64
// lanes: t = x * (f << shift_in) - mean * f is d * f in Z/2**64 (a ring identity: the scalar loop's value),
// u = t >> ush (vpsraq), u * b[j] one exact vpmuldq (u and b int32 by the proof), the rescale's floor shift
// vpsraq/vpsravq, the clip vpmaxsq/vpminsq (lo <= hi: clip's value). 32 at a time, narrowed by a permute and
// saturating packs, which change nothing in TO's range; then 8 at a time, by a truncating vpmovq*.
template <bool UNIFORM, class TI, class TO>
IVIT_AVX512 i64 layernorm_out_avx512(const TI* __restrict x, TO* __restrict y, i64 len, i64 shift_in, i64 mean,
                                     i64 f, i64 ush, const i64* b, const i64* hb, const i64* c, i64 zy, i64 lo,
                                     i64 hi) {
  const __m512i vf = _mm512_set1_epi64(static_cast<i64>(static_cast<u64>(f) << shift_in));
  const __m512i vm = _mm512_set1_epi64(static_cast<i64>(static_cast<u64>(mean) * static_cast<u64>(f)));
  const __m512i vb = _mm512_set1_epi64(b[0]), vz = _mm512_set1_epi64(zy);
  const __m512i vlo = _mm512_set1_epi64(lo), vhi = _mm512_set1_epi64(hi);
  const __m128i vu = _mm_cvtsi64_si128(ush), vc = _mm_cvtsi64_si128(c[0]);
  struct Eight {
    const TI* x;
    const i64 *b, *hb, *c;
    __m512i vf, vm, vb, vz, vlo, vhi;
    __m128i vu, vc;
    IVIT_AVX512 __m512i operator()(i64 i) const {
      const __m128i x8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x + i));
      const __m512i xv = std::is_signed_v<TI> ? _mm512_cvtepi8_epi64(x8) : _mm512_cvtepu8_epi64(x8);
      const __m512i u = _mm512_sra_epi64(_mm512_sub_epi64(_mm512_mullo_epi64(xv, vf), vm), vu);
      __m512i w;
      if constexpr (UNIFORM) {
        w = _mm512_sra_epi64(_mm512_add_epi64(_mm512_mul_epi32(u, vb), _mm512_loadu_si512(hb + i)), vc);
      } else {
        w = _mm512_add_epi64(_mm512_mul_epi32(u, _mm512_loadu_si512(b + i)), _mm512_loadu_si512(hb + i));
        w = _mm512_srav_epi64(w, _mm512_loadu_si512(c + i));
      }
      return _mm512_min_epi64(_mm512_max_epi64(_mm512_add_epi64(w, vz), vlo), vhi);
    }
  };
  const Eight eight{x, b, hb, c, vf, vm, vb, vz, vlo, vhi, vu, vc};
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i qorder = _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0);
  const __m512i dorder = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  i64 j = 0;
  for (; j + 32 <= len; j += 32) {
    const __m512i d01 = _mm512_permutex2var_epi32(eight(j), even, eight(j + 8));
    const __m512i d23 = _mm512_permutex2var_epi32(eight(j + 16), even, eight(j + 24));
    if constexpr (sizeof(TO) == 4) {
      _mm512_storeu_si512(y + j, d01);
      _mm512_storeu_si512(y + j + 16, d23);
    } else {
      const __m512i h = _mm512_packs_epi32(d01, d23);  // per 128-bit lane: 4 of d01, then 4 of d23
      if constexpr (sizeof(TO) == 2) {
        _mm512_storeu_si512(y + j, _mm512_permutexvar_epi64(qorder, h));
      } else {
        const __m512i b8 = std::is_signed_v<TO> ? _mm512_packs_epi16(h, h) : _mm512_packus_epi16(h, h);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + j),
                            _mm512_castsi512_si256(_mm512_permutexvar_epi32(dorder, b8)));
      }
    }
  }
  for (; j + 8 <= len; j += 8) {
    const __m512i w = eight(j);
    if constexpr (sizeof(TO) == 1)
      _mm_storel_epi64(reinterpret_cast<__m128i*>(y + j), _mm512_cvtepi64_epi8(w));
    else if constexpr (sizeof(TO) == 2)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + j), _mm512_cvtepi64_epi16(w));
    else
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + j), _mm512_cvtepi64_epi32(w));
  }
  return j;
}

// row_sums of an 8-bit row, 32 at a time: x widened to int16, x*x and x*1 summed in pairs by vpmaddwd into
// int32 lanes (exact under row_sums' bound, len <= 2**15: |Sx| < 2**23, Sxx < 2**31), the tail scalar
template <class TI>
IVIT_AVX512 void row_sums_avx512(const TI* __restrict x, i64 len, i64& sx, i64& sxx) {
  const __m512i ones = _mm512_set1_epi16(1);
  __m512i s = _mm512_setzero_si512(), q = _mm512_setzero_si512();
  i64 j = 0;
  for (; j + 32 <= len; j += 32) {
    const __m256i x8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
    const __m512i w = std::is_signed_v<TI> ? _mm512_cvtepi8_epi16(x8) : _mm512_cvtepu8_epi16(x8);
    s = _mm512_add_epi32(s, _mm512_madd_epi16(w, ones));
    q = _mm512_add_epi32(q, _mm512_madd_epi16(w, w));
  }
  int32_t a = _mm512_reduce_add_epi32(s), b = _mm512_reduce_add_epi32(q);
  for (; j < len; ++j) {
    const int32_t v = x[j];
    a += v;
    b += v * v;
  }
  sx = a;
  sxx = b;
}

// index_max under IndexVector's preconditions, 16 at a time: the indices, and the largest into km
template <class TI>
IVIT_AVX2 i64 index_max_avx2(const TI* __restrict x, int32_t* __restrict k, i64 len, i64 b, i64 c,
                             const IndexVector& v, i64 hi, i64& km) {
  const Uniform p{_mm256_set1_epi64x(b), _mm256_set1_epi64x(v.hf), _mm256_set1_epi64x(v.zs), _mm_cvtsi64_si128(c)};
  const __m256i vlo = _mm256_setzero_si256(), vhi = _mm256_set1_epi64x(hi);
  __m256i mx = _mm256_set1_epi32(static_cast<int32_t>(km));
  i64 j = 0;
  for (; j + 16 <= len; j += 16) {
    __m256i r[4];
    for (int q = 0; q < 4; ++q) r[q] = clip4(rescale4(widen4(x + j + 4 * q), p, 0), vlo, vhi);
    const __m256i w01 = low32(r[0], r[1]), w23 = low32(r[2], r[3]);
    mx = _mm256_max_epi32(mx, _mm256_max_epi32(w01, w23));
    store16(k + j, w01, w23);
  }
  __m128i m = _mm_max_epi32(_mm256_castsi256_si128(mx), _mm256_extracti128_si256(mx, 1));
  m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
  km = _mm_cvtsi128_si32(m);
  return j;
}

// e * f mod 2**64 of int64 lanes e, f given by its unsigned 32-bit halves fl, fh (HI: fh may be non-zero):
// e = eh * 2**32 + el, so e * f = el * fl + ((eh * fl + el * fh) << 32) mod 2**64, each product 32 x 32 -> 64-bit
// unsigned, exact
template <bool HI>
IVIT_AVX2 inline __m256i mul64(__m256i e, __m256i fl, __m256i fh) {
  __m256i cross = _mm256_mul_epu32(_mm256_srli_epi64(e, 32), fl);
  if constexpr (HI) cross = _mm256_add_epi64(cross, _mm256_mul_epu32(e, fh));
  return _mm256_add_epi64(_mm256_mul_epu32(e, fl), _mm256_slli_epi64(cross, 32));
}

// softmax_out, 16 at a time, for any e, f and 0 <= sh <= 63: the product mod 2**64 as mul64, the floor shift a
// logical one on the flipped product (zs = shifted_zy(zy, sh)), the cast a truncation (store16)
template <bool HI, class TO>
IVIT_AVX2 i64 softmax_out_avx2(const i64* __restrict e, TO* __restrict y, i64 len, i64 f, i64 sh, i64 zs) {
  const __m256i fl = _mm256_set1_epi64x(f & 0xFFFFFFFF);
  const __m256i fh = _mm256_set1_epi64x(static_cast<i64>(static_cast<u64>(f) >> 32));
  const __m256i flip = _mm256_set1_epi64x(INT64_MIN), vz = _mm256_set1_epi64x(zs);
  const __m128i vsh = _mm_cvtsi64_si128(sh);
  i64 j = 0;
  for (; j + 16 <= len; j += 16) {
    __m256i r[4];
    for (int k = 0; k < 4; ++k) {
      const __m256i t = mul64<HI>(load4(e + j + 4 * k), fl, fh);
      r[k] = _mm256_add_epi64(_mm256_srl_epi64(_mm256_xor_si256(t, flip), vsh), vz);
    }
    store16(y + j, low32(r[0], r[1]), low32(r[2], r[3]));
  }
  return j;
}
#endif

#if IVIT_NEON_PATH
// clip(v, lo, hi) as Rescale's: lo where v < lo, else hi where v > hi
inline int64x2_t clip2(int64x2_t v, int64x2_t lo, int64x2_t hi) {
  const uint64x2_t below = vcgtq_s64(lo, v), above = vcgtq_s64(v, hi);
  return vbslq_s64(below, lo, vbslq_s64(above, hi, v));
}

// 8 elements of an int8..int32 array as int32 lanes
template <class T>
inline void widen8(const T* p, int32x4_t& a, int32x4_t& b) {
  if constexpr (sizeof(T) == 4) {
    a = vld1q_s32(reinterpret_cast<const int32_t*>(p));
    b = vld1q_s32(reinterpret_cast<const int32_t*>(p) + 4);
  } else {
    int16x8_t w;
    if constexpr (sizeof(T) == 2)
      w = vld1q_s16(reinterpret_cast<const int16_t*>(p));
    else if constexpr (std::is_signed_v<T>)
      w = vmovl_s8(vld1_s8(reinterpret_cast<const int8_t*>(p)));
    else
      w = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(reinterpret_cast<const uint8_t*>(p))));
    a = vmovl_s16(vget_low_s16(w));
    b = vmovl_s16(vget_high_s16(w));
  }
}

// y[0..8) = static_cast<TO>(v), v in four int64x2 in order: truncating narrows, as the scalar cast
template <class TO>
inline void store8(TO* y, const int64x2_t v[4]) {
  const int32x4_t lo = vcombine_s32(vmovn_s64(v[0]), vmovn_s64(v[1]));
  const int32x4_t hi = vcombine_s32(vmovn_s64(v[2]), vmovn_s64(v[3]));
  if constexpr (sizeof(TO) == 4) {
    vst1q_s32(reinterpret_cast<int32_t*>(y), lo);
    vst1q_s32(reinterpret_cast<int32_t*>(y) + 4, hi);
  } else {
    const int16x8_t w = vcombine_s16(vmovn_s32(lo), vmovn_s32(hi));
    if constexpr (sizeof(TO) == 2)
      vst1q_s16(reinterpret_cast<int16_t*>(y), w);
    else
      vst1_s8(reinterpret_cast<int8_t*>(y), vmovn_s16(w));
  }
}

// layernorm_out_x under LnVector's preconditions (its proof), 8 at a time: d in int32 lanes (|x * s| < 2**30 and
// |mean| < 2**30, so x * s - mean does not wrap there), d * f as d * fl + (d * fh) << 31 (Mul's split), the floor
// shifts SSHL by negative counts (arithmetic)
template <class TI, class TO>
i64 layernorm_out_neon(const TI* __restrict x, TO* __restrict y, i64 len, i64 shift_in, i64 mean, i64 f, i64 ush,
                       const i64* b, const LnVector& v, i64 zy, i64 lo, i64 hi) {
  const int32x4_t vs = vdupq_n_s32(static_cast<int32_t>(shift_in)), vmean = vdupq_n_s32(static_cast<int32_t>(mean));
  const int32x2_t fl = vdup_n_s32(static_cast<int32_t>(f & INT32_MAX)), fh = vdup_n_s32(static_cast<int32_t>(f >> 31));
  const int64x2_t nu = vdupq_n_s64(-ush), vz = vdupq_n_s64(zy), vlo = vdupq_n_s64(lo), vhi = vdupq_n_s64(hi);
  i64 j = 0;
  for (; j + 8 <= len; j += 8) {
    int32x4_t xa, xb;
    widen8(x + j, xa, xb);
    const int32x4_t d4[2] = {vsubq_s32(vshlq_s32(xa, vs), vmean), vsubq_s32(vshlq_s32(xb, vs), vmean)};
    int64x2_t r[4];
    for (int k = 0; k < 4; ++k) {
      const i64 i = j + 2 * k;
      const int32x2_t d = (k & 1) ? vget_high_s32(d4[k >> 1]) : vget_low_s32(d4[k >> 1]);
      const int64x2_t t = vaddq_s64(vmull_s32(d, fl), vshlq_n_s64(vmull_s32(d, fh), 31));
      const int32x2_t u = vmovn_s64(vshlq_s64(t, nu));
      const int64x2_t w = vaddq_s64(vmull_s32(u, vmovn_s64(vld1q_s64(b + i))), vld1q_s64(v.hb.data() + i));
      r[k] = clip2(vaddq_s64(vshlq_s64(w, vld1q_s64(v.negc.data() + i)), vz), vlo, vhi);
    }
    store8(y + j, r);
  }
  return j;
}

// index_max under IndexVector's preconditions, 8 at a time (h, zy as index_max takes them)
template <class TI>
i64 index_max_neon(const TI* __restrict x, int32_t* __restrict k, i64 len, i64 b, i64 h, i64 c, i64 zy, i64 hi,
                   i64& km) {
  const int32x2_t vb = vdup_n_s32(static_cast<int32_t>(b));
  const int64x2_t vh = vdupq_n_s64(h), nc = vdupq_n_s64(-c), vz = vdupq_n_s64(zy);
  const int64x2_t vlo = vdupq_n_s64(0), vhi = vdupq_n_s64(hi);
  int32x4_t mx = vdupq_n_s32(static_cast<int32_t>(km));
  i64 j = 0;
  for (; j + 8 <= len; j += 8) {
    int32x4_t x4[2];
    widen8(x + j, x4[0], x4[1]);
    int64x2_t r[4];
    for (int q = 0; q < 4; ++q) {
      const int32x2_t xv = (q & 1) ? vget_high_s32(x4[q >> 1]) : vget_low_s32(x4[q >> 1]);
      r[q] = clip2(vaddq_s64(vshlq_s64(vaddq_s64(vmull_s32(xv, vb), vh), nc), vz), vlo, vhi);
    }
    const int32x4_t ka = vcombine_s32(vmovn_s64(r[0]), vmovn_s64(r[1]));
    const int32x4_t kb = vcombine_s32(vmovn_s64(r[2]), vmovn_s64(r[3]));
    vst1q_s32(k + j, ka);
    vst1q_s32(k + j + 4, kb);
    mx = vmaxq_s32(mx, vmaxq_s32(ka, kb));
  }
  km = vmaxvq_s32(mx);
  return j;
}

// softmax_out, 8 at a time, for any e, f and 0 <= sh <= 63: e * f mod 2**64 from 32 x 32 -> 64-bit unsigned
// products (as mul64), the floor shift SSHL by -sh
template <class TO>
i64 softmax_out_neon(const i64* __restrict e, TO* __restrict y, i64 len, i64 f, i64 sh, i64 zy) {
  const uint32x2_t fl = vdup_n_u32(static_cast<uint32_t>(f));
  const uint32x2_t fh = vdup_n_u32(static_cast<uint32_t>(static_cast<u64>(f) >> 32));
  const int64x2_t ns = vdupq_n_s64(-sh), vz = vdupq_n_s64(zy);
  i64 j = 0;
  for (; j + 8 <= len; j += 8) {
    int64x2_t r[4];
    for (int k = 0; k < 4; ++k) {
      const uint64x2_t ev = vreinterpretq_u64_s64(vld1q_s64(e + j + 2 * k));
      const uint32x2_t el = vmovn_u64(ev), eh = vshrn_n_u64(ev, 32);
      const uint64x2_t cross = vaddq_u64(vmull_u32(eh, fl), vmull_u32(el, fh));
      const uint64x2_t t = vaddq_u64(vmull_u32(el, fl), vshlq_n_u64(cross, 32));
      r[k] = vaddq_s64(vshlq_s64(vreinterpretq_s64_u64(t), ns), vz);
    }
    store8(y + j, r);
  }
  return j;
}
#endif

// softmax_out of one row, through the explicit vector loop where `vector` (rows_vector() and the caller's
// preconditions) and the shift allow
template <class TO>
void softmax_row_out(const i64* e, TO* yr, i64 len, i64 f, i64 sh, i64 y_zp, [[maybe_unused]] bool vector,
                     const void* post = nullptr) {
  if (post) return softmax_post(e, yr, len, f, sh, y_zp, post);
  i64 done = 0;
  if (vector && sh >= 0 && sh <= 63) {
#if IVIT_AVX2_PATH
    done = static_cast<u64>(f) >> 32 ? softmax_out_avx2<true>(e, yr, len, f, sh, shifted_zy(y_zp, sh))
                                      : softmax_out_avx2<false>(e, yr, len, f, sh, shifted_zy(y_zp, sh));
#elif IVIT_NEON_PATH
    done = softmax_out_neon(e, yr, len, f, sh, y_zp);
#endif
  }
  if (done < len) softmax_out(e + done, yr + done, len - done, f, sh, y_zp);
}

struct RowMean;

// A LayerNorm over rows of `len` (b, c, bias per channel of the last axis, or one value when nc == 1): d centred
// on mean(row, sum(row), scale), u = floor(d * floor(2**61 / root(max(sum(norm(d)), 1))) / 2**(61 - p)), then
// the per-channel rescale (bias null: 0). IL2Norm is one with the zero point for the mean and no bias.
template <class Norm, class Root, class Mean>
int layernorm_rows(const void* x, int ti, i64 rows, i64 len, const i64* b, const i64* c, const i64* bias, i64 nc,
                   i64 zy, i64 shift_in, i64 p, i64 qmin, i64 qmax, void* y, int to, int threads, Norm norm,
                   Root root, Mean mean) {
  std::vector<i64> bb(len), cc(len), biases(len);  // per channel, whatever nc
  for (i64 j = 0; j < len; ++j) {
    const i64 k = nc == 1 ? 0 : j;
    bb[j] = b[k];
    cc[j] = c[k];
    biases[j] = bias ? bias[k] : 0;
  }
  const std::vector<i64> half = halves(cc.data(), len);
  const Rescale rs{zy, qmin, qmax};
  return with_types(ti, to, [&](auto ti_, auto to_) {
    using TI = decltype(ti_);
    using TO = decltype(to_);
    const i64 scale = shl(1, shift_in), ush = 61 - p;
    if (std::is_same_v<Norm, Square> && rows_fast() && shift_in >= 0 && shift_in <= 63 && ush >= 0 && ush <= 63) {
      // the fast paths (their section above)
      const LnVector vec(ti, len, shift_in, p, bb, cc, half, biases, zy);
      std::vector<i64> hb(len);
      for (i64 j = 0; j < len; ++j) hb[j] = half[j] + biases[j];
      const bool uniform = std::all_of(bb.begin(), bb.end(), [&](i64 v) { return v == bb[0]; }) &&
                           std::all_of(cc.begin(), cc.end(), [&](i64 v) { return v == cc[0]; });
      // the AVX-512 output loop where its clip keeps values inside TO (else the portable loop)
      const bool in_type = qmin <= qmax && qmin >= std::numeric_limits<TO>::min() &&
                           qmax <= std::numeric_limits<TO>::max();
      parallel_for(rows, threads, std::max<i64>(1, GRAIN / len), [&](i64 lo, i64 hi) {
        // a block's means and reciprocals first, then its outputs: the rows' divisions and square roots are
        // independent of each other, so they overlap instead of each row's chain stalling its output loop
        constexpr i64 BLOCK = 16;
        i64 ms[BLOCK], fs[BLOCK];
        for (i64 r = lo; r < hi; ++r) {
          if ((r - lo) % BLOCK == 0)
            for (i64 q = r; q < std::min(hi, r + BLOCK); ++q) {
              const TI* xq = as<TI>(x) + q * len;
              i64 sx, sxx;
#if IVIT_AVX2_PATH
              if constexpr (sizeof(TI) == 1) {
                if (rows_avx512() && len <= (i64(1) << 15))
                  row_sums_avx512(xq, len, sx, sxx);
                else
                  row_sums(xq, len, sx, sxx);
              } else
#endif
                row_sums(xq, len, sx, sxx);
              i64 m;
              if constexpr (std::is_same_v<Mean, RowMean>)
                m = floor_div(sx * scale, len);  // RowMean's value: its sum is sx
              else
                m = mean(xq, len, scale);
              ms[q - r] = m;
              fs[q - r] = floor_div(i64(1) << 61, root(std::max<i64>(sum_squares(sx, sxx, len, scale, m), 1)));
            }
          const TI* xr = as<TI>(x) + r * len;
          TO* yr = static_cast<TO*>(y) + r * len;
          const i64 m = ms[(r - lo) % BLOCK], f = fs[(r - lo) % BLOCK];
          i64 done = 0;
          if constexpr (sizeof(TI) == 1) {
            if (vec.on) {
#if IVIT_AVX2_PATH
              if (!rows_avx512())
                done = layernorm_out_avx2(xr, yr, len, shift_in, m, f, ush, bb.data(), cc.data(), vec, qmin, qmax);
              else if (in_type)
                done = uniform ? layernorm_out_avx512<true>(xr, yr, len, shift_in, m, f, ush, bb.data(), hb.data(),
                                                            cc.data(), zy, qmin, qmax)
                               : layernorm_out_avx512<false>(xr, yr, len, shift_in, m, f, ush, bb.data(), hb.data(),
                                                             cc.data(), zy, qmin, qmax);
#elif IVIT_NEON_PATH
              done = layernorm_out_neon(xr, yr, len, shift_in, m, f, ush, bb.data(), vec, zy, qmin, qmax);
#endif
            }
          }
          if (done < len) {
            if (uniform)
              layernorm_out_x<true>(xr + done, yr + done, len - done, shift_in, m, f, ush, bb.data() + done,
                                    hb.data() + done, cc.data() + done, rs);
            else
              layernorm_out_x<false>(xr + done, yr + done, len - done, shift_in, m, f, ush, bb.data() + done,
                                     hb.data() + done, cc.data() + done, rs);
          }
        }
      });
      return;
    }
    parallel_for(rows, threads, std::max<i64>(1, GRAIN / len), [&](i64 lo, i64 hi) {
      std::vector<i64> d(len);
      for (i64 r = lo; r < hi; ++r) {
        const TI* xr = as<TI>(x) + r * len;
        const i64 v = std::max<i64>(centre(xr, d.data(), len, scale, mean(xr, len, scale), norm), 1);
        layernorm_out(d.data(), static_cast<TO*>(y) + r * len, len, floor_div(i64(1) << 61, root(v)), ush, bb.data(),
                      biases.data(), half.data(), cc.data(), rs);
      }
    });
  }) ? 0 : 1;
}

// floor(sum(row) * scale / len): the centring of ILayerNorm and L1LayerNorm
struct RowMean {
  template <class TI>
  i64 operator()(const TI* xr, i64 len, i64 scale) const {
    i64 sum = 0;
    for (i64 j = 0; j < len; ++j) sum += xr[j];
    return floor_div(sum * scale, len);
  }
};

// ---- IBertSoftmax and LogIntSoftmax: I-BERT's polynomial exp (poly_exp.h), then each op's output per row

// out(e, sum, yr) writes row r (`len` elements at yr) from its exps e and their sum; exps from a table where one
// pays for itself (over the whole tensor's span, up to the clamp point n*x0), else directly.
template <class Out>
int poly_softmax_rows(const void* x, int ti, i64 rows, i64 len, const PolyExp& exp, void* y, int to, int threads,
                      Out out) {
  return with_types(ti, to, [&](auto ti_, auto to_) {
    using TI = decltype(ti_);
    using TO = decltype(to_);
    const TI* xs = as<TI>(x);
    i64 lo, hi;
    min_max(xs, rows * len, lo, hi);
    const i64 size = table_size(exp, hi - lo, rows * len);
    std::vector<i64> table(size);
    for (i64 a = 0; a < size; ++a) table[a] = exp(a);
    const i64* lut = table.data();
    parallel_for(rows, threads, std::max<i64>(1, GRAIN / len), [&](i64 r0, i64 r1) {
      std::vector<i64> e(len);
      for (i64 r = r0; r < r1; ++r) {
        const TI* xr = xs + r * len;
        i64 mx = xr[0];
        for (i64 j = 1; j < len; ++j) mx = std::max<i64>(mx, xr[j]);
        auto from_table = [lut, size](i64 a) { return lut[std::min(a, size - 1)]; };
        const i64 sum = size ? softmax_exps(xr, e.data(), len, mx, from_table)
                             : softmax_exps(xr, e.data(), len, mx, [exp](i64 a) { return exp(a); });
        out(e.data(), sum, static_cast<TO*>(y) + r * len);
      }
    });
  }) ? 0 : 1;
}

// LogIntSoftmax's output of a row: q = #{k < K : e <= theta[k]}, y = value[q] + zy (value: lis_value of 0..K)
template <class TO>
IVIT_CLONES void log_levels(const i64* __restrict e, TO* __restrict y, i64 len, const i64* __restrict theta, i64 k,
                            const i64* __restrict value, i64 zy) {
  for (i64 j = 0; j < len; ++j) {
    i64 q = 0;
    for (i64 t = 0; t < k; ++t) q += e[j] <= theta[t];
    y[j] = static_cast<TO>(value[q] + zy);
  }
}

// ---- The index Shiftmax rows with AVX-512 VBMI (x86-64 CPUs that have it, e.g. Ice Lake, Zen 4). A row's
// exps are E[km][k] for its largest index km, so with km known its outputs are a function of k alone: the
// bytes Y[k] = ((E[km][k] * f) >> sh) + y_zp (or post[...]) are computed from E's row for the row's smallest to
// largest index, and the row is 64 vpermt2b lookups at a time. The sum of the row's exps comes from E's row as byte planes
// (ivit_exp_planes), each looked up the same way and summed by vpsadbw. Rows of up to 256; off with
// IVIT_NO_VBMI=1. Built with or without the clones (IVIT_NO_CLONES: the sanitizer's build runs it too).
#if defined(__x86_64__) && defined(__GNUC__)
#define IVIT_VBMI_PATH 1
#include <immintrin.h>
#define IVIT_VBMI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi")))

inline bool vbmi_rows() {
  static const bool on = [] {
    __builtin_cpu_init();
    return rows_fast() && __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512dq") &&
           !env_on("IVIT_NO_VBMI");
  }();
  return on;
}

// t (256 bytes as 4 registers) at 64 byte indices: vpermt2b on each 128-entry half, bit 7 choosing the half
IVIT_VBMI inline __m512i lookup256(const __m512i* t, __m512i idx) {
  const __m512i lo = _mm512_permutex2var_epi8(t[0], idx, t[1]);
  const __m512i hi = _mm512_permutex2var_epi8(t[2], idx, t[3]);
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi);
}

// the smallest of 64 bytes (vphminposuw on the last 16, as words)
IVIT_VBMI inline i64 min_byte(__m512i v) {
  const __m256i a = _mm256_min_epu8(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  __m128i b = _mm_min_epu8(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  b = _mm_min_epu8(b, _mm_srli_epi16(b, 8));
  return _mm_cvtsi128_si32(_mm_minpos_epu16(_mm_and_si128(b, _mm_set1_epi16(0xFF)))) & 0xFFFF;
}

inline __mmask64 tail64(i64 left) { return left >= 64 ? ~__mmask64(0) : (__mmask64(1) << left) - 1; }

// 64 bytes from 8 vectors of 8 int64 lanes, each lane's low byte, in order (vpmovqb, without its store form)
IVIT_VBMI inline __m512i low_bytes(const __m512i* v) {
  const __m512i pd = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i pw = _mm512_setr_epi32(0x20000, 0x60004, 0xA0008, 0xE000C, 0x120010, 0x160014, 0x1A0018, 0x1E001C,
                                       0x220020, 0x260024, 0x2A0028, 0x2E002C, 0x320030, 0x360034, 0x3A0038,
                                       0x3E003C);
  const __m512i pb = _mm512_setr_epi32(0x06040200, 0x0E0C0A08, 0x16141210, 0x1E1C1A18, 0x26242220, 0x2E2C2A28,
                                       0x36343230, 0x3E3C3A38, 0x46444240, 0x4E4C4A48, 0x56545250, 0x5E5C5A58,
                                       0x66646260, 0x6E6C6A68, 0x76747270, 0x7E7C7A78);
  const __m512i w0 = _mm512_permutex2var_epi16(_mm512_permutex2var_epi32(v[0], pd, v[1]), pw,
                                               _mm512_permutex2var_epi32(v[2], pd, v[3]));
  const __m512i w1 = _mm512_permutex2var_epi16(_mm512_permutex2var_epi32(v[4], pd, v[5]), pw,
                                               _mm512_permutex2var_epi32(v[6], pd, v[7]));
  return _mm512_permutex2var_epi8(w0, pb, w1);
}

// The rows, as ivit_index_shiftmax_rows, for byte outputs, 0 <= sh <= 63, np byte planes of E (1..8) and rows
// of C * 64 indices at most (C = 1..4): each row's indices stay in C registers (0 past len) across its passes.
// (row[q0 + i] * f) >> sh for the 8 lanes i (0 past km): the scalar int64 product and shift
IVIT_VBMI inline __m512i scaled8(const i64* row, i64 q0, i64 km, __m512i vf, __m128i vs) {
  const __mmask8 m = q0 > km ? 0 : static_cast<__mmask8>(km - q0 >= 7 ? 0xFF : (1u << (km - q0 + 1)) - 1);
  return _mm512_sra_epi64(_mm512_mullo_epi64(_mm512_maskz_loadu_epi64(m, row + q0), vf), vs);
}

template <class TO, int C>
IVIT_VBMI void index_shiftmax_vbmi(const uint8_t* k, i64 rows, i64 len, const i64* e_rows, i64 nq,
                                   const uint8_t* planes, int np, i64 y_zp, i64 sh, TO* y, const TO* post) {
  const __m512i zero = _mm512_setzero_si512(), zp = _mm512_set1_epi64(y_zp);
  const __m128i vs = _mm_cvtsi64_si128(sh);
  const __mmask64 last = tail64(len - (C - 1) * 64);
  for (i64 r = 0; r < rows; ++r) {
    const uint8_t* kr = k + r * len;
    __m512i idx[C], mx = zero, mn = _mm512_set1_epi8(-1);
    for (int c = 0; c < C; ++c) {
      idx[c] = c < C - 1 ? _mm512_loadu_si512(kr + 64 * c) : _mm512_maskz_loadu_epi8(last, kr + 64 * c);
      mx = _mm512_max_epu8(mx, idx[c]);
      mn = _mm512_min_epu8(mn, c < C - 1 ? idx[c] : _mm512_mask_mov_epi8(mn, last, idx[c]));
    }
    const i64 km = 255 - min_byte(_mm512_xor_si512(mx, _mm512_set1_epi8(-1))), kmin = min_byte(mn);
    // the sum: each plane's bytes at the row's indices (0 past its end), summed in 64-bit lanes by vpsadbw
    const uint8_t* pr = planes + km * np * 256;
    u64 sum = 0;  // mod 2**64, as the generic loop's
    for (int p = 0; p < np; ++p) {
      __m512i t[4], acc = zero;
      for (int q = 0; q < 4; ++q) t[q] = _mm512_loadu_si512(pr + 256 * p + 64 * q);
      for (int c = 0; c < C; ++c) {
        const __m512i b = lookup256(t, idx[c]);
        acc = _mm512_add_epi64(acc, _mm512_sad_epu8(c < C - 1 ? b : _mm512_maskz_mov_epi8(last, b), zero));
      }
      sum += static_cast<u64>(_mm512_reduce_add_epi64(acc)) << (8 * p);
    }
    const i64 f = floor_div(RECIP_M, static_cast<i64>(sum));
    // Y[k] for kmin <= k <= km from E's row (e * f <= RECIP_M: exact in int64), into 4 registers (others unread)
    const i64* row = e_rows + km * nq;
    __m512i t[4] = {zero, zero, zero, zero};
    const __m512i vf = _mm512_set1_epi64(f);
    if (post) {
      // the table's indices 8 at a time (vpmullq, vpsraq: the scalar int64 product and shift; the cast to int32 a
      // truncation, vpmovqd), then the lookups one at a time
      alignas(64) uint8_t yt[256];
      alignas(64) int32_t at[256];
      for (i64 q0 = kmin / 8 * 8; q0 <= km; q0 += 8)
        _mm256_store_si256(reinterpret_cast<__m256i*>(at + q0), _mm512_cvtepi64_epi32(scaled8(row, q0, km, vf, vs)));
      for (i64 q = kmin; q <= km; ++q) yt[q] = static_cast<uint8_t>(post[at[q]]);
      for (int q = 0; q < 4; ++q) t[q] = _mm512_load_si512(yt + 64 * q);
    } else {
      for (i64 q = kmin / 64 * 64; q <= km; q += 64) {
        __m512i v[8];
        for (int s = 0; s < 8; ++s) v[s] = _mm512_add_epi64(scaled8(row, q + 8 * s, km, vf, vs), zp);
        t[q / 64] = low_bytes(v);
      }
    }
    TO* yr = y + r * len;
    for (int c = 0; c < C; ++c) {
      const __m512i out = lookup256(t, idx[c]);
      if (c < C - 1) _mm512_storeu_si512(yr + 64 * c, out); else _mm512_mask_storeu_epi8(yr + 64 * c, last, out);
    }
  }
}
#endif

}  // namespace

namespace ivit {
namespace {
thread_local ParallelHook current_hook{};
}
ParallelHook parallel_hook() { return current_hook; }
ParallelHook set_parallel_hook(ParallelHook hook) {
  const ParallelHook old = current_hook;
  current_hook = hook;
  return old;
}
}  // namespace ivit

extern "C" {

// y = clip(round_shift((x - zx[ch]) * b[ch], c[ch]) + zy, qmin, qmax); ch = (i / inner) % nc; 0 <= c <= 62.
// A zero point per channel is how a GEMM's bias folds in (zx[ch] = zx - bias[ch], ivit_onnx/bias_fold.py).
// Computed as x * b[ch] + (floor(2**c/2) - zx[ch] * b[ch]): the same int64 in wrap-around arithmetic.
// With a table (qmax - qmin + 1 entries of the output type), y = table[that - qmin]: a Requantize and the
// elementwise ops after it, tabulated over its outputs (ivit_onnx/chain_fold.py).
int ivit_requantize_table(const void* x, int ti, i64 outer, i64 nc, i64 inner, const i64* zx, const i64* b,
                          const i64* c, i64 zy, i64 qmin, i64 qmax, const void* table, void* y, int to,
                          int threads) {
  std::vector<i64> offset(nc);
  for (i64 k = 0; k < nc; ++k) offset[k] = -(zx[k] * b[k]);
  return rescale_each(x, ti, outer, nc, inner, b, c, zy, qmin, qmax, y, to, threads,
                      [&](const auto*, i64, auto run) { run(Identity{}); }, offset.data(), table);
}

int ivit_requantize_pc(const void* x, int ti, i64 outer, i64 nc, i64 inner, const i64* zx, const i64* b,
                       const i64* c, i64 zy, i64 qmin, i64 qmax, void* y, int to, int threads) {
  return ivit_requantize_table(x, ti, outer, nc, inner, zx, b, c, zy, qmin, qmax, nullptr, y, to, threads);
}

// y = clip(round_shift((x - zx) * b[ch], c[ch]) + zy, qmin, qmax); ch = (i / inner) % nc; 0 <= c <= 62.
int ivit_requantize(const void* x, int ti, i64 outer, i64 nc, i64 inner, i64 zx, const i64* b, const i64* c,
                    i64 zy, i64 qmin, i64 qmax, void* y, int to, int threads) {
  const std::vector<i64> zxs(nc, zx);
  return ivit_requantize_pc(x, ti, outer, nc, inner, zxs.data(), b, c, zy, qmin, qmax, y, to, threads);
}

// y = clip(round_shift((a - za) * ma + (b - zb) * mb, c) + zy, qmin, qmax); b repeats every nb elements.
int ivit_iadd(const void* a, int ta, const void* b, int tb, i64 n, i64 nb, i64 za, i64 zb, i64 ma, i64 mb,
              i64 c, i64 zy, i64 qmin, i64 qmax, void* y, int to, int threads) {
  bool ok = false;
  const Rescale rs{zy, qmin, qmax};
  const i64 h = (i64(1) << c) >> 1;
  const FastIAdd fast(za, zb, ma, mb, h, c, zy);
  with_types(ta, tb, [&](auto ta_, auto tb_) {
    using TA = decltype(ta_);
    using TB = decltype(tb_);
    ok = with_types(I8, to, [&](auto, auto to_) {
      using TO = decltype(to_);
      const TA* as_ = as<TA>(a);
      const TB* bs = as<TB>(b);
      TO* ys = static_cast<TO*>(y);
      if (nb == n) {
        parallel_for(n, threads, GRAIN, [&](i64 lo, i64 hi) {
          iadd_span(as_ + lo, bs + lo, ys + lo, hi - lo, za, zb, ma, mb, h, c, rs, fast);
        });
        return;
      }
      parallel_for(n / nb, threads, std::max<i64>(1, GRAIN / nb), [&](i64 lo, i64 hi) {
        for (i64 r = lo; r < hi; ++r) iadd_span(as_ + r * nb, bs, ys + r * nb, nb, za, zb, ma, mb, h, c, rs, fast);
      });
    });
  });
  return ok ? 0 : 1;
}

// Shiftmax over rows of `len`: y = int_div(shift_exp(x - max), sum, bits) + zy (no clip); 0 <= bits <= 62.
int ivit_shiftmax(const void* x, int ti, i64 rows, i64 len, i64 zy, i64 x0, i64 n, i64 bits, void* y, int to,
                  int threads) {
  return with_types(ti, to, [&](auto ti_, auto to_) {
    using TI = decltype(ti_);
    const TI* xs = as<TI>(x);
    i64 lo, hi;
    min_max(xs, rows * len, lo, hi);
    shiftmax_rows(rows, len, hi - lo, x0, n, bits, zy, static_cast<decltype(to_)*>(y), threads,
                  [xs, len](i64 r, i64*) { return xs + r * len; });
  }) ? 0 : 1;
}

// Shiftmax of v = table[clip(round_shift((x - zx) * b, c) + zy, qmin, qmax) - qmin] (table: int32, qmax - qmin
// + 1 entries): a Requantize, the elementwise ops after it tabulated, and the Shiftmax they feed, in one pass
// (ivit_onnx/chain_fold.py). Output zero point y_zp; 0 <= c <= 62, 0 <= bits <= 62.
// When the table is non-decreasing (a chain of Requantizes is) and small (8-bit), the row max is table[max k]
// over the row's indices k, so each exp is E[max k][k] = shift_exp(table[k] - table[max k]): one lookup per
// element in a row of E, each row built once per call, when a row with that max first needs it.
int ivit_requantize_shiftmax(const void* x, int ti, i64 rows, i64 len, i64 zx, i64 b, i64 c, i64 zy, i64 qmin,
                             i64 qmax, const int32_t* table, i64 y_zp, i64 x0, i64 n, i64 bits, void* y, int to,
                             int threads) {
  return ivit_requantize_shiftmax_table(x, ti, rows, len, zx, b, c, zy, qmin, qmax, table, y_zp, x0, n, bits, y, to,
                                        threads, nullptr);
}

// The same, then post[value - y_zp] (2**bits + 1 entries of the output's type) for a Requantize after it
int ivit_requantize_shiftmax_table(const void* x, int ti, i64 rows, i64 len, i64 zx, i64 b, i64 c, i64 zy,
                                   i64 qmin, i64 qmax, const int32_t* table, i64 y_zp, i64 x0, i64 n, i64 bits,
                                   void* y, int to, int threads, const void* post) {
  const i64 nq = qmax - qmin + 1, h = ((i64(1) << c) >> 1) - zx * b;
  const Rescale index{zy - qmin, 0, nq - 1};  // the table index, clip(...) - qmin
  const FastRescale fast_v(&b, &h, &c, 1, zy), fast_k(&b, &h, &c, 1, index.zy);  // AVX2: values, indices
  constexpr i64 MAX_ROWS_OF_E = 1024;  // E takes nq * nq int64s: 8 MiB at most
  const bool sorted = nq <= MAX_ROWS_OF_E && std::is_sorted(table, table + nq);
  const Exp exp(x0, n);
  const i64 span = i64(*std::max_element(table, table + nq)) - *std::min_element(table, table + nq);
  const i64 size = sorted ? table_size(exp, span, rows * len) : 0;
  std::vector<i64> lut(size);
  for (i64 a = 0; a < size; ++a) lut[a] = exp(-a);
  std::unique_ptr<i64[]> e_rows(sorted ? new i64[nq * nq] : nullptr);
  std::unique_ptr<std::once_flag[]> built(sorted ? new std::once_flag[nq] : nullptr);
  auto e_row = [&](i64 km) {  // E[km][k] for k <= km (the only ones a row with max index km reads)
    i64* row = e_rows.get() + km * nq;
    std::call_once(built[km], [&] {
      for (i64 k = 0; k <= km; ++k) {
        const i64 a = i64(table[km]) - table[k];
        row[k] = size ? lut[std::min(a, size - 1)] : exp(-a);
      }
    });
    return static_cast<const i64*>(row);
  };
  return with_types(ti, to, [&](auto ti_, auto to_) {
    using TI = decltype(ti_);
    using TO = decltype(to_);
    const TI* xs = as<TI>(x);
    TO* ys = static_cast<TO*>(y);
    if (!sorted) {
      shiftmax_rows(rows, len, span, x0, n, bits, y_zp, ys, threads, [&](i64 r, i64* buf) {
        rescale_lookup(xs + r * len, buf, len, Identity{}, &b, &h, &c, 0, Rescale{zy, qmin, qmax}, table,
                       fast_v.at(0));
        return static_cast<const i64*>(buf);
      }, post);
      return;
    }
    const i64 sh = 62 - bits;
    if (rows_fast()) {  // the fast paths (their section above)
      const IndexVector vec(b, h, c, index.zy);
      parallel_for(rows, threads, std::max<i64>(1, GRAIN / len), [&](i64 r0, i64 r1) {
        std::vector<int32_t> k(len);
        std::vector<i64> e(len);
        for (i64 r = r0; r < r1; ++r) {
          const TI* xr = xs + r * len;
          TO* yr = ys + r * len;
          i64 km = 0, done = 0;  // every index is >= 0
          if (vec.on) {
#if IVIT_AVX2_PATH
            done = index_max_avx2(xr, k.data(), len, b, c, vec, index.hi, km);
#elif IVIT_NEON_PATH
            done = index_max_neon(xr, k.data(), len, b, h, c, index.zy, index.hi, km);
#endif
          }
          if (done < len) km = index_max(xr + done, k.data() + done, len - done, b, h, c, index, km);
          const i64 sum = gather_sum(k.data(), e.data(), len, e_row(km));
          softmax_row_out(e.data(), yr, len, floor_div(RECIP_M, sum), sh, y_zp, vec.on, post);
        }
      });
      return;
    }
    parallel_for(rows, threads, std::max<i64>(1, GRAIN / len), [&](i64 r0, i64 r1) {
      std::vector<int32_t> k(len);
      std::vector<i64> e(len);
      for (i64 r = r0; r < r1; ++r) {
        rescale_span(xs + r * len, k.data(), len, Identity{}, b, h, c, index, fast_k.at(0));
        i64 lo, km;
        min_max(k.data(), len, lo, km);
        const i64 sum = gather_sum(k.data(), e.data(), len, e_row(km));
        softmax_post(e.data(), ys + r * len, len, floor_div(RECIP_M, sum), sh, y_zp, post);
      }
    });
  }) ? 0 : 1;
}

// ShiftGELU: sg = int_div(e1, e1 + e2, bits) with one of e1, e2 equal to shift_exp(0) = x0 * 2**n,
// y = clip(round_shift(x * sg * b[ch], c[ch]) + zy, qmin, qmax); ch = (i / inner) % nc; 0 <= c <= 62.
int ivit_shiftgelu(const void* x, int ti, i64 outer, i64 nc, i64 inner, const i64* b, const i64* c, i64 zy,
                   i64 x0, i64 n, i64 bits, i64 qmin, i64 qmax, void* y, int to, int threads) {
  const Exp exp(x0, n);
  const i64 top = exp(0), sh = 62 - bits;  // shift_exp(0) = x0 * 2**n
  // m = max(v, 0): for v >= 0, e1 = shift_exp(0) and e2 = shift_exp(-v); for v < 0, e1 = shift_exp(v)
  // and e2 = shift_exp(0). Either way one exp of -|v|, so sg depends on v alone: tabulate it over
  // |v| up to the clamp point (beyond it, sg(v) = sg(+-last)).
  auto sigmoid = [&](i64 v) { return shift_sigmoid(exp, top, sh, v); };
  return rescale_each(x, ti, outer, nc, inner, b, c, zy, qmin, qmax, y, to, threads,
                      [&](const auto* xs, i64 total, auto run) {
                        i64 lo, hi;
                        min_max(xs, total, lo, hi);
                        const i64 size = table_size(exp, std::max(hi, -lo), total / 2);
                        if (!size) {
                          run([&sigmoid](i64 v) { return v * sigmoid(v); });
                          return;
                        }
                        const i64 last = size - 1;
                        std::vector<i64> table(2 * last + 1);
                        for (i64 v = -last; v <= last; ++v) table[v + last] = sigmoid(v);
                        const i64* mid = table.data() + last;
                        run([mid, last](i64 v) { return v * mid[std::clamp<i64>(v, -last, last)]; });
                      });
}

// ILayerNorm: the variance's exact integer square root
int ivit_ilayernorm(const void* x, int ti, i64 rows, i64 len, const i64* b, const i64* c, const i64* bias,
                    i64 nc, i64 zy, i64 shift_in, i64 p, i64 qmin, i64 qmax, void* y, int to, int threads) {
  return layernorm_rows(x, ti, rows, len, b, c, bias, nc, zy, shift_in, p, qmin, qmax, y, to, threads, Square{},
                        [](i64 v) { return isqrt(v); }, RowMean{});
}

// L1LayerNorm: the L1 norm of the centred row itself
int ivit_l1layernorm(const void* x, int ti, i64 rows, i64 len, const i64* b, const i64* c, const i64* bias,
                     i64 nc, i64 zy, i64 shift_in, i64 p, i64 qmin, i64 qmax, void* y, int to, int threads) {
  return layernorm_rows(x, ti, rows, len, b, c, bias, nc, zy, shift_in, p, qmin, qmax, y, to, threads, Abs{},
                        [](i64 v) { return v; }, RowMean{});
}

// IL2Norm: d = (x - zx) * 2**shift_in, the norm max(isqrt(max(sum(d*d), 1)), eps), no bias
int ivit_il2norm(const void* x, int ti, i64 rows, i64 len, const i64* b, const i64* c, i64 nc, i64 zx, i64 zy,
                 i64 shift_in, i64 eps, i64 p, i64 qmin, i64 qmax, void* y, int to, int threads) {
  return layernorm_rows(x, ti, rows, len, b, c, nullptr, nc, zy, shift_in, p, qmin, qmax, y, to, threads, Square{},
                        [eps](i64 v) { return std::max<i64>(isqrt(v), eps); },
                        [zx](const auto*, i64, i64 scale) { return zx * scale; });
}

// IBertGELU: y = clip(round_shift(x * g(x) * b[ch], c[ch]) + zy, qmin, qmax) with g = IBertErf (intmath.h): no
// division, so no table; ch = (i / inner) % nc; 0 <= c <= 62, 0 <= k <= 62.
int ivit_ibertgelu(const void* x, int ti, i64 outer, i64 nc, i64 inner, const i64* b, const i64* c, i64 zy,
                   i64 clip, i64 coeff, i64 k, i64 qmin, i64 qmax, void* y, int to, int threads) {
  const IBertErf erf(clip, coeff, k);
  return rescale_each(x, ti, outer, nc, inner, b, c, zy, qmin, qmax, y, to, threads,
                      [&](const auto*, i64, auto run) { run([erf](i64 v) { return v * erf(v); }); });
}

// IBertSoftmax over rows of `len`: y = int_div(e, sum(e), bits) + zy (no clip), e = poly_exp(x - max) >> k with
// k = norm_shift(qb, qc, n); attributes as poly_exp_refusal accepts, 0 <= bits <= 62.
int ivit_ibert_softmax(const void* x, int ti, i64 rows, i64 len, i64 zy, i64 x0, i64 qb, i64 qc, i64 n, i64 bits,
                       void* y, int to, int threads) {
  const i64 sh = 62 - bits;
  return poly_softmax_rows(x, ti, rows, len, PolyExp(x0, qb, qc, n, norm_shift(qb, qc, n)), y, to, threads,
                           [&](const i64* e, i64 sum, auto* yr) {
                             softmax_out(e, yr, len, floor_div(RECIP_M, sum), sh, zy);
                           });
}

// LogIntSoftmax over rows of `len`: the level q of each exp among K = lis_levels(bits, log_bits) thresholds
// floor(2 sum / D_k) of its row, y = lis_value(q) + zy (no clip); attributes as poly_exp_refusal accepts,
// 1 <= bits <= 30, 1 <= log_bits <= 5.
int ivit_log_int_softmax(const void* x, int ti, i64 rows, i64 len, i64 zy, i64 x0, i64 qb, i64 qc, i64 n, i64 bits,
                         i64 log_bits, void* y, int to, int threads) {
  const i64 k = lis_levels(bits, log_bits);
  std::vector<i64> value(k + 1);
  for (i64 q = 0; q <= k; ++q) value[q] = lis_value(q, k, bits);
  return poly_softmax_rows(x, ti, rows, len, PolyExp(x0, qb, qc, n), y, to, threads,
                           [&](const i64* e, i64 sum, auto* yr) {
                             i64 theta[64];
                             for (i64 t = 0; t < k; ++t) theta[t] = (2 * sum) / lis_divisor(t + 1);
                             log_levels(e, yr, len, theta, k, value.data(), zy);
                           });
}

// E's rows (nq x nq, nq <= 256, every entry >= 0) as byte planes for the VBMI rows: planes[(km * np + p) * 256 +
// k] = byte p of E[km][k] (0 for k >= nq), np the fewest bytes that hold E's largest entry; returns np, or 0
// (planes untouched) where nq or an entry is out of range (the rows then take the generic loops). planes:
// np * 256 bytes a row, 8 * 256 at most.
int ivit_exp_planes(const int64_t* e_rows, int64_t nq, uint8_t* planes) {
  if (nq < 1 || nq > 256) return 0;
  i64 big = 0;
  for (i64 i = 0; i < nq * nq; ++i) {
    if (e_rows[i] < 0) return 0;
    big = std::max(big, e_rows[i]);
  }
  int np = 1;
  while (np < 8 && (big >> (8 * np)) != 0) ++np;
  std::fill(planes, planes + nq * np * 256, uint8_t(0));
  for (i64 km = 0; km < nq; ++km)
    for (int p = 0; p < np; ++p)
      for (i64 q = 0; q < nq; ++q)
        planes[(km * np + p) * 256 + q] = static_cast<uint8_t>(e_rows[km * nq + q] >> (8 * p));
  return np;
}

// The Shiftmax rows of ivit_requantize_shiftmax's sorted path, from the table's indices k (bytes, rows x len):
// e = E[max k][k] (e_rows: nq x nq, row km set for k <= km), y = (e * floor_div(RECIP_M, sum(e)) >> (62 -
// bits)) + y_zp, or post[that - y_zp] where post is not null. For QBatchMatMulShiftmax (qbatch_op.cpp), whose
// GEMM epilogue writes the indices. planes (np of them, ivit_exp_planes; null: none) let byte outputs take the
// VBMI rows where the CPU has VBMI.
int ivit_index_shiftmax_rows(const uint8_t* k, int64_t rows, int64_t len, const int64_t* e_rows, int64_t nq,
                             const uint8_t* planes, int64_t np, int64_t y_zp, int64_t bits, void* y, int to,
                             const void* post) {
  return with_types(1, to, [&](auto, auto to_) {
    using TO = decltype(to_);
#ifdef IVIT_VBMI_PATH
    if constexpr (sizeof(TO) == 1) {
      if (planes && np >= 1 && np <= 8 && bits >= 0 && bits <= 62 && len >= 1 && len <= 256 && vbmi_rows()) {
        auto run = [&](auto c) {
          index_shiftmax_vbmi<TO, decltype(c)::value>(k, rows, len, e_rows, nq, planes, static_cast<int>(np), y_zp,
                                                      62 - bits, static_cast<TO*>(y), static_cast<const TO*>(post));
        };
        switch ((len + 63) / 64) {
          case 1: run(std::integral_constant<int, 1>{}); break;
          case 2: run(std::integral_constant<int, 2>{}); break;
          case 3: run(std::integral_constant<int, 3>{}); break;
          default: run(std::integral_constant<int, 4>{}); break;
        }
        return;
      }
    }
#endif
    std::vector<i64> e(len);
    i64* __restrict ev = e.data();
    for (i64 r = 0; r < rows; ++r) {
      const uint8_t* __restrict kr = k + r * len;
      uint8_t km = 0;
      for (i64 j = 0; j < len; ++j) km = std::max(km, kr[j]);
      const i64* __restrict row = e_rows + km * nq;
      i64 sum = 0;
      for (i64 j = 0; j < len; ++j) sum += ev[j] = row[kr[j]];
      softmax_row_out(ev, static_cast<TO*>(y) + r * len, len, floor_div(RECIP_M, sum), 62 - bits, y_zp,
                      rows_vector(), post);
    }
  }) ? 0 : 1;
}

// 1 where ivit_index_shiftmax_rows' byte outputs take the VBMI rows on this CPU, else 0: for the tests.
int ivit_shiftmax_vbmi() {
#ifdef IVIT_VBMI_PATH
  return vbmi_rows() ? 1 : 0;
#else
  return 0;
#endif
}

// Which loops the row kernels' fast paths take here (their section): 0 the generic ones (IVIT_GENERIC_ROWS),
// 1 the portable ones, 2 AVX2, 3 NEON; for the tests.
int ivit_rows_path() { return !rows_fast() ? 0 : rows_avx512() ? 4 : !rows_vector() ? 1 : IVIT_NEON_PATH ? 3 : 2; }

// 1 where the AVX2 rescale loops run on this CPU (avx2_path), else 0: for the tests.
int ivit_rescale_avx2() { return avx2_path() ? 1 : 0; }

// y[k] = QuantizeLinear(x[k]) with a single scale and zero point, y int8 (to 0) or uint8 (to 1): quantize_run.
int ivit_quantize_linear(const float* x, int64_t n, float scale, int64_t zp, int to, void* y) {
  if (to != 0 && to != 1) return 1;
  const float lo = static_cast<float>((to ? 0 : -128) - zp), hi = static_cast<float>((to ? 255 : 127) - zp);
  quantize_run(x, static_cast<uint8_t*>(y), n, scale, lo, hi, static_cast<int>(zp));
  return 0;
}

// r[k] = isqrt(v[k]) of intmath.h (the exact integer square root ILayerNorm uses), for the tests.
int ivit_isqrt(const int64_t* v, int64_t* r, int64_t n) {
  for (i64 k = 0; k < n; ++k) r[k] = isqrt(v[k]);
  return 0;
}

}  // extern "C"
