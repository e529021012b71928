"""Vectorisable float32 math for the generated C++ kernels (no TensorFlow here).

`CPP_PRELUDE` is C++17 text placed at the top of every CPU kernel. It defines
always-inlined float32 functions that GCC vectorises inside `#pragma omp simd`
loops under the project's flags (`-O2 -march=native -fopenmp-simd
-ffp-contract=off -fwrapv -fno-math-errno`, no -ffast-math; also with plain
x86-64 SSE2 or AVX2):

    fs_expf fs_expm1f fs_logf fs_log1pf fs_tanhf fs_sigmoidf fs_erff fs_erfcf

They are branch-free, use no lookup tables and make no libm calls. Everything
is float32: IEEE add/sub/mul/div, integer bit manipulation, and fused
multiply-adds through `fs__fma` only (`__builtin_fmaf` where GCC reports a
fast fmaf, `__FP_FAST_FMAF`: x86-64 with FMA3 or AVX-512F, aarch64; else
`a * b + c`). An fma is exactly rounded, so a lane computes the same bits
whether the loop is vectorised or not within one build. Building blocks:
Cody-Waite reduction (k * FS_LN2_HI exact), rounding to an integer by adding
1.5 * 2^23 + bias so that `bits(t) << 23` is already the float 2^n, exact
exponent scaling in two steps where results can be denormal (one rounding
into the denormals, overflow to +inf), clamps done as integer min on the bit
pattern offset by 2^23 - 1 (that keeps every NaN a NaN and costs less than a
float compare plus blend), and minimax polynomials and rationals fitted with
mpmath (Lawson / Loeb iterations) and rounded to float32 coefficients:

    exp      2^n exp(r), |r| <= ln2/2, degree-6 polynomial
    expm1    2 (2^(n-1) expm1(r) + 2^(n-1) - 1/2), expm1(r) = r + r^2 q(r)
    log      e ln2 + log1p(m - 1), m in [sqrt(1/2), sqrt(2)), denormals split
             as integer patterns; log1p: same on u = 1 + x plus c/u for the
             rounding error c of 1 + x
    tanh     em / (em + 2), em = expm1(2|x|) (the error of em is damped)
    sigmoid  1 / (1 + e) or e / (1 + e), e = exp(-|x|)
    erf      1 - 2^y, y = log2(erfc(a)) = a H(a) (degree-7 polynomial), the
             error of y damped by erfc(a) |y| ln2 / erf(a)
    erfc     exp(-a^2) / (sqrt(pi) a + 1 + a P(a)/Q(a)), a^2 exact as hi + lo:
             the rational's rounding errors matter only where it is small
             against sqrt(pi) a; 2 - erfc(|x|) for x < 0

Every select between computed floats goes through bit masks (`fs__sel`, or a
sign mask), not `c ? a : b`: with -ftrapping-math (the default) GCC otherwise
sinks work into branches or specialises code after a constant clamp, then
cannot if-convert the loop and silently does not vectorise it. Integer
`c ? a : b` (fs__imin and friends) cannot trap and is fine.

Accuracy: max error in float32 ulps of the exact result (denormal results in
absolute denormal ulps) against glibc's double functions (sigmoid: the
double formula). "FMA": -march=native on an AVX-512 AMD EPYC, every float32
input where the result is not a constant (exp [-104, 89], expm1 [-30, 89],
log all x >= 0, log1p [-1, FLT_MAX], tanh [0, 9] (odd), sigmoid [-104, 18],
erf [0, 3.93] (odd), erfc [-4, 10.1]; outside, constants and special values
are tested). "no FMA": the `a * b + c` fallback (-mno-fma -mno-avx512f),
~1e7 sampled inputs (all binades, both signs, dense near the maxima and the
joins). `ULP_BOUNDS` holds the documented bounds the tests assert.

    function   FMA (all inputs)   no FMA (sampled)   bound
    exp        0.891              1.12               2
    expm1      1.530              1.63               2
    log        1.154              1.23               2
    log1p      1.695              1.68               2
    sigmoid    2.402              2.34               3
    tanh       2.566              2.54               3
    erf        2.624              2.44               3
    erfc       3.130              3.68               4   (relative wherever the result is a normal float)

Throughput, ns per element on one core (AMD EPYC, AVX-512, GCC 12 under the
flags above; `fs_` inside a `#pragma omp simd` loop over 2 x 64 KiB of
float32 held in cache, best of 40 x 100 passes; the loop alone costs ~0.07):

    function   input range    previous   now     std:: scalar loop
    exp        [-80, 80]      0.431      0.221   3.0
    expm1      [-5, 5]        0.508      0.237   8.3
    log        [1e-3, 1e3]    0.676      0.327   3.4
    log1p      [-0.9, 100]    0.753      0.365   6.8
    tanh       [-5, 5]        0.844      0.264   11.3
    sigmoid    [-20, 20]      1.076      0.309   3.3
    erf        [-3, 3]        1.134      0.342   10.3
    erfc       [-3, 9]        2.432      0.519   12.4

("previous": the float32-without-FMA version with double internals for
sigmoid and erfc.) On Zen 4 a 512-bit FMA or multiply issues once per cycle,
a float compare plus blend costs about two of them and a division about
four; the implementations are laid out for that.

Results in the denormal range come from gradual underflow like std::exp (one
final rounding into the denormal). Special values match C's std:: functions:
NaN propagates (any payload, either sign); exp(+inf)=+inf, exp(-inf)=0,
overflow gives +inf; log(0)=-inf, log(x<0)=NaN, log(+inf)=+inf;
log1p(-1)=-inf; expm1(-0)=-0; tanh(+-inf)=+-1, tanh(-0)=-0; erf(+-inf)=+-1,
erfc(-inf)=2, erfc(+inf)=0; sigmoid(-inf)=0, sigmoid(+inf)=1.

Also here: `fs_bf16_to_f32` / `fs_f32_to_bf16` (round to nearest even; NaN
becomes a quiet NaN with its sign kept, as Eigen's bfloat16 does). float16
needs no helper: kernels use GCC's `_Float16` type and static_casts, which
round to nearest even (F16C instructions where -march allows, else libgcc).
`fs__sel` / `fs__sel64` are also used by the kernel printer (`fs_select`).

float64 kernels use the std:: functions; there are no double versions here.
"""

