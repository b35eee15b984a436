// QGemm's kernels (qgemm.h): the 8-bit GEMM, exact by construction on every path, with the Requantize epilogue
// (and QGemmAdd's residual IAdd after it) applied to each tile while it is in L1, so no int32 accumulator goes
// to memory.
//
// Every path computes dot[m, n] = sum_k a'[m, k] * w[k, n] in int32 (mod 2**32), a' being A as that path
// encodes it, and the epilogue turns it into MatMulInteger's accumulator, also mod 2**32:
//   acc = dot - zb[n] * rowsum(a'[m]) - (za' * colsum(w[:, n]) - K * za' * zb[n]),
// the sum of (a' - za') * (w - zb) expanded (a' - za' = a - za). No path can saturate:
//   * portable: int32 products of int16 values, summed with wrap-around (-fwrapv);
//   * AVX2: vpmaddwd on int16 pairs (a' = A sign- or zero-extended, za' = za): a pair sums to at most
//     2 * 255 * 128 < 2**31, then vpaddd wraps;
//   * AVX-512 VNNI: vpdpbusd, uint8 x int8 (a' = A for uint8, A + 128 for int8, za' likewise): four products of
//     at most 255 * 128 summed into int32 (vpdpbusd, not the saturating vpdpbusds);
//   * AMX (Sapphire Rapids and later, Linux): tdpbusd, the VNNI encoding and packing, a tile of 16 rows x 64 k
//     times 64 k x 16 columns: four products of at most 255 * 128 into each int32, summed with wrap-around;
//   * aarch64 NEON (every ARMv8 core, e.g. Cortex-A72): smlal / smlal2, one int16 x int16 product widened into
//     each int32 lane (a' = A sign- or zero-extended, za' = za), modular adds;
//   * aarch64 dot product (asimddp: Cortex-A76, Neoverse-N1, Apple): sdot, int8 x int8 (a' = A for int8,
//     A - 128 for uint8, za' likewise): four products of at most 128 * 128 into int32, modular adds;
//   * aarch64 i8mm (Neoverse-V1/N2, Cortex-A510/A710+, Apple M2+): smmla, the same encoding, a 2 x 8 block of
//     rows times an 8 x 2 block of columns: eight products of at most 128 * 128 into each int32, modular adds.
// B is packed once, at creation: for portable and AVX2 as int16 pairs in tiles of 16 columns
// ([K/2][16][2]), for NEON as int16 rows ([K][16]), for VNNI and sdot as 4-byte groups in tiles of 48 and 16
// columns ([K/4][nr][4]), for smmla as 8-byte groups ([K/8][16][8]: a pair of columns is one 2 x 8 operand);
// K padded with zeros (NEON and smmla to 8, sdot to 16: the lanes of one A register, AMX to 64: a tile's row).
// AMX reads the VNNI layout as it is: 16 of a tile's 48 columns over 64 k are one B tile (16 rows 192 bytes
// apart).
// Rows are split in chunks over the caller's pool (parallel.h) or over `threads` threads.

#include "qgemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "parallel.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define IVIT_QGEMM_X86 1
#include <immintrin.h>
#define IVIT_T_AVX2 __attribute__((target("avx2")))
#define IVIT_T_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
// the VNNI path's vector epilogue (vpmullq in the residual stage): with AVX-512 DQ, as every VNNI CPU has
#define IVIT_T_EPI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")))
#if defined(__clang__) || __GNUC__ >= 11  // the AMX intrinsics
#define IVIT_QGEMM_AMX 1
#define IVIT_T_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni")))
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#else
#define IVIT_QGEMM_AMX 0
#endif
#else
#define IVIT_QGEMM_X86 0
#define IVIT_QGEMM_AMX 0
#endif

#if defined(__aarch64__) && defined(__GNUC__)
#define IVIT_QGEMM_ARM 1
#include <arm_neon.h>
// the sdot and smmla kernels only (ARMv8.2-A with the extension, as arm_neon.h declares them): the library
// itself stays at the baseline ARMv8-A (setup.py adds no -march there), so it loads and runs on a Cortex-A72
#define IVIT_T_DOT __attribute__((target("arch=armv8.2-a+dotprod")))
#define IVIT_T_I8MM __attribute__((target("arch=armv8.2-a+i8mm")))
#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
#else  // no auxiliary vector (macOS reads sysctl): arm_feature ignores these
#define AT_HWCAP 0
#define AT_HWCAP2 0
#define HWCAP_ASIMDDP 0
#define HWCAP2_I8MM 0
#if defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#endif
#else
#define IVIT_QGEMM_ARM 0
#endif

namespace {

using i64 = int64_t;
enum Isa : int { AUTO = 0, PORTABLE = 1, AVX2 = 2, VNNI = 3, NEON = 4, DOTPROD = 5, I8MM = 6, AMX = 7, LAST = AMX };
const char* const NAMES[] = {"auto", "portable", "avx2", "vnni", "neon", "dotprod", "i8mm", "amx"};  // IVIT_GEMM_ISA's
enum Out : int { I8 = 0, U8 = 1, I16 = 2, I32 = 3 };
// each output type's range, by its code
constexpr i64 TYPE_LO[] = {INT8_MIN, 0, INT16_MIN, INT32_MIN}, TYPE_HI[] = {INT8_MAX, UINT8_MAX, INT16_MAX, INT32_MAX};

std::atomic<int> g_refused{0};  // bit per path the self-check refused (never picked by AUTO)

// AVX-512 VBMI (vpermt2b): 8-bit tables of up to 256 entries as 4 registers instead of gathers
bool cpu_vbmi() {
#if IVIT_QGEMM_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vbmi");
#else
  return false;
#endif
}

#if IVIT_QGEMM_ARM
// Whether the core has an optional feature: a HWCAP bit on Linux, a sysctl on macOS
bool arm_feature(unsigned long hwcap_word, unsigned long bit, const char* apple_name) {
#if defined(__linux__)
  (void)apple_name;
  return (getauxval(hwcap_word) & bit) != 0;
#elif defined(__APPLE__)
  (void)hwcap_word, (void)bit;
  int v = 0;
  size_t len = sizeof(v);
  return sysctlbyname(apple_name, &v, &len, nullptr, 0) == 0 && v;
#else
  (void)hwcap_word, (void)bit, (void)apple_name;
  return false;
#endif
}
#endif

// AVX-512 DQ (vpmullq), which the VNNI path's vector epilogue uses (every AVX-512 VNNI CPU has it)
bool cpu_dq() {
#if IVIT_QGEMM_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

#if IVIT_QGEMM_AMX
// AMX-TILE and AMX-INT8 in CPUID, and the kernel's leave to use the tile data (Linux: arch_prctl
// ARCH_REQ_XCOMP_PERM, once per process; without it the first tile instruction faults)
bool cpu_amx() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return false;
#if defined(__linux__)
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return false;
#endif
  }();
  return ok;
}
#endif

bool cpu_has(int isa) {
  if (isa == PORTABLE) return true;
#if IVIT_QGEMM_X86
  __builtin_cpu_init();
  if (isa == AVX2) return __builtin_cpu_supports("avx2");
  if (isa == VNNI)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
#if IVIT_QGEMM_AMX
  if (isa == AMX) return cpu_has(VNNI) && cpu_amx();  // the VNNI path's packing and epilogue, AMX's products
#endif
#endif
#if IVIT_QGEMM_ARM
  if (isa == NEON) return true;  // Advanced SIMD is part of every ARMv8-A core
  if (isa == DOTPROD) return arm_feature(AT_HWCAP, HWCAP_ASIMDDP, "hw.optional.arm.FEAT_DotProd");
  if (isa == I8MM) return arm_feature(AT_HWCAP2, HWCAP2_I8MM, "hw.optional.arm.FEAT_I8MM");
#endif
  return false;
}

// the byte paths: A as one byte per value (VNNI as uint8; sdot, smmla as int8); the others widen it to int16
// VNNI and AMX: the same encoding (uint8 A), packing (tiles of 48 columns), AVX-512 epilogue and repacking
bool vnni_like(int isa) { return isa == VNNI || isa == AMX; }
bool bytes(int isa) { return vnni_like(isa) || isa == DOTPROD || isa == I8MM; }
bool signed_bytes(int isa) { return isa == DOTPROD || isa == I8MM; }
bool arm(int isa) { return isa == NEON || isa == DOTPROD || isa == I8MM; }

// The paths from the fastest a CPU may have to the portable loop: AUTO's order, and the self-check's
constexpr int PREFERENCE[] = {AMX, VNNI, AVX2, I8MM, DOTPROD, NEON, PORTABLE};

// The path AUTO means: IVIT_GEMM_ISA if set, else the best one this CPU has that the self-check did not refuse.
int pick(int isa) {
  if (isa != AUTO) return isa;
  const char* env = std::getenv("IVIT_GEMM_ISA");
  if (env && *env) {
    for (int p = PORTABLE; p <= LAST; ++p)
      if (!std::strcmp(env, NAMES[p])) return p;
    return -1;
  }
  for (int p : PREFERENCE)
    if (cpu_has(p) && !(g_refused.load() & (1 << p))) return p;
  return PORTABLE;  // every path refused, the portable one too: it all the same
}

struct Layout {
  int nr, kstep, mr, kalign;  // columns per tile, k per group, rows per micro-kernel call, K padded to
};
Layout layout(int isa) {
  switch (isa) {
    case VNNI: return {48, 4, 8, 4};
    case AMX: return {48, 4, 16, 64};
    case AVX2: return {16, 2, 6, 2};
    case NEON: return {16, 1, 4, 8};
    case DOTPROD: return {16, 4, 4, 16};
    case I8MM: return {16, 8, 4, 8};
    default: return {16, 2, 4, 2};
  }
}

// One IAdd stage of the epilogue (see QGemm's comment): v as its type (mid_code), r an activation (act) or
// constants (in r_off), a multiplier past int32 (wide)
struct Stage {
  bool act = false, wide = false;
  int mid_code = 0;
  i64 mv = 0, mr = 0, ac = 0, azy = 0, alo = 0, ahi = 0, azs = 0;
  i64 mv_lo = 0, mv_hi = 0, mr_lo = 0, mr_hi = 0;
  std::vector<i64> r_off, vr_off;
  // x86's form for a constant addend with mv = 2**s, s <= c (pow2; quantize_static's bias IAdd: mv = 2**c):
  // with no wrap in u = v * 2**s + r_off (|v| < 2**16, s <= 46, |r_off| < 2**62), u >> c =
  // (v + (r_off >> s)) >> (c - s), so the stage is v + cst[n], a shift by c - s (pshift) and the clip, in int32
  // lanes (|cst| < 2**30)
  bool pow2 = false;
  i64 pshift = 0;
  std::vector<int32_t> cst;
};

struct QGemm {
  int isa, a_code, out_code;
  i64 k, n, kp, tiles, za_enc, zy, qmin, qmax;
  Layout lay;
  std::vector<int16_t> b16;  // portable, AVX2, NEON
  std::vector<int8_t> b8;    // VNNI, sdot, smmla
  std::vector<int32_t> zb, corr, table;  // per column: zb, za' * colsum - K * za' * zb (mod 2**32)
  std::vector<i64> zx, mult, half, shift;
  // the vector epilogue's (where every multiplier is an int32 and qmin, qmax are int32), per column padded to
  // whole tiles: off = (h ^ 2**63) - zx * b and zs = zy - 2**(63 - c) (kernels.cpp's flip_h and shifted_zy);
  // on aarch64 (an arithmetic shift by a vector of counts) off = h - zx * b
  bool fast = false, zb_zero = false;
  // x86's high-dword form of it (hi32), where every column has 33 <= c <= 62, qmin <= qmax and the bounds below
  // hold. With |dot| <= K * 255 * 255 = D, |D| + |zx| < 2**31: acc - zx is an int32, so it is acc with
  // corr2 = corr + zx (mod 2**32) taken off; P = (acc - zx) * b is one exact vpmuldq, and the scalar epilogue's
  // ((P + 2**(c-1)) >> c) + zy = ((P >> 32) + rnd) >> (c - 32) with rnd = 2**(c-33) + zy * 2**(c-32) (2**(c-1)
  // and zy * 2**c being multiples of 2**32 and 2**c). P >> 32 is the high dword of a 64-bit lane (no shift for
  // the odd columns), and |P >> 32| + |rnd| < 2**31 (checked per column), so the rest runs in int32 lanes, the
  // clip included (lo <= hi: clip's value). sh32 = c - 32 (past n: 0).
  bool hi32 = false;
  std::vector<int32_t> corr2, rnd, sh32;
  // the int32 accumulator is the output (QBatchMatMul's int32 form: multiplier 1, shift 0, zero points 0, the
  // int32 range, no table): y = acc, mod 2**32, with no rescale (identity_rows)
  bool identity = false;
  alignas(64) uint8_t tab8[256] = {};  // the table as bytes, for byte outputs with VBMI (vbmi_table)
  bool vbmi_table = false;
  // VNNI and AMX byte outputs in the hi32 form without a residual stage, qmin, qmax inside the output's type
  // (or a VBMI table's, inside int16): epilogue_bytes_avx512
  bool bytes48 = false;
  std::vector<i64> off, zs;
  // the residual stage (IvitQGemmAdd; out_code is then the sum's type, mid_code v's): u = v * mv + r * mr +
  // r_off[n] (mod 2**64; r_off = h - zv * mv - zr * mr, plus r[n] * mr for constants, which drop the r term),
  // then clip((u >> c) + zy, lo, hi). The vector stage (add_fast: -2**62 <= mv, mr < 2**62, lo, hi int32, v
  // inside its type) multiplies by m = hi * 2**31 + lo as two signed 32 x 32-bit products (add_wide; else
  // lo = m, hi = 0: one), exact mod 2**64 as kernels.cpp's mul4; it adds vr_off = r_off ^ 2**63 on x86 (a
  // logical shift, then zs = zy - 2**(63 - c)), r_off on aarch64.
  // Two stages where a second IAdd reads the first's sum (QGemmAddAdd: quantize_static's bias, then the
  // residual), the second's v the first's sum; at most one of them reads the activation r (add_act, r_code).
  bool has_add = false, add_act = false, add_fast = false;
  // the AVX-512 stage's high-dword form (hadd: VNNI, add_fast, every stage with 32 <= c and alo - azy, ahi - azy
  // int32): u >> c = (u >> 32) >> (c - 32), u's high dwords gathered by one permute, then the clip as
  // clip(w, alo - azy, ahi - azy) + azy in int32 lanes (alo <= ahi: clip's value)
  bool hadd = false;
  int r_code = 0, stages = 0;
  Stage st[2];
  const Stage& last() const { return st[stages - 1]; }
  // the table after the residual stage (QGemmAddTable): post[sum - alo], out_code its type; post8 its bytes
  // for byte outputs with VBMI (vbmi_post)
  std::vector<int32_t> post;
  alignas(64) uint8_t post8[256] = {};
  bool vbmi_post = false;
};

// QGemm::corr2's entry: the column correction with zx folded in, mod 2**32
inline int32_t corr_zx(int32_t corr, i64 zx) {
  return static_cast<int32_t>(static_cast<uint32_t>(corr) + static_cast<uint32_t>(zx));
}

