"""Interval arithmetic for the oracle: the enclosure of one value (`Iv`),
outward rounding to a dtype's grid, widening by an op's error, evaluation at
the corners of an input box, and the enclosures of input values.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings

import numpy as np

from tf_fusionstitch.tools.fuzzing.np_dtypes import np_dtype
from tf_fusionstitch.tools.fuzzing.ops import FLOATS, INTS


U = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
TINY = {"float64": float(np.finfo(np.float64).tiny), "float32": float(np.finfo(np.float32).tiny),
        "float16": float(np.finfo(np.float16).tiny), "bfloat16": 2.0 ** -126}
# float16/bfloat16 ops are computed in float32 by TF (and by our kernels) and
# rounded to the storage type; float64 in float64.
COMPUTE = {"float64": "float64", "float32": "float32", "float16": "float32", "bfloat16": "float32"}


@dataclasses.dataclass
class Iv:
    """Enclosure of one value. floats: lo/hi float64 (NaN where NaN is certain);
    bools: lo/hi in {0., 1.}; ints: lo == hi int64 (exact). unk: undetermined."""
    dtype: str
    lo: np.ndarray
    hi: np.ndarray
    unk: np.ndarray

    @property
    def shape(self):
        return self.unk.shape


def f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _nudge(x, direction, dtype):
    """One step on the dtype's grid (x already on it)."""
    nd = np_dtype(dtype)
    return np.nextafter(x.astype(nd), np.array(direction * np.inf, dtype=nd)).astype(np.float64)


def round_out(lo, hi, dtype):
    """Round [lo, hi] outward to the dtype's grid, then allow flush-to-zero.

    Denormals: TF runs its threads with FTZ/DAZ (docs/DESIGN.md, "Numerics", and
    test_optimize_ops: not part of the contract), so any value whose magnitude
    may be below the smallest normal may also come out as a zero of its sign."""
    with np.errstate(all="ignore"):
        if dtype == "float64":
            lo = np.where(np.isfinite(lo), np.nextafter(lo, -np.inf), lo)
            hi = np.where(np.isfinite(hi), np.nextafter(hi, np.inf), hi)
        else:
            nd = np_dtype(dtype)
            l64 = lo.astype(nd).astype(np.float64)
            h64 = hi.astype(nd).astype(np.float64)
            lo = np.where(l64 > lo, _nudge(l64, -1, dtype), l64)
            hi = np.where(h64 < hi, _nudge(h64, 1, dtype), h64)
    tiny = TINY[dtype]
    lo = np.where((lo > 0) & (lo < tiny), 0.0, lo)
    hi = np.where((hi < 0) & (hi > -tiny), -0.0, hi)
    return lo, hi


def max_finite(dtype: str) -> float:
    return 3.3895313892515355e38 if dtype == "bfloat16" else float(np.finfo(np_dtype(dtype)).max)


def widen(lo, hi, rel, absolute=0.0):
    with np.errstate(all="ignore"):
        lo2 = lo - (rel * np.abs(lo) + absolute)
        hi2 = hi + (rel * np.abs(hi) + absolute)
    return np.where(np.isfinite(lo), lo2, lo), np.where(np.isfinite(hi), hi2, hi)


def finish(dtype, lo, hi, unk, err=(0, 0, 0), absolute=0.0):
    """Widen by an op's error model, round outward, mark undetermined elements."""
    kc, kd, ka = err
    # No slack for correctly rounded ops: their corners, computed in float64 and
    # rounded outward, hold every correctly rounded result (TF's and ours).
    rel = kc * U[COMPUTE[dtype]] + (kd * U[dtype] if dtype in ("float16", "bfloat16") else 0.0)
    lo, hi = widen(lo, hi, rel, ka * U[dtype] + absolute)
    lo, hi = round_out(lo, hi, dtype)
    nan = np.isnan(lo) | np.isnan(hi)
    unk = unk | (nan & ~(np.isnan(lo) & np.isnan(hi)))
    lo = np.where(unk, -np.inf, lo)
    hi = np.where(unk, np.inf, hi)
    return Iv(dtype, lo, hi, unk)