from __future__ import annotations

__all__ = ["CPP_PRELUDE", "FLOAT32_FUNCTIONS", "ULP_BOUNDS"]

# Name of each float32 function, keyed by the math primitive it implements.
FLOAT32_FUNCTIONS = {
    "exp": "fs_expf", "expm1": "fs_expm1f", "log": "fs_logf", "log1p": "fs_log1pf",
    "tanh": "fs_tanhf", "sigmoid": "fs_sigmoidf", "erf": "fs_erff", "erfc": "fs_erfcf",
}

# Documented worst-case error in float32 ulps of the exact result (erfc: where
# the result is normal). The measured maxima (module docstring) are below.
ULP_BOUNDS = {
    "exp": 2.0, "expm1": 2.0, "log": 2.0, "log1p": 2.0, "sigmoid": 3.0,
    "tanh": 3.0, "erf": 3.0, "erfc": 4.0,
}

CPP_PRELUDE = r"""
// ---- tf_fusionstitch vecmath prelude (tf_fusionstitch/codegen/vecmath.py) ----
// float32 math that GCC vectorises in `#pragma omp simd` loops without
// -ffast-math: branch-free, no tables, no libm calls; FMA only through
// fs__fma (exactly rounded, so a lane gives the same bits vectorised or not).
// float16 uses GCC's _Float16 directly.
#include <cstdint>
#include <cstring>
#include <limits>

// Always inlined: a call left in a `#pragma omp simd` loop keeps it scalar, and
// -O2 (cpu_compiler.OPT_LEVEL) will not inline a function this size that a
// kernel calls from more than one loop.
#define FS_INLINE static inline __attribute__((always_inline))

FS_INLINE uint32_t fs__bits(float x) { uint32_t u; std::memcpy(&u, &x, sizeof u); return u; }
FS_INLINE float fs__float(uint32_t u) { float x; std::memcpy(&x, &u, sizeof x); return x; }
// Float selects go through bit masks. Without -ffast-math GCC keeps FP
// exceptions (-ftrapping-math): given `c ? a : b` on floats it may sink the
// computation of a or b into a branch, or specialise the code after a clamp to
// a constant (jump threading), and then cannot if-convert the loop ("control
// flow in loop"), so the loop is not vectorised. A mask select has no branch
// to specialise. Integer `c ? a : b` (fs__imin and friends) cannot trap and
// becomes vpminsd / vpblendmd. A float compare plus blend costs about two
// FMAs of throughput, so the clamps below work on the bit patterns instead.
FS_INLINE float fs__sel(bool c, float a, float b) {
  uint32_t m = 0u - (uint32_t)c;
  return fs__float((fs__bits(a) & m) | (fs__bits(b) & ~m));
}
// The double version (used by the kernel printer's fs_select).
FS_INLINE uint64_t fs__bits64(double x) { uint64_t u; std::memcpy(&u, &x, sizeof u); return u; }
FS_INLINE double fs__double(uint64_t u) { double x; std::memcpy(&x, &u, sizeof x); return x; }
FS_INLINE double fs__sel64(bool c, double a, double b) {
  uint64_t m = (uint64_t)0 - (uint64_t)c;
  return fs__double((fs__bits64(a) & m) | (fs__bits64(b) & ~m));
}
FS_INLINE int32_t fs__imin(int32_t a, int32_t b) { return a < b ? a : b; }
FS_INLINE int32_t fs__imax(int32_t a, int32_t b) { return a > b ? a : b; }
FS_INLINE uint32_t fs__umin(uint32_t a, uint32_t b) { return a < b ? a : b; }
FS_INLINE float fs__fabs(float x) { return fs__float(fs__bits(x) & 0x7fffffffu); }
// |mag| (sign bit clear) with the sign bit of sgn.
FS_INLINE float fs__with_sign(float mag, float sgn) {
  return fs__float(fs__bits(mag) | (fs__bits(sgn) & 0x80000000u));
}
// a * b + c. Where the target has a fast fmaf (GCC: __FP_FAST_FMAF; x86-64
// with FMA3 or AVX-512F, aarch64) a single rounding (vfmadd*ps in vector code,
// vfmadd*ss in scalar code, so lanes stay bit-identical); elsewhere two
// roundings (the documented bounds hold either way). -ffp-contract=off only
// stops implicit contraction.
#if defined(__FP_FAST_FMAF) || defined(__FMA__)
#define FS__HW_FMA 1
#endif
FS_INLINE float fs__fma(float a, float b, float c) {
#ifdef FS__HW_FMA
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}
// Clamp x to [lo, hi] (lo < 0 < hi) keeping NaN (any payload, either sign):
// integer min on the bit pattern plus 2^23 - 1, where +NaNs become negative
// (signed; +inf becomes INT32_MAX) and -NaNs wrap to small unsigned values
// (-inf becomes UINT32_MAX), so neither min reaches a NaN.
FS_INLINE float fs__clamp(float x, float lo, float hi) {
  uint32_t v = fs__bits(x) + 0x7fffffu;
  v = (uint32_t)fs__imin((int32_t)v, (int32_t)(fs__bits(hi) + 0x7fffffu));
  v = fs__umin(v, fs__bits(lo) + 0x7fffffu);
  return fs__float(v - 0x7fffffu);
}
// min(|x|, hi) for hi > 0, NaN kept: as above on the pattern of |x|.
FS_INLINE float fs__absmin(float x, float hi) {
  int32_t v = (int32_t)(fs__bits(x) & 0x7fffffffu) + 0x7fffff;
  return fs__float((uint32_t)(fs__imin(v, (int32_t)fs__bits(hi) + 0x7fffff) - 0x7fffff));
}

// Rounding to an integer n by adding FS_MAGIC + k (|y| < 2^22): t = y + FS_MAGIC
// + k has bits(t) = bits(FS_MAGIC) + n + k, so bits(t) << 23 is (n + k) << 23:
// with k = 127 that is 2^n, with k = 126 it is 2^(n-1). No float->int
// conversion, so no UB on NaN.
#define FS_MAGIC 0x1.8p23f
#define FS_LN2 0x1.62e43p-1f
// ln2 = FS_LN2_HI + FS_LN2_LO; FS_LN2_HI has 15 significant bits, so k*FS_LN2_HI
// is exact for |k| < 512 (Cody-Waite; exact without FMA too).
#define FS_LN2_HI 0x1.62e4p-1f
#define FS_LN2_LO 0x1.7f7d1cp-20f
#define FS_LOG2E 0x1.715476p+0f

// exp(r) for |r| <= 0.3467 (minimax, relative error 2^-28.3).
FS_INLINE float fs__exp_poly(float r) {
  float p = 0x1.6a4f88p-10f;
  p = fs__fma(p, r, 0x1.123988p-7f);
  p = fs__fma(p, r, 0x1.5558aep-5f);
  p = fs__fma(p, r, 0x1.555492p-3f);
  p = fs__fma(p, r, 0x1.fffffcp-2f);
  p = fs__fma(p, r, 1.0f);
  return fs__fma(p, r, 1.0f);
}
// Bits of 2^max(n - 1, -124) and 2^min(n + 124, 1) (product 2^n) from
// bt = bits(x log2e + FS_MAGIC + 126). Applied to p in [0.7, 1.42] in this
// order, the first product is exact and the second rounds once: gradual
// underflow for n >= -150, overflow to +inf for n >= 128.
FS_INLINE float fs__scale2(float p, int32_t bt) {
  const int32_t b0 = (int32_t)fs__bits(FS_MAGIC);
  float s1 = fs__float((uint32_t)fs__imax(bt, b0 + 3) << 23);
  float s2 = fs__float((uint32_t)fs__imin(bt + 125, b0 + 128) << 23);
  return (p * s1) * s2;
}
// exp(x) for x in [-104, 89] or NaN.
FS_INLINE float fs__exp_core(float x) {
  float t = fs__fma(x, FS_LOG2E, FS_MAGIC + 126.0f);
  float kf = t - (FS_MAGIC + 126.0f);              // n = round(x log2e)
  float r = fs__fma(kf, -FS_LN2_HI, x);           // exact
  r = fs__fma(kf, -FS_LN2_LO, r);
  return fs__scale2(fs__exp_poly(r), (int32_t)fs__bits(t));
}

FS_INLINE float fs_expf(float x) {
  return fs__exp_core(fs__clamp(x, -104.0f, 89.0f));   // exp(-104) = 0, exp(89) = inf
}

// expm1(r) = r + r^2 q(r) for |r| <= 0.3467 (relative error 2^-26).
FS_INLINE float fs__expm1_poly(float r) {
  float q = 0x1.6b9c5ap-10f;
  q = fs__fma(q, r, 0x1.122544p-7f);
  q = fs__fma(q, r, 0x1.5556f2p-5f);
  q = fs__fma(q, r, 0x1.5554b4p-3f);
  q = fs__fma(q, r, 0x1.fffffep-2f);
  return fs__fma(r * r, q, r);
}

FS_INLINE float fs_expm1f(float x) {
  // expm1(x) = 2 (2^(n-1) em + (2^(n-1) - 1/2)), em = expm1(r): 2^(n-1) stays
  // finite for n = 128. expm1 = -1 in float below -17.4, +inf above 88.73.
  float xc = fs__clamp(x, -30.0f, 89.0f);
  float t = fs__fma(xc, FS_LOG2E, FS_MAGIC + 126.0f);
  float kf = t - (FS_MAGIC + 126.0f);
  float r = fs__fma(kf, -FS_LN2_HI, xc);
  r = fs__fma(kf, -FS_LN2_LO, r);
  float s = fs__float(fs__bits(t) << 23);                 // 2^(n-1)
  float res = fs__fma(s, fs__expm1_poly(r), s - 0.5f) * 2.0f;
  // |x| < 2^-25: expm1(x) = x (the halving above would lose denormal bits; keeps -0)
  return fs__sel(fs__fabs(x) < 0x1p-25f, x, res);
}

// log(1 + f) for f in [sqrt(1/2) - 1, sqrt(2) - 1]: f - f^2/2 + f^3 P(f)
// (relative error 2^-24.9).
FS_INLINE float fs__log1p_poly(float f) {
  float p = 0x1.645de2p-4f;
  p = fs__fma(p, f, -0x1.242ff8p-3f);
  p = fs__fma(p, f, 0x1.31731ap-3f);
  p = fs__fma(p, f, -0x1.5382a2p-3f);
  p = fs__fma(p, f, 0x1.98d822p-3f);
  p = fs__fma(p, f, -0x1.00038p-2f);
  p = fs__fma(p, f, 0x1.5556d8p-2f);
  return fs__fma(f * f, fs__fma(p, f, -0.5f), f);
}
// Special results of log(arg) applied to res: arg = +inf or +NaN gives arg, a
// set sign bit gives NaN, +-0 gives -inf (tested last, so -0 too). Only the
// zero test is a float compare.
FS_INLINE float fs__log_special(float arg, float res) {
  uint32_t u = fs__bits(arg);
  uint32_t big = (uint32_t)((int32_t)(u + 0x800000u) >> 31);   // +inf, +NaN (negatives too)
  uint32_t r = (u & big) | (fs__bits(res) & ~big);
  r |= (uint32_t)((int32_t)u >> 31) & 0x7fc00000u;              // negative: NaN
  return fs__sel(arg == 0.0f, -std::numeric_limits<float>::infinity(), fs__float(r));
}

FS_INLINE float fs_logf(float x) {
  uint32_t u = fs__bits(x);
  // Denormals (and +0) use the pattern of x * 2^23 with 23 taken off the
  // exponent field, which may go below 1: the split below is integer
  // arithmetic and does not care.
  uint32_t sub = (uint32_t)((int32_t)(u - 0x800000u) >> 31);
  uint32_t v = ((fs__bits(x * 0x1p23f) - (23u << 23)) & sub) | (u & ~sub);
  uint32_t t = v - 0x3f3504f3u;                   // x = m 2^e, m in [sqrt(1/2), sqrt(2))
  int32_t e = (int32_t)t >> 23;                   // arithmetic shift (GCC)
  float m = fs__float(v - (t & 0xff800000u));
  return fs__log_special(x, fs__fma((float)e, FS_LN2, fs__log1p_poly(m - 1.0f)));
}

FS_INLINE float fs_log1pf(float x) {
  // u = 1 + x and its rounding error c = x - (u - 1) (exact for x >= -1);
  // log1p(x) = log(u) + c/u, c/u = cs / (1 + f) ~ cs (1 - f), cs = c 2^-e.
  float u = 1.0f + x;
  float c = x - (u - 1.0f);
  uint32_t t = fs__bits(u) - 0x3f3504f3u;
  int32_t e = (int32_t)t >> 23;
  float f = fs__float(fs__bits(u) - (t & 0xff800000u)) - 1.0f;
  float cs = c * fs__float((uint32_t)fs__imax((int32_t)(0x3f800000u - (t & 0xff800000u)), 0));
  float l = fs__log1p_poly(f) + fs__fma(-cs, f, cs);
  float res = fs__log_special(u, fs__fma((float)e, FS_LN2, l));
  return fs__float(fs__bits(res) | (fs__bits(x) & 0x80000000u));   // log1p(-0) = -0
}

FS_INLINE float fs_tanhf(float x) {
  // em / (em + 2) with em = expm1(2|x|): the error of em is damped by
  // 2 / (em + 2). n in [0, 26], so 2^n - 1 is exact or harmlessly rounded.
  float a = fs__absmin(x, 9.02f);                 // tanh = 1 in float beyond 9.01
  float a2 = a + a;
  float t = fs__fma(a2, FS_LOG2E, FS_MAGIC + 127.0f);
  float kf = t - (FS_MAGIC + 127.0f);
  float r = fs__fma(kf, -FS_LN2_HI, a2);
  r = fs__fma(kf, -FS_LN2_LO, r);
  float s = fs__float(fs__bits(t) << 23);         // 2^n
  float em = fs__fma(s, fs__expm1_poly(r), s - 1.0f);
  return fs__with_sign(em / (em + 2.0f), x);
}

FS_INLINE float fs_sigmoidf(float x) {
  // e = exp(-|x|) (exact scaling of the polynomial, so e has its relative
  // error); 1 / (1 + e) for x >= 0, e / (1 + e) for x < 0.
  float e = fs__exp_core(fs__clamp(fs__float(fs__bits(x) | 0x80000000u), -104.0f, 1.0f));
  uint32_t neg = (uint32_t)((int32_t)fs__bits(x) >> 31);
  return fs__float((fs__bits(e) & neg) | (0x3f800000u & ~neg)) / (1.0f + e);
}

FS_INLINE float fs_erff(float x) {
  // erf(a) = 1 - 2^y, y = log2(erfc(a)) = a H(a) (H minimax, weighted by the
  // damping below); 1 - 2^y = -(s expm1_2(r) + (s - 1)), s = 2^n, n = round(y),
  // r = a H - n (a H never rounded). Where erf is near 1 the error of y is
  // damped by erfc(a) |y| ln2 / erf(a).
  float a = fs__absmin(x, 3.93f);                 // erf = 1 in float beyond 3.92
  float h = -0x1.3225bp-14f;
  h = fs__fma(h, a, 0x1.51959cp-11f);
  h = fs__fma(h, a, -0x1.0b41fep-9f);
  h = fs__fma(h, a, -0x1.acc188p-16f);
  h = fs__fma(h, a, 0x1.c6346cp-6f);
  h = fs__fma(h, a, -0x1.2fb352p-3f);
  h = fs__fma(h, a, -0x1.d63eacp-1f);
  h = fs__fma(h, a, -0x1.a0be84p+0f);
  float t = fs__fma(a, h, FS_MAGIC + 127.0f);
  float kf = t - (FS_MAGIC + 127.0f);
  float r = fs__fma(a, h, -kf);                   // |r| <= 1/2
  float p = 0x1.429616p-13f;                      // (2^r - 1) / r, relative error 2^-26.2
  p = fs__fma(p, r, 0x1.5ef134p-10f);
  p = fs__fma(p, r, 0x1.3b2c3ep-7f);
  p = fs__fma(p, r, 0x1.c6afa4p-5f);
  p = fs__fma(p, r, 0x1.ebfbdep-3f);
  p = fs__fma(p, r, 0x1.62e43p-1f);
  float s = fs__float(fs__bits(t) << 23);         // 2^n
  float em = fs__fma(s, r * p, s - 1.0f);         // 2^y - 1 in (-1, 0]
  uint32_t ux = fs__bits(x);
  return fs__float(ux ^ ((ux ^ fs__bits(em)) & 0x7fffffffu));   // |em| with the sign of x
}

FS_INLINE float fs_erfcf(float x) {
  // erfc(a) = exp(-a^2) / F(a), F = 1 / (erfc(a) exp(a^2)) = sqrt(pi) a + c(a),
  // c = 1 + a P(a) / Q(a) in (0, 1]: where the Horner errors of P and Q are
  // large (large a), c is small against sqrt(pi) a; near a = 0 c is formed by
  // one fma. a^2 = hi + lo exactly. x < 0: 2 - erfc(|x|).
  float a = fs__absmin(x, 10.1f);                 // erfc = 0 beyond 10.06
  float hi = a * a;
#ifdef FS__HW_FMA
  float lo = __builtin_fmaf(a, a, -hi);
#else
  float ah = fs__float(fs__bits(a) & 0xfffff000u), al = a - ah;   // 12 significant bits
  float lo = ((ah * ah - hi) + (ah + ah) * al) + al * al;
#endif
  float p = -0x1.2f6a18p-5f;
  p = fs__fma(p, a, -0x1.bd117p-3f);
  p = fs__fma(p, a, -0x1.1a7b88p-1f);
  p = fs__fma(p, a, -0x1.49c428p-1f);
  float q = 0x1.2f75d6p-5f;
  q = fs__fma(q, a, 0x1.fff11p-3f);
  q = fs__fma(q, a, 0x1.8d1afcp-1f);
  q = fs__fma(q, a, 0x1.47e524p+0f);
  q = fs__fma(q, a, 0x1p+0f);
  // sqrt(pi) = 0x1.c5bf8ap+0 - 0x1.c96212p-25; the low part goes into c
  float F = fs__fma(0x1.c5bf8ap+0f, a, fs__fma(a, p / q - 0x1.c96212p-25f, 1.0f));
  float t = fs__fma(hi, -FS_LOG2E, FS_MAGIC + 126.0f);
  float kf = t - (FS_MAGIC + 126.0f);
  float r = fs__fma(kf, -FS_LN2_HI, -hi) + fs__fma(kf, -FS_LN2_LO, -lo);   // first term exact
  // exp(r) / F is in [0.037, 1.42]; times 16 (and n - 4) it meets scale2's
  // bound, so its first product stays normal and survives flush-to-zero.
  float v = fs__scale2(fs__exp_poly(r) / F * 16.0f, (int32_t)fs__bits(t) - 4);
  uint32_t neg = (uint32_t)((int32_t)fs__bits(x) >> 31);
  return fs__float((fs__bits(2.0f - v) & neg) | (fs__bits(v) & ~neg));
}

#undef FS__HW_FMA
#undef FS_MAGIC
#undef FS_LN2
#undef FS_LN2_HI
#undef FS_LN2_LO
#undef FS_LOG2E

// bfloat16 <-> float32. Rounds to nearest even; NaN stays NaN (quiet, sign kept).
FS_INLINE float fs_bf16_to_f32(uint16_t h) { return fs__float((uint32_t)h << 16); }
FS_INLINE uint16_t fs_f32_to_bf16(float x) {
  uint32_t u = fs__bits(x);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t qnan = ((u >> 16) & 0x8000u) | 0x7fc0u;
  return (uint16_t)((x != x) ? qnan : rounded);
}
// ---- end of vecmath prelude ----
"""
