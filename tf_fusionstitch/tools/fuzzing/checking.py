"""Checking one output: which elements of a value lie outside its enclosure,
and a short description of the first few.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tf_fusionstitch.tools.fuzzing.intervals import Iv, f64
from tf_fusionstitch.tools.fuzzing.ops import INTS


@dataclasses.dataclass
class Verdict:
    bad: np.ndarray          # elements outside the enclosure
    checked: int             # elements compared (not undetermined)
    total: int


def check_value(iv: Iv, value: np.ndarray) -> Verdict:
    """Where `value` (a result of TF or of the optimized function) leaves the enclosure.

    Floats: NaN exactly where NaN is certain; otherwise lo <= value <= hi
    (the sign of a zero is not compared: -0.0 == 0.0). Integers: equal.
    Booleans: equal where the result is determined."""
    if value.shape != iv.shape:
        raise ValueError(f"shape {value.shape} != {iv.shape}")
    known = ~iv.unk
    if iv.dtype in INTS:
        bad = known & (value.astype(np.int64) != iv.lo)
    elif iv.dtype == "bool":
        v = value.astype(np.float64)
        known = known & (iv.lo == iv.hi)
        bad = known & (v != iv.lo)
    else:
        v = f64(value)
        nan = np.isnan(iv.lo)
        with np.errstate(invalid="ignore"):
            inside = (v >= iv.lo) & (v <= iv.hi)
        bad = known & np.where(nan, ~np.isnan(v), ~inside)
    return Verdict(bad, int(known.sum()), int(known.size))


def describe(iv: Iv, expected, actual, bad, limit=4) -> str:
    idx = np.argwhere(bad)[:limit]
    parts = []
    for i in idx:
        i = tuple(int(t) for t in i)
        parts.append(f"[{','.join(map(str, i))}] fused={_fmt(actual[i])} tf={_fmt(expected[i])} "
                     f"allowed=[{_fmt(iv.lo[i])}, {_fmt(iv.hi[i])}]")
    return f"{int(bad.sum())}/{bad.size} elements: " + "; ".join(parts)


def _fmt(v) -> str:
    v = v.item() if hasattr(v, "item") else v
    if isinstance(v, float):
        return repr(float(np.float64(v)))
    return repr(v)
