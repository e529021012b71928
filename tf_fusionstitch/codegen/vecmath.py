"""Vectorisable float32 math for the generated C++ kernels (no TensorFlow here).

`CPP_PRELUDE` is C++17 text placed at the top of every CPU kernel. It defines
`static inline` float32 functions that GCC vectorises inside `#pragma omp simd`
loops under the project's flags (`-O3 -march=native -fopenmp-simd
-ffp-contract=off -fwrapv -fno-math-errno`, no -ffast-math; also with plain
x86-64 SSE2 or AVX2):

    fs_expf fs_expm1f fs_logf fs_log1pf fs_tanhf fs_sigmoidf fs_erff fs_erfcf

They are branch-free, use no lookup tables, make no libm calls and no FMA, and
use only IEEE add/sub/mul/div, conversions and integer bit manipulation, so a
lane computes the same bits whether the loop is vectorised or not, on any
target. Building blocks: Cody-Waite reduction with exact products, exact
exponent manipulation, Fast2Sum where a rounding error must be kept, and
minimax polynomials fitted for float32 evaluation. fs_sigmoidf and fs_erfcf
compute in double internally (a double exp kernel, no libm) and round once at
the end: that is what keeps erfc's tail relatively accurate down to the
smallest denormal, and sigmoid at 0.5 ulp.

Every select between computed values goes through bit masks (`fs__sel`), not
`c ? a : b`: with -ftrapping-math (the default) GCC otherwise sinks work into
branches or specialises code after a constant clamp, then cannot if-convert
the loop and silently does not vectorise it.

Accuracy: max error in float32 ulps of the exact result (denormal results in
absolute denormal ulps), measured over all 2^32 inputs against glibc's double
functions. `ULP_BOUNDS` holds the documented bounds the tests assert.

    function   measured   bound
    exp        0.952      2
    expm1      1.450      2
    log        0.898      2
    log1p      1.326      2
    sigmoid    0.500      2
    tanh       1.498      3
    erf        1.314      3
    erfc       0.520      4   (relative wherever the result is a normal float)

Results in the denormal range come from gradual underflow like std::exp (one
final rounding into the denormal). Special values match C's std:: functions:
NaN propagates; exp(+inf)=+inf, exp(-inf)=0, overflow gives +inf; log(0)=-inf,
log(x<0)=NaN, log(+inf)=+inf; log1p(-1)=-inf; expm1(-0)=-0; tanh(+-inf)=+-1,
tanh(-0)=-0; erf(+-inf)=+-1, erfc(-inf)=2, erfc(+inf)=0; sigmoid(-inf)=0,
sigmoid(+inf)=1.

Also here: `fs_bf16_to_f32` / `fs_f32_to_bf16` (round to nearest even; NaN
becomes a quiet NaN with its sign kept, as Eigen's bfloat16 does). float16
needs no helper: kernels use GCC's `_Float16` type and static_casts, which
round to nearest even (F16C instructions where -march allows, else libgcc).

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
    "exp": 2.0, "expm1": 2.0, "log": 2.0, "log1p": 2.0, "sigmoid": 2.0,
    "tanh": 3.0, "erf": 3.0, "erfc": 4.0,
}

CPP_PRELUDE = r"""
// ---- tf_fusionstitch vecmath prelude (tf_fusionstitch/codegen/vecmath.py) ----
// float32 math that GCC vectorises in `#pragma omp simd` loops without
// -ffast-math: branch-free, no tables, no libm calls, no FMA (bit-identical
// results whether vectorised or not). float16 uses GCC's _Float16 directly.
#include <cstdint>
#include <cstring>
#include <cmath>
#include <limits>

static inline uint32_t fs__bits(float x) { uint32_t u; std::memcpy(&u, &x, sizeof u); return u; }
static inline float fs__float(uint32_t u) { float x; std::memcpy(&x, &u, sizeof x); return x; }
static inline uint64_t fs__bits64(double x) { uint64_t u; std::memcpy(&u, &x, sizeof u); return u; }
static inline double fs__double(uint64_t u) { double x; std::memcpy(&x, &u, sizeof x); return x; }
// Every float select goes through bit masks. Without -ffast-math GCC keeps FP
// exceptions (-ftrapping-math): given `c ? a : b` it may sink the computation
// of a or b into a branch, or specialise the code after a clamp to a constant
// (jump threading), and then cannot if-convert the loop ("control flow in
// loop"), so the loop is not vectorised. A mask select has no branch to
// specialise. Comparisons are false for NaN, so clamps let NaN through.
static inline float fs__sel(bool c, float a, float b) {
  uint32_t m = 0u - (uint32_t)c;
  return fs__float((fs__bits(a) & m) | (fs__bits(b) & ~m));
}
static inline double fs__sel64(bool c, double a, double b) {
  uint64_t m = (uint64_t)0 - (uint64_t)c;
  return fs__double((fs__bits64(a) & m) | (fs__bits64(b) & ~m));
}
static inline float fs__min(float x, float hi) { return fs__sel(x > hi, hi, x); }
static inline float fs__max(float x, float lo) { return fs__sel(x < lo, lo, x); }
static inline float fs__fabs(float x) { return fs__float(fs__bits(x) & 0x7fffffffu); }
// |mag| with the sign bit of sgn (mag must have a clear sign bit).
static inline float fs__with_sign(float mag, float sgn) {
  return fs__float(fs__bits(mag) | (fs__bits(sgn) & 0x80000000u));
}
// 2^n for -126 <= n <= 127.
static inline float fs__pow2i(int32_t n) { return fs__float((uint32_t)(n + 127) << 23); }

