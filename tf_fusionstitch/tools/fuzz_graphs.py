"""Differential fuzzing of `tf_fusionstitch.optimize` with random graphs.

A *case* is a small random DAG of op-table ops (3-12 ops) over a few inputs,
described by plain JSON so that it can be replayed, shrunk and checked in:

    {"version": 1, "seed": 123,
     "inputs": [{"name": "x0", "dtype": "float32", "shape": [3, 1, 4],
                 "static": [null, 1, 4], "domain": "normal", "edges": 0.1}],
     "nodes": [{"name": "n0", "op": "AddV2", "inputs": ["x0", {"const": 0.5}],
                "attrs": {}}],
     "outputs": ["n0"]}

`shape` is the run-time shape, `static` the input signature (None = dynamic),
`domain` and `edges` say how input values are drawn (`make_inputs`: seeded by
`seed`, the draw and the input's name; mostly valid-domain values, never all
zeros; `edges` is the fraction of elements replaced by NaN, +-Inf, -0.0,
denormals, huge values, or for integers extreme values). A node's inputs are
value names or scalar constants. Extreme integers overflow only where TF's
kernels wrap (two's complement add, sub, mul, neg, abs, square, sums and
products, int64 means; ours build with -fwrapv); TF's int32 Mean does not wrap
(it is exact, measured), and the oracle says so. Integer division gets divisors
in +-[2, 20] (no division by zero, no INT_MIN / -1); float-to-int casts of
NaN, Inf or out-of-range values are undetermined (undefined behaviour in C++).

The runner (`run_cases`) puts several independent cases into ONE tf.function
(one trace, one Grappler run, the kernels of all cases compiled in parallel),
optimizes it with min_cluster_ops=1, calls both on fresh random inputs and
checks every output of every case, so a mismatch is attributed to its case.

How results are judged (the oracle)
-----------------------------------
Every output is checked against an *enclosure* computed by `evaluate`: interval
arithmetic in float64 over the same DAG, starting from the exact input values.
For every value it gives [lo, hi] (floats), an exact value (integers), or a
{0, 1} interval (booleans), that contains what ANY implementation conforming
to docs/DESIGN.md, "Numerics" may return: each primitive is evaluated at the
corners of its input box (every op here is monotone in each argument, or is
handled by a rule of its own below), then widened by that op's documented error
(`_ERR`: a few ulps for transcendental functions, none for correctly rounded
arithmetic) and rounded *outward* to the dtype's grid. Consequences:

- integers and booleans are exact wherever the value is determined;
- an ill-conditioned value (a float16 cancellation, a floor of a value that
  sits on an integer within its error, a comparison of nearly equal values)
  gets a wide interval, or becomes undetermined, because the interval of its
  inputs straddles the cancellation or the discontinuity. This is a derived
  bound: it never loosens a well-conditioned value;
- a NaN must be NaN exactly where every conforming implementation gives NaN;
  where a NaN depends on rounding (inf - inf after a possible overflow) the
  element is undetermined and skipped;
- TensorFlow's own result is checked against the same enclosure. If TF falls
  outside, the *oracle* is wrong (or TF differs from the documented
  semantics): that is reported as an oracle problem, not as a compiler bug.
  So the rules below are validated on every run against TF itself.

Rules that are semantic choices, not arithmetic, are commented where they are
made (`_ERR`, `_Oracle`): denormals (TF runs with FTZ/DAZ), float-to-int casts
of NaN/Inf/out-of-range values (undefined in C++), softmax rows holding +Inf or
NaN (TF's Eigen and oneDNN kernels disagree), signs of zero (not compared),
TF's float64 erf beyond sqrt(DBL_MAX) (NaN in TF), reduction orders (partial
sums and products that may overflow or underflow). Grappler rewrites that TF
and optimize() both apply and that change results (pow by a constant, max of a
monotone function, log of softmax, not of a comparison, 1/(1/x), x / c as
x * (1/c), reassociated sums and products: the union over their possible
orders) are applied to the oracle's graph first (`grappler_rewrites`,
`_reassociate`, `_Oracle.monotone_hoist`).

On a mismatch, `shrink` removes outputs and ops, lowers ranks and extents and
drops edge values while the mismatch persists, and `save_regression` writes the
minimal case under tests/fuzz_regressions/. `python -m tf_fusionstitch.tools.fuzz`
is the command-line driver.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import pathlib
import time
import warnings
import zlib
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs

FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int32", "int64")
DTYPES = FLOATS + INTS + ("bool",)
F, FI, FIB, B = FLOATS, FLOATS + INTS, FLOATS + INTS + ("bool",), ("bool",)

CASE_VERSION = 1
REGRESSIONS_DIR = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fuzz_regressions"

# ---------------------------------------------------------------------------
# The ops the generator draws from: the op table's TF ops, with the dtypes
# TensorFlow's CPU kernels accept for them (those fused and a few left to TF,
# e.g. integer division, so that fused and unfused ops mix).
# ---------------------------------------------------------------------------
UNARY_OPS = {
    "Neg": FI, "Abs": FI, "Square": FI, "Sign": FI, "Relu": FI, "Relu6": F,
    "Exp": F, "Log": F, "Log1p": F, "Expm1": F, "Sqrt": F, "Rsqrt": F, "Reciprocal": F,
    "Tanh": F, "Sigmoid": F, "Elu": F, "Selu": F, "Softplus": F, "Erf": F, "Erfc": F,
    "Sin": F, "Cos": F, "Floor": F, "Ceil": F, "Round": F, "IsFinite": F, "IsNan": F,
    "LogicalNot": B,
}
_FEATURES_ARG = {"Relu", "Relu6", "Elu", "Selu", "Softplus"}
BINARY_OPS = {
    "AddV2": FI, "Add": FI, "Sub": FI, "Mul": FI, "RealDiv": F, "Div": FI, "DivNoNan": F,
    "Maximum": FI, "Minimum": FI, "Pow": F, "SquaredDifference": FI, "FloorDiv": FI,
    "FloorMod": FI, "Less": FI, "Greater": FI, "LessEqual": FI, "GreaterEqual": FI,
    "Equal": FIB, "NotEqual": FIB, "LogicalAnd": B, "LogicalOr": B,
}
COMPARISONS = ("Less", "Greater", "LessEqual", "GreaterEqual", "Equal", "NotEqual")
REDUCE_OPS = {"Sum": FI, "Mean": FI, "Max": FI, "Min": FI, "Prod": FI, "Any": B, "All": B}
# ops whose second operand must keep away from zero (integers: a fresh divisor
# input in +-[2, 20], so that neither division by zero nor INT_MIN / -1 occurs).
_DIVISIONS = ("RealDiv", "Div", "FloorDiv", "FloorMod")
_NEEDS = {"Log": "pos", "Rsqrt": "pos", "Sqrt": "nonneg", "Log1p": "nonneg",
          "Reciprocal": "nonzero"}
_MAKES = {"Exp": "pos", "Sigmoid": "pos", "Softplus": "nonneg", "Square": "nonneg",
          "Abs": "nonneg", "Relu": "nonneg", "Relu6": "nonneg", "Sqrt": "nonneg",
          "Erfc": "nonneg", "Softmax": "nonneg"}

SELU_SCALE = 1.0507009873554804934193349852946
SELU_ALPHA = 1.6732632423543772848170429916717


class CaseError(ValueError):
    """The case does not describe a valid graph (shapes, dtypes, attributes)."""


def _np_dtype(dtype: str):
    return tf.as_dtype(dtype).as_numpy_dtype


# ---------------------------------------------------------------------------
# Types of a case's values (the generator's and the shrinker's shape inference)
# ---------------------------------------------------------------------------
def _broadcast(*shapes) -> tuple:
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise CaseError(f"shapes {[list(s) for s in shapes]} do not broadcast") from None


def _norm_axes(axes, rank) -> list:
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise CaseError(f"axis {a} out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise CaseError(f"repeated axis in {axes}")
    return sorted(out)


def _const_dtype(node, types, k):
    """Dtype of a scalar constant operand: that of the node's other operands."""
    for j, ref in enumerate(node["inputs"]):
        if j != k and isinstance(ref, str):
            return types[ref][0]
    raise CaseError(f"{node['name']}: only constant operands")


def operand_types(node, types) -> list:
    out = []
    for k, ref in enumerate(node["inputs"]):
        if isinstance(ref, str):
            if ref not in types:
                raise CaseError(f"{node['name']}: unknown input {ref}")
            out.append(types[ref])
        else:
            out.append((_const_dtype(node, types, k), ()))
    return out


def node_type(node, ins) -> tuple:
    """(dtype, shape) of a node's result; raises CaseError if TF would refuse it."""
    op, a = node["op"], node.get("attrs", {})
    dts = [t[0] for t in ins]
    shapes = [tuple(t[1]) for t in ins]

    def need(ok, why):
        if not ok:
            raise CaseError(f"{node['name']} ({op}): {why}")

    if op in UNARY_OPS:
        need(len(ins) == 1 and dts[0] in UNARY_OPS[op], f"dtype {dts}")
        return ("bool" if op in ("IsFinite", "IsNan") else dts[0]), shapes[0]
    if op in BINARY_OPS:
        need(len(ins) == 2 and dts[0] == dts[1] and dts[0] in BINARY_OPS[op], f"dtypes {dts}")
        return ("bool" if op in COMPARISONS else dts[0]), _broadcast(*shapes)
    if op == "Select":
        need(len(ins) == 3 and dts[0] == "bool" and dts[1] == dts[2], f"dtypes {dts}")
        need(shapes[1] == shapes[2], "Select needs x and y of one shape")
        need(shapes[0] == shapes[1] or (len(shapes[0]) == 1 and len(shapes[1]) > 1
                                        and shapes[0][0] == shapes[1][0]),
             "Select condition must match x or be a vector over its first dim")
        return dts[1], shapes[1]
    if op == "SelectV2":
        need(len(ins) == 3 and dts[0] == "bool" and dts[1] == dts[2], f"dtypes {dts}")
        return dts[1], _broadcast(*shapes)
    if op in REDUCE_OPS:
        need(len(ins) == 1 and dts[0] in REDUCE_OPS[op], f"dtype {dts}")
        shape = shapes[0]
        axes = _norm_axes(a["axis"], len(shape)) if shape else (
            [] if not a["axis"] else need(False, "axes of a scalar"))
        n = math.prod(shape[i] for i in axes)
        keep = bool(a["keep_dims"])
        out = tuple((1 if i in axes else d) for i, d in enumerate(shape) if keep or i not in axes)
        # integer Mean of nothing divides by zero (SIGFPE in TF): never generated
        need(not (op == "Mean" and dts[0] in INTS and n == 0 and math.prod(out) > 0),
             "integer mean over an empty axis")
        return dts[0], out
    if op in ("Softmax", "LogSoftmax"):
        need(len(ins) == 1 and dts[0] in FLOATS and len(shapes[0]) >= 1, "float, rank >= 1")
        return dts[0], shapes[0]
    if op == "BiasAdd":
        need(len(ins) == 2 and dts[0] == dts[1] and dts[0] in FI, f"dtypes {dts}")
        x, b = shapes
        fmt = a.get("data_format", "NHWC")
        need(len(x) >= 2 and len(b) == 1, "BiasAdd: rank >= 2 and a vector bias")
        c = x[1] if fmt == "NCHW" else x[-1]
        need(fmt in ("NHWC", "NCHW") and (fmt == "NHWC" or len(x) >= 3) and b[0] == c,
             "BiasAdd bias size")
        return dts[0], x
    if op == "Cast":
        need(len(ins) == 1 and a["to"] in DTYPES, "Cast")
        return a["to"], shapes[0]
    if op == "Reshape":
        target = tuple(a["shape"])
        need(all(d >= 0 for d in target) and [d for d in target if d != 1] ==
             [d for d in shapes[0] if d != 1] and math.prod(target) == math.prod(shapes[0]),
             "Reshape only adds or removes size-1 dims")
        return dts[0], target
    if op == "ExpandDims":
        r = len(shapes[0])
        ax = a["axis"]
        need(-r - 1 <= ax <= r, "ExpandDims axis")
        ax = ax % (r + 1)
        return dts[0], shapes[0][:ax] + (1,) + shapes[0][ax:]
    if op == "Squeeze":
        axes = _norm_axes(a["axis"], len(shapes[0]))
        need(axes and all(shapes[0][i] == 1 for i in axes), "Squeeze of a dim that is not 1")
        return dts[0], tuple(d for i, d in enumerate(shapes[0]) if i not in axes)
    if op == "BroadcastTo":
        target = tuple(a["shape"])
        need(_broadcast(shapes[0], target) == target, "BroadcastTo target")
        return dts[0], target
    if op == "Transpose":
        perm = list(a["perm"])
        need(sorted(perm) == list(range(len(shapes[0]))), "Transpose permutation")
        return dts[0], tuple(shapes[0][i] for i in perm)
    raise CaseError(f"unknown op {op}")


def infer_types(case) -> Dict[str, tuple]:
    types = {}
    for inp in case["inputs"]:
        shape = tuple(inp["shape"])
        static = inp.get("static")
        if inp["dtype"] not in DTYPES or any(d < 0 for d in shape) or (
                static is not None and (len(static) != len(shape) or any(
                    s is not None and s != d for s, d in zip(static, shape)))):
            raise CaseError(f"input {inp['name']}: bad dtype/shape/signature")
        types[inp["name"]] = (inp["dtype"], shape)
    for node in case["nodes"]:
        if node["name"] in types:
            raise CaseError(f"duplicate name {node['name']}")
        types[node["name"]] = node_type(node, operand_types(node, types))
    if not case["outputs"] or any(o not in types or o in {i["name"] for i in case["inputs"]}
                                  for o in case["outputs"]):
        raise CaseError("outputs must be computed values")
    if len(set(case["outputs"])) != len(case["outputs"]):
        raise CaseError("duplicate outputs")
    return types