// the residual activation of one run: rows repeating (row m reads row m % rows); r null where there is none
struct Resid {
  const void* r;
  i64 rows;
};

// ------------------------------------------------------------------------------------------- micro-kernels
// out[r * nr + j] (+)= sum over k < klen of a[r * lda + k] * tile[k][j], for the lay.mr rows of a (add: onto
// what out holds, for the blocks of K after the first).

// One row at a time: GCC 12 (-O3) vectorized the rows-inside-k form into loads of rows past the MR given (a
// read past the packed rows' buffer, which faulted where the next page was unmapped).
template <int MR>
void micro_portable(const int16_t* a, i64 lda, i64 klen, const int16_t* b, int32_t* out, bool add) {
  for (int r = 0; r < MR; ++r) {
    int32_t acc[16] = {};
    if (add) std::memcpy(acc, out + r * 16, sizeof(acc));
    const int16_t* ar = a + r * lda;
    const int16_t* bk = b;
    for (i64 k = 0; k < klen; k += 2, bk += 32) {
      const int32_t a0 = ar[k], a1 = ar[k + 1];
      for (int j = 0; j < 16; ++j) acc[j] += a0 * bk[2 * j] + a1 * bk[2 * j + 1];
    }
    std::memcpy(out + r * 16, acc, sizeof(acc));
  }
}

#if IVIT_QGEMM_X86
// The accumulators are named variables, not an array: GCC copies arrays of vectors around the loop.
inline int32_t load32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#define IVIT_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
IVIT_T_AVX2 void micro_avx2(const int16_t* a, i64 lda, i64 klen, const int16_t* b, int32_t* out, bool add) {
#define IVIT_ZERO(r)                                                                              \
  __m256i c##r##0 = add ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(out + r * 16))      \
                        : _mm256_setzero_si256();                                                 \
  __m256i c##r##1 = add ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(out + r * 16 + 8))  \
                        : _mm256_setzero_si256();
  IVIT_ROWS(IVIT_ZERO)
#undef IVIT_ZERO
  for (i64 k = 0; k < klen; k += 2, b += 32) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
#define IVIT_STEP(r)                                                 \
  {                                                                  \
    const __m256i av = _mm256_set1_epi32(load32(a + r * lda + k));   \
    c##r##0 = _mm256_add_epi32(c##r##0, _mm256_madd_epi16(av, b0));  \
    c##r##1 = _mm256_add_epi32(c##r##1, _mm256_madd_epi16(av, b1));  \
  }
    IVIT_ROWS(IVIT_STEP)
#undef IVIT_STEP
  }
  // lanes hold columns 0..7 (c.0) and 8..15 (c.1): the packing's order
#define IVIT_STORE(r)                                                          \
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * 16), c##r##0);     \
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * 16 + 8), c##r##1);
  IVIT_ROWS(IVIT_STORE)
#undef IVIT_STORE
}
#undef IVIT_ROWS

#define IVIT_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
// NV of the tile's 3 vectors of 16 columns: a last, narrow tile (attention's N = 64 or 197) computes only the
// vectors it has columns in (the epilogue reads no others)
template <int NV>
IVIT_T_VNNI void micro_vnni(const uint8_t* a, i64 lda, i64 klen, const int8_t* b, int32_t* out, bool add) {
#define IVIT_ZERO(r)                                                                                          \
  __m512i c##r##0 = add ? _mm512_loadu_si512(out + r * 48) : _mm512_setzero_si512();                       \
  __m512i c##r##1 = add && NV > 1 ? _mm512_loadu_si512(out + r * 48 + 16) : _mm512_setzero_si512();        \
  __m512i c##r##2 = add && NV > 2 ? _mm512_loadu_si512(out + r * 48 + 32) : _mm512_setzero_si512();
  IVIT_ROWS(IVIT_ZERO)
#undef IVIT_ZERO
  for (i64 k = 0; k < klen; k += 4, b += 192) {
    const __m512i b0 = _mm512_loadu_si512(b);
    const __m512i b1 = NV > 1 ? _mm512_loadu_si512(b + 64) : b0, b2 = NV > 2 ? _mm512_loadu_si512(b + 128) : b0;
#define IVIT_STEP(r)                                               \
  {                                                                \
    const __m512i av = _mm512_set1_epi32(load32(a + r * lda + k)); \
    c##r##0 = _mm512_dpbusd_epi32(c##r##0, av, b0);                \
    if constexpr (NV > 1) c##r##1 = _mm512_dpbusd_epi32(c##r##1, av, b1); \
    if constexpr (NV > 2) c##r##2 = _mm512_dpbusd_epi32(c##r##2, av, b2); \
  }
    IVIT_ROWS(IVIT_STEP)
#undef IVIT_STEP
  }
#define IVIT_STORE(r)                                                    \
  _mm512_storeu_si512(out + r * 48, c##r##0);                            \
  if constexpr (NV > 1) _mm512_storeu_si512(out + r * 48 + 16, c##r##1); \
  if constexpr (NV > 2) _mm512_storeu_si512(out + r * 48 + 32, c##r##2);
  IVIT_ROWS(IVIT_STORE)
#undef IVIT_STORE
}
#undef IVIT_ROWS

#if IVIT_QGEMM_AMX
// micro_amx's tile palette: tiles 0-2 the accumulators (16 rows of 16 int32), 3 the rows of A (16 rows of 64
// bytes), 4-6 B (16 groups of 4 k, 16 columns each). Loaded per chunk (run_chunk): other code on the thread
// (onnxruntime's own AMX kernels) may load its own between our calls.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
// GCC's tile intrinsics are asm statements that tell the compiler nothing of the memory they read or write
// (_tile_loadconfig: 8 bytes of the 64): the barriers keep the stores before them (the palette, the packed
// rows) and the reads after them (the stored tile)
#define IVIT_AMX_FENCE(p) __asm__ volatile("" : : "r"(p) : "memory")
// tiles 0 .. tiles-1 as 16 rows of 64 bytes (micro_amx's 7, the peak loop's 8)
IVIT_T_AMX void amx_begin(int tiles = 7) {
  TileConfig cfg;
  for (int t = 0; t < tiles; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  IVIT_AMX_FENCE(&cfg);
  _tile_loadconfig(&cfg);
}
IVIT_T_AMX void amx_end() { _tile_release(); }

// 16 rows x NV vectors of 16 columns of the tile (out's rows 48 int32 apart; add: onto what it holds), klen a
// multiple of 64: per 64 k one A tile and NV B tiles read in place from the VNNI-packed weights
template <int NV>
IVIT_T_AMX void micro_amx(const uint8_t* a, i64 lda, i64 klen, const int8_t* b, int32_t* out, bool add) {
  constexpr i64 LD = 48 * 4;  // bytes between rows of out and between groups of 4 k of the packed tile
  IVIT_AMX_FENCE(out);
  if (add) {
    _tile_loadd(0, out, LD);
    if constexpr (NV > 1) _tile_loadd(1, out + 16, LD);
    if constexpr (NV > 2) _tile_loadd(2, out + 32, LD);
  } else {
    _tile_zero(0);
    if constexpr (NV > 1) _tile_zero(1);
    if constexpr (NV > 2) _tile_zero(2);
  }
  for (i64 k = 0; k < klen; k += 64) {
    const int8_t* bk = b + k * 48;
    _tile_loadd(3, a + k, lda);
    _tile_loadd(4, bk, LD);
    _tile_dpbusd(0, 3, 4);
    if constexpr (NV > 1) {
      _tile_loadd(5, bk + 64, LD);
      _tile_dpbusd(1, 3, 5);
    }
    if constexpr (NV > 2) {
      _tile_loadd(6, bk + 128, LD);
      _tile_dpbusd(2, 3, 6);
    }
  }
  _tile_stored(0, out, LD);
  if constexpr (NV > 1) _tile_stored(1, out + 16, LD);
  if constexpr (NV > 2) _tile_stored(2, out + 32, LD);
  IVIT_AMX_FENCE(out);
}
#endif
#endif

#if IVIT_QGEMM_ARM
// 4 rows x 16 columns, each row's accumulators c<r>0..c<r>3 holding columns 0-3, 4-7, 8-11, 12-15.
#define IVIT_ROWS(X) X(0) X(1) X(2) X(3)
#define IVIT_ZERO(r)                                                          \
  int32x4_t c##r##0 = add ? vld1q_s32(out + r * 16) : vdupq_n_s32(0);          \
  int32x4_t c##r##1 = add ? vld1q_s32(out + r * 16 + 4) : vdupq_n_s32(0);      \
  int32x4_t c##r##2 = add ? vld1q_s32(out + r * 16 + 8) : vdupq_n_s32(0);      \
  int32x4_t c##r##3 = add ? vld1q_s32(out + r * 16 + 12) : vdupq_n_s32(0);
#define IVIT_STORE(r)                     \
  vst1q_s32(out + r * 16, c##r##0);       \
  vst1q_s32(out + r * 16 + 4, c##r##1);   \
  vst1q_s32(out + r * 16 + 8, c##r##2);   \
  vst1q_s32(out + r * 16 + 12, c##r##3);
#define IVIT_ACC(r) c##r##0, c##r##1, c##r##2, c##r##3

// k = L of 8: the 16 int16 weights b0, b1 times lane L of the row's int16 a, widened into int32 (smlal, smlal2)
template <int L>
inline __attribute__((always_inline)) void mac_neon(int32x4_t& c0, int32x4_t& c1, int32x4_t& c2, int32x4_t& c3,
                                                    int16x8_t b0, int16x8_t b1, int16x8_t a) {
  c0 = vmlal_laneq_s16(c0, vget_low_s16(b0), a, L);
  c1 = vmlal_high_laneq_s16(c1, b0, a, L);
  c2 = vmlal_laneq_s16(c2, vget_low_s16(b1), a, L);
  c3 = vmlal_high_laneq_s16(c3, b1, a, L);
}

void micro_neon(const int16_t* a, i64 lda, i64 klen, const int16_t* b, int32_t* out, bool add) {
  IVIT_ROWS(IVIT_ZERO)
  for (i64 k = 0; k < klen; k += 8, b += 128) {  // klen: a multiple of 8 (kalign)
    const int16x8_t a0 = vld1q_s16(a + k), a1 = vld1q_s16(a + lda + k);
    const int16x8_t a2 = vld1q_s16(a + 2 * lda + k), a3 = vld1q_s16(a + 3 * lda + k);
#define IVIT_K(l)                                                                      \
  {                                                                                    \
    const int16x8_t b0 = vld1q_s16(b + (l) * 16), b1 = vld1q_s16(b + (l) * 16 + 8);   \
    mac_neon<l>(IVIT_ACC(0), b0, b1, a0);                                              \
    mac_neon<l>(IVIT_ACC(1), b0, b1, a1);                                              \
    mac_neon<l>(IVIT_ACC(2), b0, b1, a2);                                              \
    mac_neon<l>(IVIT_ACC(3), b0, b1, a3);                                              \
  }
    IVIT_K(0) IVIT_K(1) IVIT_K(2) IVIT_K(3) IVIT_K(4) IVIT_K(5) IVIT_K(6) IVIT_K(7)
#undef IVIT_K
  }
  IVIT_ROWS(IVIT_STORE)
}

// k group L of 4 (16 bytes of a row): 16 columns' 4-byte groups b0..b3 dotted with the row's group L (sdot)
template <int L>
IVIT_T_DOT inline __attribute__((always_inline)) void mac_dot(int32x4_t& c0, int32x4_t& c1, int32x4_t& c2,
                                                             int32x4_t& c3, int8x16_t b0, int8x16_t b1,
                                                             int8x16_t b2, int8x16_t b3, int8x16_t a) {
  c0 = vdotq_laneq_s32(c0, b0, a, L);
  c1 = vdotq_laneq_s32(c1, b1, a, L);
  c2 = vdotq_laneq_s32(c2, b2, a, L);
  c3 = vdotq_laneq_s32(c3, b3, a, L);
}

IVIT_T_DOT void micro_dot(const int8_t* a, i64 lda, i64 klen, const int8_t* b, int32_t* out, bool add) {
  IVIT_ROWS(IVIT_ZERO)
  for (i64 k = 0; k < klen; k += 16, b += 256) {  // klen: a multiple of 16 (kalign)
    const int8x16_t a0 = vld1q_s8(a + k), a1 = vld1q_s8(a + lda + k);
    const int8x16_t a2 = vld1q_s8(a + 2 * lda + k), a3 = vld1q_s8(a + 3 * lda + k);
#define IVIT_K(l)                                                                                \
  {                                                                                              \
    const int8_t* bl = b + (l) * 64;                                                             \
    const int8x16_t b0 = vld1q_s8(bl), b1 = vld1q_s8(bl + 16), b2 = vld1q_s8(bl + 32);          \
    const int8x16_t b3 = vld1q_s8(bl + 48);                                                      \
    mac_dot<l>(IVIT_ACC(0), b0, b1, b2, b3, a0);                                                 \
    mac_dot<l>(IVIT_ACC(1), b0, b1, b2, b3, a1);                                                 \
    mac_dot<l>(IVIT_ACC(2), b0, b1, b2, b3, a2);                                                 \
    mac_dot<l>(IVIT_ACC(3), b0, b1, b2, b3, a3);                                                 \
  }
    IVIT_K(0) IVIT_K(1) IVIT_K(2) IVIT_K(3)
#undef IVIT_K
  }
  IVIT_ROWS(IVIT_STORE)
}
#undef IVIT_ACC
#undef IVIT_STORE
#undef IVIT_ZERO
#undef IVIT_ROWS

// 4 rows x 16 columns as 2 x 2 blocks: c<p><q> holds rows 2p, 2p+1 by columns 2q, 2q+1 (row-major); per 8 k,
// the A operand of rows 2p, 2p+1 is their 8 bytes side by side, the B operand of columns 2q, 2q+1 the packed
// 16 bytes (smmla)
#define IVIT_PAIRS(X, p) X(p, 0) X(p, 1) X(p, 2) X(p, 3) X(p, 4) X(p, 5) X(p, 6) X(p, 7)
#define IVIT_ZERO(p, q)                                                                      \
  int32x4_t c##p##q = add ? vcombine_s32(vld1_s32(out + 2 * p * 16 + 2 * q),                  \
                                         vld1_s32(out + (2 * p + 1) * 16 + 2 * q))           \
                          : vdupq_n_s32(0);
#define IVIT_MAC(p, q) c##p##q = vmmlaq_s32(c##p##q, a##p, vld1q_s8(b + 16 * q));
#define IVIT_STORE(p, q)                                          \
  vst1_s32(out + 2 * p * 16 + 2 * q, vget_low_s32(c##p##q));      \
  vst1_s32(out + (2 * p + 1) * 16 + 2 * q, vget_high_s32(c##p##q));
IVIT_T_I8MM void micro_i8mm(const int8_t* a, i64 lda, i64 klen, const int8_t* b, int32_t* out, bool add) {
  IVIT_PAIRS(IVIT_ZERO, 0) IVIT_PAIRS(IVIT_ZERO, 1)
  for (i64 k = 0; k < klen; k += 8, b += 128) {  // klen: a multiple of 8 (kalign)
    const int8x16_t a0 = vcombine_s8(vld1_s8(a + k), vld1_s8(a + lda + k));
    const int8x16_t a1 = vcombine_s8(vld1_s8(a + 2 * lda + k), vld1_s8(a + 3 * lda + k));
    IVIT_PAIRS(IVIT_MAC, 0) IVIT_PAIRS(IVIT_MAC, 1)
  }
  IVIT_PAIRS(IVIT_STORE, 0) IVIT_PAIRS(IVIT_STORE, 1)
}
#undef IVIT_STORE
#undef IVIT_MAC
#undef IVIT_ZERO
#undef IVIT_PAIRS
#endif

// ------------------------------------------------------------------------------------------------ epilogue

// v as the type of `code` (the cast to the Requantize's output type: truncation)
inline i64 as_type(i64 v, int code) {
  switch (code) {
    case I8: return static_cast<int8_t>(v);
    case U8: return static_cast<uint8_t>(v);
    case I16: return static_cast<int16_t>(v);
    default: return static_cast<int32_t>(v);
  }
}

// a residual stage on one value v of column n (r: the residual there, for an activation)
inline i64 add_one(const Stage& s, i64 v, i64 n, int32_t r) {
  const i64 u = as_type(v, s.mid_code) * s.mv + (s.act ? r * s.mr : 0) + s.r_off[n];  // mod 2**64 (-fwrapv)
  const i64 w = (u >> s.ac) + s.azy;
  return w < s.alo ? s.alo : (w > s.ahi ? s.ahi : w);
}

// the stages on v, then the sum (in the last one's alo..ahi) through the table after them, if any
inline i64 after_add(const QGemm& g, i64 v, i64 n, int32_t r) {
  for (int i = 0; i < g.stages; ++i) v = add_one(g.st[i], v, n, r);
  return g.post.empty() ? v : g.post[v - g.last().alo];
}

// y[j] for the columns n0..n0+cols of one row: the accumulator from dot (see the top), then Requantize
// (and the table), then the residual stage (rv: the residual activation's row, widened)
template <class TO>
void epilogue(const QGemm& g, const int32_t* dot, int32_t rowsum, i64 n0, i64 cols, const int32_t* rv, TO* y) {
  const i64 lo = g.qmin, hi = g.qmax;
  for (i64 j = 0; j < cols; ++j) {
    const i64 n = n0 + j;
    const uint32_t acc = static_cast<uint32_t>(dot[j]) - static_cast<uint32_t>(g.zb[n]) * static_cast<uint32_t>(rowsum) -
                         static_cast<uint32_t>(g.corr[n]);
    const i64 t = (static_cast<i64>(static_cast<int32_t>(acc)) - g.zx[n]) * g.mult[n];
    i64 v = ((t + g.half[n]) >> g.shift[n]) + g.zy;
    v = v < lo ? lo : (v > hi ? hi : v);
    v = g.table.empty() ? v : g.table[v - lo];
    y[j] = static_cast<TO>(g.has_add ? after_add(g, v, n, rv ? rv[j] : 0) : v);
  }
}

// The same values, a whole tile at a time on x86 (g.fast: epilogue_tile_avx512, epilogue_tile_avx2, below), a
// row at a time on aarch64 (epilogue_fast): acc * b + off is (acc - zx) * b + h + 2**63 mod 2**64 with one
// signed 32 x 32-bit multiply, the floor shift a logical one on the sign-flipped sum (kernels.cpp's AVX2
// rescale).
#if IVIT_QGEMM_X86
// tab8[i] of 64 byte indices i: vpermt2b on each 128-entry half (index bit 6 choosing the register), bit 7
// choosing the half. Inline asm, as the epilogue's target lacks VBMI (only run where the CPU has it: vbmi_table).
IVIT_T_EPI inline __m512i vbmi64(const __m512i* t, __m512i i) {
  __m512i lo = t[0], hi = t[2];
  asm("vpermt2b %[b], %[i], %[a]" : [a] "+v"(lo) : [i] "v"(i), [b] "v"(t[1]));
  asm("vpermt2b %[b], %[i], %[a]" : [a] "+v"(hi) : [i] "v"(i), [b] "v"(t[3]));
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(i), lo, hi);
}
// the same for 16 indices (the lanes past them unused)
IVIT_T_EPI inline __m128i vbmi16(const __m512i* t, __m128i idx) {
  return _mm512_castsi512_si128(vbmi64(t, _mm512_castsi128_si512(idx)));
}

// 16 int32 lanes as two sets of int64 lanes: the even columns (each lane's low half, sign-extended) and the odd
// ones (its high half); and back, each int64 lane holding an int32's value
IVIT_T_EPI inline __m512i even64(__m512i v) { return _mm512_srai_epi64(_mm512_slli_epi64(v, 32), 32); }
IVIT_T_EPI inline __m512i odd64(__m512i v) { return _mm512_srai_epi64(v, 32); }
IVIT_T_EPI inline __m512i join32(__m512i e, __m512i o) {
  return _mm512_mask_blend_epi32(0xAAAA, e, _mm512_slli_epi64(o, 32));
}

// p[n..n+16) (one int64 per column) as the even columns' 8 and the odd columns' 8
struct Pair {
  __m512i e, o;
};
IVIT_T_EPI inline Pair split(const i64* p) {
  const __m512i a = _mm512_loadu_si512(p), b = _mm512_loadu_si512(p + 8);
  return {_mm512_permutex2var_epi64(a, _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), b),
          _mm512_permutex2var_epi64(a, _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15), b)};
}

// a tile row's 16 accumulators less their column correction corr (and zb times the row's sum rs)
IVIT_T_EPI inline __m512i corrected(const int32_t* acc, __m512i corr, __m512i zb, int32_t rs, bool zb_zero) {
  const __m512i a = _mm512_sub_epi32(_mm512_load_si512(acc), corr);
  return zb_zero ? a : _mm512_sub_epi32(a, _mm512_mullo_epi32(zb, _mm512_set1_epi32(rs)));
}

// QGemm's hi32 form before the clip: ((P >> 32) + rnd) >> (c - 32) in int32 lanes, P = acc * b the even
// columns' products e and the odd ones' o (int64 lanes), whose high dwords a blend gathers
IVIT_T_EPI inline __m512i hi32_value(__m512i e, __m512i o, __m512i rnd, __m512i sh32) {
  const __m512i h = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(e, 32), o);
  return _mm512_srav_epi32(_mm512_add_epi32(h, rnd), sh32);
}

// v * m of int64 lanes holding int32 values: one signed 32 x 32-bit product where m fits int32 (not wide)
IVIT_T_EPI inline __m512i mul_stage(__m512i v, __m512i m, bool wide) {
  return wide ? _mm512_mullo_epi64(v, m) : _mm512_mul_epi32(v, m);
}

// the lanes m of 16 values at r of type `code`, as int32 lanes
IVIT_T_EPI inline __m512i load16(const void* r, int code, __mmask16 m) {
  switch (code) {
    case I8: return _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, r));
    case U8: return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, r));
    case I16: return _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(m, r));
    default: return _mm512_maskz_loadu_epi32(m, r);
  }
}

// the lanes m of 16 bytes b to y (unmasked where all 16 are written)
IVIT_T_EPI inline void store_bytes16(__m128i b, void* y, __mmask16 m) {
  if (m == 0xFFFF) _mm_storeu_si128(static_cast<__m128i*>(y), b); else _mm_mask_storeu_epi8(y, m, b);
}

// the lanes m of 16 int32 lanes v to y as TO (truncating, as the scalar cast). The narrowed value stays a
// register (the empty asm) and a whole vector stores unmasked: GCC would otherwise fuse the two into vpmovdb
// to memory, which Zen 4 runs microcoded, at a fifth of the epilogue's time.
template <class TO>
IVIT_T_EPI inline void store16(__m512i v, TO* y, __mmask16 m) {
  if constexpr (sizeof(TO) == 1) {
    __m128i b = _mm512_cvtepi32_epi8(v);
    asm("" : "+v"(b));
    store_bytes16(b, y, m);
  } else if constexpr (sizeof(TO) == 2) {
    __m256i w = _mm512_cvtepi32_epi16(v);
    asm("" : "+v"(w));
    if (m == 0xFFFF) _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), w); else _mm256_mask_storeu_epi16(y, m, w);
  } else {
    _mm512_mask_storeu_epi32(y, m, v);
  }
}

