"""Accuracy, special values and vectorisation of the float32 math prelude.

No TensorFlow: a small C++ harness around `CPP_PRELUDE` is compiled with g++
under the kernel flags, loaded with ctypes, and compared with float64
references (numpy; math.erf/erfc for erf and erfc). On x86-64 it is built
twice: for the native target and with FMA switched off (-mno-fma
-mno-avx512f), which takes the two-rounding fallback of fs__fma.
"""

from __future__ import annotations

import ctypes
import math
import re
import shutil
import subprocess

import numpy as np
import pytest

from tf_fusionstitch.codegen.vecmath import CPP_PRELUDE, FLOAT32_FUNCTIONS, ULP_BOUNDS
from tf_fusionstitch.runtime import cpu_compiler

NAMES = tuple(FLOAT32_FUNCTIONS)  # exp, expm1, log, log1p, tanh, sigmoid, erf, erfc
FLAGS = ["-std=c++17", cpu_compiler.OPT_LEVEL, "-fPIC", "-shared", "-fopenmp-simd",
         "-ffp-contract=off", "-fwrapv", "-fno-math-errno", "-Wall", "-Wextra", "-Werror"]
FLT_MAX = float(np.finfo(np.float32).max)
INF = math.inf


def _harness_source():
    """The prelude plus, per function, a vector loop and a scalar entry point.

    Returns (source, {name: line of the vector loop}).
    """
    lines = ["#if defined(__SSE__)", "#include <xmmintrin.h>", "#endif"]
    lines += CPP_PRELUDE.splitlines()
    loop_line = {}
    for name in NAMES:
        fn = FLOAT32_FUNCTIONS[name]
        lines.append(f'extern "C" void vec_{name}(const float* x, float* y, int64_t n) {{')
        lines.append("#pragma omp simd")
        loop_line[name] = len(lines) + 1
        lines.append(f"  for (int64_t i = 0; i < n; ++i) y[i] = {fn}(x[i]);")
        lines.append("}")
        lines.append(f'extern "C" float one_{name}(float x) {{ return {fn}(x); }}')
        # TF's intra-op threads run with flush-to-zero and denormals-are-zero.
        lines += ["#if defined(__SSE__)",
                  f'extern "C" void ftz_{name}(const float* x, float* y, int64_t n) {{',
                  "  unsigned int saved = _mm_getcsr();",
                  "  _mm_setcsr(saved | 0x8040u);",
                  f"  vec_{name}(x, y, n);",
                  "  _mm_setcsr(saved);",
                  "}",
                  "#endif"]
    for name, (src_t, dst_t, fn) in {"to_bf16": ("float", "uint16_t", "fs_f32_to_bf16"),
                                     "from_bf16": ("uint16_t", "float", "fs_bf16_to_f32")}.items():
        lines.append(f'extern "C" void {name}(const {src_t}* x, {dst_t}* y, int64_t n) {{')
        lines.append("#pragma omp simd")
        loop_line[name] = len(lines) + 1
        lines.append(f"  for (int64_t i = 0; i < n; ++i) y[i] = {fn}(x[i]);")
        lines.append("}")
    return "\n".join(lines) + "\n", loop_line