# ---------------------------------------------------------------------------
# Input values
# ---------------------------------------------------------------------------
def _edge_values(dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        tiny, big = 2.0 ** -126, 3.0e38
    else:
        fi = np.finfo(_np_dtype(dtype))
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
        return v.astype(_np_dtype(dtype))


def make_inputs(case, draw: int) -> List[np.ndarray]:
    return [make_input(inp, case["seed"], draw) for inp in case["inputs"]]


# ---------------------------------------------------------------------------
# Building the TF ops of a case
# ---------------------------------------------------------------------------
def build_outputs(case, args: Sequence) -> list:
    """Emits the case's ops on `args` (tensors for case['inputs']); returns the outputs."""
    raw = tf.raw_ops
    env = {inp["name"]: t for inp, t in zip(case["inputs"], args)}
    dts = {inp["name"]: inp["dtype"] for inp in case["inputs"]}
    for node in case["nodes"]:
        op, a = node["op"], node.get("attrs", {})
        xs = []
        for k, ref in enumerate(node["inputs"]):
            if isinstance(ref, str):
                xs.append(env[ref])
            else:
                other = next(dts[r] for r in node["inputs"] if isinstance(r, str))
                xs.append(tf.constant(ref["const"], dtype=other))
        if op in UNARY_OPS:
            y = getattr(raw, op)(**{("features" if op in _FEATURES_ARG else "x"): xs[0]})
        elif op in BINARY_OPS:
            y = getattr(raw, op)(x=xs[0], y=xs[1])
        elif op == "Select":
            y = raw.Select(condition=xs[0], x=xs[1], y=xs[2])
        elif op == "SelectV2":
            y = raw.SelectV2(condition=xs[0], t=xs[1], e=xs[2])
        elif op in REDUCE_OPS:
            y = getattr(raw, op)(input=xs[0], axis=tf.constant(a["axis"], tf.int32),
                                 keep_dims=bool(a["keep_dims"]))
        elif op == "Softmax":
            y = raw.Softmax(logits=xs[0])
        elif op == "LogSoftmax":
            y = raw.LogSoftmax(logits=xs[0])
        elif op == "BiasAdd":
            y = raw.BiasAdd(value=xs[0], bias=xs[1], data_format=a.get("data_format", "NHWC"))
        elif op == "Cast":
            y = raw.Cast(x=xs[0], DstT=tf.as_dtype(a["to"]))
        elif op == "Reshape":
            y = raw.Reshape(tensor=xs[0], shape=tf.constant(a["shape"], tf.int32))
        elif op == "ExpandDims":
            y = raw.ExpandDims(input=xs[0], axis=tf.constant(a["axis"], tf.int32))
        elif op == "Squeeze":
            y = raw.Squeeze(input=xs[0], axis=list(a["axis"]))
        elif op == "BroadcastTo":
            y = raw.BroadcastTo(input=xs[0], shape=tf.constant(a["shape"], tf.int32))
        elif op == "Transpose":
            y = raw.Transpose(x=xs[0], perm=tf.constant(a["perm"], tf.int32))
        else:
            raise CaseError(f"unknown op {op}")
        env[node["name"]] = y
        dts[node["name"]] = y.dtype.name
    return [env[o] for o in case["outputs"]]


def signature(case) -> List[tf.TensorSpec]:
    return [tf.TensorSpec(inp.get("static", inp["shape"]), inp["dtype"])
            for inp in case["inputs"]]


def combined_function(cases) -> tf.types.experimental.GenericFunction:
    """One tf.function running all `cases` side by side (inputs and outputs concatenated)."""
    sig = [s for c in cases for s in signature(c)]
    sizes = [len(c["inputs"]) for c in cases]

    def body(*flat):
        outs, k = [], 0
        for case, n in zip(cases, sizes):
            outs += build_outputs(case, flat[k:k + n])
            k += n
        return outs

    return tf.function(body, input_signature=sig, autograph=False)


# ---------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------
_EXTENTS = (1, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 33)
_DTYPE_WEIGHTS = {"float32": .36, "float16": .15, "bfloat16": .13, "float64": .13,
                  "int32": .11, "int64": .08, "bool": .04}
_POW_EXPONENTS = (0.5, -0.5, 2.0, 3.0, 4.0, -1.0, 1.0, 1.5, -2.0, 0.25)
MAX_ELEMENTS = 6000


class _Gen:
    def __init__(self, rng: np.random.Generator, seed: int):
        self.r = rng
        self.seed = int(seed)
        self.inputs, self.nodes = [], []
        self.types: Dict[str, tuple] = {}
        self.props: Dict[str, str] = {}        # 'pos', 'nonneg', 'nonzero' or 'any'
        self.uses: Dict[str, int] = {}
        self.dynamic = self.r.random() < 0.3
        self.zero_dims = self.r.random() < 0.06
        self.big = self.r.random() < 0.04
        self.edge_rate = self.r.choice([0.0, 0.1, 0.25], p=[0.55, 0.3, 0.15])
        self.int_edges = self.r.random() < 0.3

    # -- helpers ---------------------------------------------------------
    def chance(self, p) -> bool:
        return bool(self.r.random() < p)

    def choice(self, seq):
        return seq[int(self.r.integers(len(seq)))]

    def extent(self) -> int:
        if self.zero_dims and self.chance(0.15):
            return 0
        if self.big and self.chance(0.3):
            return self.choice((127, 257, 1000, 4099))
        return self.choice(_EXTENTS)

    def shape(self, rank=None) -> tuple:
        for _ in range(20):
            r = rank if rank is not None else int(self.r.choice(5, p=[.08, .2, .3, .27, .15]))
            s = tuple(self.extent() for _ in range(r))
            if math.prod(s) <= MAX_ELEMENTS:
                return s
        return (2, 3)[:rank if rank is not None else 2]

    def compatible(self, s: tuple) -> tuple:
        """A shape that broadcasts with s (it may widen s's size-1 dims)."""
        for _ in range(20):
            mode = self.r.random()
            r = len(s) if mode < .5 else (
                int(self.r.integers(0, len(s) + 1)) if mode < .75 else
                min(4, len(s) + int(self.r.integers(1, 3))))
            out = []
            for i in range(r):
                j = len(s) - r + i
                if j < 0:
                    out.append(self.choice((1, 2, 3, 4)))
                elif s[j] == 1:
                    out.append(1 if self.chance(.6) else self.extent())
                else:
                    out.append(s[j] if self.chance(.75) else 1)
            out = tuple(out)
            if math.prod(_broadcast(s, out)) <= MAX_ELEMENTS:
                return out
        return s

    def new_input(self, dtype: str, shape: tuple, domain: str = None) -> str:
        name = f"x{len(self.inputs)}"
        if domain is None:
            domain = ("bool:" + self.choice(("0.1", "0.5", "0.9"))) if dtype == "bool" else (
                "small" if dtype in INTS else self.choice(("normal", "normal", "normal",
                                                           "wide", "small", "unit")))
        edges = 0.0
        if self.edge_rate and self.chance(0.6) and dtype != "bool" and (
                dtype not in INTS or self.int_edges):
            edges = float(self.edge_rate)
        static = [None if (self.dynamic and self.chance(.5)) else d for d in shape]
        self.inputs.append({"name": name, "dtype": dtype, "shape": list(shape),
                            "static": static, "domain": domain, "edges": edges})
        self.types[name] = (dtype, tuple(shape))
        self.props[name] = {"positive": "pos", "unit": "pos", "divisor": "nonzero"}.get(
            domain, "any") if not edges else "any"
        return name

    def emit(self, op, inputs, attrs=None, prop="any") -> str:
        node = {"name": f"n{len(self.nodes)}", "op": op, "inputs": list(inputs),
                "attrs": attrs or {}}
        t = node_type(node, operand_types(node, self.types))   # raises CaseError
        if math.prod(t[1]) > MAX_ELEMENTS:
            raise CaseError("too large")
        self.nodes.append(node)
        self.types[node["name"]] = t
        self.props[node["name"]] = _MAKES.get(op, prop)
        for ref in inputs:
            if isinstance(ref, str):
                self.uses[ref] = self.uses.get(ref, 0) + 1
        return node["name"]

    def values(self, dtypes=None, min_rank=0) -> List[str]:
        return [v for v, (d, s) in self.types.items()
                if (dtypes is None or d in dtypes) and len(s) >= min_rank]

    def pick(self, dtypes, min_rank=0) -> Optional[str]:
        """A recent value most of the time (chains); any value otherwise
        (shared producers with several consumers)."""
        vals = self.values(dtypes, min_rank)
        if dtypes is not None and "bool" in dtypes and len(dtypes) > 1 and self.chance(.8):
            vals = [v for v in vals if self.types[v][0] != "bool"] or vals
        if not vals:
            return None
        if self.chance(0.65):
            return vals[-1 - int(self.r.integers(min(3, len(vals))))]
        return self.choice(vals)

    def operand(self, dtypes, min_rank=0) -> str:
        v = self.pick(dtypes, min_rank)
        if v is not None:
            return v
        # convert something, or make a new input
        src = self.pick(FIB)
        target = self.main if self.main in dtypes else self.choice(list(dtypes))
        if src is not None and len(self.types[src][1]) >= min_rank and self.chance(.5):
            return self.emit("Cast", [src], {"to": target})
        return self.new_input(target, self.shape(rank=max(min_rank, int(
            self.r.choice(5, p=[.08, .2, .3, .27, .15])))))

    def guarded(self, v: str, need: str) -> str:
        """Make v satisfy a domain need most of the time (else NaN/Inf paths are exercised)."""
        have = self.props.get(v, "any")
        ok = have == need or have == "pos" or (need == "nonneg" and have == "pos")
        if ok or self.chance(0.2):
            return v
        g = self.r.random()
        if g < .4:
            return self.emit("AddV2", [self.emit("Abs", [v]), {"const": 0.5}], prop="pos")
        if g < .6:
            return self.emit("Exp", [v])
        if g < .8:
            return self.emit("AddV2", [self.emit("Square", [v]), {"const": 0.25}], prop="pos")
        return self.emit("Sigmoid", [v])

    def second(self, a: str, dtype: str, domain=None) -> str:
        """Second operand of a binary op with a: existing broadcast-compatible value,
        a scalar constant, or a new input of a compatible shape."""
        s = self.types[a][1]
        u = self.r.random()
        if u < .4:
            cands = [v for v in self.values((dtype,)) if v != a and _compat(self.types[v][1], s)
                     and (domain is None or self.props.get(v) in ("pos",) + (
                         ("nonzero",) if domain == "nonzero" else ()))]
            if cands:
                return self.choice(cands)
        if u < .55 and dtype != "bool" and domain != "divisor":
            c = {"pos": self.choice((0.5, 2.0, 3.0)), "nonzero": self.choice((-2.0, 0.5, 4.0))
                 }.get(domain, self.choice((0.5, -1.0, 2.0, 0.0, 1.5, -3.0)))
            return {"const": int(c) if dtype in INTS and c == int(c) else (
                float(c) if dtype not in INTS else 2)}
        dom = {"pos": "positive", "nonzero": "positive", "divisor": "divisor"}.get(domain)
        return self.new_input(dtype, self.compatible(s), dom)

    # -- op builders -----------------------------------------------------
    def unary(self):
        op = self.choice(list(UNARY_OPS))
        x = self.operand(UNARY_OPS[op])
        if op in _NEEDS:
            x = self.guarded(x, _NEEDS[op])
        self.emit(op, [x])

    def binary(self):
        if self.chance(.7):
            op = self.choice([o for o in BINARY_OPS if o not in COMPARISONS + (
                "LogicalAnd", "LogicalOr")])
        else:
            op = self.choice(list(COMPARISONS) + ["LogicalAnd", "LogicalOr"])
        dts = BINARY_OPS[op]
        a = self.operand(dts)
        d = self.types[a][0]
        if d not in dts:
            a = self.emit("Cast", [a], {"to": self.choice([t for t in dts if t in FI] or list(dts))})
            d = self.types[a][0]
        if op in _DIVISIONS and d in INTS:
            b = self.second(a, d, "divisor")
        elif op in ("RealDiv", "Div", "FloorDiv", "FloorMod") or (op == "DivNoNan" and self.chance(.5)):
            b = self.second(a, d, "nonzero")
            if isinstance(b, str):
                b = self.guarded(b, "nonzero")
        elif op == "Pow":
            a = self.guarded(a, "pos")
            if self.chance(.5):
                b = {"const": float(self.choice(_POW_EXPONENTS))}
            else:
                b = self.new_input(d, self.compatible(self.types[a][1]), "small")
        else:
            b = self.second(a, d)
        if isinstance(b, str) and self.chance(.3) and op not in _DIVISIONS + ("Pow",):
            a, b = b, a                        # constants and new inputs on either side
        if isinstance(a, dict):
            a, b = b, a
        self.emit(op, [a, b])

    def reduction(self):
        op = self.choice(list(REDUCE_OPS))
        x = self.operand(REDUCE_OPS[op])
        s = self.types[x][1]
        r = len(s)
        if r == 0:
            axes = []
        elif self.chance(.07):
            axes = []
        elif self.chance(.2):
            axes = list(range(r))
        else:
            axes = sorted(self.r.choice(r, size=int(self.r.integers(1, r + 1)), replace=False).tolist())
        axes = [int(a) - (r if self.chance(.3) else 0) for a in axes]
        self.emit(op, [x], {"axis": axes, "keep_dims": self.chance(.5)})

    def stitch(self):
        """A reduction and a consumer that broadcasts it back over its input (the
        layernorm/softmax shape FusionStitching stitches into one kernel)."""
        x = self.operand(F, min_rank=1)
        r = len(self.types[x][1])
        axes = [r - 1] if self.chance(.6) else sorted(
            self.r.choice(r, size=int(self.r.integers(1, r + 1)), replace=False).tolist())
        red = self.emit(self.choice(("Mean", "Max", "Sum", "Min")), [x],
                        {"axis": [int(a) for a in axes], "keep_dims": True})
        op = self.choice(("Sub", "Mul", "AddV2", "RealDiv", "SquaredDifference"))
        if op == "RealDiv":
            red = self.guarded(red, "nonzero")
        self.emit(op, [x, red] if self.chance(.7) else [red, x])

    def softmax(self):
        x = self.operand(F, min_rank=1)
        self.emit(self.choice(("Softmax", "LogSoftmax")), [x])

    def bias_add(self):
        x = self.operand(FI, min_rank=2)
        d, s = self.types[x]
        fmt = "NCHW" if len(s) >= 3 and self.chance(.3) else "NHWC"
        c = s[1] if fmt == "NCHW" else s[-1]
        cands = [v for v in self.values((d,)) if self.types[v][1] == (c,)]
        b = self.choice(cands) if cands and self.chance(.4) else self.new_input(d, (c,))
        self.emit("BiasAdd", [x, b], {"data_format": fmt})

    def condition(self, s: tuple, exact=False) -> str:
        cands = [v for v in self.values(B) if (self.types[v][1] == s if exact
                                                else _compat(self.types[v][1], s))]
        if cands and self.chance(.5):
            return self.choice(cands)
        if self.chance(.5):
            fl = [v for v in self.values(FI) if (self.types[v][1] == s if exact
                                                 else _compat(self.types[v][1], s))]
            if fl:
                a = self.choice(fl)
                other = self.second(a, self.types[a][0]) if not exact else \
                    self.new_input(self.types[a][0], self.types[a][1])
                return self.emit(self.choice(COMPARISONS), [a, other])
        return self.new_input("bool", s if exact else self.compatible(s))

    def select(self):
        x = self.operand(FIB)
        d, s = self.types[x]
        if self.chance(.35):                      # v1: same shapes; condition maybe a row vector
            same = [v for v in self.values((d,)) if v != x and self.types[v][1] == s]
            y = self.choice(same) if same and self.chance(.5) else self.new_input(d, s)
            if len(s) > 1 and self.chance(.4):
                c = self.new_input("bool", (s[0],))
            else:
                c = self.condition(s, exact=True)
            self.emit("Select", [c, x, y])
        else:
            y = self.second(x, d) if d != "bool" else self.new_input(d, self.compatible(s))
            if isinstance(y, dict):
                y = self.new_input(d, self.compatible(s))
            c = self.condition(_broadcast(s, self.types[y][1]))
            self.emit("SelectV2", [c, x, y] if self.chance(.5) else [c, y, x])

    def cast(self):
        x = self.operand(FIB)
        d = self.types[x][0]
        self.emit("Cast", [x], {"to": self.choice([t for t in DTYPES if t != d])})

    def reshape(self):
        x = self.operand(FIB)
        s = list(self.types[x][1])
        k = self.r.random()
        ones = [i for i, e in enumerate(s) if e == 1]
        if k < .35 and len(s) < 5:
            self.emit("ExpandDims", [x], {"axis": int(self.r.integers(-len(s) - 1, len(s) + 1))})
        elif k < .6 and ones:
            axes = sorted(self.r.choice(ones, size=int(self.r.integers(1, len(ones) + 1)),
                                        replace=False).tolist())
            self.emit("Squeeze", [x], {"axis": [int(a) - (len(s) if self.chance(.3) else 0)
                                                for a in axes]})
        elif k < .8 and len(s) >= 2:
            self.emit("Transpose", [x], {"perm": [int(i) for i in self.r.permutation(len(s))]})
        elif k < .9:
            t = [e for e in s if e != 1]
            for _ in range(int(self.r.integers(0, 3))):
                t.insert(int(self.r.integers(0, len(t) + 1)), 1)
            if len(t) <= 5:
                self.emit("Reshape", [x], {"shape": t})
        else:
            target = list(self.compatible(tuple(s)))
            target = list(_broadcast(s, target))
            self.emit("BroadcastTo", [x], {"shape": target})

    def _restore(self, n_nodes: int, n_inputs: int) -> None:
        dropped = {n["name"] for n in self.nodes[n_nodes:]} | {
            i["name"] for i in self.inputs[n_inputs:]}
        for node in self.nodes[n_nodes:]:
            for ref in node["inputs"]:
                if isinstance(ref, str) and ref not in dropped:
                    self.uses[ref] -= 1
        del self.nodes[n_nodes:]
        del self.inputs[n_inputs:]
        for name in dropped:
            self.types.pop(name, None)
            self.props.pop(name, None)
            self.uses.pop(name, None)

    def build(self) -> dict:
        self.main = str(self.r.choice(list(_DTYPE_WEIGHTS), p=list(_DTYPE_WEIGHTS.values())))
        for _ in range(int(self.r.integers(1, 3))):
            self.new_input(self.main, self.shape())
        target = int(self.r.integers(3, 13))
        actions = [(self.unary, .25), (self.binary, .28), (self.reduction, .1),
                   (self.stitch, .06), (self.softmax, .05), (self.bias_add, .04),
                   (self.select, .08), (self.cast, .05), (self.reshape, .09)]
        fns, ps = zip(*actions)
        ps = np.array(ps) / sum(ps)
        tries = 0
        while len(self.nodes) < target and tries < 200:
            tries += 1
            n_before, i_before = len(self.nodes), len(self.inputs)
            try:
                fns[int(self.r.choice(len(fns), p=ps))]()
            except CaseError:
                self._restore(n_before, i_before)     # roll back a half-built op
        sinks = [n["name"] for n in self.nodes if not self.uses.get(n["name"])]
        extra = [n["name"] for n in self.nodes if self.uses.get(n["name"]) and self.chance(.15)]
        outputs = [n["name"] for n in self.nodes if n["name"] in set(sinks + extra)]
        return {"version": CASE_VERSION, "seed": self.seed, "inputs": self.inputs,
                "nodes": self.nodes, "outputs": outputs}


def _compat(a, b) -> bool:
    try:
        np.broadcast_shapes(tuple(a), tuple(b))
        return True
    except ValueError:
        return False


def validate_case(case) -> Optional[str]:
    """None if TF runs the case eagerly on its first draw (and the oracle handles it),
    else the reason."""
    try:
        infer_types(case)
        args = [tf.constant(v) for v in make_inputs(case, 0)]
        outs = build_outputs(case, args)
        for o in outs:
            o.numpy()
    except (CaseError, tf.errors.OpError, ValueError, TypeError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return None


def generate_case(seed: int) -> dict:
    """A valid random case, deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    last = None
    for attempt in range(100):
        case = _Gen(rng, seed).build()
        if len(case["nodes"]) < 3:
            continue
        last = validate_case(case)
        if last is None:
            return case
    raise RuntimeError(f"no valid case from seed {seed}: {last}")


def case_seed(run_seed: int, index: int) -> int:
    return int(np.random.SeedSequence([run_seed, index]).generate_state(1)[0])


# ---------------------------------------------------------------------------
# The oracle: enclosures by interval arithmetic
# ---------------------------------------------------------------------------
U = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
TINY = {"float64": float(np.finfo(np.float64).tiny), "float32": float(np.finfo(np.float32).tiny),
        "float16": float(np.finfo(np.float16).tiny), "bfloat16": 2.0 ** -126}
# float16/bfloat16 ops are computed in float32 by TF (and by our kernels) and
# rounded to the storage type; float64 in float64.
COMPUTE = {"float64": "float64", "float32": "float32", "float16": "float32", "bfloat16": "float32"}

# Error of one op's implementation, beyond the rounding of its result to the
# output type (which the outward rounding accounts for), as
# (units of roundoff u of the compute type, relative; u of the output type,
#  relative; u of the output type, absolute); u = 2^-24 for float32 (half an
# ulp). An enclosure is widened by these once: it must hold TF's result and
# ours, each within that much of the exact value. The numbers are the larger
# of our documented bounds (vecmath.ULP_BOUNDS: exp/log 2 ulp, tanh/erf 3,
# erfc 4; float64 uses std::) and TF's own error, measured over 5e5 points
# per op and dtype against float64/libm (max seen, in u, float32 / float64):
#   exp 2/2.8, expm1 5/4, log 3.3/2, log1p 4.6/4, tanh 5.6/9, sigmoid 8/4,
#   erf 6/4, erfc 11/12 (66/516 within 2^40 of the smallest normal, below),
#   softplus 7.7/7.8, sin 2.2, cos 2.7, rsqrt 2.9, reciprocal 3.4 (TF's float
#   reciprocal is not correctly rounded), pow 2/3; div, mul, sqrt exact.
# float16/bfloat16: TF rounds every op to the dtype, so only its composite
# kernels add error in units of the dtype: sigmoid 2.5 u, softplus 7.6 u, rsqrt
# 2 u (1/sqrt, rounded twice).
# - softplus: TF switches to x above -log(eps)-2 and to exp(x) below
#   log(eps)+2; those approximations are off by up to e^(log(eps)+2)/2 ~ 7.4 u.
# - elu/selu: TF and we compute exp(x) - 1 (not expm1), so for x < 0 the
#   error is absolute: ~1 u of 1 from the subtraction plus the exp's error
#   (float16/bfloat16: TF rounds exp(x) to the dtype first): 3 u absolute,
#   times selu's scale*alpha.
# - selu: TF rounds scale and scale*alpha to the dtype (bfloat16: 1.0507 becomes
#   1.0469): 2 u of the dtype for float16/bfloat16.
# - sin/cos: argument reduction errors are absolute (Lipschitz 1): 4 u
#   absolute on top of 4 u relative.
_ERR = {
    "RealDiv": (1, 2, 0), "Div": (1, 2, 0), "Sqrt": (1, 0, 0), "DivNoNan": (1, 0, 0),
    "FloorDiv": (1, 0, 0), "Reciprocal": (4, 0, 0), "Rsqrt": (4, 2, 0),
    "Exp": (6, 0, 0), "Expm1": (8, 0, 0), "Log": (6, 0, 0), "Log1p": (8, 0, 0),
    "Tanh": (12, 0, 0), "Sigmoid": (12, 4, 0), "Erf": (8, 0, 0), "Erfc": (16, 0, 0),
    "Softplus": (10, 10, 0), "Elu": (8, 0, 3), "Selu": (8, 2, 3 * SELU_ALPHA * SELU_SCALE),
    "Sin": (4, 0, 0), "Cos": (4, 0, 0), "Pow": (6, 2, 0),
}
# x / c: Grappler's constant folding makes it x * (1 / c) with 1 / c rounded to
# the dtype (float16/bfloat16: 2 u of the dtype; measured: a third of the
# float16 quotients by 3 differ from x / 3; float32/float64: grappler_rewrites
# rewrites it so, measured equal to TF's in every element).
# pow: Grappler rewrites x**2, x**3, ... with a constant exponent into products,
# rounded in the dtype by TF (float16/bfloat16: two roundings, 2 u of the dtype).
# TF's erfc near underflow (result below 2^40 smallest normals): 66 u (float32),
# 516 u (float64) measured.
_ERFC_TAIL = {"float32": 100, "float64": 800}
_RCP_EST_ERR = 1.5 * 2.0 ** -12      # relative error of x86 rcp_ps (see Reciprocal)
_SIN_COS_ABS_ULPS = 4


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


def _f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _nudge(x, direction, dtype):
    """One step on the dtype's grid (x already on it)."""
    nd = _np_dtype(dtype)
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
            nd = _np_dtype(dtype)
            l64 = lo.astype(nd).astype(np.float64)
            h64 = hi.astype(nd).astype(np.float64)
            lo = np.where(l64 > lo, _nudge(l64, -1, dtype), l64)
            hi = np.where(h64 < hi, _nudge(h64, 1, dtype), h64)
    tiny = TINY[dtype]
    lo = np.where((lo > 0) & (lo < tiny), 0.0, lo)
    hi = np.where((hi < 0) & (hi > -tiny), -0.0, hi)
    return lo, hi


def _max_finite(dtype: str) -> float:
    return 3.3895313892515355e38 if dtype == "bfloat16" else float(np.finfo(_np_dtype(dtype)).max)


def _widen(lo, hi, rel, absolute=0.0):
    with np.errstate(all="ignore"):
        lo2 = lo - (rel * np.abs(lo) + absolute)
        hi2 = hi + (rel * np.abs(hi) + absolute)
    return np.where(np.isfinite(lo), lo2, lo), np.where(np.isfinite(hi), hi2, hi)


def _finish(dtype, lo, hi, unk, err=(0, 0, 0), absolute=0.0):
    """Widen by an op's error model, round outward, mark undetermined elements."""
    kc, kd, ka = err
    # No slack for correctly rounded ops: their corners, computed in float64 and
    # rounded outward, hold every correctly rounded result (TF's and ours).
    rel = kc * U[COMPUTE[dtype]] + (kd * U[dtype] if dtype in ("float16", "bfloat16") else 0.0)
    lo, hi = _widen(lo, hi, rel, ka * U[dtype] + absolute)
    lo, hi = round_out(lo, hi, dtype)
    nan = np.isnan(lo) | np.isnan(hi)
    unk = unk | (nan & ~(np.isnan(lo) & np.isnan(hi)))
    lo = np.where(unk, -np.inf, lo)
    hi = np.where(unk, np.inf, hi)
    return Iv(dtype, lo, hi, unk)


def _minmax_corners(results):
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


def _corners(fn, ivs, extra_points=()):
    """fn over every corner of the inputs' box (valid for functions monotone in each
    argument separately); extra_points: more argument tuples to evaluate."""
    shape = np.broadcast_shapes(*[v.shape for v in ivs])
    results = []
    with np.errstate(all="ignore"):
        for choice in itertools.product(*[(v.lo, v.hi) for v in ivs]):
            results.append(np.broadcast_to(fn(*choice), shape).astype(np.float64))
        for pts in extra_points:
            results.append(np.broadcast_to(fn(*pts), shape).astype(np.float64))
    lo, hi, maybe_nan = _minmax_corners(results)
    unk = np.zeros(shape, bool)
    for v in ivs:
        unk = unk | v.unk
    return lo, hi, unk | maybe_nan


def _holds(iv: Iv, v: float) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return (iv.lo <= v) & (v <= iv.hi)


def _exact(iv: Iv) -> np.ndarray:
    return ~iv.unk & (iv.lo == iv.hi)


def _bool_iv(lo, hi) -> Iv:
    lo, hi = _f64(lo), _f64(hi)
    return Iv("bool", lo, hi, np.zeros(lo.shape, bool))


def _int_iv(dtype, val, unk) -> Iv:
    val = np.asarray(val).astype(np.int64)
    unk = np.broadcast_to(unk, val.shape).copy()
    return Iv(dtype, val, val.copy(), unk)


def input_iv(dtype: str, value: np.ndarray) -> Iv:
    if dtype == "bool":
        return _bool_iv(value, value)
    if dtype in INTS:
        return _int_iv(dtype, value, np.zeros(value.shape, bool))
    v = _f64(value)
    # DAZ: a denormal input may be read as a zero of its sign.
    tiny = TINY[dtype]
    den = (v != 0) & (np.abs(v) < tiny)
    lo = np.where(den & (v > 0), 0.0, v)
    hi = np.where(den & (v < 0), -0.0, v)
    return Iv(dtype, lo, hi, np.zeros(v.shape, bool))


def _denormal_endpoint(iv: Iv) -> np.ndarray:
    """The denormal value an input interval came from (DAZ widened it to a zero),
    NaN where there is none."""
    tiny = TINY[iv.dtype]
    with np.errstate(invalid="ignore"):
        dl = (iv.lo != 0) & (np.abs(iv.lo) < tiny)
        dh = (iv.hi != 0) & (np.abs(iv.hi) < tiny)
    return np.where(dl, iv.lo, np.where(dh, iv.hi, np.nan))


def _with_passthrough(lo, hi, *ivs):
    """Selects between values (relu, max, min) read a denormal operand as zero
    (DAZ) but may return its bits unchanged: TF flushes, our kernels pass it
    through (test_optimize_ops: not part of the contract). Widen to include it."""
    for iv in ivs:
        if iv.dtype not in FLOATS:
            continue
        den = _denormal_endpoint(iv)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            lo = np.where(np.isnan(den) | np.isnan(lo), lo, np.fmin(lo, den))
            hi = np.where(np.isnan(den) | np.isnan(hi), hi, np.fmax(hi, den))
    return lo, hi


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x) if np.size(x) else _f64(x)


def _erfc(x):
    return np.vectorize(math.erfc, otypes=[np.float64])(x) if np.size(x) else _f64(x)


def _sigmoid(x):
    with np.errstate(all="ignore"):
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _relu(x):
    return np.where(x < 0, 0.0, x)     # NaN stays NaN


# after widening, bounded transcendental functions are clamped to their range
# (relu/relu6 need no clamp, they add no error; a clamp would cut off denormals
# they pass through)
_RANGE = {"Sigmoid": (0.0, 1.0), "Tanh": (-1.0, 1.0), "Erf": (-1.0, 1.0), "Erfc": (0.0, 2.0)}

_FLOAT_UNARY = {   # monotone (corners suffice) unless listed in _SPECIAL_UNARY
    "Neg": np.negative, "Exp": np.exp, "Log": np.log, "Log1p": np.log1p, "Expm1": np.expm1,
    "Sqrt": np.sqrt, "Tanh": np.tanh, "Sigmoid": _sigmoid, "Erf": _erf, "Erfc": _erfc,
    "Softplus": lambda x: np.logaddexp(0.0, x),
    "Relu": _relu, "Relu6": lambda x: np.where(x > 6, 6.0, _relu(x)),
    "Elu": lambda x: np.where(x < 0, np.expm1(x), x),
    "Selu": lambda x: SELU_SCALE * np.where(x < 0, SELU_ALPHA * np.expm1(x), x),
    "Floor": np.floor, "Ceil": np.ceil, "Round": np.rint, "Sign": np.sign,
    "Abs": np.abs, "Square": np.square, "Reciprocal": lambda x: 1.0 / x,
    "Rsqrt": lambda x: 1.0 / np.sqrt(x),
}


def _consumers(nodes, outputs) -> Dict[str, int]:
    """Consumers of each value as Grappler counts them for its rewrites: after
    its common subgraph elimination, which merges nodes of one op, attributes
    and inputs first, so two LogicalNot(c) are one consumer of c
    (--seed=20261130 graph 7922: not(a <= b) became a > b, NaN -> False)."""
    canon: Dict[str, str] = {}
    first: Dict[str, str] = {}
    for node in nodes:
        key = json.dumps([node["op"], [canon.get(r, r) if isinstance(r, str) else r
                                       for r in node["inputs"]], node.get("attrs", {})],
                         sort_keys=True, default=str)
        canon[node["name"]] = first.setdefault(key, node["name"])
    count: Dict[str, int] = {}
    for node in nodes:
        if canon[node["name"]] != node["name"]:
            continue                         # merged into an equal node
        for ref in node["inputs"]:
            if isinstance(ref, str):
                r = canon.get(ref, ref)
                count[r] = count.get(r, 0) + 1
    for o in outputs:
        r = canon.get(o, o)
        count[r] = count.get(r, 0) + 1
    for name, c in canon.items():
        if c != name and c in count:
            count[name] = count[c]
    return count


_INVERSE = {"Less": "GreaterEqual", "GreaterEqual": "Less", "Greater": "LessEqual",
            "LessEqual": "Greater"}


def grappler_rewrites(case) -> list:
    """The case's nodes as Grappler leaves them, for the rewrites that change
    results (TF and optimize() both run them; measured):
    - Pow(x, c) for a constant c: 0.5 -> Sqrt, -0.5 -> Rsqrt, 1 -> x, 2 -> Square,
      3 -> x * Square(x), -1 -> Reciprocal (sqrt(-inf) is NaN, pow(-inf, .5) inf);
    - LogicalNot(Less(a, b)) -> GreaterEqual(a, b), etc. (differs for NaN);
    - Reciprocal(Reciprocal(x)) -> x (differs where 1/x overflows or flushes);
    - Log(Softmax(x)) -> LogSoftmax(x) (no underflow to log(0) = -inf);
    - Maximum(x, x * a) -> LeakyRelu(x, a) (`_leaky_relu`: min for a > 1);
    each only where the inner op has no other consumer and is not an output;
    - float32/float64 x / c -> x * (1 / c) and the reassociation of trees of
      + - (or of *) ops (`_reassociate`).
    (Max/Min of a monotone op is handled in _Oracle.monotone_hoist.)"""
    nodes = [dict(n) for n in case["nodes"]]
    by_name = {n["name"]: n for n in nodes}
    consumers = _consumers(nodes, case["outputs"])
    types = infer_types(case)

    def sole(ref, op=None):
        inner = by_name.get(ref) if isinstance(ref, str) else None
        if inner is None or consumers.get(ref) != 1:
            return None
        return inner if (op is None or inner["op"] in op) else None

    out = []
    for node in nodes:
        op, ins = node["op"], node["inputs"]
        if op == "Pow" and isinstance(ins[1], dict):
            c = float(ins[1]["const"])
            simple = {0.5: "Sqrt", -0.5: "Rsqrt", 1.0: "Identity", 2.0: "Square",
                      -1.0: "Reciprocal"}
            if c in simple:
                node = dict(node, op=simple[c], inputs=[ins[0]], attrs={})
            elif c == 3.0:
                sq = {"name": node["name"] + "/square", "op": "Square", "inputs": [ins[0]],
                      "attrs": {}}
                out.append(sq)
                node = dict(node, op="Mul", inputs=[ins[0], sq["name"]], attrs={})
        elif op == "LogicalNot" and sole(ins[0], _INVERSE):
            inner = by_name[ins[0]]
            node = dict(node, op=_INVERSE[inner["op"]], inputs=list(inner["inputs"]), attrs={})
        elif op == "Reciprocal" and sole(ins[0], ("Reciprocal",)):
            node = dict(node, op="Identity", inputs=[by_name[ins[0]]["inputs"][0]], attrs={})
        elif op == "Log" and sole(ins[0], ("Softmax",)):
            node = dict(node, op="LogSoftmax", inputs=[by_name[ins[0]]["inputs"][0]], attrs={})
        elif op == "Maximum" and _leaky_relu(node, by_name, consumers, types):
            x, alpha = _leaky_relu(node, by_name, consumers, types)
            node = dict(node, op="LeakyRelu", inputs=[x], attrs={"alpha": alpha})
        elif op in ("RealDiv", "Div") and isinstance(ins[1], dict) and isinstance(ins[0], str) \
                and types[node["name"]][0] in _REASSOCIATED:
            # constant folding's ReduceDivToReciprocalMul (before it pushes
            # constants down); float16/bfloat16: see _ERR's RealDiv slack
            r = _fold("RealDiv", 1.0, ins[1]["const"], types[node["name"]][0])
            node = dict(node, op="Mul", inputs=[ins[0], {"const": r}], attrs={})
        out.append(node)
    return _reassociate(out, case["outputs"], types)


def _leaky_relu(node, by_name, consumers, types) -> Optional[tuple]:
    """(x, alpha) where the remapper (FindMulAndMaximum, remapper.cc) fuses
    Maximum(x, x * alpha) into LeakyRelu(x, alpha) = x > 0 ? x : alpha * x.
    It checks only alpha >= 0, so for alpha > 1 TF returns min(x, alpha * x)
    (a TF bug; TF defines the reference), and for alpha = 0, LeakyRelu(+inf) is
    inf where max(inf, 0 * inf) is NaN. The product may be x / c, which
    constant folding made x * (1/c) first. Measured: float32 and bfloat16 only
    (float16 and float64 keep the Maximum); the inner op has no other consumer."""
    d = types[node["name"]][0]
    if d not in ("float32", "bfloat16") or not all(isinstance(r, str) for r in node["inputs"]):
        return None
    for m_ref, x in (node["inputs"], node["inputs"][::-1]):
        m = by_name.get(m_ref)
        if m is None or consumers.get(m_ref) != 1 or len(m["inputs"]) != 2:
            continue
        a, b = m["inputs"]
        if m["op"] == "Mul" and (a, b) != (x, x):
            alpha = b if a == x else a if b == x else None
            if isinstance(alpha, dict):
                alpha = float(alpha["const"])
            else:
                continue
        elif m["op"] in ("RealDiv", "Div") and a == x and isinstance(b, dict):
            alpha = _fold("RealDiv", 1.0, b["const"], d)
        else:
            continue
        if alpha >= 0:
            return x, alpha
    return None


_REASSOCIATED = ("float32", "float64")
_ADD_FAMILY = ("Add", "AddV2", "Sub")
_MAX_TERMS = 5            # (2n-3)!! orders: 105 for 5 terms


def _fold(op, a, b, dtype) -> float:
    """Grappler's constant folding of op(a, b): TF's kernel, rounded to the dtype."""
    nd = _np_dtype(dtype)
    with np.errstate(all="ignore"):
        fn = {"AddV2": np.add, "Mul": np.multiply, "RealDiv": np.divide}[op]
        return float(fn(np.array(a, nd), np.array(b, nd)).astype(nd))


def _orders(items):
    """Every binary tree over `items` (commutative: a tree and its mirror once)."""
    if len(items) == 1:
        yield items[0]
        return
    first, rest = items[0], items[1:]
    for k in range(len(rest)):
        for combo in itertools.combinations(range(len(rest)), k):
            left = [first] + [rest[i] for i in combo]
            right = [rest[i] for i in range(len(rest)) if i not in combo]
            for lt in _orders(left):
                for rt in _orders(right):
                    yield (lt, rt)


def _reassociate(nodes, outputs, types) -> list:
    """Grappler reassociates trees of + and - ops, and of * ops (x / c counts
    as x * (1/c)), of float32/float64 values:
    - constant folding's ConstantPushDown (constant_folding.cc), for a constant
      c and an inner op with no other consumer: (a + b) - c -> a + (b - c) or
      b + (a - c) (which operand of a commutative op stays outside depends on
      node names), c * (a * b) -> a * (c * b), repeated until nothing changes,
      folding constants that meet (in the dtype);
    - the arithmetic optimizer's AddOpsRewrite and MinimizeBroadcasts, which
      re-pair the operands of a tree of Add (or Mul) ops by shape, e.g. back to
      (a + b) - c when a and b have one shape.
    Rounding then happens in another order: (a + b) - c and a + (b - c) differ
    by an ulp of the partial sums, which is large next to a cancelling result;
    products may also overflow or underflow in one order only. The oracle takes
    the union over every order of the tree's signed terms (a - b is a + (-b)
    exactly; constants that meet are folded as Grappler does): TF's result is
    one of them. Trees with a constant (pushdown) or of Add/AddV2 or Mul only
    (re-pairing); not trees with a non-constant division. float16/bfloat16:
    Add/AddV2 or Mul trees only (ConstantPushDown skips these dtypes; the
    re-pairing does not, measured: (x + y) + z with z shaped like x). Integers
    are exact (wrapping), so their order does not matter. Up to _MAX_TERMS
    terms; larger trees keep TF's graph order (not seen)."""
    by_name = {n["name"]: n for n in nodes}
    consumers = _consumers(nodes, outputs)

    def family(n):
        dtype = types.get(n["name"], (None,))[0] if n is not None else None
        if dtype in _REASSOCIATED:
            return "add" if n["op"] in _ADD_FAMILY else "mul" if n["op"] == "Mul" else None
        if dtype in FLOATS:        # float16/bfloat16: re-pairing only (no pushdown)
            return "add" if n["op"] in ("Add", "AddV2") else "mul" if n["op"] == "Mul" else None
        return None

    def interior(ref, fam):
        n = by_name.get(ref) if isinstance(ref, str) else None
        return n is not None and family(n) == fam and consumers.get(ref) == 1

    inner = {ref for n in nodes if family(n) for ref in n["inputs"]
             if interior(ref, family(n))}
    out = []
    for node in nodes:
        fam = family(node)
        if fam is None or node["name"] in inner:
            out.append(node)
            continue
        terms, ops = [], []

        def collect(n, sign):
            ops.append(n["op"])
            for k, ref in enumerate(n["inputs"]):
                sk = -sign if (n["op"] == "Sub" and k == 1) else sign
                if interior(ref, fam):
                    collect(by_name[ref], sk)
                else:
                    terms.append((ref, sk))

        collect(node, 1)
        has_const = any(isinstance(t, dict) for t, _ in terms)
        if len(ops) < 2 or len(terms) > _MAX_TERMS or not (
                has_const or all(o in ("Add", "AddV2", "Mul") for o in ops)):
            out.append(node)
            continue
        dtype = types[node["name"]][0]
        finals = []
        for k, tree in enumerate(_orders(terms)):
            emitted = []
            counter = itertools.count()

            def emit(t):
                if isinstance(t, tuple) and len(t) == 2 and isinstance(t[1], int):
                    return t                                # a leaf: (ref, sign)
                (a, sa), (b, sb) = emit(t[0]), emit(t[1])
                if isinstance(a, dict) and isinstance(b, dict):
                    if fam == "mul":
                        return {"const": _fold("Mul", a["const"], b["const"], dtype)}, 1
                    v = _fold("AddV2", sa * a["const"], sb * b["const"], dtype)
                    return {"const": v}, 1
                name = f"{node['name']}/order{k}.{next(counter)}"
                if fam == "mul":
                    emitted.append({"name": name, "op": "Mul", "inputs": [a, b], "attrs": {}})
                    return name, 1
                if sa == sb:
                    emitted.append({"name": name, "op": "AddV2", "inputs": [a, b], "attrs": {}})
                    return name, sa
                x, y = (a, b) if sa > 0 else (b, a)
                emitted.append({"name": name, "op": "Sub", "inputs": [x, y], "attrs": {}})
                return name, 1

            ref, sign = emit(tree)
            if isinstance(ref, dict) or sign < 0:          # (all constants: not a tree here)
                name = f"{node['name']}/order{k}.neg"
                emitted.append({"name": name, "op": "Neg", "inputs": [ref], "attrs": {}})
                ref = name
            out += emitted
            finals.append(ref)
        out.append({"name": node["name"], "op": "Hull", "inputs": finals, "attrs": {}})
    return out


# grappler::IsElementWiseMonotonic (op-table ops only)
_MONOTONE_UP = ("Ceil", "Elu", "Erf", "Exp", "Expm1", "Floor", "Log", "Log1p", "Relu", "Relu6",
                "Selu", "Sigmoid", "Sign", "Softplus", "Sqrt", "Tanh")
_MONOTONE_DOWN = ("Erfc", "Neg", "Rsqrt")


class _Oracle:
    """Evaluates a case's enclosures for one draw of inputs."""

    def __init__(self, case, inputs: Sequence[np.ndarray]):
        self.case = case
        self.env: Dict[str, Iv] = {}
        for inp, v in zip(case["inputs"], inputs):
            self.env[inp["name"]] = input_iv(inp["dtype"], v)

    def run(self) -> Dict[str, Iv]:
        nodes = grappler_rewrites(self.case)
        self.nodes = {n["name"]: n for n in nodes}
        self.consumers = _consumers(nodes, self.case["outputs"])
        for node in nodes:
            if node["op"] in ("Max", "Min"):
                hoisted = self.monotone_hoist(node)
                if hoisted is not None:
                    self.env[node["name"]] = hoisted
                    continue
            ins = []
            for k, ref in enumerate(node["inputs"]):
                if isinstance(ref, str):
                    ins.append(self.env[ref])
                else:
                    other = next(self.env[r] for r in node["inputs"] if isinstance(r, str))
                    c = np.array(ref["const"], dtype=_np_dtype(other.dtype))
                    ins.append(input_iv(other.dtype, c))
            self.env[node["name"]] = self.apply(node, ins)
        return self.env

    def monotone_hoist(self, node) -> Optional[Iv]:
        """Grappler's arithmetic optimizer (which TF and optimize() both run)
        rewrites max(f(x)) to f(max(x)) (min for a decreasing f) when f is
        elementwise monotone and the reduction is f's only consumer
        (OptimizeMaxOrMinOfMonotonicStage), repeatedly down a chain. This changes
        NaN propagation (max(sqrt(x)) with some x < 0), so the oracle follows it."""
        chain, src, op = [], node["inputs"][0], node["op"]
        while isinstance(src, str) and src in self.nodes and self.consumers.get(src) == 1:
            inner = self.nodes[src]
            if inner["op"] in _MONOTONE_UP:
                flip = False
            elif inner["op"] in _MONOTONE_DOWN:
                flip = True
            else:
                break
            producer = self.nodes.get(inner["inputs"][0]) if isinstance(
                inner["inputs"][0], str) else None
            if inner["op"] in ("Relu", "Relu6") and producer is not None and \
                    producer["op"] == "BiasAdd":
                break                       # left for the remapper to fuse
            chain.append(inner["op"])
            if flip:
                op = "Min" if op == "Max" else "Max"
            src = inner["inputs"][0]
        if not chain:
            return None
        a = node.get("attrs", {})
        v = self.reduce(op, self.env[src], a["axis"], bool(a["keep_dims"]))
        for f in reversed(chain):
            v = self.unary(f, v)
        return v

    # -- dispatch ----------------------------------------------------------
    def apply(self, node, ins: List[Iv]) -> Iv:
        op, a = node["op"], node.get("attrs", {})
        d = ins[0].dtype
        if op in UNARY_OPS:
            return self.unary(op, ins[0])
        if op in BINARY_OPS:
            return self.binary(op, ins[0], ins[1])
        if op == "Select":
            c = ins[0]
            x = ins[1]
            if c.lo.ndim == 1 and x.lo.ndim > 1:
                shape = c.lo.shape + (1,) * (x.lo.ndim - 1)
                c = Iv("bool", c.lo.reshape(shape), c.hi.reshape(shape), c.unk.reshape(shape))
            return self.select(c, x, ins[2])
        if op == "SelectV2":
            return self.select(*ins)
        if op in REDUCE_OPS:
            return self.reduce(op, ins[0], a["axis"], bool(a["keep_dims"]))
        if op in ("Softmax", "LogSoftmax"):
            return self.softmax(ins[0], op == "LogSoftmax")
        if op == "BiasAdd":
            b = ins[1]
            if a.get("data_format") == "NCHW":
                shape = b.lo.shape + (1,) * (ins[0].lo.ndim - 2)
                b = Iv(b.dtype, b.lo.reshape(shape), b.hi.reshape(shape), b.unk.reshape(shape))
            return self.binary("AddV2", ins[0], b)
        if op == "Cast":
            return self.cast(ins[0], a["to"])
        if op == "LeakyRelu":   # x > 0 ? x : alpha * x, increasing for alpha >= 0
            alpha = a["alpha"]
            lo, hi, unk = _corners(lambda t: np.where(t > 0, t, alpha * t), [ins[0]])
            return _finish(d, lo, hi, unk)
        if op == "Hull":        # one of several results (grappler_rewrites): their union
            either = _bool_iv(np.zeros(ins[0].shape), np.ones(ins[0].shape))
            v = ins[0]
            for w in ins[1:]:
                v = self.select(either, v, w)
            return v
        x = ins[0]
        if op == "Identity":
            return x
        if op == "Reshape":
            shape = tuple(a["shape"])
        elif op == "ExpandDims":
            ax = a["axis"] % (x.lo.ndim + 1)
            shape = x.shape[:ax] + (1,) + x.shape[ax:]
        elif op == "Squeeze":
            axes = _norm_axes(a["axis"], x.lo.ndim)
            shape = tuple(e for i, e in enumerate(x.shape) if i not in axes)
        elif op == "BroadcastTo":
            shape = tuple(a["shape"])
            return Iv(d, np.broadcast_to(x.lo, shape).copy(), np.broadcast_to(x.hi, shape).copy(),
                      np.broadcast_to(x.unk, shape).copy())
        elif op == "Transpose":
            perm = list(a["perm"])
            return Iv(d, x.lo.transpose(perm), x.hi.transpose(perm), x.unk.transpose(perm))
        else:
            raise CaseError(f"oracle: unknown op {op}")
        return Iv(d, x.lo.reshape(shape), x.hi.reshape(shape), x.unk.reshape(shape))

    # -- elementwise -------------------------------------------------------
    def unary(self, op, x: Iv) -> Iv:
        d = x.dtype
        if op == "LogicalNot":
            return _bool_iv(1 - x.hi, 1 - x.lo)
        if d in INTS:
            v = x.lo.astype(d)
            with np.errstate(all="ignore"):
                f = {"Neg": np.negative, "Abs": np.abs, "Square": np.square, "Sign": np.sign,
                     "Relu": lambda t: np.maximum(t, 0)}[op]
                return _int_iv(d, f(v).astype(d), x.unk)
        if op == "IsNan":
            nan = np.isnan(x.lo) & ~x.unk
            return _bool_iv(nan, nan | x.unk)
        if op == "IsFinite":
            fin = ~x.unk & np.isfinite(x.lo) & np.isfinite(x.hi)
            never = ~x.unk & (np.isnan(x.lo) | ((x.lo == x.hi) & np.isinf(x.lo)))
            return _bool_iv(fin, ~never)
        if op in ("Sin", "Cos"):
            # Lipschitz 1: [f(c) - w, f(c) + w] around the interval's centre.
            f = np.sin if op == "Sin" else np.cos
            with np.errstate(all="ignore"):
                c = 0.5 * x.lo + 0.5 * x.hi
                w = 0.5 * x.hi - 0.5 * x.lo
                fc = f(c)
                lo = np.maximum(fc - w, -1.0)
                hi = np.minimum(fc + w, 1.0)
                lo = np.where(w == 0, fc, lo)
                hi = np.where(w == 0, fc, hi)
            unk = x.unk | (np.isinf(x.lo) | np.isinf(x.hi)) & (x.lo != x.hi)
            return _finish(d, lo, hi, unk, _ERR[op],
                           absolute=_SIN_COS_ABS_ULPS * U[COMPUTE[d]])
        if op == "Erf" and d == "float64":
            # TF's Eigen erf<double> squares x and returns NaN once x*x overflows
            # (|x| > sqrt(DBL_MAX), infinities included); std::erf gives +-1. A TF
            # defect: either answer is accepted there.
            big = np.sqrt(np.finfo(np.float64).max)
            x = Iv(d, x.lo, x.hi, x.unk | (np.abs(x.lo) > big) | (np.abs(x.hi) > big))
        fn = _FLOAT_UNARY[op]
        extra = ()
        straddle = (x.lo < 0) & (x.hi > 0) | ((x.lo == 0) & (x.hi > 0) & np.signbit(x.lo)) | \
            ((x.hi == 0) & (x.lo < 0) & ~np.signbit(x.hi))
        if op in ("Abs", "Square"):
            extra = [(np.where(straddle, 0.0, x.lo),)]       # the minimum inside
        lo, hi, unk = _corners(fn, [x], extra)
        if op in ("Relu", "Relu6"):
            lo, hi = _with_passthrough(lo, hi, x)
        if op == "Sign":
            # TF's Sign of a denormal returns a denormal (of either sign, seen);
            # denormals are not part of the contract: allow +-smallest normal there.
            den = ~np.isnan(_denormal_endpoint(x))
            lo = np.where(den, np.fmin(lo, -TINY[d]), lo)
            hi = np.where(den, np.fmax(hi, TINY[d]), hi)
        if op in ("Reciprocal", "Rsqrt"):
            # a pole inside the interval: anything from -inf to inf
            unk = unk | (straddle & (x.lo != x.hi))
        absolute = 0.0
        if op == "Erfc":
            c = COMPUTE[d]
            tail = np.abs(lo) < TINY[c] * 2.0 ** 40
            absolute = np.where(tail, _ERFC_TAIL[c] * U[c] * np.abs(hi), 0.0)
        if op == "Reciprocal" and COMPUTE[d] == "float32":
            # TF's vectorised float reciprocal (Eigen preciprocal: rcp_ps estimate
            # plus one Newton step) loses the Newton correction to FTZ when that
            # correction is below the smallest normal: up to FLT_MIN absolute, and
            # never more than the estimate's own error, 1.5 * 2^-12 relative
            # (Intel's bound; measured over 4e6 points in 2^[90, 126]: error <=
            # 3.4 u + min(FLT_MIN, 2^-11.6 |1/x|), relative error up to 5.3e3 u
            # for |1/x| < 2^-113). Tails of a tensor not filling a packet divide.
            with np.errstate(all="ignore"):
                mag = np.fmax(np.abs(lo), np.abs(hi))
                absolute = np.fmin(TINY["float32"], _RCP_EST_ERR * mag)
        iv = _finish(d, lo, hi, unk, _ERR.get(op, (0, 0, 0)), absolute=absolute)
        if op in _RANGE:      # bounded functions stay in their range after widening
            a, b = _RANGE[op]
            iv.lo = np.where(iv.unk, iv.lo, np.clip(iv.lo, a, b))
            iv.hi = np.where(iv.unk, iv.hi, np.clip(iv.hi, a, b))
        return iv

    def binary(self, op, x: Iv, y: Iv) -> Iv:
        d = x.dtype
        if op in ("LogicalAnd", "LogicalOr"):
            f = np.minimum if op == "LogicalAnd" else np.maximum
            return _bool_iv(f(x.lo, y.lo), f(x.hi, y.hi))
        if op in COMPARISONS:
            return self.compare(op, x, y)
        if d in INTS:
            return self.int_binary(op, x, y)
        if op == "Add":
            op = "AddV2"
        if op == "SquaredDifference":
            # TF rounds x - y to the dtype, then squares (test_optimize_ops).
            return self.unary("Square", self.binary("Sub", x, y))
        if op == "FloorDiv":
            # floor(x / y) with the quotient rounded first, as TF computes it
            q = self.binary("RealDiv", x, y)
            return self.unary("Floor", q)
        if op == "FloorMod":
            return self.floor_mod(x, y)
        if op == "Pow":
            return self.pow(x, y)
        fn = {"AddV2": np.add, "Sub": np.subtract, "Mul": np.multiply,
              "RealDiv": np.divide, "Div": np.divide, "DivNoNan": np.divide,
              "Maximum": np.maximum, "Minimum": np.minimum}[op]
        lo, hi, unk = _corners(fn, [x, y])
        # NaN from inside the box, where corners do not see it: 0 * inf, 0 / 0, inf / inf
        shape = lo.shape
        zx, zy = _holds(x, 0.0), _holds(y, 0.0)
        ix = np.isinf(x.lo) | np.isinf(x.hi)
        iy = np.isinf(y.lo) | np.isinf(y.hi)
        if op == "Mul":
            unk = unk | np.broadcast_to((zx & iy) | (ix & zy), shape)
        elif op in ("RealDiv", "Div"):
            unk = unk | np.broadcast_to((zx & zy & ~(_exact(x) & _exact(y))) | (ix & iy), shape)
        if op in ("Maximum", "Minimum"):
            lo, hi = _with_passthrough(lo, hi, x, y)
            # max/min of +0 and -0 may return either (TF: max(-0, 0) = -0,
            # and rsqrt of it -inf: --seed=20261130 graph 3435)
            both = np.broadcast_to(_holds(x, 0.0) & _holds(y, 0.0), lo.shape)
            lo = np.where(both & (lo == 0), -0.0, lo)
            hi = np.where(both & (hi == 0), 0.0, hi)
        if op in ("RealDiv", "Div", "DivNoNan"):
            ystr = ((y.lo < 0) | ((y.lo == 0) & np.signbit(y.lo))) & (
                (y.hi > 0) | ((y.hi == 0) & ~np.signbit(y.hi)))
            ystr = ystr & (y.lo != y.hi) | (np.signbit(y.lo) != np.signbit(y.hi))
            unk = unk | ystr            # the divisor's interval holds a pole
            if op == "DivNoNan":
                # y == 0 gives 0 (whatever x is): exact zero divisors give 0, an
                # interval touching 0 (e.g. a denormal under DAZ) is undetermined
                zero = (y.lo == 0) & (y.hi == 0) & ~y.unk
                touch = (y.lo <= 0) & (y.hi >= 0)
                lo = np.where(zero, 0.0, lo)
                hi = np.where(zero, 0.0, hi)
                unk = np.where(zero, np.broadcast_to(y.unk, lo.shape), unk | touch)
        return _finish(d, lo, hi, unk, _ERR.get(op, (0, 0, 0)))

    def pow(self, x: Iv, y: Iv) -> Iv:
        """x**y: monotone in each argument where x >= 0. For x < 0 only an exact
        integer exponent is defined (corners plus 0 for even powers); otherwise NaN
        or undetermined."""
        d = x.dtype
        shape = np.broadcast_shapes(x.shape, y.shape)
        xlo, xhi = np.broadcast_to(x.lo, shape), np.broadcast_to(x.hi, shape)
        ylo, yhi = np.broadcast_to(y.lo, shape), np.broadcast_to(y.hi, shape)
        zero = np.where((xlo < 0) & (xhi > 0), 0.0, xlo)     # even powers: minimum inside
        lo, hi, unk = _corners(np.power, [x, y], [(zero, ylo), (zero, yhi)])
        neg = (xlo < 0) | ((xlo == 0) & np.signbit(xlo) & (xhi != xlo))
        y_int = (ylo == yhi) & (np.floor(ylo) == ylo)
        y_no_int = np.floor(ylo) == np.floor(yhi)
        y_no_int = y_no_int & (np.floor(ylo) != ylo) & np.isfinite(ylo)
        # (pow(-inf, y) is +-inf or 0 in C, not NaN)
        nan_certain = neg & (xhi < 0) & (xlo > -np.inf) & y_no_int
        # pow(1, NaN) = pow(NaN, 0) = 1: an interval holding 1 (or 0) with a NaN partner
        with np.errstate(invalid="ignore"):
            one_nan = (((xlo <= 1) & (1 <= xhi) & np.isnan(ylo)) |
                       ((ylo <= 0) & (0 <= yhi) & np.isnan(xlo)))
        unk = unk | (one_nan & ~(np.broadcast_to(_exact(x), shape) &
                                 np.broadcast_to(_exact(y), shape)))
        minus_inf = (xlo == -np.inf) & (xhi == -np.inf)
        unk = unk | (neg & ~y_int & ~nan_certain & ~minus_inf)
        lo = np.where(nan_certain, np.nan, lo)
        hi = np.where(nan_certain, np.nan, hi)
        return _finish(d, lo, hi, unk & ~nan_certain, _ERR["Pow"])

    def floor_mod(self, x: Iv, y: Iv) -> Iv:
        """TF: r = fmod(x, y); r != 0 and sign(r) != sign(y) ? r + y : r.
        Exact inputs: that formula (fmod is exact, the + y rounds). Otherwise,
        where the quotient's floor is the same over the box, x - q*y, linear."""
        d = x.dtype
        shape = np.broadcast_shapes(x.shape, y.shape)
        with np.errstate(all="ignore"):
            xl, yl = np.broadcast_to(x.lo, shape), np.broadcast_to(y.lo, shape)
            r = np.fmod(xl, yl)
            exact_val = np.where((r != 0) & ((yl < 0) != (r < 0)), r + yl, r)
            q = self.binary("RealDiv", x, y)
            ql, qh = np.floor(q.lo), np.floor(q.hi)
            same_q = ~q.unk & (ql == qh) & np.isfinite(ql)
            qv = np.where(same_q, ql, 0.0)
            lin_lo, lin_hi, lin_unk = _corners(lambda a, b: a - qv * b, [x, y])
        exact = _exact(x) & _exact(y)
        exact = np.broadcast_to(exact, shape)
        # with an infinite operand the result jumps (fmod(x, inf) = x, then + inf
        # when x < 0): only exact operands are determined there
        infinite = np.broadcast_to(~np.isfinite(x.lo) | ~np.isfinite(x.hi), shape) | \
            np.broadcast_to(~np.isfinite(y.lo) | ~np.isfinite(y.hi), shape)
        lo = np.where(exact, exact_val, lin_lo)
        hi = np.where(exact, exact_val, lin_hi)
        unk = np.where(exact, np.broadcast_to(x.unk | y.unk, shape),
                       lin_unk | ~same_q | infinite)
        absolute = 0.0
        if d == "float64":
            # the oracle's own x - q*y in float64 rounds q*y (not exact for float64
            # operands): up to an ulp of q*y, many ulps of a cancelling result
            # (--seed=20261129 graph 10154: -1 mod 0.197, 4 ulps)
            with np.errstate(all="ignore"):
                qy = np.abs(qv) * np.maximum(np.abs(y.lo), np.abs(y.hi))
            absolute = np.where(exact | ~np.isfinite(qy), 0.0, 2 * U[d] * qy)
        return _finish(d, lo, hi, unk, (1, 0, 0), absolute=absolute)

    def int_binary(self, op, x: Iv, y: Iv) -> Iv:
        d = x.dtype
        a, b = x.lo.astype(d), y.lo.astype(d)
        unk = x.unk | y.unk
        with np.errstate(all="ignore"):
            if op in ("AddV2", "Add"):
                v = a + b
            elif op == "Sub":
                v = a - b
            elif op == "Mul":
                v = a * b
            elif op == "Maximum":
                v = np.maximum(a, b)
            elif op == "Minimum":
                v = np.minimum(a, b)
            elif op == "SquaredDifference":
                v = (a - b) * (a - b)
            elif op == "FloorDiv":
                v = np.floor_divide(a, np.where(b == 0, 1, b))
            elif op == "FloorMod":
                v = np.mod(a, np.where(b == 0, 1, b))
            elif op == "Div":                     # C++ integer division truncates
                bb = np.where(b == 0, 1, b)
                q = np.floor_divide(a, bb)
                v = np.where((q * bb != a) & ((a < 0) != (bb < 0)), q + 1, q)
            else:
                raise CaseError(f"oracle: {op} on integers")
        return _int_iv(d, np.asarray(v).astype(d), unk)

    def compare(self, op, x: Iv, y: Iv) -> Iv:
        shape = np.broadcast_shapes(x.shape, y.shape)
        unk = np.broadcast_to(x.unk | y.unk, shape)
        if op in ("Equal", "NotEqual"):
            # certain where both are exact, or where the intervals are disjoint
            with np.errstate(all="ignore"):
                nan = np.isnan(x.lo) | np.isnan(y.lo)
                disjoint = (x.hi < y.lo) | (y.hi < x.lo) | nan
                both = (x.lo == x.hi) & (y.lo == y.hi) & (x.lo == y.lo)
            eq_lo = both & ~unk
            eq_hi = ~disjoint | unk
            if op == "Equal":
                return _bool_iv(eq_lo, eq_hi)
            return _bool_iv(~eq_hi, ~eq_lo)
        fn = {"Less": np.less, "Greater": np.greater, "LessEqual": np.less_equal,
              "GreaterEqual": np.greater_equal}[op]
        with np.errstate(all="ignore"):
            res = [fn(a, b) for a in (x.lo, x.hi) for b in (y.lo, y.hi)]
        r = np.stack([np.broadcast_to(t, shape) for t in res])
        lo, hi = r.all(0), r.any(0)
        return _bool_iv(lo & ~unk, hi | unk)

    def select(self, c: Iv, x: Iv, y: Iv) -> Iv:
        shape = np.broadcast_shapes(c.shape, x.shape, y.shape)
        t = (c.lo == 1)
        f = (c.hi == 0)
        bx = [np.broadcast_to(v, shape) for v in (x.lo, x.hi, x.unk)]
        by = [np.broadcast_to(v, shape) for v in (y.lo, y.hi, y.unk)]
        if x.dtype in INTS:
            eq = bx[0] == by[0]
            lo = np.where(f, by[0], bx[0])
            unk = np.where(t, bx[2], np.where(f, by[2], bx[2] | by[2] | ~eq))
            return _int_iv(x.dtype, lo, unk)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ulo = np.fmin(bx[0], by[0])
            uhi = np.fmax(bx[1], by[1])
        # union of a NaN and a number: NaN or not depends on the condition
        mixed = np.isnan(bx[0]) != np.isnan(by[0])
        lo = np.where(t, bx[0], np.where(f, by[0], ulo))
        hi = np.where(t, bx[1], np.where(f, by[1], uhi))
        unk = np.where(t, bx[2], np.where(f, by[2], bx[2] | by[2] | mixed))
        if x.dtype == "bool":
            return _bool_iv(np.where(unk, 0.0, lo), np.where(unk, 1.0, hi))
        lo = np.where(unk, -np.inf, lo)
        hi = np.where(unk, np.inf, hi)
        return Iv(x.dtype, lo, hi, unk)

    def cast(self, x: Iv, to: str) -> Iv:
        d = x.dtype
        if d == to:
            return x
        if to == "bool":
            if d == "bool":
                return x
            if d in INTS:
                nz = x.lo != 0
                return _bool_iv(nz & ~x.unk, nz | x.unk)
            # x != 0 (NaN != 0 is true): certain where 0 is outside the interval
            nz = ~x.unk & ((x.lo > 0) | (x.hi < 0) | np.isnan(x.lo))
            z = ~x.unk & (x.lo == 0) & (x.hi == 0)
            return _bool_iv(nz, ~z)
        if d == "bool":
            if to in INTS:
                return _int_iv(to, x.lo, x.lo != x.hi)
            return Iv(to, x.lo.copy(), x.hi.copy(), np.zeros(x.lo.shape, bool))
        if d in INTS and to in INTS:
            return _int_iv(to, x.lo.astype(d).astype(to), x.unk)
        if d in INTS:
            v = x.lo.astype(np.float64)         # exact below 2^53; else one rounding
            big = np.abs(x.lo) > 2 ** 53
            lo = np.where(big, np.nextafter(v, -np.inf), v)
            hi = np.where(big, np.nextafter(v, np.inf), v)
            return _finish(to, lo, hi, x.unk.copy())
        if to in INTS:
            # float -> int truncates; NaN, Inf and out-of-range values are
            # undefined behaviour in C++ (TF gives INT_MIN on x86): undetermined.
            info = np.iinfo(to)
            with np.errstate(all="ignore"):
                tl, th = np.trunc(x.lo), np.trunc(x.hi)
            ok = ~x.unk & np.isfinite(tl) & np.isfinite(th) & (tl >= info.min) & (th <= info.max)
            ok = ok & (tl == th)
            return _int_iv(to, np.where(ok, tl, 0).astype(np.int64), ~ok)
        lo, hi = round_out(x.lo, x.hi, to)      # float -> float: rounding is monotone
        return Iv(to, lo, hi, x.unk.copy())

    # -- reductions ----------------------------------------------------------
    def reduce(self, op, x: Iv, axes, keep) -> Iv:
        d = x.dtype
        r = x.lo.ndim
        ax = tuple(_norm_axes(axes, r)) if r else ()
        n = int(math.prod(x.shape[i] for i in ax))
        unk = np.any(x.unk, axis=ax, keepdims=keep) if ax else x.unk.copy()
        if not ax:     # reduction over no axes: the identity
            return Iv(d, x.lo.copy(), x.hi.copy(), unk)
        if op in ("Any", "All"):
            f = np.max if op == "Any" else np.min
            init = 0.0 if op == "Any" else 1.0
            return _bool_iv(f(x.lo, axis=ax, keepdims=keep, initial=init),
                            f(x.hi, axis=ax, keepdims=keep, initial=init))
        if d in INTS:
            v = x.lo.astype(d)
            info = np.iinfo(d)
            with np.errstate(all="ignore"):
                if op == "Sum":
                    out = np.sum(v, axis=ax, keepdims=keep, dtype=d)
                elif op == "Prod":
                    out = np.prod(v, axis=ax, keepdims=keep, dtype=d)
                elif op == "Max":
                    out = np.max(v, axis=ax, keepdims=keep, initial=info.min)
                elif op == "Min":
                    out = np.min(v, axis=ax, keepdims=keep, initial=info.max)
                else:
                    # Mean: TF's int32 mean is exact (it does not wrap: measured), int64's
                    # sum wraps; then C++ integer division (truncation toward zero).
                    s = np.sum(v.astype(np.int64), axis=ax, keepdims=keep, dtype=np.int64)
                    # (floor division, then toward zero: |INT64_MIN| does not exist,
                    # --seed=20261129 graph 13737)
                    q = np.floor_divide(s, max(n, 1))
                    out = np.where((s < 0) & (q * max(n, 1) != s), q + 1, q)
            return _int_iv(d, np.asarray(out).astype(d), unk)
        with np.errstate(all="ignore"):
            if op in ("Max", "Min"):
                # exact; NaN propagates (TF's reducers and ours)
                f = np.max if op == "Max" else np.min
                init = -np.inf if op == "Max" else np.inf
                lo = f(x.lo, axis=ax, keepdims=keep, initial=init)
                hi = f(x.hi, axis=ax, keepdims=keep, initial=init)
                return _finish(d, lo, hi, unk)
            if op in ("Sum", "Mean"):
                # |error| <= (n + 2) eps sum|x| for any summation order
                # (test_optimize_ops' reduction bound), eps = 2u of the dtype.
                # float64 sums that overflow in the oracle's own order are formed
                # again scaled down, where the exact sum may be finite (`_fsum`)
                lo, hi = _fsum(x.lo, ax, keep), _fsum(x.hi, ax, keep)
                mag = np.maximum(np.abs(x.lo), np.abs(x.hi))
                mag = _fsum(np.where(np.isfinite(mag), mag, 0.0), ax, keep)
                bound = (n + 2) * 2 * U[d] * mag      # may be inf: then so is the slack
                if op == "Mean":
                    lo = _fsum(x.lo, ax, keep, n) if n else lo / n
                    hi = _fsum(x.hi, ax, keep, n) if n else hi / n
                    bound = bound / n if n else bound
                    bound = bound + 2 * U[d] * np.maximum(np.abs(lo), np.abs(hi))
                # inf + -inf (NaN) may happen if some element can be +inf and one
                # -inf, or if partial sums can overflow both ways (order-dependent)
                big = _max_finite(d)
                pos = _fsum(np.where(np.isfinite(x.hi), np.maximum(x.hi, 0), 0), ax, keep)
                neg = _fsum(np.where(np.isfinite(x.lo), np.minimum(x.lo, 0), 0), ax, keep)
                # partial sums beyond the dtype's range (bfloat16's is float32's, so
                # float32 accumulation overflows too) may give +-inf in some order
                hi = np.where((pos > big) & ~np.isnan(hi), np.inf, hi)
                lo = np.where((neg < -big) & ~np.isnan(lo), -np.inf, lo)
                amb = (np.isnan(lo) != np.isnan(hi)) | (
                    (np.any(np.isposinf(x.hi), axis=ax, keepdims=keep) | (pos > big))
                    & (np.any(np.isneginf(x.lo), axis=ax, keepdims=keep) | (neg < -big))
                    & ~(np.isnan(lo) & np.isnan(hi)))
                return _finish(d, lo, hi, unk | amb, absolute=np.where(np.isnan(bound),
                                                                     0.0, bound))
            # Prod: interval product, element by element along the reduced axes
            keep_axes = [i for i in range(r) if i not in ax]
            perm = keep_axes + list(ax)
            xl = np.transpose(x.lo, perm).reshape([x.shape[i] for i in keep_axes] + [n])
            xh = np.transpose(x.hi, perm).reshape([x.shape[i] for i in keep_axes] + [n])
            plo = np.ones(xl.shape[:-1])
            phi = np.ones(xl.shape[:-1])
            amb = np.zeros(xl.shape[:-1], bool)
            for j in range(n):
                c = [plo * xl[..., j], plo * xh[..., j], phi * xl[..., j], phi * xh[..., j]]
                lo_j, hi_j, amb_j = _minmax_corners(c)
                plo, phi, amb = lo_j, hi_j, amb | amb_j
            out_shape = tuple((1 if i in ax else e) for i, e in enumerate(x.shape)) if keep else \
                tuple(e for i, e in enumerate(x.shape) if i not in ax)
            plo, phi, amb = plo.reshape(out_shape), phi.reshape(out_shape), amb.reshape(out_shape)
            # Partial products depend on the order of multiplication: if the large
            # factors together can overflow, or the small ones underflow (FTZ), some
            # order gives inf, 0 or 0 * inf = NaN where the exact product is finite,
            # or inf: undetermined then (TF's order is Eigen's tree, ours is not).
            mag = np.maximum(np.abs(xl), np.abs(xh))
            mag_lo = np.minimum(np.abs(xl), np.abs(xh))
            mag_lo = np.where((xl <= 0) & (xh >= 0), 0.0, mag_lo)
            p_big = np.prod(np.where(np.isfinite(mag) & (mag > 1), mag, 1.0), -1)
            p_small = np.prod(np.where(mag_lo < 1, mag_lo, 1.0), -1)
            has_inf = np.isinf(mag).any(-1)
            has_zero = (mag_lo == 0).any(-1)
            order = ((p_big > _max_finite(d)) | has_inf) & ((p_small < TINY[d]) | has_zero)
            order = order | ((p_big > _max_finite(d)) & ~has_inf) | (
                (p_small < TINY[d]) & ~has_zero & (p_small > 0))
            amb = amb | order.reshape(out_shape)
            bound = (n + 2) * 2 * U[d] * np.maximum(np.abs(plo), np.abs(phi))
            return _finish(d, plo, phi, unk | amb,
                           absolute=np.where(np.isfinite(bound), bound, 0.0))

    def softmax(self, x: Iv, log: bool) -> Iv:
        """Output i is increasing in x_i and decreasing in every other x_j, so its
        bounds take x_i at one end and the others at the opposite end (computed in
        float64, shifted by the row maximum m).

        Rounding, with d_j = x_j - m and u of the dtype (TF computes float16 and
        bfloat16 softmax in the dtype): d_j rounds (u|d_j|, which exp turns into a
        relative error), exp adds k u, the sum of positive terms n u, the division
        u. Only terms with e^d_j > u matter for the sum: with D the largest such
        |d_j|, softmax_i has relative error <= (|d_i| + D + n + 12) u, and
        log-softmax_i = d_i - log(sum) absolute error <= (|d_i| + |out_i| + D + n
        + 12 + 8 |log sum|) u.

        Rows holding +Inf or NaN are undetermined: TF's Eigen kernel gives NaN for
        the whole row, its oneDNN kernel only at those positions (test_optimize_ops,
        test_exp_log_softmax_with_inf); both are TF."""
        d = x.dtype
        n = x.shape[-1]
        uu = U[d]
        with np.errstate(all="ignore"):
            bad = (x.unk | np.isnan(x.lo) | np.isnan(x.hi) | np.isposinf(x.hi)).any(
                -1, keepdims=True)
            lo_in = np.where(bad, 0.0, x.lo)
            hi_in = np.where(bad, 0.0, x.hi)
            m = np.max(hi_in, axis=-1, keepdims=True) if n else np.zeros(x.shape[:-1] + (1,))
            all_neg_inf = np.isneginf(m)
            m = np.where(all_neg_inf, 0.0, m)
            dl, dh = lo_in - m, hi_in - m
            sh = np.sum(np.exp(dh), -1, keepdims=True)
            others_hi = _logsumexp_others(dh)    # log sum_{j != i} e^(x_j - m), x_j high
            others_lo = _logsumexp_others(dl)
            if log:
                lo = dl - np.logaddexp(dl, others_hi)
                hi = dh - np.logaddexp(dh, others_lo)
            else:
                lo = _sigmoid(dl - others_hi)
                hi = _sigmoid(dh - others_lo)
            mattering = dl >= np.log(uu) - 1
            big_d = np.max(np.where(mattering, -dl, 0.0), -1, keepdims=True) \
                if n else np.zeros(x.shape[:-1] + (1,))
            di = np.maximum(np.abs(dl), np.abs(dh))
            if log:
                out = np.maximum(np.abs(lo), np.abs(hi))
                absolute = (di + out + big_d + n + 12 + 8 * np.abs(np.log(sh))) * uu
                absolute = np.where(np.isfinite(absolute), absolute, 0.0)
                lo, hi = _widen(lo, hi, 0.0, absolute)
            else:
                rel = (di + big_d + n + 12) * uu
                lo = np.where(np.isfinite(rel), lo * (1 - rel), 0.0)
                hi = np.where(np.isfinite(rel), hi * (1 + rel), hi)
        if not log:
            # exp(x - max) underflows first: outputs below ~n smallest normals may be
            # 0 (seen: TF's kernel flushes 1.5e-38)
            lo = np.where(hi < 4 * max(n, 1) * TINY[d], np.minimum(lo, 0.0), lo)
        nan_row = all_neg_inf & ~bad            # a row of -inf: exp(-inf - -inf) = NaN
        lo = np.where(nan_row, np.nan, lo)
        hi = np.where(nan_row, np.nan, hi)
        # a row whose every element may be -inf (e.g. a product that may overflow)
        # may be NaN or not (--seed=20261129 graphs 4264, 4664, 19644)
        maybe_nan_row = (np.isneginf(x.lo).all(-1, keepdims=True) if n else
                         np.zeros(x.shape[:-1] + (1,), bool)) & ~all_neg_inf
        unk = np.broadcast_to(bad | maybe_nan_row, x.shape).copy()
        return _finish(d, lo, hi, unk)


def _fsum(a, ax, keep, div=1):
    """sum(a) / div in float64. Where that overflows, the sum is formed again
    scaled by 2^-64 (a float64 sum may be finite where the oracle's order
    overflows). Not scaled otherwise: scaling first would flush values below
    2^-958 (float64 denormals, which TF's Sum over one element returns as they
    are: --seed=20261129 graphs 5276, 9635, 13690, 14688)."""
    with np.errstate(all="ignore"):
        s = np.sum(a, axis=ax, keepdims=keep)
        sc = 2.0 ** -64
        scaled = np.sum(a * sc, axis=ax, keepdims=keep) / div / sc
        return np.where(np.isfinite(s), s / div, scaled)


def _logsumexp_others(d: np.ndarray) -> np.ndarray:
    """out[..., i] = log(sum_{j != i} exp(d[..., j])), without cancellation: for i
    other than the row's argmax the sum holds the max's term e^0 = 1, so removing
    e^(d_i - M) <= 1 from it loses at most n ulps; the argmax itself gets a sum of
    its own around the second largest value."""
    n = d.shape[-1]
    if n <= 1:
        return np.full(d.shape, -np.inf)
    with np.errstate(all="ignore"):
        am = np.argmax(d, -1)[..., None]
        m = np.take_along_axis(d, am, -1)
        ms = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(d - ms)
        out = np.log(np.maximum(np.sum(e, -1, keepdims=True) - e, 0.0)) + ms
        rest = d.copy()
        np.put_along_axis(rest, am, -np.inf, -1)
        m2 = np.max(rest, -1, keepdims=True)
        m2s = np.where(np.isfinite(m2), m2, 0.0)
        at_max = np.log(np.sum(np.exp(rest - m2s), -1, keepdims=True)) + m2s
        np.put_along_axis(out, am, at_max, -1)
    return out


def evaluate(case, inputs: Sequence[np.ndarray]) -> Dict[str, Iv]:
    """Enclosures of every value of the case for these input values."""
    return _Oracle(case, inputs).run()


# ---------------------------------------------------------------------------
# Checking one output
# ---------------------------------------------------------------------------
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
        v = _f64(value)
        nan = np.isnan(iv.lo)
        with np.errstate(invalid="ignore"):
            inside = (v >= iv.lo) & (v <= iv.hi)
        bad = known & np.where(nan, ~np.isnan(v), ~inside)
    return Verdict(bad, int(known.sum()), int(known.size))


def _describe(iv: Iv, expected, actual, bad, limit=4) -> str:
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


# ---------------------------------------------------------------------------
# The differential runner
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class CaseResult:
    case: dict
    status: str = "ok"          # ok | mismatch | oracle | invalid
    problems: List[str] = dataclasses.field(default_factory=list)
    draw: int = 0               # the draw that failed
    checked: int = 0
    total: int = 0

    @property
    def failed(self) -> bool:
        return self.status == "mismatch"


@dataclasses.dataclass
class BatchStats:
    graphs: int = 0
    kernels: int = 0
    fallbacks: int = 0
    invalid: int = 0
    oracle: int = 0
    checked: int = 0
    total: int = 0
    seconds: float = 0.0


def _to_numpy(t) -> np.ndarray:
    return np.asarray(t.numpy())


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[:3])[:600]