// The epilogue of a whole tile (rows x cols accumulators, row stride nr, the rows' sums rowsum; y: row m0,
// column n0 of the output, row stride ldy), 16 columns at a time with their constants in registers across the
// rows. A row's 16 columns split even / odd into int64 lanes (vpmuldq reads a lane's low half: no widening
// shuffles); then acc * b + off as above, the clip on int64, the table (vpermt2b, or a gather), and the
// residual stage (vpmullq: the low 64 bits, exact mod 2**64).
template <bool HI32, bool HADD, class TO>
IVIT_T_EPI void epilogue_tile_avx512(const QGemm& g, const int32_t* tile, i64 nr, const int32_t* rowsum, i64 m0,
                                     i64 rows, i64 n0, i64 cols, const Resid& res, TO* y, i64 ldy) {
  const __m512i lo = _mm512_set1_epi64(g.qmin), hi = _mm512_set1_epi64(g.qmax);
  const __m512i qmin = _mm512_set1_epi32(static_cast<int32_t>(g.qmin));
  const __m512i qmax = _mm512_set1_epi32(static_cast<int32_t>(g.qmax));
  struct Consts {
    __m512i mv, mr, azs, alo, ahi, lo_z, hi_z, azy;
    __m128i ac, ac32;
  } cs[2];  // stages past g.stages unread (no zeroing: this runs once per tile)
  for (int i = 0; i < g.stages; ++i) {
    const Stage& t = g.st[i];
    cs[i] = {_mm512_set1_epi64(t.mv),
             _mm512_set1_epi64(t.mr),
             _mm512_set1_epi64(t.azs),
             _mm512_set1_epi64(t.alo),
             _mm512_set1_epi64(t.ahi),
             _mm512_set1_epi32(static_cast<int32_t>(t.alo - t.azy)),
             _mm512_set1_epi32(static_cast<int32_t>(t.ahi - t.azy)),
             _mm512_set1_epi32(static_cast<int32_t>(t.azy)),
             _mm_cvtsi64_si128(t.ac),
             _mm_cvtsi64_si128(!HADD ? 0 : t.pow2 ? t.pshift : t.ac - 32)};
  }
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const bool tab = !g.table.empty();
  const __m512i alo32 = _mm512_set1_epi32(static_cast<int32_t>(g.has_add ? g.last().alo : 0));
  __m512i t8[4], p8[4];  // read only where loaded
  for (int i = 0; i < 4; ++i) {
    if (g.vbmi_table) t8[i] = _mm512_load_si512(g.tab8 + 64 * i);
    if (g.vbmi_post) p8[i] = _mm512_load_si512(g.post8 + 64 * i);
  }
  const i64 rsize = g.r_code == I16 ? 2 : (g.r_code == I32 ? 4 : 1);
  for (i64 j = 0; j < cols; j += 16) {
    const i64 n = n0 + j;
    const __mmask16 mask = static_cast<__mmask16>(cols - j >= 16 ? 0xFFFF : (1u << (cols - j)) - 1);
    const __m512i corr = _mm512_loadu_si512(HI32 ? &g.corr2[n] : &g.corr[n]), zb = _mm512_loadu_si512(&g.zb[n]);
    const Pair mult = split(&g.mult[n]), off = split(&g.off[n]), sh = split(&g.shift[n]), zs = split(&g.zs[n]);
    __m512i rnd = qmin, sh32 = qmin;
    if constexpr (HI32) rnd = _mm512_loadu_si512(&g.rnd[n]), sh32 = _mm512_loadu_si512(&g.sh32[n]);
    Pair roff[2] = {off, off};
    for (int i = 0; i < g.stages; ++i) roff[i] = split(&g.st[i].vr_off[n]);
    for (i64 r = 0; r < rows; ++r) {
      const __m512i acc = corrected(tile + r * nr + j, corr, zb, rowsum[r], g.zb_zero);
      __m512i e = _mm512_mul_epi32(acc, mult.e), o = _mm512_mul_epi32(_mm512_srli_epi64(acc, 32), mult.o);
      __m512i v;  // the clipped values in int32 lanes (column order)
      if constexpr (HI32) {  // QGemm's hi32 form
        v = _mm512_min_epi32(_mm512_max_epi32(hi32_value(e, o, rnd, sh32), qmin), qmax);
        if (!HADD && g.has_add && !tab) e = even64(v), o = odd64(v);
      } else {
        e = _mm512_add_epi64(e, off.e), o = _mm512_add_epi64(o, off.o);
        e = _mm512_min_epi64(_mm512_max_epi64(_mm512_add_epi64(_mm512_srlv_epi64(e, sh.e), zs.e), lo), hi);
        o = _mm512_min_epi64(_mm512_max_epi64(_mm512_add_epi64(_mm512_srlv_epi64(o, sh.o), zs.o), lo), hi);
        v = HADD || !g.has_add || tab ? join32(e, o) : e;  // the residual stage without a table reads e, o
      }
      TO* yr = y + r * ldy + j;
      if (!g.has_add) {
        if constexpr (sizeof(TO) == 1) {
          if (g.vbmi_table) {
            store_bytes16(vbmi16(t8, _mm512_cvtepi32_epi8(_mm512_sub_epi32(v, qmin))), yr, mask);
            continue;
          }
        }
        store16(tab ? _mm512_i32gather_epi32(_mm512_sub_epi32(v, qmin), g.table.data(), 4) : v, yr, mask);
        continue;
      }
      if constexpr (HADD) {  // QGemm's hadd form: v and the sums in int32 lanes, column order
        __m512i w = v;
        if (tab) {  // v through the table (entries already v's type)
          const __m512i k = _mm512_sub_epi32(v, qmin);
          if (g.vbmi_table) {
            const __m128i b = vbmi16(t8, _mm512_cvtepi32_epi8(k));
            w = g.st[0].mid_code == I8 ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
          } else {
            w = _mm512_i32gather_epi32(k, g.table.data(), 4);
          }
        }
        __m512i rl = _mm512_setzero_si512(), rh = rl;  // the residual's columns 0-7 and 8-15 as int64
        if (g.add_act) {
          const i64 m = m0 + r, at = (m < res.rows ? m : m % res.rows) * g.n + n;
          const __m512i rv = load16(static_cast<const char*>(res.r) + at * rsize, g.r_code, mask);
          rl = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(rv));
          rh = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(rv, 1));
        }
        for (int i = 0; i < g.stages; ++i) {  // u = v * mv (+ r * mr) + r_off mod 2**64, in 64-bit lanes
          const Consts& k = cs[i];
          if (g.st[i].pow2) {  // Stage::pow2: (v + cst) >> (c - s)
            w = _mm512_sra_epi32(_mm512_add_epi32(w, _mm512_loadu_si512(&g.st[i].cst[n])), k.ac32);
            w = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(w, k.lo_z), k.hi_z), k.azy);
            continue;
          }
          const bool wide = g.st[i].wide;
          const i64* ro = &g.st[i].r_off[n];
          __m512i ul = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(w));
          __m512i uh = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(w, 1));
          ul = _mm512_add_epi64(mul_stage(ul, k.mv, wide), _mm512_loadu_si512(ro));
          uh = _mm512_add_epi64(mul_stage(uh, k.mv, wide), _mm512_loadu_si512(ro + 8));
          if (g.st[i].act) {
            ul = _mm512_add_epi64(ul, mul_stage(rl, k.mr, wide));
            uh = _mm512_add_epi64(uh, mul_stage(rh, k.mr, wide));
          }
          w = _mm512_sra_epi32(_mm512_permutex2var_epi32(ul, odd, uh), k.ac32);  // u >> 32, then >> (c - 32)
          w = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(w, k.lo_z), k.hi_z), k.azy);
        }
        if (g.post.empty()) {
          store16(w, yr, mask);
          continue;
        }
        const __m512i k = _mm512_sub_epi32(w, alo32);  // through the table after the stage
        if constexpr (sizeof(TO) == 1) {
          if (g.vbmi_post) {
            store_bytes16(vbmi16(p8, _mm512_cvtepi32_epi8(k)), yr, mask);
            continue;
          }
        }
        store16(_mm512_i32gather_epi32(k, g.post.data(), 4), yr, mask);
        continue;
      }
      if (tab) {  // v through the table (entries already v's type), as int32 lanes
        const __m512i k = _mm512_sub_epi32(v, qmin);
        __m512i w;
        if (g.vbmi_table) {
          const __m128i b = vbmi16(t8, _mm512_cvtepi32_epi8(k));
          w = g.st[0].mid_code == I8 ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
        } else {
          w = _mm512_i32gather_epi32(k, g.table.data(), 4);
        }
        e = even64(w), o = odd64(w);
      }
      __m512i re = _mm512_setzero_si512(), ro = re;
      if (g.add_act) {
        const i64 m = m0 + r, at = (m < res.rows ? m : m % res.rows) * g.n + n;
        const __m512i rv = load16(static_cast<const char*>(res.r) + at * rsize, g.r_code, mask);
        re = even64(rv), ro = odd64(rv);
      }
      for (int i = 0; i < g.stages; ++i) {  // each stage's v: the previous one's sums (int64 lanes)
        const Consts& k = cs[i];
        // v and r are int32 values: one signed 32 x 32-bit product each where the multipliers fit int32
        // (vpmuldq: one uop where vpmullq takes three on Intel), else the full 64-bit one
        const bool wide = g.st[i].wide;
        e = _mm512_add_epi64(mul_stage(e, k.mv, wide), roff[i].e);
        o = _mm512_add_epi64(mul_stage(o, k.mv, wide), roff[i].o);
        if (g.st[i].act) {
          e = _mm512_add_epi64(e, mul_stage(re, k.mr, wide));
          o = _mm512_add_epi64(o, mul_stage(ro, k.mr, wide));
        }
        e = _mm512_min_epi64(_mm512_max_epi64(_mm512_add_epi64(_mm512_srl_epi64(e, k.ac), k.azs), k.alo), k.ahi);
        o = _mm512_min_epi64(_mm512_max_epi64(_mm512_add_epi64(_mm512_srl_epi64(o, k.ac), k.azs), k.alo), k.ahi);
      }
      if (g.post.empty()) {
        store16(join32(e, o), yr, mask);
        continue;
      }
      const __m512i k = _mm512_sub_epi32(join32(e, o), alo32);  // through the table after the stage
      if constexpr (sizeof(TO) == 1) {
        if (g.vbmi_post) {
          store_bytes16(vbmi16(p8, _mm512_cvtepi32_epi8(k)), yr, mask);
          continue;
        }
      }
      store16(_mm512_i32gather_epi32(k, g.post.data(), 4), yr, mask);
    }
  }
}