// q(r) ~ (exp(r) - 1 - r) / r^2 on |r| <= 0.3467 (minimax, rel. err of exp ~2^-31).
static inline float fs__expq(float r) {
  float q = 0x1.9e6e76p-13f;
  q = q * r + 0x1.6d3a44p-10f;
  q = q * r + 0x1.1112dap-7f;
  q = q * r + 0x1.5554f8p-5f;
  q = q * r + 0x1.555554p-3f;
  q = q * r + 0.5f;
  return q;
}
// Round y = x*log2(e) to the integer n (returned) and kf = (float)n, for
// |y| < 2^22, by the 1.5*2^23 trick: no float->int conversion, so no UB on NaN.
static inline int32_t fs__exp_round(float y, float& kf) {
  const float magic = 0x1.8p23f;
  float t = y + magic;
  kf = t - magic;
  return (int32_t)(fs__bits(t) - 0x4b400000u);
}
// exp(r) * 2^n for |r| <= 0.3467, -160 <= n <= 130: 2^n is applied as two
// factors so that results in the denormal range round once (gradual
// underflow) and results past FLT_MAX become +inf.
static inline float fs__exp_finish(float r, int32_t n) {
  float p = 1.0f + (r + (r * r) * fs__expq(r));
  int32_t n1 = n >> 1;  // arithmetic shift (GCC); n1 and n - n1 in [-80, 65]
  return (p * fs__pow2i(n1)) * fs__pow2i(n - n1);
}
// ln2 = FS_LN2_HI + FS_LN2_LO; FS_LN2_HI has 15 significant bits, so k*FS_LN2_HI
// is exact for |k| < 512.
#define FS_LN2_HI 0x1.62e4p-1f
#define FS_LN2_LO 0x1.7f7d1cp-20f
#define FS_LOG2E 0x1.715476p+0f

static inline float fs_expf(float x) {
  float xc = fs__max(fs__min(x, 90.0f), -110.0f);   // NaN passes through
  float kf;
  int32_t n = fs__exp_round(xc * FS_LOG2E, kf);
  float r = (xc - kf * FS_LN2_HI) - kf * FS_LN2_LO;  // first difference exact
  return fs__exp_finish(r, n);
}

// exp(xh + xl) for |xl| << |xh|, xh + xl in [-111, 0], xh a multiple of 2^-24
// when |xh| >= 0.25 (true for -a*a with a of 12 significant bits, a >= 0.5).
static inline float fs__exp2(float xh, float xl) {
  float kf;
  int32_t n = fs__exp_round((xh + xl) * FS_LOG2E, kf);
  float r = ((xh - kf * FS_LN2_HI) + xl) - kf * FS_LN2_LO;
  return fs__exp_finish(r, n);
}

// exp(x) in double for |x| <= 700 (NaN passes through), relative error < 2^-38.
// Internal to the functions that compute in double and round to float once.
static inline double fs__exp_d(double x) {
  const double magic = 0x1.8p52;
  double t = x * 0x1.71547652b82fep+0 + magic;
  double kd = t - magic;
  int64_t n = (int64_t)(fs__bits64(t) - fs__bits64(magic));
  double r = x - kd * 0x1.62e42fefa39efp-1;   // error ~2^-46, far below float's needs
  double q = 0x1.9e8169f751394p-16;
  q = q * r + 0x1.a18c805062765p-13;
  q = q * r + 0x1.6c18e824d10b7p-10;
  q = q * r + 0x1.11109dfe697ecp-7;
  q = q * r + 0x1.5555540ba8a96p-5;
  q = q * r + 0x1.555555803f83cp-3;
  q = q * r + 0x1.000000006585dp-1;
  return (1.0 + (r + (r * r) * q)) * fs__double((uint64_t)(n + 1023) << 52);
}

