"""Device-side C++ placed at the top of every CUDA kernel (no TensorFlow here).

The CUDA twin of vecmath.CPP_PRELUDE: what the printer's expression
templates (printer._EXPR) and limits need, written for NVRTC, which compiles
without any standard header.
"""

# NVRTC has no standard headers: fixed-width types, the limits the printer
# asks for, and the helpers _EXPR names, written for the device.
CUDA_PRELUDE = r"""// ---- CUDA prelude (compiled by NVRTC without standard headers) ----
typedef int int32_t;
typedef long long int64_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
#define FS_DEV static __device__ __forceinline__
template <typename T> struct fs_limits;
template <> struct fs_limits<float> {
  FS_DEV float infinity() { return __int_as_float(0x7f800000); }
  FS_DEV float quiet_NaN() { return __int_as_float(0x7fc00000); }
  FS_DEV float lowest() { return -3.40282347e+38f; }
  FS_DEV float max() { return 3.40282347e+38f; }
};
template <> struct fs_limits<double> {
  FS_DEV double infinity() { return __longlong_as_double(0x7ff0000000000000LL); }
  FS_DEV double quiet_NaN() { return __longlong_as_double(0x7ff8000000000000LL); }
  FS_DEV double lowest() { return -1.7976931348623157e+308; }
  FS_DEV double max() { return 1.7976931348623157e+308; }
};
template <> struct fs_limits<int32_t> {
  FS_DEV int32_t lowest() { return -2147483647 - 1; }
  FS_DEV int32_t max() { return 2147483647; }
};
template <> struct fs_limits<int64_t> {
  FS_DEV int64_t lowest() { return -9223372036854775807LL - 1; }
  FS_DEV int64_t max() { return 9223372036854775807LL; }
};
FS_DEV float fs_select(bool c, float a, float b) { return c ? a : b; }
FS_DEV double fs_select(bool c, double a, double b) { return c ? a : b; }
template <typename T> FS_DEV T fs_select(bool c, T a, T b) { return c ? a : b; }
// The C++ target's formulas (printer.py, vecmath.py), on CUDA's libm.
FS_DEV float fs_sigmoidf(float x) {
  const float e = expf(-fabsf(x));
  return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
FS_DEV double fs_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
FS_DEV float fs_softplusf(float x) {
  const float th = -13.942385f, e = expf(x);
  return x > -th ? x : (x < th ? e : log1pf(e));
}
FS_DEV double fs_softplus(double x) {
  const double th = -34.04365338911715, e = exp(x);
  return x > -th ? x : (x < th ? e : log1p(e));
}
FS_DEV float fs__fmod(float x, float y) { return fmodf(x, y); }
FS_DEV double fs__fmod(double x, double y) { return fmod(x, y); }
template <typename T> FS_DEV T fs_floor_mod(T x, T y) {
  const T r = fs__fmod(x, y);
  return fs_select(r != T(0) && ((y < T(0)) != (r < T(0))), r + y, r);
}
// float16 travels as its bits; converted by the PTX instructions cuda_fp16.h
// uses (round to nearest even, NaN and Inf kept, denormals converted exactly).
FS_DEV float fs_f16_to_f32(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
FS_DEV uint16_t fs_f32_to_f16(float f) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
// bfloat16 <-> float32 as the C++ target does (vecmath.py): nearest even,
// NaN stays a quiet NaN with its sign.
FS_DEV float fs_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
FS_DEV uint16_t fs_f32_to_bf16(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t qnan = ((u >> 16) & 0x8000u) | 0x7fc0u;
  return (uint16_t)((x != x) ? qnan : rounded);
}
// ---- end of CUDA prelude ----
"""
