"""Run a fusion-IR cluster with an array library, one primitive at a time.

With jax.numpy this is the same computation for XLA to fuse and compile:
tools/cuda_check.py times the generated CUDA kernels against it. With NumPy
it is a plain reference that tests compare with the generated kernels. The
primitives' meaning is TensorFlow's (rewriters/op_table.py lowers TF ops to
them); 16-bit floats compute in float32, as the kernels do. TF-free.
"""

from __future__ import annotations

import math
import types
from typing import Callable

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.runtime.cpu_kernel import as_dtype
from tf_fusionstitch.codegen import scatter
from tf_fusionstitch.schedule import build_schedule

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def numpy_special(np) -> types.SimpleNamespace:
    """erf and erfc for NumPy, which has none (math's, element by element)."""
    erf, erfc = np.vectorize(math.erf, otypes=[np.float64]), np.vectorize(math.erfc,
                                                                          otypes=[np.float64])
    return types.SimpleNamespace(erf=lambda x: erf(x).astype(x.dtype),
                                 erfc=lambda x: erfc(x).astype(x.dtype))


def _unary(xp, special) -> dict:
    one = lambda x: xp.ones_like(x)  # noqa: E731
    return {
        "neg": lambda x: -x, "abs": xp.abs, "exp": xp.exp, "log": xp.log, "log1p": xp.log1p,
        "expm1": xp.expm1, "sqrt": xp.sqrt, "rsqrt": lambda x: one(x) / xp.sqrt(x),
        "square": lambda x: x * x, "reciprocal": lambda x: one(x) / x, "tanh": xp.tanh,
        "sigmoid": lambda x: one(x) / (one(x) + xp.exp(-x)),
        "relu": lambda x: xp.maximum(x, xp.zeros_like(x)),
        "relu6": lambda x: xp.minimum(xp.maximum(x, xp.zeros_like(x)), 6 * one(x)),
        "elu": lambda x: xp.where(x > 0, x, xp.expm1(x)),
        "selu": lambda x: _SELU_SCALE * xp.where(x > 0, x, _SELU_ALPHA * xp.expm1(x)),
        "softplus": lambda x: xp.log1p(xp.exp(-xp.abs(x))) + xp.maximum(x, xp.zeros_like(x)),
        "erf": special.erf, "erfc": special.erfc, "sin": xp.sin, "cos": xp.cos,
        "floor": xp.floor, "ceil": xp.ceil, "round": xp.round, "sign": xp.sign,
        "isfinite": xp.isfinite, "isnan": xp.isnan, "logical_not": xp.logical_not,
    }


def _binary(xp) -> dict:
    return {
        "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "div": lambda a, b: a / b,
        "div_no_nan": lambda a, b: xp.where(b == 0, xp.zeros_like(a * b), a / xp.where(
            b == 0, xp.ones_like(b), b)),
        "maximum": xp.maximum, "minimum": xp.minimum, "pow": xp.power,
        "squared_difference": lambda a, b: (a - b) * (a - b),
        "floor_div": lambda a, b: xp.floor(a / b), "floor_mod": xp.mod,
        "less": xp.less, "greater": xp.greater, "equal": xp.equal,
        "not_equal": xp.not_equal, "less_equal": xp.less_equal,
        "greater_equal": xp.greater_equal, "logical_and": xp.logical_and,
        "logical_or": xp.logical_or,
    }