def _compile(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module", params=["native", "no-fma"])
def harness(request, tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found")
    tmp = tmp_path_factory.mktemp("vecmath")
    source, loop_line = _harness_source()
    src = tmp / "harness.cpp"
    src.write_text(source)
    out = tmp / "harness.so"
    flags = list(FLAGS)
    probe = _compile([gxx, "-march=native", "-x", "c++", "-fsyntax-only", "/dev/null"])
    if probe.returncode == 0:
        flags.append("-march=native")
    if request.param == "no-fma":
        # fs__fma without hardware FMA (a * b + c, two roundings) and erfc's
        # exact square without fmaf; GCC's __FP_FAST_FMAF is off with both.
        no_fma = ["-mno-fma", "-mno-avx512f"]
        probe = _compile([gxx, *flags, *no_fma, "-x", "c++", "-fsyntax-only", "/dev/null"])
        if probe.returncode != 0:
            pytest.skip("no x86 FMA switches")
        flags += no_fma
    proc = _compile([gxx, *flags, "-fopt-info-vec-optimized", str(src), "-o", str(out)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    lib = ctypes.CDLL(str(out))
    fptr = ctypes.POINTER(ctypes.c_float)
    for name in NAMES:
        getattr(lib, f"vec_{name}").argtypes = [fptr, fptr, ctypes.c_int64]
        getattr(lib, f"one_{name}").argtypes = [ctypes.c_float]
        getattr(lib, f"one_{name}").restype = ctypes.c_float
    return lib, proc.stderr, loop_line


def _apply(lib, name, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty_like(x)
    fptr = ctypes.POINTER(ctypes.c_float)
    getattr(lib, f"vec_{name}")(x.ctypes.data_as(fptr), y.ctypes.data_as(fptr), x.size)
    return y


def _sigmoid64(x):
    with np.errstate(over="ignore"):
        e = np.exp(-np.abs(x))
        return np.where(x < 0, e, 1.0) / (1.0 + e)


_vec_erf = np.frompyfunc(math.erf, 1, 1)
_vec_erfc = np.frompyfunc(math.erfc, 1, 1)

REFERENCE = {
    "exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "tanh": np.tanh,
    "sigmoid": _sigmoid64,
    "erf": lambda x: _vec_erf(x).astype(np.float64),
    "erfc": lambda x: _vec_erfc(x).astype(np.float64),
}


def _reference(name, x32):
    with np.errstate(all="ignore"):
        x = x32.astype(np.float64)
        if name in ("erf", "erfc"):
            out = np.full(x.shape, np.nan)
            ok = ~np.isnan(x)
            out[ok] = REFERENCE[name](x[ok])
            return out
        return REFERENCE[name](x)


def _ulp_errors(y32, ref):
    """|y - ref| in float32 ulps of ref (denormal ulps below FLT_MIN); inf on a
    NaN/Inf mismatch or an overflow that the float32 result does not match."""
    with np.errstate(all="ignore"):
        y = y32.astype(np.float64)
        ref32 = ref.astype(np.float32).astype(np.float64)
        exponent = np.frexp(np.where(np.isfinite(ref) & (ref != 0), ref, 1.0))[1] - 1
        ulp = np.ldexp(1.0, np.maximum(exponent, -126) - 23)
        err = np.abs(y - ref) / ulp
    nonfinite = ~np.isfinite(ref32) | ~np.isfinite(y)
    same = (y == ref32) | (np.isnan(y) & np.isnan(ref))
    return np.where(nonfinite, np.where(same, 0.0, np.inf), err)


def _bits(u):
    return np.asarray(u, dtype=np.uint32).view(np.float32)


def _consecutive(start, count):
    """`count` consecutive float32 values from `start` upwards."""
    b = np.float32(start).view(np.uint32).astype(np.int64)
    if start < 0:
        idx = b - np.arange(count)  # towards -0 is upwards for negatives
        idx = idx[idx >= 0x80000000]
    else:
        idx = b + np.arange(count)
    return idx.astype(np.uint32).view(np.float32)


# Regions that each need dense coverage: near 0, thresholds of overflow,
# underflow and saturation, and the joins between approximation pieces.
# The last entries are where the exhaustive maxima of the current
# implementation lie (module docstring) and where its scaling steps switch
# (exp: 2^n split at x ~ -85.3; log1p: the c 2^-e term near FLT_MAX).
DENSE = {
    "exp": [(-104.0, -86.0), (86.0, 89.0), (-1.0, 1.0), (-90.0, -80.0), (-8.0, 8.0)],
    "expm1": [(-20.0, 1.0), (86.0, 89.0), (-1e-3, 1e-3), (0.3, 1.1), (-1.1, -0.3)],
    "log": [(0.5, 2.0), (1e-40, 1e-37), (0.99, 1.01), (0.7, 0.85)],
    "log1p": [(-1.0, 1.0), (-1e-3, 1e-3), (0.25, 0.5), (-0.3, -0.15), (1e37, 3.4e38)],
    "tanh": [(-10.0, 10.0), (-1.0, 1.0), (0.03, 0.2)],
    "sigmoid": [(-110.0, 90.0), (-20.0, 20.0), (-6.0, -2.0), (-104.0, -84.0)],
    "erf": [(-4.5, 4.5), (0.8, 1.2), (0.05, 0.3), (-1e-3, 1e-3)],
    "erfc": [(-5.0, 11.0), (0.3, 1.2), (8.5, 10.2), (0.7, 0.9), (9.1, 9.2)],
}
CONSECUTIVE = {
    "exp": [88.5, -87.5, -103.5, -0.35, -85.3, -5.8486],
    "expm1": [88.5, 0.34, -0.35, 1e-7, -1e-7, 0.3959, 2.98e-8],
    "log": [0.70710, 1.41421, 1.0 - 1e-6, 1e-45, 0.78929],
    "log1p": [-0.2929, 0.41420, -1.0, 1e-7, -1e-7, -0.22007],
    "tanh": [0.0, -0.001, 9.0, 0.062023],
    "sigmoid": [-103.9, 0.0, 16.5, -4.1573],
    "erf": [0.999, -1.0, 3.9, 2.1129e-7, 0.109],
    "erfc": [0.499, -0.501, 0.999, 9.19, 10.0, 0.81469, 9.158],
}


def _inputs(name, rng):
    parts = [
        # every 1024th bit pattern: all binades, both signs, denormals, Inf, NaN
        np.arange(0, 2**32, 1024, dtype=np.uint64).astype(np.uint32).view(np.float32),
        _bits(rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)),
    ]
    for lo, hi in DENSE[name]:
        parts.append(rng.uniform(lo, hi, 300_000).astype(np.float32))
    for start in CONSECUTIVE[name]:
        parts.append(_consecutive(np.float32(start), 20_000))
    return np.concatenate(parts)


@pytest.mark.parametrize("name", NAMES)
def test_accuracy(harness, name):
    lib, _, _ = harness
    x = _inputs(name, np.random.default_rng(1234))
    y = _apply(lib, name, x)
    ref = _reference(name, x)
    err = _ulp_errors(y, ref)
    worst = int(np.argmax(err))
    assert err[worst] <= ULP_BOUNDS[name], (
        f"{name}: {err[worst]:.3f} ulp at x={float(x[worst])!r} "
        f"(got {float(y[worst])!r}, want {float(ref[worst])!r})")


def test_erfc_tail_is_relative(harness):
    # erfc must keep relative accuracy out to the smallest normal result (x ~ 9.19).
    lib, _, _ = harness
    x = np.linspace(0.5, 9.19, 200_001).astype(np.float32)
    y = _apply(lib, "erfc", x).astype(np.float64)
    ref = _reference("erfc", x)
    assert np.all(ref >= np.finfo(np.float32).tiny)
    rel = np.abs(y - ref) / ref
    assert rel.max() <= 4 * 2.0 ** -23


SPECIAL = {
    "exp": [(INF, INF), (-INF, 0.0), (0.0, 1.0), (-0.0, 1.0), (89.0, INF), (-104.0, 0.0),
            (FLT_MAX, INF), (-FLT_MAX, 0.0), (-103.5, 2.0 ** -149), (-110.0, 0.0)],
    "expm1": [(INF, INF), (-INF, -1.0), (0.0, 0.0), (-0.0, -0.0), (89.0, INF), (-30.0, -1.0),
              (1e-45, 1e-45), (-1e-45, -1e-45), (FLT_MAX, INF)],
    "log": [(0.0, -INF), (-0.0, -INF), (-1.0, math.nan), (-INF, math.nan), (INF, INF),
            (1.0, 0.0), (2.0 ** -149, float(np.float32(-149 * math.log(2))))],
    "log1p": [(-1.0, -INF), (-2.0, math.nan), (-INF, math.nan), (INF, INF), (0.0, 0.0),
              (-0.0, -0.0), (1e-45, 1e-45), (FLT_MAX, float(np.float32(math.log(FLT_MAX))))],
    "tanh": [(INF, 1.0), (-INF, -1.0), (0.0, 0.0), (-0.0, -0.0), (20.0, 1.0), (-20.0, -1.0),
             (1e-45, 1e-45), (-1e-45, -1e-45)],
    "sigmoid": [(INF, 1.0), (-INF, 0.0), (0.0, 0.5), (-0.0, 0.5), (-200.0, 0.0), (200.0, 1.0)],
    "erf": [(INF, 1.0), (-INF, -1.0), (0.0, 0.0), (-0.0, -0.0), (5.0, 1.0), (-5.0, -1.0)],
    "erfc": [(INF, 0.0), (-INF, 2.0), (0.0, 1.0), (-0.0, 1.0), (11.0, 0.0), (-6.0, 2.0)],
}


@pytest.mark.parametrize("name", NAMES)
def test_special_values(harness, name):
    lib, _, _ = harness
    cases = SPECIAL[name] + [(math.nan, math.nan), (-math.nan, math.nan)]
    x = np.array([c[0] for c in cases], dtype=np.float32)
    want = np.array([c[1] for c in cases], dtype=np.float32)
    got = _apply(lib, name, x)
    for xi, gi, wi in zip(x, got, want):
        if np.isnan(wi):
            assert np.isnan(gi), f"{name}({xi!r}) = {gi!r}, want NaN"
        else:
            assert gi == wi and np.signbit(gi) == np.signbit(wi), (
                f"{name}({xi!r}) = {gi!r}, want {wi!r}")


@pytest.mark.parametrize("name", NAMES)
def test_nan_payloads_and_infinities(harness, name):
    # The clamps work on bit patterns: every NaN (either sign, any payload)
    # must come out NaN, the infinities and the largest finite values must
    # come out as std:: gives them.
    lib, _, _ = harness
    nans = _bits(np.array([0x7f800001, 0x7fbfffff, 0x7fc00000, 0x7fc00001, 0x7fffffff,
                           0xff800001, 0xffbfffff, 0xffc00000, 0xffffffff], dtype=np.uint32))
    assert np.isnan(_apply(lib, name, nans)).all()
    x = np.array([INF, -INF, FLT_MAX, -FLT_MAX, np.nextafter(np.float32(INF), np.float32(0))],
                 dtype=np.float32)
    err = _ulp_errors(_apply(lib, name, x), _reference(name, x))
    assert (err <= ULP_BOUNDS[name]).all(), (name, x, err)


@pytest.mark.parametrize("name", NAMES)
def test_vector_and_scalar_results_are_identical(harness, name):
    lib, _, _ = harness
    rng = np.random.default_rng(7)
    x = np.concatenate([_bits(rng.integers(0, 2**32, 1000, dtype=np.uint64).astype(np.uint32)),
                        rng.uniform(-12, 12, 1000).astype(np.float32)])
    y = _apply(lib, name, x)
    one = getattr(lib, f"one_{name}")
    scalar = np.array([one(float(v)) for v in x], dtype=np.float32)
    same = (y.view(np.uint32) == scalar.view(np.uint32)) | (np.isnan(y) & np.isnan(scalar))
    assert same.all(), f"{name}: first difference at x={float(x[np.argmin(same)])!r}"


@pytest.mark.parametrize("name", NAMES)
def test_normal_results_survive_flush_to_zero(harness, name):
    """Kernels inside TF run with FTZ/DAZ set. Where the result is a normal
    float and the input is not a denormal, no intermediate may underflow: the
    result must be the same bits as without FTZ (erfc near 9.16 once became 0)."""
    lib, _, _ = harness
    if not hasattr(lib, f"ftz_{name}"):
        pytest.skip("flush-to-zero is set through SSE's MXCSR; not an SSE target")
    x = _inputs(name, np.random.default_rng(11))
    plain = _apply(lib, name, x)
    fptr = ctypes.POINTER(ctypes.c_float)
    flushed = np.empty_like(x)
    getattr(lib, f"ftz_{name}")(x.ctypes.data_as(fptr), flushed.ctypes.data_as(fptr), x.size)
    tiny = np.finfo(np.float32).tiny
    with np.errstate(invalid="ignore"):
        check = ~(np.abs(x) < tiny) & ~(np.abs(plain) < tiny)
    same = (plain.view(np.uint32) == flushed.view(np.uint32)) | (np.isnan(plain) & np.isnan(flushed))
    bad = check & ~same
    assert not bad.any(), (f"{name}: {int(bad.sum())} results change under FTZ, e.g. "
                           f"x={float(x[bad][0])!r}: {plain[bad][0]!r} -> {flushed[bad][0]!r}")


def test_every_loop_is_vectorised(harness):
    _, report, loop_line = harness
    vectorised = {int(m.group(1)) for m in
                  re.finditer(r"harness\.cpp:(\d+):\d+: optimized: loop vectorized", report)}
    missing = [name for name, line in loop_line.items() if line not in vectorised]
    assert not missing, f"not vectorised: {missing}\n{report[-3000:]}"


def test_bfloat16_conversions(harness):
    lib, _, _ = harness
    u16p = ctypes.POINTER(ctypes.c_uint16)
    fptr = ctypes.POINTER(ctypes.c_float)
    # bf16 -> f32 is exact for all 65536 patterns.
    h = np.arange(65536, dtype=np.uint16)
    f = np.empty(65536, np.float32)
    lib.from_bf16(h.ctypes.data_as(u16p), f.ctypes.data_as(fptr), h.size)
    assert np.array_equal(f.view(np.uint32), h.astype(np.uint32) << 16)
    # f32 -> bf16 rounds to nearest even; NaN stays a quiet NaN with its sign.
    rng = np.random.default_rng(3)
    bits = np.concatenate([
        rng.integers(0, 2**32, 300_000, dtype=np.uint64).astype(np.uint32),
        (rng.integers(0, 2**16, 2000, dtype=np.uint32) << 16) | 0x8000,  # exact ties
        np.array([0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7f800001, 0xffc00000,
                  0x00000001, 0x80008000, 0x3f808000, 0x3f818000], dtype=np.uint32),
    ])
    x = bits.view(np.float32)
    out = np.empty(x.size, np.uint16)
    lib.to_bf16(x.ctypes.data_as(fptr), out.ctypes.data_as(u16p), x.size)
    b = bits.astype(np.uint64)
    want = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(out[~nan], want[~nan])
    assert np.all((out[nan] & 0x7FC0) == 0x7FC0)                    # quiet NaN
    assert np.array_equal(out[nan] >> 15, (bits[nan] >> 31).astype(np.uint16))
    assert out[bits == 0x7f7fffff][0] == 0x7F80                      # rounds to +inf


def test_prelude_includes_only_the_allowed_headers():
    includes = set(re.findall(r"#include\s*<([^>]+)>", CPP_PRELUDE))
    assert includes == {"cstdint", "cstring", "limits"}
    for name, fn in FLOAT32_FUNCTIONS.items():
        assert f"FS_INLINE float {fn}(float x)" in CPP_PRELUDE, name