// The epilogue of a whole tile for byte outputs without a residual stage (QGemm's hi32 form; a table only
// with VBMI: bytes48): a row's NV vectors of 16 columns at once, their constants in registers across the rows.
// The values narrow by saturating packs, exact as the clip's bounds (or the table's 256 indices) lie inside
// int16 and the output's type, so the clip runs on 32 words and one lookup and one store serve 48 columns;
// vpermd puts the packs' 128-bit lanes back in column order.
template <int NV, bool TAB, class TO>
IVIT_T_EPI void epilogue_bytes_avx512(const QGemm& g, const int32_t* tile, i64 nr, const int32_t* rowsum, i64 rows,
                                      i64 n0, i64 cols, TO* y, i64 ldy) {
  __m512i corr[NV], zb[NV], me[NV], mo[NV], rnd[NV], sh[NV];
  for (int v = 0; v < NV; ++v) {
    const i64 n = n0 + 16 * v;
    const Pair m = split(&g.mult[n]);
    corr[v] = _mm512_loadu_si512(&g.corr2[n]), zb[v] = _mm512_loadu_si512(&g.zb[n]), me[v] = m.e, mo[v] = m.o;
    rnd[v] = _mm512_loadu_si512(&g.rnd[n]), sh[v] = _mm512_loadu_si512(&g.sh32[n]);
  }
  const __m512i lo = _mm512_set1_epi16(static_cast<int16_t>(g.qmin));
  const __m512i hi = _mm512_set1_epi16(static_cast<int16_t>(g.qmax));
  const __m512i base = _mm512_set1_epi16(static_cast<int16_t>(TAB ? g.qmin : 0));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __m512i t8[4];  // read only with TAB
  for (int i = 0; i < 4 && TAB; ++i) t8[i] = _mm512_load_si512(g.tab8 + 64 * i);
  const __mmask64 mask = cols >= 64 ? ~__mmask64(0) : (__mmask64(1) << cols) - 1;
  const bool zb_zero = g.zb_zero;
  for (i64 r = 0; r < rows; ++r) {
    __m512i x[4];
    for (int v = 0; v < NV; ++v) {
      const __m512i acc = corrected(tile + r * nr + 16 * v, corr[v], zb[v], rowsum[r], zb_zero);
      const __m512i e = _mm512_mul_epi32(acc, me[v]), o = _mm512_mul_epi32(_mm512_srli_epi64(acc, 32), mo[v]);
      x[v] = hi32_value(e, o, rnd[v], sh[v]);
    }
    for (int v = NV; v < 4; ++v) x[v] = x[0];  // lanes past cols: not stored
    // in each 128-bit lane L, dword s of the packed bytes holds x[s]'s columns 4L .. 4L + 3
    __m512i w0 = _mm512_packs_epi32(x[0], x[1]), w1 = _mm512_packs_epi32(x[2], x[3]);
    w0 = _mm512_sub_epi16(_mm512_min_epi16(_mm512_max_epi16(w0, lo), hi), base);
    w1 = _mm512_sub_epi16(_mm512_min_epi16(_mm512_max_epi16(w1, lo), hi), base);
    __m512i b = TAB || std::is_same_v<TO, uint8_t> ? _mm512_packus_epi16(w0, w1) : _mm512_packs_epi16(w0, w1);
    if constexpr (TAB) b = vbmi64(t8, b);
    _mm512_mask_storeu_epi8(y + r * ldy, mask, _mm512_permutexvar_epi32(order, b));
  }
}

IVIT_T_AVX2 inline __m256i ld(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// clip(t, lo, hi) on int64 lanes (AVX2 has no 64-bit min / max)
IVIT_T_AVX2 inline __m256i clip64(__m256i t, __m256i lo, __m256i hi) {
  t = _mm256_blendv_epi8(t, hi, _mm256_cmpgt_epi64(t, hi));
  return _mm256_blendv_epi8(t, lo, _mm256_cmpgt_epi64(lo, t));
}

// p[n..n+8) (one int64 per column) as the even columns' 4 and the odd columns' 4
struct Pair4 {
  __m256i e, o;
};
IVIT_T_AVX2 inline Pair4 split4(const i64* p) {
  const __m256i a = ld(p), b = ld(p + 4);  // unpack: c0 c4 c2 c6 / c1 c5 c3 c7, then lanes 0 2 1 3
  return {_mm256_permute4x64_epi64(_mm256_unpacklo_epi64(a, b), 0xD8),
          _mm256_permute4x64_epi64(_mm256_unpackhi_epi64(a, b), 0xD8)};
}

// even / odd int64 lanes, each holding an int32's value, as 8 int32 lanes in column order
IVIT_T_AVX2 inline __m256i join8(__m256i e, __m256i o) {
  return _mm256_blend_epi32(e, _mm256_slli_epi64(o, 32), 0xAA);
}

// the `cols` (<= 8) values at r of type `code`, as int32 lanes (a short tail through a copy: no read past r)
IVIT_T_AVX2 inline __m256i load8(const void* r, int code, i64 cols) {
  alignas(32) int32_t v[8] = {};
  if (cols == 8) {
    switch (code) {
      case I8: return _mm256_cvtepi8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(r)));
      case U8: return _mm256_cvtepu8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(r)));
      case I16: return _mm256_cvtepi16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(r)));
      default: return ld(r);
    }
  }
  for (i64 j = 0; j < cols; ++j) {
    switch (code) {
      case I8: v[j] = static_cast<const int8_t*>(r)[j]; break;
      case U8: v[j] = static_cast<const uint8_t*>(r)[j]; break;
      case I16: v[j] = static_cast<const int16_t*>(r)[j]; break;
      default: v[j] = static_cast<const int32_t*>(r)[j]; break;
    }
  }
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(v));
}

// the first `cols` (<= 8) of 8 int32 lanes v to y as TO (truncating, as the scalar cast)
template <class TO>
IVIT_T_AVX2 inline void store8(__m256i v, TO* y, i64 cols) {
  __m128i w;
  if constexpr (sizeof(TO) == 4) {
    if (cols == 8) return _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), v);
  }
  if constexpr (sizeof(TO) == 1) {  // byte 0 of each lane
    const __m256i b = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                                              -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                                              -1, -1, -1, -1));
    w = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1)));
    if (cols == 8) return _mm_storel_epi64(reinterpret_cast<__m128i*>(y), w);
  } else if constexpr (sizeof(TO) == 2) {  // bytes 0, 1 of each lane
    const __m256i b = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1,
                                                              -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1,
                                                              -1, -1, -1, -1));
    w = _mm256_castsi256_si128(_mm256_permute4x64_epi64(b, 0x08));
    if (cols == 8) return _mm_storeu_si128(reinterpret_cast<__m128i*>(y), w);
  }
  alignas(32) TO t[32 / sizeof(TO)];
  if constexpr (sizeof(TO) == 4) _mm256_store_si256(reinterpret_cast<__m256i*>(t), v);
  else _mm_store_si128(reinterpret_cast<__m128i*>(t), w);
  for (i64 j = 0; j < cols; ++j) y[j] = t[j];
}

// the residual stage's constants
struct AddAvx2 {
  __m256i mvl, mvh, mrl, mrh, zs, lo, hi;
  __m128i c;
  __m256i lo_z, hi_z, zy;  // Stage::pow2's clip in int32 lanes: alo - azy, ahi - azy, azy
  __m128i pc;              // its shift, c - s
};

// the residual stage on v and r (int32 values in the int64 lanes' low halves; r: the residual, for an
// activation), off: its per-column offsets there
IVIT_T_AVX2 inline __m256i stage_avx2(const Stage& s, const AddAvx2& k, __m256i v, __m256i r, __m256i off) {
  __m256i t = _mm256_add_epi64(_mm256_mul_epi32(v, k.mvl), off);
  __m256i w = _mm256_mul_epi32(v, k.mvh);
  if (s.act) {
    t = _mm256_add_epi64(t, _mm256_mul_epi32(r, k.mrl));
    w = _mm256_add_epi64(w, _mm256_mul_epi32(r, k.mrh));
  }
  if (s.wide) t = _mm256_add_epi64(t, _mm256_slli_epi64(w, 31));
  return clip64(_mm256_add_epi64(_mm256_srl_epi64(t, k.c), k.zs), k.lo, k.hi);
}

// The AVX2 path's epilogue of a whole tile, as epilogue_tile_avx512's: 8 columns at a time with their
// constants held across the rows, even / odd columns in int64 lanes (vpmuldq reads a lane's low half), the
// clips by compare and blend; the residual stage multiplies by m = hi * 2**31 + lo as two signed 32 x 32-bit
// products where a multiplier is past int32 (add_wide), exact mod 2**64; tables by vpgatherdd.
template <bool HI32, class TO>
IVIT_T_AVX2 void epilogue_tile_avx2(const QGemm& g, const int32_t* tile, i64 nr, const int32_t* rowsum, i64 m0,
                                    i64 rows, i64 n0, i64 cols, const Resid& res, TO* y, i64 ldy) {
  const __m256i lo = _mm256_set1_epi64x(g.qmin), hi = _mm256_set1_epi64x(g.qmax);
  const __m256i qmin = _mm256_set1_epi32(static_cast<int32_t>(g.qmin));
  const __m256i qmax = _mm256_set1_epi32(static_cast<int32_t>(g.qmax));
  const __m256i alo32 = _mm256_set1_epi32(static_cast<int32_t>(g.has_add ? g.last().alo : 0));
  AddAvx2 ks[2] = {};
  for (int i = 0; i < g.stages; ++i) {
    const Stage& t = g.st[i];
    ks[i] = {_mm256_set1_epi64x(t.mv_lo),
             _mm256_set1_epi64x(t.mv_hi),
             _mm256_set1_epi64x(t.mr_lo),
             _mm256_set1_epi64x(t.mr_hi),
             _mm256_set1_epi64x(t.azs),
             _mm256_set1_epi64x(t.alo),
             _mm256_set1_epi64x(t.ahi),
             _mm_cvtsi64_si128(t.ac),
             _mm256_set1_epi32(static_cast<int32_t>(t.alo - t.azy)),
             _mm256_set1_epi32(static_cast<int32_t>(t.ahi - t.azy)),
             _mm256_set1_epi32(static_cast<int32_t>(t.azy)),
             _mm_cvtsi64_si128(t.pshift)};
  }
  const bool tab = !g.table.empty();
  const i64 rsize = g.r_code == I16 ? 2 : (g.r_code == I32 ? 4 : 1);
  for (i64 j = 0; j < cols; j += 8) {
    const i64 n = n0 + j, left = std::min<i64>(8, cols - j);
    const __m256i corr = ld(HI32 ? &g.corr2[n] : &g.corr[n]), zb = ld(&g.zb[n]);
    const Pair4 mult = split4(&g.mult[n]), off = split4(&g.off[n]), sh = split4(&g.shift[n]), zs = split4(&g.zs[n]);
    __m256i rnd = qmin, sh32 = qmin;
    if constexpr (HI32) rnd = ld(&g.rnd[n]), sh32 = ld(&g.sh32[n]);
    Pair4 roff[2] = {off, off};
    for (int i = 0; i < g.stages; ++i) roff[i] = split4(&g.st[i].vr_off[n]);
    for (i64 r = 0; r < rows; ++r) {
      __m256i acc = _mm256_sub_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(tile + r * nr + j)), corr);
      if (!g.zb_zero) acc = _mm256_sub_epi32(acc, _mm256_mullo_epi32(zb, _mm256_set1_epi32(rowsum[r])));
      __m256i e = _mm256_mul_epi32(acc, mult.e), o = _mm256_mul_epi32(_mm256_srli_epi64(acc, 32), mult.o);
      __m256i v;
      if constexpr (HI32) {  // QGemm's hi32 form
        v = _mm256_add_epi32(_mm256_blend_epi32(_mm256_srli_epi64(e, 32), o, 0xAA), rnd);
        v = _mm256_min_epi32(_mm256_max_epi32(_mm256_srav_epi32(v, sh32), qmin), qmax);
      } else {
        e = _mm256_add_epi64(e, off.e), o = _mm256_add_epi64(o, off.o);
        e = clip64(_mm256_add_epi64(_mm256_srlv_epi64(e, sh.e), zs.e), lo, hi);
        o = clip64(_mm256_add_epi64(_mm256_srlv_epi64(o, sh.o), zs.o), lo, hi);
        v = join8(e, o);
      }
      if (tab) v = _mm256_i32gather_epi32(g.table.data(), _mm256_sub_epi32(v, qmin), 4);
      TO* yr = y + r * ldy + j;
      if (!g.has_add) {
        store8(v, yr, left);
        continue;
      }
      __m256i rv = _mm256_setzero_si256();
      if (g.add_act) {
        const i64 m = m0 + r, at = (m < res.rows ? m : m % res.rows) * g.n + n;
        rv = load8(static_cast<const char*>(res.r) + at * rsize, g.r_code, left);
      }
      const __m256i ro = _mm256_srli_epi64(rv, 32);
      for (int i = 0; i < g.stages; ++i) {  // each stage's v: the previous one's sums
        const Stage& t = g.st[i];
        if (t.pow2) {  // Stage::pow2: (v + cst) >> (c - s), the clip, in int32 lanes
          const AddAvx2& k = ks[i];
          v = _mm256_sra_epi32(_mm256_add_epi32(v, ld(&t.cst[n])), k.pc);
          v = _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(v, k.lo_z), k.hi_z), k.zy);
          continue;
        }
        e = stage_avx2(t, ks[i], v, rv, roff[i].e);
        o = stage_avx2(t, ks[i], _mm256_srli_epi64(v, 32), ro, roff[i].o);
        v = join8(e, o);
      }
      if (!g.post.empty()) v = _mm256_i32gather_epi32(g.post.data(), _mm256_sub_epi32(v, alo32), 4);
      store8(v, yr, left);
    }
  }
}
#endif