def run_cases(cases: Sequence[dict], draws: int = 2, stats: BatchStats = None,
              isolate: bool = True) -> List[CaseResult]:
    """Optimizes all `cases` as one tf.function and checks each case's outputs on
    `draws` fresh input draws. A crash of the batch is attributed by running each
    case alone."""
    stats = stats if stats is not None else BatchStats()
    start = time.perf_counter()
    results = [CaseResult(c) for c in cases]
    draw_inputs = [[make_inputs(c, k) for c in cases] for k in range(draws)]
    f = combined_function(cases)
    try:
        f.get_concrete_function()
        expected = [f(*[tf.constant(v) for per in per_draw for v in per])
                    for per_draw in draw_inputs]
    except Exception as e:          # TF itself refuses the batch: find the invalid case(s)
        if len(cases) == 1 or not isolate:
            for r in results:
                r.status, r.problems = "invalid", [f"TF: {_short(e)}"]
            stats.invalid += len(cases)
            return results
        out = []
        for c in cases:
            out += run_cases([c], draws, stats)
        return out
    opt = fs.optimize(f, min_cluster_ops=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            actual = [opt(*[tf.constant(v) for per in per_draw for v in per])
                      for per_draw in draw_inputs]
    except Exception as e:
        if len(cases) > 1 and isolate:
            stats.seconds += time.perf_counter() - start
            out = []
            for c in cases:
                out += run_cases([c], draws, stats)
            if not any(r.failed for r in out):   # only the batch crashes: blame all
                for r in out:
                    r.status, r.problems = "mismatch", [f"crash in a batch: {_short(e)}"]
            return out
        for r in results:
            r.status, r.problems = "mismatch", [f"crash: {_short(e)}"]
        stats.graphs += len(cases)
        stats.seconds += time.perf_counter() - start
        return results
    report = opt.report()
    stats.graphs += len(cases)
    if report is not None:
        stats.kernels += sum(c.parts for c in report.fused_clusters)  # packs count per part
        stats.fallbacks += len(report.fallbacks)
    offsets = np.cumsum([0] + [len(c["outputs"]) for c in cases])
    for k in range(draws):
        exp_k = [_to_numpy(t) for t in tf.nest.flatten(expected[k])]
        act_k = [_to_numpy(t) for t in tf.nest.flatten(actual[k])]
        for ci, (case, res) in enumerate(zip(cases, results)):
            if res.status != "ok":
                continue
            env = evaluate(case, draw_inputs[k][ci])
            for oi, name in enumerate(case["outputs"]):
                e, a = exp_k[offsets[ci] + oi], act_k[offsets[ci] + oi]
                iv = env[name]
                where = f"output {name} ({case_op(case, name)}), draw {k}"
                if a.dtype != e.dtype or a.shape != e.shape:
                    res.status, res.draw = "mismatch", k
                    res.problems.append(f"{where}: fused {a.dtype}{list(a.shape)} vs TF "
                                        f"{e.dtype}{list(e.shape)}")
                    continue
                try:
                    tf_v = check_value(iv, e)
                except ValueError as err:
                    res.status, res.draw = "oracle", k
                    res.problems.append(f"{where}: oracle shape: {err}")
                    continue
                fs_v = check_value(iv, a)
                res.checked += fs_v.checked
                res.total += fs_v.total
                if tf_v.bad.any():
                    # the enclosure does not hold TF's own result: the oracle is wrong
                    res.status, res.draw = "oracle", k
                    res.problems.append(f"{where}: TF outside the oracle's enclosure: "
                                        + _describe(iv, e, a, tf_v.bad))
                compiler = fs_v.bad & ~tf_v.bad
                if compiler.any():
                    if res.status == "ok" or res.status == "oracle":
                        res.status, res.draw = "mismatch", k
                    res.problems.append(f"{where}: " + _describe(iv, e, a, compiler))
    for r in results:
        stats.checked += r.checked
        stats.total += r.total
        stats.oracle += r.status == "oracle"
    stats.seconds += time.perf_counter() - start
    return results


def case_op(case, name) -> str:
    for n in case["nodes"]:
        if n["name"] == name:
            return n["op"]
    return "input"


# ---------------------------------------------------------------------------
# Shrinking
# ---------------------------------------------------------------------------
def _dce(case) -> dict:
    """Drop nodes and inputs no output depends on."""
    live = set(case["outputs"])
    for node in reversed(case["nodes"]):
        if node["name"] in live:
            live.update(r for r in node["inputs"] if isinstance(r, str))
    return dict(case, nodes=[n for n in case["nodes"] if n["name"] in live],
                inputs=[i for i in case["inputs"] if i["name"] in live])


def _copy(case) -> dict:
    return json.loads(json.dumps(case))


def _replace_uses(case, old, new) -> dict:
    c = _copy(case)
    for node in c["nodes"]:
        node["inputs"] = [new if r == old else r for r in node["inputs"]]
    return c


def _candidates(case):
    """Smaller variants of a case, most aggressive first."""
    # 1. fewer outputs
    if len(case["outputs"]) > 1:
        for o in case["outputs"]:
            yield _dce(dict(_copy(case), outputs=[o]))
        for o in case["outputs"]:
            yield _dce(dict(_copy(case), outputs=[k for k in case["outputs"] if k != o]))
    types = infer_types(case)
    names = [n["name"] for n in case["nodes"]]
    # 2. cut a node: replace it by a new input of its type (its producers go away)
    for node in case["nodes"]:
        if node["name"] in case["outputs"]:
            continue
        d, s = types[node["name"]]
        c = _copy(case)
        new = f"x{len(c['inputs'])}_{node['name']}"
        c["inputs"].append({"name": new, "dtype": d, "shape": list(s), "static": list(s),
                            "domain": "bool:0.5" if d == "bool" else "normal", "edges": 0.0})
        yield _dce(_replace_uses(c, node["name"], new))
    # 3. bypass a node: its consumers use one of its operands instead
    for node in case["nodes"]:
        for ref in node["inputs"]:
            if isinstance(ref, str) and types[ref] == types[node["name"]]:
                c = _replace_uses(case, node["name"], ref)
                if node["name"] in c["outputs"]:
                    if ref not in names:
                        continue
                    c["outputs"] = [ref if o == node["name"] else o for o in c["outputs"]]
                    if len(set(c["outputs"])) != len(c["outputs"]):
                        continue
                yield _dce(c)
    # 4. drop edge values, plain domains, static signatures
    for i, inp in enumerate(case["inputs"]):
        if inp.get("edges"):
            c = _copy(case)
            c["inputs"][i]["edges"] = 0.0
            yield c
        if inp.get("static") != inp["shape"]:
            c = _copy(case)
            c["inputs"][i]["static"] = list(inp["shape"])
            yield c
    # 5. smaller extents: replace one extent value everywhere (keeps broadcasting)
    extents = sorted({d for i in case["inputs"] for d in i["shape"] if d > 1}, reverse=True)
    for e in extents:
        for new in sorted({1, 2, e // 2, e - 1}):
            if new >= e or new < 1:
                continue
            c = _copy(case)
            for inp in c["inputs"]:
                inp["shape"] = [new if d == e else d for d in inp["shape"]]
                inp["static"] = [(new if d == e else d) if d is not None else None
                                 for d in inp.get("static", inp["shape"])]
            for node in c["nodes"]:
                if "shape" in node.get("attrs", {}):
                    node["attrs"]["shape"] = [new if d == e else d for d in node["attrs"]["shape"]]
            yield c
    # 6. lower ranks: drop a size-1 (or any) dim of one input
    for i, inp in enumerate(case["inputs"]):
        for j in range(len(inp["shape"])):
            c = _copy(case)
            del c["inputs"][i]["shape"][j]
            del c["inputs"][i]["static"][j]
            yield c


def _valid(case) -> bool:
    try:
        infer_types(case)
    except (CaseError, KeyError, IndexError, TypeError):
        return False
    return validate_case(case) is None


def shrink(case: dict, still_fails: Callable[[dict], bool], budget_s: float = 120.0,
           log: Callable[[str], None] = None) -> dict:
    """Greedy: take the first smaller valid variant that still fails, repeat."""
    deadline = time.monotonic() + budget_s
    best = _dce(_copy(case))
    if not _valid(best) or not still_fails(best):
        best = case
    progress = True
    while progress and time.monotonic() < deadline:
        progress = False
        for cand in _candidates(best):
            if time.monotonic() > deadline:
                break
            if not cand["nodes"] or not _valid(cand) or _size(cand) >= _size(best):
                continue
            if still_fails(cand):
                best = cand
                progress = True
                if log:
                    log(f"  shrunk to {len(best['nodes'])} ops, {len(best['inputs'])} inputs, "
                        f"{sum(math.prod(i['shape']) for i in best['inputs'])} input elements")
                break
    return best


def _size(case) -> tuple:
    return (len(case["nodes"]), len(case["outputs"]),
            sum(math.prod(i["shape"]) for i in case["inputs"]),
            sum(len(i["shape"]) for i in case["inputs"]),
            sum(bool(i.get("edges")) for i in case["inputs"]),
            sum(i.get("static") != i["shape"] for i in case["inputs"]))


def fails(case: dict, draws: int = 2) -> Optional[CaseResult]:
    """The case's result if it shows a compiler mismatch, else None."""
    r = run_cases([case], draws)[0]
    return r if r.failed else None


# ---------------------------------------------------------------------------
# Regression files and reproducers
# ---------------------------------------------------------------------------
def case_key(case) -> str:
    text = json.dumps({k: case[k] for k in ("inputs", "nodes", "outputs")}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def save_regression(case: dict, result: CaseResult, directory=None, found_by: str = "") -> pathlib.Path:
    directory = pathlib.Path(directory or REGRESSIONS_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    ops = sorted({n["op"] for n in case["nodes"]})
    name = "-".join(ops)[:60] + "-" + case_key(case) + ".json"
    path = directory / name
    record = {"case": case, "draws": max(2, result.draw + 1), "failure": result.problems[:6],
              "found_by": found_by, "status": "open"}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def load_regressions(directory=None) -> List[Tuple[pathlib.Path, dict]]:
    directory = pathlib.Path(directory or REGRESSIONS_DIR)
    if not directory.is_dir():
        return []
    return [(p, json.loads(p.read_text())) for p in sorted(directory.glob("*.json"))]


def replay(record: dict) -> CaseResult:
    return run_cases([record["case"]], draws=int(record.get("draws", 2)))[0]


def to_python(case: dict, draw: int = 0) -> str:
    """A standalone script that reproduces the case on the given draw's inputs."""
    types = infer_types(case)
    lines = ["import numpy as np", "import tensorflow as tf", "import tf_fusionstitch as fs",
             "", "raw = tf.raw_ops", "nan, inf = float('nan'), float('inf')"]
    for inp, v in zip(case["inputs"], make_inputs(case, draw)):
        if inp["dtype"] == "bool":
            flat = [str(bool(x)) for x in np.asarray(v).reshape(-1)]
        else:
            flat = [_py(x) for x in np.asarray(v).astype(np.float64).reshape(-1).tolist()]
        src = "float64" if inp["dtype"] in FLOATS else inp["dtype"]
        lines.append(f"{inp['name']} = tf.constant(np.array([{', '.join(flat)}], "
                     f"'{src}').reshape({tuple(inp['shape'])}), tf.{inp['dtype']})")
    sig = ", ".join(f"tf.TensorSpec({inp.get('static', inp['shape'])}, tf.{inp['dtype']})"
                    for inp in case["inputs"])
    args = ", ".join(i["name"] for i in case["inputs"])
    lines += ["", f"@tf.function(input_signature=[{sig}])", f"def f({args}):"]
    for node in case["nodes"]:
        op, a = node["op"], node.get("attrs", {})
        other = next((types[r][0] for r in node["inputs"] if isinstance(r, str)), None)
        refs = [r if isinstance(r, str) else f"tf.constant({_py(r['const'])}, tf.{other})"
                for r in node["inputs"]]
        if op in UNARY_OPS:
            call = f"raw.{op}({'features' if op in _FEATURES_ARG else 'x'}={refs[0]})"
        elif op in BINARY_OPS:
            call = f"raw.{op}(x={refs[0]}, y={refs[1]})"
        elif op == "Select":
            call = f"raw.Select(condition={refs[0]}, x={refs[1]}, y={refs[2]})"
        elif op == "SelectV2":
            call = f"raw.SelectV2(condition={refs[0]}, t={refs[1]}, e={refs[2]})"
        elif op in REDUCE_OPS:
            call = f"raw.{op}(input={refs[0]}, axis={a['axis']}, keep_dims={bool(a['keep_dims'])})"
        elif op in ("Softmax", "LogSoftmax"):
            call = f"raw.{op}(logits={refs[0]})"
        elif op == "BiasAdd":
            call = (f"raw.BiasAdd(value={refs[0]}, bias={refs[1]}, "
                    f"data_format={a.get('data_format', 'NHWC')!r})")
        elif op == "Cast":
            call = f"raw.Cast(x={refs[0]}, DstT=tf.{a['to']})"
        elif op == "Reshape":
            call = f"raw.Reshape(tensor={refs[0]}, shape={a['shape']})"
        elif op == "ExpandDims":
            call = f"raw.ExpandDims(input={refs[0]}, axis={a['axis']})"
        elif op == "Squeeze":
            call = f"raw.Squeeze(input={refs[0]}, axis={a['axis']})"
        elif op == "Transpose":
            call = f"raw.Transpose(x={refs[0]}, perm={a['perm']})"
        else:
            call = f"raw.BroadcastTo(input={refs[0]}, shape={a['shape']})"
        lines.append(f"    {node['name']} = {call}")
    lines.append(f"    return [{', '.join(case['outputs'])}]")
    lines += ["", "opt = fs.optimize(f, min_cluster_ops=1)",
              f"for want, got in zip(f({args}), opt({args})):",
              "    print('TF   ', want.numpy().tolist())",
              "    print('fused', got.numpy().tolist())"]
    return "\n".join(lines) + "\n"


def _py(x) -> str:
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


# ---------------------------------------------------------------------------
# A fuzzing session
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Finding:
    case: dict
    result: CaseResult
    path: Optional[pathlib.Path]
    duplicate_of: str = ""


def failure_signature(case: dict, result: CaseResult) -> str:
    """Ops of the (minimal) case and the kind of failure: two findings with the same
    signature are most likely one bug, and only the first is saved."""
    text = " ".join(result.problems)
    kind = "crash" if "crash" in text else ("shape" if " vs TF " in text else "values")
    dyn = any(i.get("static") != i["shape"] for i in case["inputs"])
    return f"{kind}:{'dynamic:' if dyn else ''}{','.join(sorted({n['op'] for n in case['nodes']}))}"


def _quick_signature(case: dict, result: CaseResult) -> str:
    """Before shrinking: failure kind, dynamic signature or not, and the failing
    output's op and dtype. A repeat is not shrunk again (shrinking costs a minute)."""
    text = result.problems[0] if result.problems else ""
    kind = "crash" if "crash" in text else ("shape" if " vs TF " in text else "values")
    dyn = any(i.get("static") != i["shape"] for i in case["inputs"])
    if kind != "values":
        return f"{kind}:{dyn}"
    name = text.split(" ", 2)[1] if text.startswith("output ") else ""
    try:
        dtype = infer_types(case)[name][0]
    except (CaseError, KeyError):
        dtype = "?"
    return f"{kind}:{dyn}:{case_op(case, name)}:{dtype}"


def fuzz(graphs: int, seed: int, batch: int = 8, draws: int = 2, shrink_budget_s: float = 90.0,
         regressions_dir=None, save: bool = True, time_limit_s: float = 0.0,
         log: Callable[[str], None] = print,
         first: int = 0) -> Tuple[BatchStats, List[Finding], List[CaseResult]]:
    """Generates cases first .. first + graphs - 1 of `seed`, runs them in
    batches, shrinks and saves every mismatch (one file per failure signature).
    Returns (stats, findings, oracle problems)."""
    stats = BatchStats()
    findings: List[Finding] = []
    oracle: List[CaseResult] = []
    seen: Dict[str, str] = {}
    quick: Dict[str, str] = {}
    start = time.monotonic()
    index, graphs = first, first + graphs
    while index < graphs:
        if time_limit_s and time.monotonic() - start > time_limit_s:
            log(f"time limit reached after {index - first} graphs")
            break
        n = min(batch, graphs - index)
        cases = [generate_case(case_seed(seed, index + k)) for k in range(n)]
        origins = [f"--seed={seed} graph {index + k}" for k in range(n)]
        index += n
        results = run_cases(cases, draws, stats)
        if ((index - first) // batch) % 10 == 0:
            wall = time.monotonic() - start
            log(f"... {stats.graphs} graphs, {stats.kernels} kernels, {len(findings)} "
                f"mismatches, {len(oracle)} oracle problems, {wall:.0f} s")
        for c, origin, r in zip(cases, origins, results):
            if r.status == "oracle":
                oracle.append(r)
                log(f"oracle problem ({origin}): " + "; ".join(r.problems[:2]))
            if not r.failed:
                continue
            log(f"MISMATCH ({origin}): " + "; ".join(r.problems[:3]))
            q = _quick_signature(c, r)
            if q in quick:
                log(f"  like {quick[q]} ({q}): not shrunk again")
                findings.append(Finding(c, r, None, quick[q]))
                continue
            small, final = c, r
            if shrink_budget_s > 0:
                small = shrink(c, lambda cand: fails(cand, draws) is not None,
                               shrink_budget_s, log=log)
                final = fails(small, draws)
                if final is None:             # flaky: keep the original
                    small, final = c, r
            sig = failure_signature(small, final)
            path = None
            if sig in seen:
                log(f"  same failure signature as {seen[sig]}: not saved again")
                findings.append(Finding(small, final, None, seen[sig]))
            else:
                if save:
                    path = save_regression(small, final, regressions_dir, origin)
                seen[sig] = str(path or origin)
                findings.append(Finding(small, final, path))
            quick[q] = seen[sig]
            log(f"minimal case ({len(small['nodes'])} ops)" + (f", saved to {path}" if path else "")
                + ":\n" + json.dumps(small) + "\n" + "\n".join(final.problems[:4]) + "\n"
                + to_python(small, final.draw))
    return stats, findings, oracle