static inline float fs_expm1f(float x) {
  // expm1(x) = -1 in float below -17.4 and overflows above 88.73.
  float xc = fs__max(fs__min(x, 88.8f), -30.0f);    // NaN passes through
  float kf;
  int32_t n = fs__exp_round(xc * FS_LOG2E, kf);   // n <= 128
  float r = (xc - kf * FS_LN2_HI) - kf * FS_LN2_LO;
  float em = r + (r * r) * fs__expq(r);           // expm1(r)
  // expm1(x) = 2^n * em + (2^n - 1); for n > 100 use 2 * (2^(n-1) em + 2^(n-1))
  // so that the scale stays finite and only the final doubling overflows.
  bool big = n > 100;
  float s = fs__pow2i(n - (int32_t)big);
  float res = (s * em + (s - fs__sel(big, 0.5f, 1.0f))) * fs__sel(big, 2.0f, 1.0f);
  return fs__sel(x == 0.0f, x, res);     // keeps -0
}

// log(1 + f) for f in [sqrt(1/2) - 1, sqrt(2) - 1]: f - f^2/2 + f^3 P(f).
static inline float fs__log1p_poly(float f) {
  float p = 0x1.14730ap-4f;
  p = p * f - 0x1.de01cap-4f;
  p = p * f + 0x1.e6c010p-4f;
  p = p * f - 0x1.fc28ccp-4f;
  p = p * f + 0x1.233ba2p-3f;
  p = p * f - 0x1.555c44p-3f;
  p = p * f + 0x1.99a476p-3f;
  p = p * f - 0x1.000006p-2f;
  p = p * f + 0x1.555548p-2f;
  return f + (f * f) * (p * f - 0.5f);
}
// Split a positive normal u as m * 2^e with m in [sqrt(1/2), sqrt(2)).
static inline float fs__log_split(float u, int32_t& e) {
  uint32_t t = fs__bits(u) - 0x3f3504f3u;
  e = (int32_t)t >> 23;  // arithmetic shift (GCC)
  return fs__float(fs__bits(u) - (t & 0xff800000u));
}

static inline float fs_logf(float x) {
  bool sub = x < 0x1p-126f;                       // denormals (and 0, < 0) scaled up
  float xs = fs__sel(sub, x * 0x1p23f, x);
  int32_t e;
  float m = fs__log_split(xs, e);
  float ef = (float)(e - 23 * (int32_t)sub);
  float l = fs__log1p_poly(m - 1.0f);             // m - 1 is exact
  float res = ef * FS_LN2_HI + (l + ef * FS_LN2_LO);
  const float inf = std::numeric_limits<float>::infinity();
  res = fs__sel(x == inf, inf, res);
  res = fs__sel(x == 0.0f, -inf, res);
  res = fs__sel(x < 0.0f, std::numeric_limits<float>::quiet_NaN(), res);
  return fs__sel(x != x, x, res);
}

static inline float fs_log1pf(float x) {
  // In [sqrt(1/2) - 1, sqrt(2) - 1) the polynomial takes x itself. Outside,
  // u = 1 + x and its exact rounding error d (Fast2Sum); log1p(x) =
  // log(u) + d/u to well under an ulp.
  bool near0 = (x >= -0x1.2bec34p-2f) & (x < 0x1.a8279ap-2f);
  float u = 1.0f + x;
  float d = fs__sel(fs__fabs(x) <= 1.0f, (1.0f - u) + x, (x - u) + 1.0f);
  int32_t e;
  float m = fs__log_split(u, e);
  float l = fs__log1p_poly(fs__sel(near0, x, m - 1.0f));
  float ef = (float)e;
  float far = ef * FS_LN2_HI + (l + (ef * FS_LN2_LO + d / u));
  const float inf = std::numeric_limits<float>::infinity();
  far = fs__sel(u == inf, inf, far);
  far = fs__sel(u == 0.0f, -inf, far);
  far = fs__sel(u < 0.0f, std::numeric_limits<float>::quiet_NaN(), far);
  return fs__sel(x != x, x, fs__sel(near0, l, far));
}

static inline float fs_tanhf(float x) {
  // |x| < 0.625: |x| + |x|^3 T(x^2); above: em / (em + 2) with em = expm1(2|x|),
  // where the error of em is damped by 2 / (em + 2) < 0.45. The sign goes on last.
  float a = fs__fabs(x);
  float z = a * a;
  float t = 0x1.1a2816p-9f;
  t = t * z - 0x1.0c5ed0p-7f;
  t = t * z + 0x1.63a550p-6f;
  t = t * z - 0x1.b9f188p-5f;
  t = t * z + 0x1.11107ap-3f;
  t = t * z - 0x1.555554p-2f;
  float small = a + (a * z) * t;
  float ac = fs__min(a, 10.0f);          // tanh = 1 in float beyond 9.01
  float em = fs_expm1f(ac + ac);
  float big = em / (em + 2.0f);
  return fs__with_sign(fs__sel(a < 0.625f, small, big), x);
}