#if IVIT_QGEMM_ARM
// v[0..cols) (cols a multiple of 4) clipped to qmin..qmax, as epilogue() computes them: acc * b + off with one
// widening multiply-add (smlal, mod 2**64 as the scalar int64 arithmetic), an arithmetic shift (sshl by -c),
// + zy, the clip on int64, then narrowed (qmin, qmax being int32)
void rescale_neon(const QGemm& g, const int32_t* dot, int32_t rowsum, i64 n0, i64 cols, int32_t* v) {
  const int32x4_t rs = vdupq_n_s32(rowsum);
  const int64x2_t lo = vdupq_n_s64(g.qmin), hi = vdupq_n_s64(g.qmax), zy = vdupq_n_s64(g.zy);
  for (i64 j = 0; j < cols; j += 4) {
    const i64 n = n0 + j;
    int32x4_t acc = vsubq_s32(vld1q_s32(dot + j), vld1q_s32(&g.corr[n]));
    acc = vmlsq_s32(acc, vld1q_s32(&g.zb[n]), rs);
    int32x2_t part[2];
    for (int half = 0; half < 2; ++half) {
      const i64 m = n + 2 * half;
      const int32x2_t b = vmovn_s64(vld1q_s64(&g.mult[m]));
      int64x2_t t = vmlal_s32(vld1q_s64(&g.off[m]), half ? vget_high_s32(acc) : vget_low_s32(acc), b);
      t = vaddq_s64(vshlq_s64(t, vnegq_s64(vld1q_s64(&g.shift[m]))), zy);
      t = vbslq_s64(vcgtq_s64(t, hi), hi, t);
      part[half] = vmovn_s64(vbslq_s64(vcltq_s64(t, lo), lo, t));
    }
    vst1q_s32(v + j, vcombine_s32(part[0], part[1]));
  }
}

// the residual stage on v[0..cols) in place (cols even; v inside its type), r the residual's values
// (activations) or null: smlal (exact products, sums mod 2**64), an arithmetic shift, the clip on int64
void add_neon(const Stage& g, int32_t* v, const int32_t* r, i64 n0, i64 cols) {
  const int32x2_t mvl = vdup_n_s32(static_cast<int32_t>(g.mv_lo)), mvh = vdup_n_s32(static_cast<int32_t>(g.mv_hi));
  const int32x2_t mrl = vdup_n_s32(static_cast<int32_t>(g.mr_lo)), mrh = vdup_n_s32(static_cast<int32_t>(g.mr_hi));
  const int64x2_t lo = vdupq_n_s64(g.alo), hi = vdupq_n_s64(g.ahi), zy = vdupq_n_s64(g.azy);
  const int64x2_t nc = vdupq_n_s64(-g.ac);
  for (i64 j = 0; j < cols; j += 2) {
    const int32x2_t vv = vld1_s32(v + j);
    int64x2_t t = vmlal_s32(vld1q_s64(&g.vr_off[n0 + j]), vv, mvl);
    int64x2_t wide = vmull_s32(vv, mvh);
    if (r) {
      const int32x2_t rr = vld1_s32(r + j);
      t = vmlal_s32(t, rr, mrl);
      wide = vmlal_s32(wide, rr, mrh);
    }
    if (g.wide) t = vaddq_s64(t, vshlq_n_s64(wide, 31));
    t = vaddq_s64(vshlq_s64(t, nc), zy);
    t = vbslq_s64(vcgtq_s64(t, hi), hi, t);
    vst1_s32(v + j, vmovn_s64(vbslq_s64(vcltq_s64(t, lo), lo, t)));
  }
}
#endif

#if IVIT_QGEMM_ARM
// epilogue through the NEON rescale: v, then the cast (or the table), which the compiler vectorizes; with the
// residual stage, the table, then the vector stage, then the cast (and the table after it)
template <class TO>
void epilogue_fast(const QGemm& g, const int32_t* dot, int32_t rowsum, i64 n0, i64 cols, const int32_t* rv,
                   TO* __restrict y) {
  alignas(64) int32_t v[48];
  rescale_neon(g, dot, rowsum, n0, g.lay.nr, v);
  const int32_t* tab = g.table.empty() ? nullptr : g.table.data() - g.qmin;
  if (!g.has_add) {
    for (i64 j = 0; j < cols; ++j) y[j] = static_cast<TO>(tab ? tab[v[j]] : v[j]);
    return;
  }
  if (tab)
    for (i64 j = 0; j < g.lay.nr; ++j) v[j] = tab[v[j]];
  for (int i = 0; i < g.stages; ++i) add_neon(g.st[i], v, g.st[i].act ? rv : nullptr, n0, g.lay.nr);
  const int32_t* post = g.post.empty() ? nullptr : g.post.data() - g.last().alo;
  for (i64 j = 0; j < cols; ++j) y[j] = static_cast<TO>(post ? post[v[j]] : v[j]);
}
#endif

// the residual activation's values at row m, columns n0..n0+cols, as int32 (zeros up to lay.nr)
template <class T>
void widen(const T* __restrict r, i64 cols, i64 nr, int32_t* __restrict rv) {
  for (i64 j = 0; j < cols; ++j) rv[j] = r[j];
  for (i64 j = cols; j < nr; ++j) rv[j] = 0;
}

// one row's columns n0..n0+cols of a tile (row m of the output): the vector epilogue where it applies, else the
// scalar one, with the residual activation's row (if any) widened first
template <class TO>
void epilogue_row(const QGemm& g, const int32_t* dot, int32_t rowsum, i64 m, i64 n0, i64 cols, const Resid& res,
                  TO* y) {
  alignas(64) int32_t rv[48];
  const int32_t* r = nullptr;
  if (g.add_act) {
    const i64 at = (m < res.rows ? m : m % res.rows) * g.n + n0;
    switch (g.r_code) {
      case I8: widen(static_cast<const int8_t*>(res.r) + at, cols, g.lay.nr, rv); break;
      case U8: widen(static_cast<const uint8_t*>(res.r) + at, cols, g.lay.nr, rv); break;
      case I16: widen(static_cast<const int16_t*>(res.r) + at, cols, g.lay.nr, rv); break;
      default: widen(static_cast<const int32_t*>(res.r) + at, cols, g.lay.nr, rv); break;
    }
    r = rv;
  }
#if IVIT_QGEMM_ARM
  if (g.fast) return epilogue_fast(g, dot, rowsum, n0, cols, r, y);
#endif
  epilogue(g, dot, rowsum, n0, cols, r, y);
}

// y[r][j] = acc of row r, column n0 + j (the identity epilogue: the top's acc, mod 2**32, no rescale)
void identity_rows(const QGemm& g, const int32_t* tile, i64 nr, const int32_t* rowsum, i64 rows, i64 n0, i64 cols,
                   int32_t* y, i64 ldy) {
  const uint32_t* corr = reinterpret_cast<const uint32_t*>(g.corr.data()) + n0;
  const uint32_t* zb = reinterpret_cast<const uint32_t*>(g.zb.data()) + n0;
  for (i64 r = 0; r < rows; ++r) {
    const uint32_t* dot = reinterpret_cast<const uint32_t*>(tile + r * nr);
    uint32_t* out = reinterpret_cast<uint32_t*>(y + r * ldy);
    if (g.zb_zero) {
      for (i64 j = 0; j < cols; ++j) out[j] = dot[j] - corr[j];
    } else {
      const uint32_t rs = static_cast<uint32_t>(rowsum[r]);
      for (i64 j = 0; j < cols; ++j) out[j] = dot[j] - zb[j] * rs - corr[j];
    }
  }
}

// ------------------------------------------------------------------------------------------------- driver

constexpr i64 MC = 48;   // rows per task: a multiple of every lay.mr (4, 6, 8)
constexpr i64 KC = 256;  // packed k per block (a multiple of every kstep)
constexpr i64 NC = 192;  // columns per task (rounded to whole tiles)

