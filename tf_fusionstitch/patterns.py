"""The reference patterns as fusion-IR clusters, with NumPy references
(docs/DESIGN.md, "Reference patterns").

Each pattern is built as the rewriters lower TensorFlow's ops (primitives of
fusion_ir.py) over a dynamic batch dimension, so one kernel serves every row
count. `reference` computes in float64 from the same float32 inputs; `rtol`
and `atol` are the per-pattern tolerances docs/DESIGN.md, "Numerics" allows for a
float32 kernel (reductions: bounded by the sum of magnitudes). Used by the
CUDA checks and their tool, with `random_inputs` and `max_error` for any
other cluster. TF-free.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, List

import numpy as np

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.runtime.cpu_kernel import as_dtype
from tf_fusionstitch.schedule import build_schedule

T, op = ir.TensorType, ir.make_op
N = None


@dataclasses.dataclass(frozen=True)
class Pattern:
    name: str
    cluster: ir.Cluster
    make_inputs: Callable[[np.random.Generator, int], List[np.ndarray]]  # (rng, rows)
    reference: Callable[[List[np.ndarray]], List[np.ndarray]]
    rtol: float
    atol: float


def _f32(*shape):
    return T("float32", shape)


def _layernorm_ops(x: str, width: int, prefix: str = "") -> tuple:
    full, row = _f32(N, width), _f32(N, 1)
    p = prefix
    return (op(f"{p}mean", "reduce_mean", [x], row, axes=[1], keep_dims=True),
            op(f"{p}d", "sub", [x, f"{p}mean"], full),
            op(f"{p}sq", "square", [f"{p}d"], full),
            op(f"{p}var", "reduce_mean", [f"{p}sq"], row, axes=[1], keep_dims=True),
            op(f"{p}eps", "const", [], _f32(), value=1e-5),
            op(f"{p}ve", "add", [f"{p}var", f"{p}eps"], row),
            op(f"{p}rs", "rsqrt", [f"{p}ve"], row),
            op(f"{p}n", "mul", [f"{p}d", f"{p}rs"], full),
            op(f"{p}s", "mul", [f"{p}n", "gamma"], full),
            op(f"{p}y", "add", [f"{p}s", "beta"], full))


def _layernorm_ref(x, g, b):
    x = x.astype(np.float64)
    mu = x.mean(1, keepdims=True)
    var = ((x - mu) ** 2).mean(1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b, mu


def _normal(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def layernorm(width: int) -> Pattern:
    c = ir.Cluster((("x", _f32(N, width)), ("gamma", _f32(width)), ("beta", _f32(width))),
                   _layernorm_ops("x", width), ("y", "mean"))
    return Pattern(
        f"layernorm_{width}", c,
        lambda rng, rows: [_normal(rng, rows, width, scale=3.0) + 1.0, _normal(rng, width),
                           _normal(rng, width)],
        lambda ins: list(_layernorm_ref(*ins)), rtol=1e-4, atol=1e-4)


def residual_layernorm(width: int) -> Pattern:
    c = ir.Cluster((("x", _f32(N, width)), ("res", _f32(N, width)), ("gamma", _f32(width)),
                    ("beta", _f32(width))),
                   (op("h", "add", ["x", "res"], _f32(N, width)),) + _layernorm_ops("h", width),
                   ("y", "h"))

    def ref(ins):
        x, r, g, b = ins
        h = x.astype(np.float32) + r  # the sum is rounded to float32 before the norm
        return [_layernorm_ref(h, g, b)[0], h]
    return Pattern(f"residual_layernorm_{width}", c,
                   lambda rng, rows: [_normal(rng, rows, width), _normal(rng, rows, width),
                                      _normal(rng, width), _normal(rng, width)],
                   ref, rtol=1e-4, atol=1e-4)


def _softmax_ops(width: int, log: bool) -> tuple:
    full, row = _f32(N, width), _f32(N, 1)
    ops = (op("m", "reduce_max", ["x"], row, axes=[-1], keep_dims=True),
           op("d", "sub", ["x", "m"], full),
           op("e", "exp", ["d"], full),
           op("z", "reduce_sum", ["e"], row, axes=[-1], keep_dims=True))
    if log:
        return ops + (op("lz", "log", ["z"], row), op("y", "sub", ["d", "lz"], full))
    return ops + (op("y", "div", ["e", "z"], full),)


def softmax(width: int, log: bool = False) -> Pattern:
    c = ir.Cluster((("x", _f32(N, width)),), _softmax_ops(width, log), ("y",))

    def ref(ins):
        x = ins[0].astype(np.float64)
        d = x - x.max(-1, keepdims=True)
        z = np.exp(d).sum(-1, keepdims=True)
        return [d - np.log(z) if log else np.exp(d) / z]
    return Pattern(f"{'log_' if log else ''}softmax_{width}", c,
                   lambda rng, rows: [_normal(rng, rows, width, scale=4.0)],
                   ref, rtol=2e-5, atol=1e-6)


def bias_gelu(width: int, approximate: bool) -> Pattern:
    full = _f32(N, width)
    ops = [op("x", "add", ["a", "bias"], full),
           op("half", "const", [], _f32(), value=0.5),
           op("one", "const", [], _f32(), value=1.0),
           op("hx", "mul", ["x", "half"], full)]
    if approximate:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        ops += [op("k", "const", [], _f32(), value=0.044715),
                op("c", "const", [], _f32(), value=math.sqrt(2 / math.pi)),
                op("x2", "square", ["x"], full), op("x3", "mul", ["x2", "x"], full),
                op("kx3", "mul", ["x3", "k"], full), op("u", "add", ["x", "kx3"], full),
                op("cu", "mul", ["u", "c"], full), op("t", "tanh", ["cu"], full)]
    else:  # 0.5 x (1 + erf(x / sqrt 2))
        ops += [op("r2", "const", [], _f32(), value=1 / math.sqrt(2)),
                op("xs", "mul", ["x", "r2"], full), op("t", "erf", ["xs"], full)]
    ops += [op("t1", "add", ["t", "one"], full), op("y", "mul", ["hx", "t1"], full)]
    c = ir.Cluster((("a", full), ("bias", _f32(width))), tuple(ops), ("y",))

    def ref(ins):
        x = (ins[0] + ins[1]).astype(np.float64)
        if approximate:
            t = np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))
        else:
            t = np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2))
        return [0.5 * x * (1 + t)]
    return Pattern(f"bias_gelu_{'tanh' if approximate else 'erf'}_{width}", c,
                   lambda rng, rows: [_normal(rng, rows, width, scale=2.0), _normal(rng, width)],
                   ref, rtol=1e-5, atol=1e-6)


def bn_inference_relu(channels: int, hw: int = 7) -> Pattern:
    s, p = (N, hw, hw, channels), (channels,)
    ops = (op("eps", "const", [], _f32(), value=1e-3),
           op("ve", "add", ["var", "eps"], _f32(*p)),
           op("rs", "rsqrt", ["ve"], _f32(*p)),
           op("f", "mul", ["scale", "rs"], _f32(*p)),
           op("mf", "mul", ["mean", "f"], _f32(*p)),
           op("sh", "sub", ["offset", "mf"], _f32(*p)),
           op("xf", "mul", ["x", "f"], _f32(*s)),
           op("z", "add", ["xf", "sh"], _f32(*s)),
           op("y", "relu", ["z"], _f32(*s)))
    c = ir.Cluster((("x", _f32(*s)), ("scale", _f32(*p)), ("offset", _f32(*p)),
                    ("mean", _f32(*p)), ("var", _f32(*p))), ops, ("y",))

    def ref(ins):
        x, scale, offset, mean, var = (a.astype(np.float64) for a in ins)
        f = scale / np.sqrt(var + 1e-3)
        return [np.maximum(x * f + (offset - mean * f), 0)]
    return Pattern(f"bn_inference_relu_{channels}", c,
                   lambda rng, rows: [_normal(rng, rows, hw, hw, channels), _normal(rng, channels),
                                      _normal(rng, channels), _normal(rng, channels),
                                      np.abs(_normal(rng, channels)) + 0.1],
                   ref, rtol=1e-5, atol=1e-5)


def random_inputs(cluster: ir.Cluster, rows: int, rng: np.random.Generator) -> List[np.ndarray]:
    """Inputs whose dynamic dimensions are `rows`, except where the cluster
    ties a dimension to an axis of known extent."""
    sched = build_schedule(cluster)
    out = []
    for name, t in cluster.inputs:
        axes = sched.dim_axes[name]
        shape = tuple(d if d is not None else
                      (sched.static_extent[a] if a is not None
                       and sched.static_extent[a] is not None else rows)
                      for d, a in zip(t.shape, axes))
        if t.dtype == "bool":
            out.append(rng.random(shape) < 0.5)
        elif t.dtype in ir.INT_DTYPES:
            out.append(rng.integers(-100, 100, shape).astype(t.dtype))
        else:
            out.append(rng.standard_normal(shape).astype(as_dtype(t.dtype)))
    return out


def max_error(got, want, rtol: float, atol: float) -> tuple:
    """(largest |got - want|, within tolerance); NaNs must sit in the same places."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf"), False
    nan = np.isnan(want)
    if not np.array_equal(np.isnan(got), nan):
        return float("inf"), False
    with np.errstate(invalid="ignore"):  # equal infinities differ by nothing
        diff = np.where(got == want, 0.0, np.abs(got - want))[~nan]
        bound = atol + rtol * np.abs(want[~nan])
    err = float(diff.max(initial=0.0))
    return err, bool(np.all((diff == 0) | (diff <= bound)))


def standard_patterns() -> Dict[str, Pattern]:
    """Every reference pattern, at sizes that take both GPU mappings: rows of
    at most 1024 columns run warp per row, longer ones block per row."""
    pats = [layernorm(768), layernorm(4096), residual_layernorm(1024),
            softmax(128), softmax(3000), softmax(128, log=True), softmax(5000, log=True),
            bias_gelu(3072, approximate=False), bias_gelu(1024, approximate=True),
            bn_inference_relu(64)]
    return {p.name: p for p in pats}