static inline float fs_sigmoidf(float x) {
  // In double: e/(1+e) or 1/(1+e) with e = exp(-|x|) is then accurate to
  // ~2^-38 and the one rounding to float gives ~0.5 ulp (denormals too).
  float a = fs__min(fs__fabs(x), 120.0f);
  double e = fs__exp_d(-(double)a);
  return (float)(fs__sel64(x < 0.0f, e, 1.0) / (1.0 + e));
}

// erf(x) = x + x * E(x^2) for |x| <= 1 (float or double evaluation).
template <typename T>
static inline T fs__erf_small(T x) {
  T z = x * x;
  T p = 0x1.4771fcp-14f;
  p = p * z - 0x1.a3515ep-11f;
  p = p * z + 0x1.53f224p-8f;
  p = p * z - 0x1.b7f71ap-6f;
  p = p * z + 0x1.ce2ce6p-4f;
  p = p * z - 0x1.81273ep-2f;
  p = p * z + 0x1.06eba8p-3f;
  return x + x * p;
}
// erfc(a) for a in [0.5, 10.5]: exp(-a^2) * h(q) / (1 + 2a), where
// h(a) = (1 + 2a) exp(a^2) erfc(a) in [1, 1.13] is a polynomial in
// q = (a - 2) / (a + 2), and a^2 is carried exactly as hi^2 + (2 hi lo + lo^2).
static inline float fs__erfc_big(float a) {
  float q = (a - 2.0f) / (a + 2.0f);
  float p = 0x1.bbe146p-12f;
  p = p * q - 0x1.5e3ff0p-12f;
  p = p * q - 0x1.bec98ep-10f;
  p = p * q + 0x1.4407b0p-10f;
  p = p * q + 0x1.2105e4p-7f;
  p = p * q - 0x1.0720b4p-7f;
  p = p * q - 0x1.bc4c7ep-5f;
  p = p * q + 0x1.4ffa0cp-3f;
  p = p * q - 0x1.540748p-3f;
  p = p * q - 0x1.7bf5ecp-4f;
  p = p * q + 0x1.1ba038p-2f;
  float r = (1.0f + p) / (a + a + 1.0f);
  float hi = fs__float(fs__bits(a) & 0xfffff000u);  // 12 significant bits
  float lo = a - hi;
  return r * fs__exp2(-(hi * hi), -((hi + hi) * lo + lo * lo));
}
// The same in double (coefficients to ~2^-33; a*a is exact for a float a).
static inline double fs__erfc_big_d(double a) {
  double q = (a - 2.0) / (a + 2.0);
  double p = 0x1.7aa29479fe52ep-14;
  p = p * q + 0x1.9f1d70a716933p-13;
  p = p * q - 0x1.b385b903de3e8p-12;
  p = p * q - 0x1.7cdce3f32482fp-10;
  p = p * q + 0x1.4a35cc9f8b9a6p-10;
  p = p * q + 0x1.1dcc99903e2c6p-7;
  p = p * q - 0x1.0734336150429p-7;
  p = p * q - 0x1.bc2b72e28abefp-5;
  p = p * q + 0x1.4ffa10863db66p-3;
  p = p * q - 0x1.5407bf055995bp-3;
  p = p * q - 0x1.7bf5eb9f7fc7ep-4;
  p = p * q + 0x1.1ba0388a0dfc4p-2;
  return (1.0 + p) / (a + a + 1.0) * fs__exp_d(-(a * a));
}

static inline float fs_erff(float x) {
  float a = fs__fabs(x);
  // erf = 1 in float beyond 3.92.
  float big = fs__with_sign(1.0f - fs__erfc_big(fs__min(a, 4.0f)), x);
  return fs__sel(a < 1.0f, fs__erf_small(x), big);
}

static inline float fs_erfcf(float x) {
  // In double, so that the tail keeps its relative accuracy down to the
  // smallest denormal (erfc(10.06)) with a single final rounding.
  float af = fs__min(fs__fabs(x), 10.5f);   // erfc = 0 beyond 10.06
  double k = fs__erfc_big_d((double)af);
  double big = fs__sel64(x < 0.0f, 2.0 - k, k);
  double small = 1.0 - fs__erf_small((double)x);
  return (float)fs__sel64(af < 0.5f, small, big);
}

#undef FS_LN2_HI
#undef FS_LN2_LO
#undef FS_LOG2E

// bfloat16 <-> float32. Rounds to nearest even; NaN stays NaN (quiet, sign kept).
static inline float fs_bf16_to_f32(uint16_t h) { return fs__float((uint32_t)h << 16); }
static inline uint16_t fs_f32_to_bf16(float x) {
  uint32_t u = fs__bits(x);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t qnan = ((u >> 16) & 0x8000u) | 0x7fc0u;
  return (uint16_t)((x != x) ? qnan : rounded);
}
// ---- end of vecmath prelude ----
"""