template <class TO>
void run_chunk(const QGemm& g, const void* a_raw, i64 lda, i64 m0, i64 m1, i64 total, i64 t0, i64 t1,
               const Resid& res, TO* y, i64 ldy) {
  const Layout L = g.lay;
  const i64 kp = g.kp, rows = m1 - m0, padded = (rows + L.mr - 1) / L.mr * L.mr;
  thread_local std::vector<int16_t> a16;
  thread_local std::vector<uint8_t> a8;
  int32_t rowsum[MC];
  alignas(64) int32_t tile[MC * 48];  // the chunk's accumulators of one tile
  // pack the rows of A as the path wants them (zero rows and zero k past the end) and sum them
  const bool byte = bytes(g.isa), sbytes = signed_bytes(g.isa);  // a' as uint8 (VNNI) or int8 (sdot, smmla)
  // only the padding needs zeros: the k past K of each row, and the rows past the last
  if (byte) a8.resize(padded * kp); else a16.resize(padded * kp);
  uint8_t* __restrict p8 = a8.data();
  int16_t* __restrict p16 = a16.data();
  const i64 k = g.k;
  // rows already in the path's encoding (VNNI: uint8, sdot and smmla: int8) are read in place (but for a last,
  // partial block of rows); the others are re-encoded by flipping bit 7 (+-128). Where K is not a multiple of
  // kalign, a row read in place reads kp - K < kalign <= K <= lda bytes past its end: the next row's, times the
  // packed B's zero rows past K, so they add nothing; the block holding A's last row (nothing after it) is copied.
  const bool flip = byte && g.a_code == (sbytes ? 1 : 0);
  const bool direct = byte && !flip && (kp == k || (k >= L.kalign && lda >= k));
  i64 in_place = direct ? rows / L.mr * L.mr : 0;
  if (direct && kp != k && m1 == total) in_place = std::min(in_place, (rows - 1) / L.mr * L.mr);
  const uint8_t* a_rows = static_cast<const uint8_t*>(a_raw) + m0 * lda;
  auto byte_sum = [sbytes](const uint8_t* v, i64 n) {
    int32_t s = 0;
    if (sbytes)
      for (i64 j = 0; j < n; ++j) s += static_cast<int8_t>(v[j]);
    else
      for (i64 j = 0; j < n; ++j) s += v[j];
    return s;
  };
  for (i64 r = 0; r < padded; ++r) {
    uint8_t* d8 = p8 + r * kp;
    int16_t* d16 = p16 + r * kp;
    if (r >= rows) {
      if (byte) std::memset(d8, 0, kp); else std::memset(d16, 0, kp * 2);
      continue;
    }
    int32_t s = 0;  // the row sums only matter where zb is not 0
    if (r < in_place) {
      if (!g.zb_zero) s = byte_sum(a_rows + r * lda, k);
    } else if (byte) {
      const uint8_t* src = static_cast<const uint8_t*>(a_raw) + (m0 + r) * lda;
      if (flip) {
        for (i64 j = 0; j < k; ++j) d8[j] = src[j] ^ 0x80;
      } else {
        std::memcpy(d8, src, k);
      }
      for (i64 j = k; j < kp; ++j) d8[j] = 0;
      s = byte_sum(d8, k);
    } else {
      if (g.a_code == 0) {
        const int8_t* src = static_cast<const int8_t*>(a_raw) + (m0 + r) * lda;
        for (i64 j = 0; j < k; ++j) d16[j] = src[j];
      } else {
        const uint8_t* src = static_cast<const uint8_t*>(a_raw) + (m0 + r) * lda;
        for (i64 j = 0; j < k; ++j) d16[j] = src[j];
      }
      for (i64 j = k; j < kp; ++j) d16[j] = 0;
      for (i64 j = 0; j < k; ++j) s += d16[j];
    }
    rowsum[r] = s;
  }
  // K in blocks of KC, so that a block of the weight tile and of the rows stay in L1 across the row blocks
  // (AMX: K whole, its accumulators staying in their tiles; the weight tile streams from L2 at any K)
  const i64 kc = kp <= 3 * KC / 2 || g.isa == AMX ? kp : KC;
#if IVIT_QGEMM_AMX
  struct Tiles {  // AMX: the palette loaded for this chunk, released after it
    bool on;
    explicit Tiles(bool amx) : on(amx) { if (on) amx_begin(); }
    ~Tiles() { if (on) amx_end(); }
  } tiles_in_use(g.isa == AMX);
#endif
  for (i64 t = t0; t < t1; ++t) {
    const i64 n0 = t * L.nr, cols = std::min<i64>(L.nr, g.n - n0);
    for (i64 k0 = 0; k0 < kp; k0 += kc) {
      const i64 klen = std::min(kc, kp - k0);
      for (i64 r0 = 0; r0 < padded; r0 += L.mr) {
        int32_t* out = tile + r0 * L.nr;
        switch (g.isa) {
#if IVIT_QGEMM_X86
          case VNNI:
          case AMX: {  // the tile's 1-3 vectors of 16 columns with any in it, on vpdpbusd or tdpbusd
            using Micro = void (*)(const uint8_t*, i64, i64, const int8_t*, int32_t*, bool);
#if IVIT_QGEMM_AMX
            static constexpr Micro AMX_K[] = {micro_amx<1>, micro_amx<2>, micro_amx<3>};
#else
            static constexpr Micro AMX_K[] = {nullptr, nullptr, nullptr};  // never packed without AMX
#endif
            static constexpr Micro VNNI_K[] = {micro_vnni<1>, micro_vnni<2>, micro_vnni<3>};
            const uint8_t* ar = r0 < in_place ? a_rows + r0 * lda + k0 : p8 + r0 * kp + k0;
            const i64 ld = r0 < in_place ? lda : kp;
            const i64 nv = (cols + 15) / 16;
            (g.isa == AMX ? AMX_K : VNNI_K)[nv - 1](ar, ld, klen, g.b8.data() + (t * kp + k0) * 48, out, k0 > 0);
            break;
          }
          case AVX2: micro_avx2(p16 + r0 * kp + k0, kp, klen, g.b16.data() + (t * kp + k0) * 16, out, k0 > 0); break;
#endif
#if IVIT_QGEMM_ARM
          case NEON: micro_neon(p16 + r0 * kp + k0, kp, klen, g.b16.data() + (t * kp + k0) * 16, out, k0 > 0); break;
          case DOTPROD:
            micro_dot(reinterpret_cast<const int8_t*>(r0 < in_place ? a_rows + r0 * lda : p8 + r0 * kp) + k0,
                      r0 < in_place ? lda : kp, klen,
                      g.b8.data() + (t * kp + k0) * 16, out, k0 > 0);
            break;
          case I8MM:
            micro_i8mm(reinterpret_cast<const int8_t*>(r0 < in_place ? a_rows + r0 * lda : p8 + r0 * kp) + k0,
                       r0 < in_place ? lda : kp, klen,
                       g.b8.data() + (t * kp + k0) * 16, out, k0 > 0);
            break;
#endif
          default:
            micro_portable<4>(p16 + r0 * kp + k0, kp, klen, g.b16.data() + (t * kp + k0) * 16, out, k0 > 0);
            break;
        }
      }
    }
    if constexpr (std::is_same_v<TO, int32_t>) {
      if (g.identity) {
        identity_rows(g, tile, L.nr, rowsum, rows, n0, cols, y + m0 * ldy + n0, ldy);
        continue;
      }
    }
#if IVIT_QGEMM_X86
    if (g.fast && (vnni_like(g.isa) || g.isa == AVX2)) {
      TO* yt = y + m0 * ldy + n0;
      if constexpr (sizeof(TO) == 1) {
        if (g.bytes48) {  // byte outputs without a residual stage: a row's 48 columns at a time
          using Epi = void (*)(const QGemm&, const int32_t*, i64, const int32_t*, i64, i64, i64, TO*, i64);
          static constexpr Epi PLAIN[] = {epilogue_bytes_avx512<1, false, TO>, epilogue_bytes_avx512<2, false, TO>,
                                          epilogue_bytes_avx512<3, false, TO>};
          static constexpr Epi TABLE[] = {epilogue_bytes_avx512<1, true, TO>, epilogue_bytes_avx512<2, true, TO>,
                                          epilogue_bytes_avx512<3, true, TO>};
          (g.vbmi_table ? TABLE : PLAIN)[(cols + 15) / 16 - 1](g, tile, L.nr, rowsum, rows, n0, cols, yt, ldy);
          continue;
        }
      }
      if (vnni_like(g.isa)) {
        if (g.hi32 && g.hadd) epilogue_tile_avx512<true, true>(g, tile, L.nr, rowsum, m0, rows, n0, cols, res, yt, ldy);
        else if (g.hi32) epilogue_tile_avx512<true, false>(g, tile, L.nr, rowsum, m0, rows, n0, cols, res, yt, ldy);
        else if (g.hadd) epilogue_tile_avx512<false, true>(g, tile, L.nr, rowsum, m0, rows, n0, cols, res, yt, ldy);
        else epilogue_tile_avx512<false, false>(g, tile, L.nr, rowsum, m0, rows, n0, cols, res, yt, ldy);
      } else {
        if (g.hi32) epilogue_tile_avx2<true>(g, tile, L.nr, rowsum, m0, rows, n0, cols, res, yt, ldy);
        else epilogue_tile_avx2<false>(g, tile, L.nr, rowsum, m0, rows, n0, cols, res, yt, ldy);
      }
      continue;
    }
#endif
    for (i64 r = 0; r < rows; ++r)
      epilogue_row(g, tile + r * L.nr, rowsum[r], m0 + r, n0, cols, res, y + (m0 + r) * ldy + n0);
  }
}

template <class TO>
void run_all(const QGemm& g, const void* a, i64 lda, i64 rows, const Resid& res, TO* y, i64 ldy, int threads) {
  // tasks: MC rows by about NC columns (whole tiles), small enough to balance a busy pool
  const i64 per = std::max<i64>(1, NC / g.lay.nr), groups = (g.tiles + per - 1) / per;
  const i64 chunks = (rows + MC - 1) / MC * groups;
  struct Task {
    const QGemm* g;
    const void* a;
    i64 lda, rows, per, groups;
    Resid res;
    TO* y;
    i64 ldy;
  } task{&g, a, lda, rows, per, groups, res, y, ldy};
  auto one = [](void* data, size_t c) {
    const Task& t = *static_cast<Task*>(data);
    const i64 m0 = static_cast<i64>(c) / t.groups * MC, t0 = static_cast<i64>(c) % t.groups * t.per;
    run_chunk(*t.g, t.a, t.lda, m0, std::min(t.rows, m0 + MC), t.rows, t0, std::min(t.g->tiles, t0 + t.per), t.res,
              t.y, t.ldy);
  };
  const ivit::ParallelHook hook = ivit::parallel_hook();
  if (chunks <= 1) {
    for (i64 c = 0; c < chunks; ++c) one(&task, c);
  } else if (hook.run) {
    hook.run(hook.ctx, one, static_cast<size_t>(chunks), &task);
  } else {
    const int nt = static_cast<int>(std::min<i64>(std::max(threads, 1), chunks));
    std::atomic<i64> next{0};
    auto worker = [&] {
      for (i64 c; (c = next++) < chunks;) one(&task, static_cast<size_t>(c));
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < nt; ++t) pool.emplace_back(worker);
    worker();
    for (auto& th : pool) th.join();
  }
}

// ------------------------------------------------------------------------------------------- self-check

// One probe at the worst cases: A at its extremes (and zero point), B at -128 and 127, K odd and large
// enough for the int16/int32 partial sums to reach their largest, per-column zb; y = acc - zx in int32.
std::string probe(int isa, int a_code) {
  const i64 M = 13, K = 1031, N = 37;
  std::vector<int8_t> b(K * N);
  std::vector<uint8_t> a(M * K);
  for (i64 i = 0; i < K * N; ++i) b[i] = static_cast<int8_t>(i % 5 == 1 ? 127 : (i % 7 == 3 ? 3 : -128));
  const uint8_t hi = a_code == 0 ? 0x80 : 0xFF, other = a_code == 0 ? 0x7F : 0x00;  // -128 / 255; 127 / 0
  for (i64 i = 0; i < M * K; ++i) a[i] = (i / K) % 3 == 2 ? other : (i % 11 == 5 ? other : hi);
  std::vector<i64> zb(N), zx(N), ones(N, 1), zero(N, 0);
  for (i64 j = 0; j < N; ++j) zb[j] = j % 3 == 0 ? 127 : (j % 3 == 1 ? -128 : 0), zx[j] = j * 1000 - 7;
  const i64 za = a_code == 0 ? 127 : 0;
  const char* err = nullptr;
  void* g = ivit_qgemm_create(isa, a_code, K, N, b.data(), zb.data(), N, za, zx.data(), ones.data(), zero.data(),
                              N, 0, INT32_MIN, INT32_MAX, nullptr, I32, &err);
  if (!g) return err;
  std::vector<int32_t> y(M * N);
  ivit_qgemm_run(g, a.data(), M, y.data(), 1);
  ivit_qgemm_destroy(g);
  for (i64 m = 0; m < M; ++m)
    for (i64 j = 0; j < N; ++j) {
      i64 s = 0;
      for (i64 k = 0; k < K; ++k) {
        const i64 av = a_code == 0 ? static_cast<int8_t>(a[m * K + k]) : a[m * K + k];
        s += (av - za) * (b[k * N + j] - zb[j]);
      }
      const i64 want = static_cast<int32_t>(static_cast<uint32_t>(s)) - zx[j];
      if (y[m * N + j] != static_cast<int32_t>(want))
        return "gave " + std::to_string(y[m * N + j]) + " instead of " + std::to_string(want);
    }
  return "";
}

// The residual stage at its edges, on the vector stage where the path has one: uint8 A, Requantize to int8 at
// its clip bounds (form 0: an int8 activation residual, v the IAdd's a, multipliers at +-2**31; form 1: through
// an int8 table, per-column constant residuals, multipliers past int32 as the converter's, a uint8 sum), sums
// that saturate; against int64 loops.
std::string probe_add(int isa, int form) {
  const i64 M = 11, K = 67, N = 53;
  std::vector<int8_t> b(K * N), r(M * N);
  std::vector<uint8_t> a(M * K);
  for (i64 i = 0; i < K * N; ++i) b[i] = static_cast<int8_t>((i * 7) % 256 - 128);
  for (i64 i = 0; i < M * K; ++i) a[i] = static_cast<uint8_t>((i * 13 + i / K * 29) % 256);
  for (i64 i = 0; i < M * N; ++i) r[i] = static_cast<int8_t>((i * 71) % 256 - 128);
  std::vector<i64> zx(N), mult(N), shift(N), rc(N), zb(1, 0);
  std::vector<int32_t> table(256);
  for (i64 j = 0; j < N; ++j)
    zx[j] = j * 37 - 500, mult[j] = (j % 2 ? 1 : -1) * (12345 + j * 1001), shift[j] = 12 + j % 5, rc[j] = j * 5 - 128;
  for (i64 i = 0; i < 256; ++i) table[i] = static_cast<int32_t>((i * 37) % 256 - 128);
  const IvitQGemmAdd add = form == 0 ? IvitQGemmAdd{I8, nullptr, 0, 5, INT32_MAX - 8, -7, INT32_MIN, 32, 2, -128, 127, I8}
                                     : IvitQGemmAdd{-1, rc.data(), N, -3, (i64(1) << 50) - 3, 4, (i64(3) << 49) + 7,
                                                    50, 100, 0, 255, U8};
  const char* err = nullptr;
  void* g = ivit_qgemm_create_add(isa, 1, K, N, b.data(), zb.data(), 1, 3, zx.data(), mult.data(), shift.data(), N,
                                  -3, -128, 127, form ? table.data() : nullptr, I8, &add, &err);
  if (!g) return err;
  std::vector<uint8_t> y(M * N);
  const int bad = ivit_qgemm_run_add(g, a.data(), M, form ? nullptr : r.data(), M, y.data(), 1);
  ivit_qgemm_destroy(g);
  if (bad) return "the residual run failed";
  for (i64 m = 0; m < M; ++m)
    for (i64 j = 0; j < N; ++j) {
      i64 s = 0;
      for (i64 k = 0; k < K; ++k) s += (a[m * K + k] - i64(3)) * b[k * N + j];
      const i64 h = i64(1) << (shift[j] - 1);
      i64 v = std::min<i64>(127, std::max<i64>(-128, (((s - zx[j]) * mult[j] + h) >> shift[j]) - 3));
      if (form) v = table[v + 128];
      const i64 rv = form ? rc[j] : r[m * N + j];
      const i64 u = ((v - add.zv) * add.mv + (rv - add.zr) * add.mr + (i64(1) << (add.shift - 1))) >> add.shift;
      const i64 want = std::min(add.qmax, std::max(add.qmin, u + add.zy));
      const i64 got = form ? i64(y[m * N + j]) : i64(static_cast<int8_t>(y[m * N + j]));
      if (got != want)
        return "gave " + std::to_string(got) + " instead of " + std::to_string(want) + " with a residual";
    }
  return "";
}

}  // namespace