def minmax_corners(results):
    """lo/hi over corner results (NaN ignored) and whether some/all corners are NaN."""
    r = np.stack(results)
    nan = np.isnan(r)
    any_nan, all_nan = nan.any(0), nan.all(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo = np.nanmin(r, 0)
        hi = np.nanmax(r, 0)
    neg0 = ((r == 0) & np.signbit(r)).any(0)
    pos0 = ((r == 0) & ~np.signbit(r)).any(0)
    lo = np.where((lo == 0) & neg0, -0.0, lo)
    hi = np.where((hi == 0) & pos0, 0.0, hi)
    lo = np.where(all_nan, np.nan, lo)
    hi = np.where(all_nan, np.nan, hi)
    return lo, hi, any_nan & ~all_nan


def corners(fn, ivs, extra_points=()):
    """fn over every corner of the inputs' box (valid for functions monotone in each
    argument separately); extra_points: more argument tuples to evaluate."""
    shape = np.broadcast_shapes(*[v.shape for v in ivs])
    results = []
    with np.errstate(all="ignore"):
        for choice in itertools.product(*[(v.lo, v.hi) for v in ivs]):
            results.append(np.broadcast_to(fn(*choice), shape).astype(np.float64))
        for pts in extra_points:
            results.append(np.broadcast_to(fn(*pts), shape).astype(np.float64))
    lo, hi, maybe_nan = minmax_corners(results)
    unk = np.zeros(shape, bool)
    for v in ivs:
        unk = unk | v.unk
    return lo, hi, unk | maybe_nan


def holds(iv: Iv, v: float) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return (iv.lo <= v) & (v <= iv.hi)


def is_exact(iv: Iv) -> np.ndarray:
    return ~iv.unk & (iv.lo == iv.hi)


def bool_iv(lo, hi) -> Iv:
    lo, hi = f64(lo), f64(hi)
    return Iv("bool", lo, hi, np.zeros(lo.shape, bool))


def int_iv(dtype, val, unk) -> Iv:
    val = np.asarray(val).astype(np.int64)
    unk = np.broadcast_to(unk, val.shape).copy()
    return Iv(dtype, val, val.copy(), unk)


def input_iv(dtype: str, value: np.ndarray) -> Iv:
    if dtype == "bool":
        return bool_iv(value, value)
    if dtype in INTS:
        return int_iv(dtype, value, np.zeros(value.shape, bool))
    v = f64(value)
    # DAZ: a denormal input may be read as a zero of its sign.
    tiny = TINY[dtype]
    den = (v != 0) & (np.abs(v) < tiny)
    lo = np.where(den & (v > 0), 0.0, v)
    hi = np.where(den & (v < 0), -0.0, v)
    return Iv(dtype, lo, hi, np.zeros(v.shape, bool))


def denormal_endpoint(iv: Iv) -> np.ndarray:
    """The denormal value an input interval came from (DAZ widened it to a zero),
    NaN where there is none."""
    tiny = TINY[iv.dtype]
    with np.errstate(invalid="ignore"):
        dl = (iv.lo != 0) & (np.abs(iv.lo) < tiny)
        dh = (iv.hi != 0) & (np.abs(iv.hi) < tiny)
    return np.where(dl, iv.lo, np.where(dh, iv.hi, np.nan))


def with_passthrough(lo, hi, *ivs):
    """Selects between values (relu, max, min) read a denormal operand as zero
    (DAZ) but may return its bits unchanged: TF flushes, our kernels pass it
    through (test_optimize_ops: not part of the contract). Widen to include it."""
    for iv in ivs:
        if iv.dtype not in FLOATS:
            continue
        den = denormal_endpoint(iv)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            lo = np.where(np.isnan(den) | np.isnan(lo), lo, np.fmin(lo, den))
            hi = np.where(np.isnan(den) | np.isnan(hi), hi, np.fmax(hi, den))
    return lo, hi
