"""Input values of a case: seeded by the case's seed, the draw and the
input's name; mostly valid-domain values, never all zeros, with a fraction of
edge values (NaN, +-Inf, -0.0, denormals, huge values, extreme integers).
"""

from __future__ import annotations

import zlib
from typing import List

import numpy as np

from tf_fusionstitch.tools.fuzzing.np_dtypes import np_dtype
from tf_fusionstitch.tools.fuzzing.ops import INTS


def _edge_values(dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        tiny, big = 2.0 ** -126, 3.0e38
    else:
        fi = np.finfo(np_dtype(dtype))
        tiny, big = float(fi.tiny), float(fi.max)
    return np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, tiny / 4, -tiny / 4, tiny, big / 3,
                     -big / 3, big, -big], np.float64)


def make_input(inp, seed: int, draw: int) -> np.ndarray:
    """Values of one input for one draw (numpy, in the input's dtype). Seeded by the
    input's name, so that removing other inputs (shrinking) keeps these values."""
    gen = np.random.default_rng([seed, draw, zlib.crc32(inp["name"].encode())])
    shape, dtype, domain = tuple(inp["shape"]), inp["dtype"], inp.get("domain", "normal")
    if dtype == "bool":
        p = float(domain.split(":")[1]) if domain.startswith("bool:") else 0.5
        v = gen.random(shape) < p
        if v.size and not v.any():
            v.reshape(-1)[gen.integers(v.size)] = True
        return v
    if dtype in INTS:
        lo, hi = {"positive": (1, 21), "divisor": (2, 21)}.get(domain, (-20, 21))
        v = gen.integers(lo, hi, size=shape).astype(np.int64)
        if domain == "divisor":
            v *= gen.choice([-1, 1], size=shape)
        edges = float(inp.get("edges", 0.0))
        if edges > 0 and v.size:
            info = np.iinfo(dtype)
            pool = np.array([info.min, info.max, info.min + 1, info.max - 1, info.max // 2 + 1,
                             -(info.max // 2) - 1, 0, -1, 1], np.int64)
            if domain == "divisor":
                pool = pool[np.abs(pool.astype(np.float64)) >= 2]   # never 0 or -1
            v = np.where(gen.random(shape) < edges, gen.choice(pool, size=shape), v)
        if v.size and not np.any(v != 0):          # never all zeros
            v.reshape(-1)[gen.integers(v.size)] = 1
        return v.astype(dtype)
    else:
        if domain == "positive":
            v = np.exp(gen.uniform(np.log(0.05), np.log(20.0), shape))
        elif domain == "unit":
            v = gen.uniform(0.5, 1.5, shape)
        elif domain == "small":
            v = gen.uniform(-1.5, 1.5, shape)
        elif domain == "wide":     # magnitudes over six decades, both signs
            v = np.exp(gen.uniform(np.log(1e-3), np.log(1e3), shape)) * gen.choice([-1, 1], shape)
        else:
            v = gen.standard_normal(shape) * 2.0
    edges = float(inp.get("edges", 0.0))
    if edges > 0 and v.size:
        pick = gen.random(shape) < edges
        v = np.where(pick, gen.choice(_edge_values(dtype), size=shape), v)
    if v.size and not np.any(v != 0):        # never all zeros
        v.reshape(-1)[gen.integers(v.size)] = 1.0
    with np.errstate(over="ignore"):
        return v.astype(np_dtype(dtype))


def make_inputs(case, draw: int) -> List[np.ndarray]:
    return [make_input(inp, case["seed"], draw) for inp in case["inputs"]]