extern "C" {

int ivit_qgemm_supported(int isa) { return isa >= PORTABLE && isa <= LAST && cpu_has(isa) ? 1 : 0; }

int ivit_qgemm_usable(int isa) {
  ivit::check_qgemm();
  return ivit_qgemm_supported(isa) && !(g_refused.load() & (1 << isa)) ? 1 : 0;
}

void* ivit_qgemm_create(int isa, int a_code, int64_t k, int64_t n, const int8_t* b, const int64_t* zb, int64_t nzb,
                        int64_t za, const int64_t* zx, const int64_t* mult, const int64_t* shift, int64_t nch,
                        int64_t zy, int64_t qmin, int64_t qmax, const int32_t* table, int out_code,
                        const char** err) {
  return ivit_qgemm_create_add(isa, a_code, k, n, b, zb, nzb, za, zx, mult, shift, nch, zy, qmin, qmax, table,
                               out_code, nullptr, err);
}

void* ivit_qgemm_create_add(int isa, int a_code, int64_t k, int64_t n, const int8_t* b, const int64_t* zb,
                            int64_t nzb, int64_t za, const int64_t* zx, const int64_t* mult, const int64_t* shift,
                            int64_t nch, int64_t zy, int64_t qmin, int64_t qmax, const int32_t* table,
                            int out_code, const IvitQGemmAdd* add, const char** err) {
  isa = pick(isa);
  auto fail = [&](const char* why) -> void* {
    *err = why;
    return nullptr;
  };
  if (isa < PORTABLE || isa > LAST)
    return fail("IVIT_GEMM_ISA must be portable, avx2, vnni, amx, neon, dotprod or i8mm");
  if (!cpu_has(isa)) return fail("this CPU lacks the instruction set of the GEMM path asked for");
  if (a_code != 0 && a_code != 1) return fail("A must be int8 or uint8");
  if (out_code < I8 || out_code > I32) return fail("the output must be int8, uint8, int16 or int32");
  if (k < 1 || n < 1) return fail("K and N must be at least 1");
  if ((nzb != 1 && nzb != n) || (nch != 1 && nch != n)) return fail("parameters must be per tensor or per column");
  if (qmin > qmax) return fail("qmin must not exceed qmax");
  if (table && qmax - qmin >= (i64(1) << 24)) return fail("the table would be too large");
  for (i64 j = 0; j < nch; ++j)
    if (shift[j] < 0 || shift[j] > 62) return fail("shifts must be in 0..62");
  const IvitQGemmAdd* adds[2] = {add, add ? add->then : nullptr};
  for (const IvitQGemmAdd* a : adds) {
    if (!a) continue;
    if (a->r_code < -1 || a->r_code > I32) return fail("the residual must be int8, uint8, int16 or int32");
    if (a->r_code < 0 && (!a->r_const || (a->r_size != 1 && a->r_size != n)))
      return fail("a constant residual must have 1 or N values");
    if (a->out_code < I8 || a->out_code > I32) return fail("the sum must be int8, uint8, int16 or int32");
    if (a->post && (a->post_code < I8 || a->post_code > I32))
      return fail("the table after the sum must be int8, uint8, int16 or int32");
    if (a->post && a->qmax - a->qmin >= (i64(1) << 16))
      return fail("the table after the sum takes at most 65536 entries (the sum's qmin..qmax)");
    if (a->shift < 0 || a->shift > 62) return fail("the residual's shift must be in 0..62");
    if (a->qmin > a->qmax) return fail("the residual's qmin must not exceed its qmax");
  }
  if (adds[1] && (adds[1]->then || adds[0]->post))
    return fail("two IAdd stages at most, a table only after the last");
  if (adds[1] && adds[0]->r_code >= 0 && adds[1]->r_code >= 0)
    return fail("one IAdd stage at most may read an activation");
  auto g = std::make_unique<QGemm>();
  g->isa = isa, g->a_code = a_code, g->out_code = out_code, g->k = k, g->n = n, g->lay = layout(isa);
  g->kp = (k + g->lay.kalign - 1) / g->lay.kalign * g->lay.kalign;
  g->tiles = (n + g->lay.nr - 1) / g->lay.nr;
  g->za_enc = vnni_like(isa) && a_code == 0 ? za + 128 : (signed_bytes(isa) && a_code == 1 ? za - 128 : za);
  g->zy = zy, g->qmin = qmin, g->qmax = qmax;
  const i64 nr = g->lay.nr, kstep = g->lay.kstep, kp = g->kp;
  if (bytes(isa)) g->b8.assign(g->tiles * kp * nr, 0); else g->b16.assign(g->tiles * kp * nr, 0);
  for (i64 kk = 0; kk < k; ++kk)
    for (i64 j = 0; j < n; ++j) {
      const i64 t = j / nr, at = t * kp * nr + (kk / kstep) * nr * kstep + (j % nr) * kstep + kk % kstep;
      if (bytes(isa)) g->b8[at] = b[kk * n + j]; else g->b16[at] = b[kk * n + j];
    }
  for (i64 j = 0; j < n; ++j) {
    uint32_t colsum = 0;
    for (i64 kk = 0; kk < k; ++kk) colsum += static_cast<uint32_t>(static_cast<int32_t>(b[kk * n + j]));
    const uint32_t zbj = static_cast<uint32_t>(zb[nzb == 1 ? 0 : j]), zae = static_cast<uint32_t>(g->za_enc);
    g->zb.push_back(static_cast<int32_t>(zbj));
    g->corr.push_back(static_cast<int32_t>(zae * colsum - static_cast<uint32_t>(k) * zae * zbj));
    const i64 c = shift[nch == 1 ? 0 : j];
    g->zx.push_back(zx[nch == 1 ? 0 : j]);
    g->mult.push_back(mult[nch == 1 ? 0 : j]);
    g->shift.push_back(c);
    g->half.push_back(c ? i64(1) << (c - 1) : 0);
  }
  if (table) g->table.assign(table, table + (qmax - qmin + 1));
  if (add)  // the residual stage reads v as its type: the table's entries cast to it, once
    for (int32_t& e : g->table) e = static_cast<int32_t>(as_type(e, out_code));
  if (table && vnni_like(isa) && (out_code == I8 || out_code == U8) && qmax - qmin < 256 && cpu_vbmi()) {
    for (i64 i = 0; i <= qmax - qmin; ++i) g->tab8[i] = static_cast<uint8_t>(table[i]);
    g->vbmi_table = true;
  }
  g->fast = isa != PORTABLE && qmin >= INT32_MIN && qmax <= INT32_MAX && (!vnni_like(isa) || cpu_dq());
  const i64 padded = g->tiles * nr;  // the vector epilogue reads whole tiles (padding columns: unused)
  if (add) {
    auto fits = [](i64 v) { return v >= INT32_MIN && v <= INT32_MAX; };
    auto fits62 = [](i64 v) { return v >= -(i64(1) << 62) && v < (i64(1) << 62); };
    g->has_add = true, g->stages = adds[1] ? 2 : 1, g->add_fast = true;
    for (int i = 0; i < g->stages; ++i) {
      const IvitQGemmAdd* a = adds[i];
      Stage& t = g->st[i];
      const i64 c = a->shift;
      // v: the Requantize's (table's) output, or the first stage's sum, which the vector stage takes as it is
      // only where it lies inside its type (else the scalar epilogue casts it)
      t.act = a->r_code >= 0, t.mid_code = i ? adds[0]->out_code : out_code;
      if (t.act) g->add_act = true, g->r_code = a->r_code;
      t.mv = a->mv, t.mr = a->mr, t.ac = c, t.azy = a->zy, t.alo = a->qmin, t.ahi = a->qmax;
      t.azs = static_cast<i64>(static_cast<uint64_t>(a->zy) - (uint64_t(1) << (63 - c)));
      const i64 base = (c ? i64(1) << (c - 1) : 0) - a->zv * a->mv - a->zr * a->mr;  // mod 2**64
      for (i64 j = 0; j < padded; ++j) {
        const i64 rj = t.act || j >= n ? 0 : a->r_const[a->r_size == 1 ? 0 : j];
        t.r_off.push_back(base + rj * a->mr);
        t.vr_off.push_back(static_cast<i64>(static_cast<uint64_t>(t.r_off[j]) ^ (arm(isa) ? 0 : uint64_t(1) << 63)));
      }
      t.wide = !fits(a->mv) || !fits(a->mr);
      t.mv_lo = t.wide ? a->mv & INT32_MAX : a->mv, t.mv_hi = t.wide ? a->mv >> 31 : 0;
      t.mr_lo = t.wide ? a->mr & INT32_MAX : a->mr, t.mr_hi = t.wide ? a->mr >> 31 : 0;
      const bool inside = i ? adds[0]->qmin >= TYPE_LO[t.mid_code] && adds[0]->qmax <= TYPE_HI[t.mid_code]
                            : table || (qmin >= TYPE_LO[out_code] && qmax <= TYPE_HI[out_code]);
      g->add_fast = g->add_fast && fits62(a->mv) && fits62(a->mr) && fits(a->qmin) && fits(a->qmax) && inside;
      const i64 s = a->mv > 0 && (a->mv & (a->mv - 1)) == 0 ? __builtin_ctzll(static_cast<uint64_t>(a->mv)) : -1;
      t.pow2 = !arm(isa) && !t.act && t.mid_code != I32 && s >= 0 && s <= c && s <= 46 &&
               t.alo - t.azy >= INT32_MIN && t.ahi - t.azy <= INT32_MAX;
      for (i64 j = 0; j < padded && t.pow2; ++j) {
        const i64 ro = t.r_off[j], q = ro >> s;
        t.pow2 = ro > -(i64(1) << 62) && ro < (i64(1) << 62) && q > -(i64(1) << 30) && q < (i64(1) << 30);
        t.cst.push_back(static_cast<int32_t>(q));
      }
      t.pshift = t.pow2 ? c - s : 0;
    }
    const IvitQGemmAdd* last = adds[g->stages - 1];
    g->out_code = last->post ? last->post_code : last->out_code;
    if (last->post) {
      g->post.assign(last->post, last->post + (last->qmax - last->qmin + 1));
      if (vnni_like(isa) && (g->out_code == I8 || g->out_code == U8) && last->qmax - last->qmin < 256 && cpu_vbmi()) {
        for (i64 i = 0; i <= last->qmax - last->qmin; ++i) g->post8[i] = static_cast<uint8_t>(last->post[i]);
        g->vbmi_post = true;
      }
    }
    g->fast = g->fast && g->add_fast;
    g->hadd = g->fast && vnni_like(isa);
    for (int i = 0; i < g->stages; ++i) {
      const Stage& t = g->st[i];
      g->hadd = g->hadd && (t.pow2 || (t.ac >= 32 && t.alo - t.azy >= INT32_MIN && t.ahi - t.azy <= INT32_MAX));
    }
  }
  g->zb_zero = std::all_of(g->zb.begin(), g->zb.end(), [](int32_t v) { return v == 0; });
  for (i64 j = 0; j < n; ++j) g->fast = g->fast && g->mult[j] >= INT32_MIN && g->mult[j] <= INT32_MAX;
  g->identity = !add && out_code == I32 && !table && zy == 0 && qmin <= INT32_MIN && qmax >= INT32_MAX;
  for (i64 j = 0; j < n; ++j) g->identity = g->identity && g->mult[j] == 1 && g->shift[j] == 0 && g->zx[j] == 0;
  for (auto* v : {&g->zx, &g->mult, &g->half, &g->shift}) v->resize(padded, 0);
  g->zb.resize(padded, 0);
  g->corr.resize(padded, 0);
  g->hi32 = g->fast && !arm(isa) && qmin <= qmax && k <= 32768;
  for (i64 j = 0; j < n && g->hi32; ++j) {
    const i64 c = g->shift[j];
    if (c < 33 || c > 62) {
      g->hi32 = false;
      break;
    }
    const double d = static_cast<double>(k) * 65025 + std::fabs(static_cast<double>(g->zx[j]));
    const double hmax = d * std::fabs(static_cast<double>(g->mult[j])) / 0x1p32 + 1;
    const double r = std::ldexp(1.0, static_cast<int>(c - 33)) +
                     static_cast<double>(zy) * std::ldexp(1.0, static_cast<int>(c - 32));
    g->hi32 = d < 0x1p31 * 0.999 && hmax + std::fabs(r) < 0x1p31 * 0.999;
  }
  g->bytes48 = g->hi32 && vnni_like(isa) && !add && (out_code == I8 || out_code == U8) &&
               (table ? g->vbmi_table && qmin >= INT16_MIN && qmax <= INT16_MAX
                      : qmin >= TYPE_LO[out_code] && qmax <= TYPE_HI[out_code]);
  for (i64 j = 0; j < padded; ++j) {
    const i64 c = g->shift[j];
    const uint64_t zxb = static_cast<uint64_t>(g->zx[j]) * static_cast<uint64_t>(g->mult[j]);
    g->off.push_back(static_cast<i64>((static_cast<uint64_t>(g->half[j]) ^ (arm(isa) ? 0 : uint64_t(1) << 63)) - zxb));
    g->zs.push_back(static_cast<i64>(static_cast<uint64_t>(zy) - (uint64_t(1) << (63 - c))));
    if (g->hi32) {
      g->corr2.push_back(corr_zx(g->corr[j], g->zx[j]));
      g->rnd.push_back(j < n ? static_cast<int32_t>((i64(1) << (c - 33)) + zy * (i64(1) << (c - 32))) : 0);
      g->sh32.push_back(static_cast<int32_t>(j < n ? c - 32 : 0));
    }
  }
  return g.release();
}

int ivit_qgemm_isa(const void* g) { return static_cast<const QGemm*>(g)->isa; }

int ivit_qgemm_epilogue(const void* gp) {
  const QGemm& g = *static_cast<const QGemm*>(gp);
  const bool pow2 = g.fast && g.has_add && (g.st[0].pow2 || (g.stages > 1 && g.st[1].pow2));
  return (g.hi32 ? 1 : 0) | (g.hadd ? 2 : 0) | (pow2 ? 4 : 0) | (g.bytes48 ? 8 : 0);
}

// the rows through run_all with the output's type
static int run_any(const QGemm& g, const void* a, i64 lda, i64 rows, const Resid& res, void* y, i64 ldy, int threads) {
  switch (g.out_code) {
    case I8: run_all(g, a, lda, rows, res, static_cast<int8_t*>(y), ldy, threads); return 0;
    case U8: run_all(g, a, lda, rows, res, static_cast<uint8_t*>(y), ldy, threads); return 0;
    case I16: run_all(g, a, lda, rows, res, static_cast<int16_t*>(y), ldy, threads); return 0;
    case I32: run_all(g, a, lda, rows, res, static_cast<int32_t*>(y), ldy, threads); return 0;
    default: return 1;
  }
}

int ivit_qgemm_run_strided(const void* gp, const void* a, int64_t lda, int64_t rows, void* y, int64_t ldy,
                           int threads) {
  const QGemm& g = *static_cast<const QGemm*>(gp);
  if (lda < g.k || ldy < g.n || g.add_act) return 1;
  return run_any(g, a, lda, rows, Resid{nullptr, 0}, y, ldy, threads);
}

int ivit_qgemm_run_add(const void* gp, const void* a, int64_t rows, const void* r, int64_t r_rows, void* y,
                       int threads) {
  const QGemm& g = *static_cast<const QGemm*>(gp);
  if (g.add_act != (r != nullptr) || (r && (r_rows < 1 || rows % r_rows))) return 1;
  return run_any(g, a, g.k, rows, Resid{r, r_rows}, y, g.n, threads);
}

int ivit_qgemm_run(const void* gp, const void* a, int64_t rows, void* y, int threads) {
  const QGemm& g = *static_cast<const QGemm*>(gp);
  return ivit_qgemm_run_strided(gp, a, g.k, rows, y, g.n, threads);
}

void ivit_qgemm_destroy(void* g) { delete static_cast<QGemm*>(g); }

}  // extern "C"