def _reduce(xp, prim: str, x, axes: tuple, keep: bool, dtype: str, sum_order=None):
    if sum_order is not None and prim in ("reduce_sum", "reduce_mean"):
        for axis in axes:   # another order of the same float32 sum
            x = xp.take(x, sum_order.permutation(x.shape[axis]), axis=axis)
    if prim == "reduce_mean" and dtype in ir.INT_DTYPES:  # TF truncates an integer mean
        total = xp.sum(x, axis=axes, keepdims=keep)
        count = math.prod(x.shape[a] for a in axes)
        return (xp.sign(total) * (xp.abs(total) // max(count, 1))).astype(x.dtype)
    fn = {"reduce_sum": xp.sum, "reduce_mean": xp.mean, "reduce_max": xp.max,
          "reduce_min": xp.min, "reduce_prod": xp.prod, "reduce_any": xp.any,
          "reduce_all": xp.all}[prim]
    return fn(x, axis=axes, keepdims=keep)


def interpret(cluster: ir.Cluster, xp, special=None, sum_order=None) -> Callable[..., tuple]:
    """A function of the cluster's inputs (arrays in their storage dtypes)
    returning its outputs as a tuple. `xp`: numpy or jax.numpy; `special`:
    a namespace with erf and erfc (default: numpy_special for NumPy,
    jax.scipy.special for JAX). `sum_order`: a NumPy Generator that shuffles
    each sum's (and mean's) terms along its reduced axes, on every call: the
    same sum in another rounding order, for checks that measure how far
    float32 rounding alone moves an output (tools/output_checks.py)."""
    if special is None:
        special = numpy_special(xp) if xp.__name__ == "numpy" else _jax_special()
    unary, binary = _unary(xp, special), _binary(xp)
    if scatter.is_scatter(cluster):   # the rows' alignment; the sums have their own
        axes_of = build_schedule(scatter.scatter_form(cluster).rows).dim_axes
    else:
        axes_of = build_schedule(cluster).dim_axes
    compute = {d: ("float32" if d in ("float16", "bfloat16") else d) for d in ir.DTYPES}
    types_ = cluster.types()
    storage = {d: d for d in ir.DTYPES}
    if xp.__name__ == "numpy":  # NumPy knows bfloat16 through ml_dtypes only
        storage = {d: as_dtype(d) for d in ir.DTYPES}

    def run(*arrays) -> tuple:
        if xp.__name__ == "numpy":  # NaN and Inf are values here, as in the kernels
            with xp.errstate(all="ignore"):
                return evaluate(arrays)
        return evaluate(arrays)

    def evaluate(arrays) -> tuple:
        if len(arrays) != len(cluster.inputs):
            raise ValueError(f"the cluster takes {len(cluster.inputs)} inputs, got {len(arrays)}")
        extent = {}
        for (name, _), a in zip(cluster.inputs, arrays):
            for axis, n in zip(axes_of.get(name, ()), a.shape):
                if axis is not None:
                    extent[axis] = n
        values = {name: a.astype(compute[t.dtype]) for (name, t), a in
                  zip(cluster.inputs, arrays)}
        for op in cluster.ops:
            dtype = compute[op.type.dtype]
            args = [values[i] for i in op.inputs]
            attrs = dict(op.attrs)
            if op.prim == "const":
                out = xp.full(op.type.shape, attrs["value"] if not isinstance(
                    attrs["value"], str) else ir.NONFINITE[attrs["value"]], dtype=dtype)
            elif op.prim == "cast":
                out = args[0].astype("bool") if dtype == "bool" else args[0].astype(dtype)
            elif op.prim in unary:
                out = unary[op.prim](args[0])
            elif op.prim in binary:
                out = binary[op.prim](*args)
            elif op.prim == "select":
                out = xp.where(*args)
            elif op.prim == "segment_sum":
                out = _segment_sum(xp, args[0], values[op.inputs[1]], attrs["num_segments"])
            elif op.prim == "transpose":
                out = xp.transpose(args[0], attrs["perm"])
            elif op.prim in ir.REDUCE:
                rank = len(types_[op.inputs[0]].shape)
                axes = tuple(sorted(a % rank for a in attrs["axes"]))
                out = _reduce(xp, op.prim, args[0], axes, attrs.get("keep_dims", False),
                              dtype, sum_order)
            else:  # reshape, broadcast_to: run-time extents by the schedule's axes
                shape = tuple(d if d is not None else extent[a]
                              for d, a in zip(op.type.shape, axes_of[op.name]))
                fn = xp.reshape if op.prim == "reshape" else xp.broadcast_to
                out = fn(args[0], shape)
            values[op.name] = out.astype(dtype)
        return tuple(values[o].astype(storage[types_[o].dtype]) for o in cluster.outputs)

    return run


def _segment_sum(xp, data, ids, n: int):
    """TF's UnsortedSegmentSum: rows with negative ids are dropped, ids past
    the last segment are an error; rows add in order."""
    ids = xp.asarray(ids).astype("int64")
    if bool((ids >= n).any()):
        raise ValueError(f"segment ids out of range [0, {n})")
    out = xp.zeros((n,) + tuple(data.shape[1:]), dtype=data.dtype)
    keep = ids >= 0
    if xp.__name__ == "numpy":
        xp.add.at(out, ids[keep], data[keep])
        return out
    return out.at[xp.where(keep, ids, n)].add(data, mode="drop")


def _jax_special():
    import jax.scipy.special as special
    return special