// ------------------------------------------------------------------------------------------------ peak
// The roofline's ceiling (benchmarks/bench_qgemm.py --kernel): each path's multiply-accumulate instruction in
// independent chains (12; AVX2's 6) on registers only, no loads, no epilogue; returns the MACs done (sum: keeps
// the loop)
namespace {
#if IVIT_QGEMM_X86
IVIT_T_VNNI i64 peak_vnni(i64 iters, int32_t* sum) {
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-5);
  __m512i c[12];
  for (auto& v : c) v = _mm512_setzero_si512();
  for (i64 i = 0; i < iters; ++i)
    for (auto& v : c) v = _mm512_dpbusd_epi32(v, a, b);
  for (auto& v : c) *sum += _mm512_reduce_add_epi32(v);
  return iters * 12 * 64;
}
// six chains, each with its own A made opaque every round (else GCC computes one product and hoists it)
IVIT_T_AVX2 i64 peak_avx2(i64 iters, int32_t* sum) {
  __m256i a0 = _mm256_set1_epi16(1), a1 = _mm256_set1_epi16(2), a2 = _mm256_set1_epi16(3);
  __m256i a3 = _mm256_set1_epi16(4), a4 = _mm256_set1_epi16(5), a5 = _mm256_set1_epi16(6);
  const __m256i b = _mm256_set1_epi16(-5);
  __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
  for (i64 i = 0; i < iters; ++i) {
    __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
    c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(a0, b));
    c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(a1, b));
    c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(a2, b));
    c3 = _mm256_add_epi32(c3, _mm256_madd_epi16(a3, b));
    c4 = _mm256_add_epi32(c4, _mm256_madd_epi16(a4, b));
    c5 = _mm256_add_epi32(c5, _mm256_madd_epi16(a5, b));
  }
  alignas(32) int32_t lanes[8];
  for (const __m256i v : {c0, c1, c2, c3, c4, c5}) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
    for (int32_t x : lanes) *sum += x;
  }
  return iters * 6 * 16;
}
#if IVIT_QGEMM_AMX
// four independent tdpbusd chains (tiles 0-3), A in tiles 4-5, B in 6-7
IVIT_T_AMX i64 peak_amx(i64 iters, int32_t* sum) {
  amx_begin(8);
  alignas(64) int8_t src[16 * 64];
  for (int i = 0; i < 16 * 64; ++i) src[i] = static_cast<int8_t>(i % 7 - 3);
  IVIT_AMX_FENCE(src);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, src, 64);
  _tile_loadd(5, src, 64);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  for (i64 i = 0; i < iters; ++i) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  alignas(64) int32_t c[16 * 16];
  _tile_stored(0, c, 64);
  IVIT_AMX_FENCE(c);
  for (int32_t v : c) *sum += v;
  amx_end();
  return iters * 4 * 16 * 16 * 64;
}
#endif
#endif
#if IVIT_QGEMM_ARM
i64 peak_neon(i64 iters, int32_t* sum) {
  const int16x8_t a = vdupq_n_s16(3), b = vdupq_n_s16(-5);
  int32x4_t c[12];
  for (auto& v : c) v = vdupq_n_s32(0);
  for (i64 i = 0; i < iters; ++i)
    for (int j = 0; j < 12; j += 2) {
      c[j] = vmlal_s16(c[j], vget_low_s16(a), vget_low_s16(b));
      c[j + 1] = vmlal_high_s16(c[j + 1], a, b);
    }
  for (auto& v : c) *sum += vaddvq_s32(v);
  return iters * 12 * 4;
}
IVIT_T_DOT i64 peak_dot(i64 iters, int32_t* sum) {
  const int8x16_t a = vdupq_n_s8(3), b = vdupq_n_s8(-5);
  int32x4_t c[12];
  for (auto& v : c) v = vdupq_n_s32(0);
  for (i64 i = 0; i < iters; ++i)
    for (auto& v : c) v = vdotq_s32(v, a, b);
  for (auto& v : c) *sum += vaddvq_s32(v);
  return iters * 12 * 16;
}
IVIT_T_I8MM i64 peak_i8mm(i64 iters, int32_t* sum) {
  const int8x16_t a = vdupq_n_s8(3), b = vdupq_n_s8(-5);
  int32x4_t c[12];
  for (auto& v : c) v = vdupq_n_s32(0);
  for (i64 i = 0; i < iters; ++i)
    for (auto& v : c) v = vmmlaq_s32(v, a, b);
  for (auto& v : c) *sum += vaddvq_s32(v);
  return iters * 12 * 32;
}
#endif
}  // namespace

extern "C" {
// MACs done by `iters` rounds of the path's bare multiply-accumulate loop (0: a path with no such loop here)
int64_t ivit_qgemm_peak(int isa, int64_t iters, int32_t* sum) {
  if (!cpu_has(isa)) return 0;
  switch (isa) {
#if IVIT_QGEMM_X86
    case VNNI: return peak_vnni(iters, sum);
    case AVX2: return peak_avx2(iters, sum);
#endif
#if IVIT_QGEMM_AMX
    case AMX: return peak_amx(iters, sum);
#endif
#if IVIT_QGEMM_ARM
    case NEON: return peak_neon(iters, sum);
    case DOTPROD: return peak_dot(iters, sum);
    case I8MM: return peak_i8mm(iters, sum);
#endif
    default: return 0;
  }
}

}  // extern "C"

namespace ivit {

std::string check_qgemm() {
  static const std::string result = [] {
    // IVIT_GEMM_PROBE_FAULT=qgemm (tests): every vector path counts as wrong
    const char* fault = std::getenv("IVIT_GEMM_PROBE_FAULT");
    const bool faulty = fault && !std::strcmp(fault, "qgemm");
    std::string out;
    for (int isa : PREFERENCE) {
      if (!cpu_has(isa)) continue;
      std::string why;
      for (int a_code : {0, 1})
        if (why.empty()) why = probe(isa, a_code);
      for (int form : {0, 1})
        if (why.empty()) why = probe_add(isa, form);
      if (faulty && isa != PORTABLE && why.empty()) why = "IVIT_GEMM_PROBE_FAULT";
      if (!why.empty()) g_refused |= 1 << isa;
      out += std::string(out.empty() ? "" : ", ") + NAMES[isa] +
             (why.empty() ? " exact" : " refused (" + why + ")");
    }
    return out;
  }();
  return result;
}

}  // namespace ivit

// ---------------------------------------------------------------------------------- repacking B (qbatch_op.cpp)
// A new B for a packed GEMM of the same K and N, so that a GEMM whose B is an activation (attention's Q·Kᵀ,
// P·V) packs it in O(K N) per call without ivit_qgemm_create's allocations and parameter set-up: B[k][n] is
// b[k * ldk + n * ldn] ^ flip (flip 0x80: a uint8 B re-encoded as int8), its zero point zb (one value). It
// writes the layout ivit_qgemm_create writes (tiles of lay.nr columns, groups of lay.kstep k, into b8 or b16):
// a path packed otherwise must be handled here too (tests/opset/test_qbatch.py runs every path; tests/arm/run.sh
// runs it on the NEON, sdot and i8mm paths).
namespace {
// dst: tiles of nr columns, each [kp / KS][nr][KS], written tile by tile (the k past K left as create zeroed
// them): a column's KS values at a time where they are contiguous (Kᵀ, ldk 1), else a k's columns at a time
// (V, ldn 1); then colsum[j] += the column's values, summed from the packed tile in contiguous runs
template <int KS, class T>
void repack_b(T* dst, const uint8_t* b, i64 k, i64 n, i64 kp, i64 nr, i64 ldk, i64 ldn, uint8_t f,
              uint32_t* colsum) {
  constexpr i64 MOST = 48 * 8;  // nr * KS of every layout is at most this
  for (i64 j0 = 0; j0 < n; j0 += nr) {
    const i64 cols = std::min(nr, n - j0);
    T* tile = dst + j0 * kp;
    for (i64 k0 = 0; k0 < k; k0 += KS) {
      const i64 ks = std::min<i64>(KS, k - k0);
      T* __restrict d = tile + k0 * nr;
      if constexpr (KS == 4 && sizeof(T) == 1) {  // 4 bytes a column: as 32-bit words
        if (ldk == 1 && ks == KS) {
          const uint32_t f4 = f * 0x01010101u;
          for (i64 jj = 0; jj < cols; ++jj) {
            uint32_t w;
            std::memcpy(&w, b + (j0 + jj) * ldn + k0, 4);
            w ^= f4;
            std::memcpy(d + jj * KS, &w, 4);
          }
          continue;
        }
#if IVIT_QGEMM_X86
        if (ldn == 1 && ks == KS) {  // 4 rows of 16 columns interleaved by bytes, then by pairs (SSE2)
          const __m128i fx = _mm_set1_epi8(static_cast<char>(f));
          const uint8_t* r0 = b + k0 * ldk + j0;
          i64 jj = 0;
          for (; jj + 16 <= cols; jj += 16) {
            auto row = [&](int s) {
              return _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + s * ldk + jj)), fx);
            };
            const __m128i a0 = row(0), a1 = row(1), a2 = row(2), a3 = row(3);
            const __m128i l01 = _mm_unpacklo_epi8(a0, a1), h01 = _mm_unpackhi_epi8(a0, a1);
            const __m128i l23 = _mm_unpacklo_epi8(a2, a3), h23 = _mm_unpackhi_epi8(a2, a3);
            __m128i* out = reinterpret_cast<__m128i*>(d + jj * KS);
            _mm_storeu_si128(out, _mm_unpacklo_epi16(l01, l23));
            _mm_storeu_si128(out + 1, _mm_unpackhi_epi16(l01, l23));
            _mm_storeu_si128(out + 2, _mm_unpacklo_epi16(h01, h23));
            _mm_storeu_si128(out + 3, _mm_unpackhi_epi16(h01, h23));
          }
          for (; jj < cols; ++jj)
            for (int s = 0; s < KS; ++s) d[jj * KS + s] = static_cast<int8_t>(r0[s * ldk + jj] ^ f);
          continue;
        }
#endif
      }
      if (ldk == 1 && ks == KS) {
        for (i64 jj = 0; jj < cols; ++jj) {
          const uint8_t* __restrict src = b + (j0 + jj) * ldn + k0;
          for (int s = 0; s < KS; ++s) d[jj * KS + s] = static_cast<int8_t>(src[s] ^ f);
        }
      } else {
        for (i64 s = 0; s < ks; ++s) {
          const uint8_t* __restrict src = b + (k0 + s) * ldk + j0 * ldn;
          for (i64 jj = 0; jj < cols; ++jj) d[jj * KS + s] = static_cast<int8_t>(src[jj * ldn] ^ f);
        }
      }
    }
    int32_t acc[MOST] = {};
    const i64 run = nr * KS;
    for (i64 g = 0; g < kp / KS; ++g) {
      const T* __restrict d = tile + g * run;
      for (i64 i = 0; i < run; ++i) acc[i] += d[i];
    }
    for (i64 jj = 0; jj < cols; ++jj) {
      int32_t sum = 0;
      for (int s = 0; s < KS; ++s) sum += acc[jj * KS + s];
      colsum[j0 + jj] += static_cast<uint32_t>(sum);
    }
  }
}
#if IVIT_QGEMM_X86
// Kᵀ (ldk 1) into the VNNI layout (nr 48, groups of 4 k): 16 columns' 64 k at a time (16 registers, each a
// column's 64 bytes, flipped, zero past K or past n) as a 16 x 16 transpose of 4-byte groups, so that each group
// of k is one store of 16 columns; colsum from the stored groups (vpdpbusd with ones). The same bytes as
// repack_b<4>.
IVIT_T_VNNI void repack_kt_vnni(int8_t* dst, const uint8_t* b, i64 k, i64 n, i64 kp, i64 ldn, uint8_t f,
                                uint32_t* colsum) {
  const __m512i fx = _mm512_set1_epi8(static_cast<char>(f)), ones = _mm512_set1_epi8(1);
  for (i64 j = 0; j < n; j += 16) {
    const i64 cols = std::min<i64>(16, n - j);
    int8_t* tile = dst + j / 48 * 48 * kp + j % 48 * 4;
    __m512i sum = _mm512_setzero_si512();
    for (i64 k0 = 0; k0 < k; k0 += 64) {
      const __mmask64 m = k - k0 >= 64 ? ~__mmask64(0) : (__mmask64(1) << (k - k0)) - 1;
      const __m512i fm = _mm512_maskz_mov_epi8(m, fx);
      __m512i r[16], u[16];
      for (int i = 0; i < 16; ++i)
        r[i] = i < cols ? _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, b + (j + i) * ldn + k0), fm)
                        : _mm512_setzero_si512();
      for (int i = 0; i < 16; i += 4) {  // u[i + s], lane L: rows i..i+3 at group 4L + s
        const __m512i t0 = _mm512_unpacklo_epi32(r[i], r[i + 1]), t1 = _mm512_unpackhi_epi32(r[i], r[i + 1]);
        const __m512i t2 = _mm512_unpacklo_epi32(r[i + 2], r[i + 3]), t3 = _mm512_unpackhi_epi32(r[i + 2], r[i + 3]);
        u[i] = _mm512_unpacklo_epi64(t0, t2);
        u[i + 1] = _mm512_unpackhi_epi64(t0, t2);
        u[i + 2] = _mm512_unpacklo_epi64(t1, t3);
        u[i + 3] = _mm512_unpackhi_epi64(t1, t3);
      }
      const i64 groups = std::min<i64>(16, (kp - k0) / 4);
      for (int s = 0; s < 4; ++s) {  // group 4L + s: lane L of u[s], u[4 + s], u[8 + s], u[12 + s]
        const __m512i v0 = _mm512_shuffle_i32x4(u[s], u[4 + s], 0x44), v1 = _mm512_shuffle_i32x4(u[s], u[4 + s], 0xEE);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + s], u[12 + s], 0x44);
        const __m512i v3 = _mm512_shuffle_i32x4(u[8 + s], u[12 + s], 0xEE);
        const __m512i c[4] = {_mm512_shuffle_i32x4(v0, v2, 0x88), _mm512_shuffle_i32x4(v0, v2, 0xDD),
                              _mm512_shuffle_i32x4(v1, v3, 0x88), _mm512_shuffle_i32x4(v1, v3, 0xDD)};
        for (int l = 0; l < 4; ++l) {
          const i64 g = 4 * l + s;
          if (g >= groups) continue;
          _mm512_storeu_si512(tile + (k0 / 4 + g) * 48 * 4, c[l]);
          sum = _mm512_dpbusd_epi32(sum, ones, c[l]);
        }
      }
    }
    alignas(64) int32_t lanes[16];
    _mm512_store_si512(lanes, sum);
    for (i64 i = 0; i < cols; ++i) colsum[j + i] += static_cast<uint32_t>(lanes[i]);
  }
}
#endif
}  // namespace

extern "C" void ivit_qgemm_repack(void* gp, const uint8_t* b, int64_t ldk, int64_t ldn, int flip, int64_t zb) {
  QGemm& g = *static_cast<QGemm*>(gp);
  const i64 k = g.k, n = g.n, nr = g.lay.nr, kstep = g.lay.kstep, kp = g.kp;
  const uint8_t f = static_cast<uint8_t>(flip);
  std::vector<uint32_t> colsum(n, 0);
  auto pack = [&](auto* dst) {  // the layout ivit_qgemm_create packs (k groups of lay.kstep: 1, 2, 4 or 8)
    switch (kstep) {
      case 1: repack_b<1>(dst, b, k, n, kp, nr, ldk, ldn, f, colsum.data()); break;
      case 2: repack_b<2>(dst, b, k, n, kp, nr, ldk, ldn, f, colsum.data()); break;
      case 4: repack_b<4>(dst, b, k, n, kp, nr, ldk, ldn, f, colsum.data()); break;
      default: repack_b<8>(dst, b, k, n, kp, nr, ldk, ldn, f, colsum.data()); break;
    }
  };
#if IVIT_QGEMM_X86
  if (vnni_like(g.isa) && ldk == 1) {
    repack_kt_vnni(g.b8.data(), b, k, n, kp, ldn, f, colsum.data());
  } else
#endif
  if (!g.b8.empty()) pack(g.b8.data()); else pack(g.b16.data());
  const uint32_t zbj = static_cast<uint32_t>(zb), zae = static_cast<uint32_t>(g.za_enc);
  for (i64 j = 0; j < n; ++j) {
    g.zb[j] = static_cast<int32_t>(zbj);
    g.corr[j] = static_cast<int32_t>(zae * colsum[j] - static_cast<uint32_t>(k) * zae * zbj);
    if (g.hi32) g.corr2[j] = corr_zx(g.corr[j], g.zx[j]);
  }
  g.zb_zero = zb == 0;
}
