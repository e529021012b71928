"""The op table: every TensorFlow op we fuse, and its lowering to primitives.

This is the single source of truth for what is fusible. Each entry names the
op's class (elementwise, reduction, composite, shape-only) and a lowering that
emits fusion-IR primitives through a `LoweringContext`. An op is fused only if
its lowering succeeds for the node at hand (dtypes, attributes, constant
operands, shapes); otherwise it stays a TensorFlow op.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from tf_fusionstitch import fusion_ir as ir

ELEMENTWISE, REDUCTION, COMPOSITE, SHAPE = "elementwise", "reduction", "composite", "shape"
SCATTER = "scatter"
MOVE = "move"   # moves every element (a transpose): a TF kernel, no arithmetic


class NotFusible(ValueError):
    """This node cannot be lowered (the reason is the message)."""


class LoweringContext:
    """What a lowering sees of one node: typed inputs, attributes, constants."""

    def __init__(self, node, input_values: Sequence[Optional[str]], types: Dict[str, ir.TensorType],
                 output_types: Sequence[Optional[ir.TensorType]], constants: Sequence, emit,
                 scalars: Sequence = ()):
        self.node = node
        self._scalars = list(scalars)
        self._inputs = list(input_values)
        self._types = types
        self._output_types = list(output_types)
        self._constants = list(constants)
        self._emit = emit

    def input(self, i: int) -> str:
        if i >= len(self._inputs) or self._inputs[i] is None:
            raise NotFusible(f"input {i} is not a tensor value")
        return self._inputs[i]

    def type_of(self, value: str) -> ir.TensorType:
        return self._types[value]

    def out_type(self, k: int = 0) -> ir.TensorType:
        t = self._output_types[k] if k < len(self._output_types) else None
        if t is None:
            raise NotFusible(f"output {k} has an unknown shape or dtype")
        return t

    def constant(self, i: int) -> np.ndarray:
        value = self._constants[i] if i < len(self._constants) else None
        if value is None:
            raise NotFusible(f"input {i} must be a constant")
        return value

    def scalar_input(self, i: int):
        """The value of input i when it is a scalar constant, else None."""
        return self._scalars[i] if i < len(self._scalars) else None

    def attr(self, name: str, default=None):
        a = self.node.attr
        if name not in a:
            return default
        field = a[name].WhichOneof("value")
        if field == "s":
            return a[name].s.decode()
        if field == "list":
            return list(a[name].list.i)
        return getattr(a[name], field)

    def emit(self, prim: str, inputs: Sequence[str], type: ir.TensorType, **attrs) -> str:
        return self._emit(prim, inputs, type, attrs)

    def scalar(self, value, dtype: str) -> str:
        return self.emit("const", [], ir.TensorType(dtype, ()), value=json_number(value))


def json_number(value):
    value = float(value) if not isinstance(value, (bool, int, np.integer, np.bool_)) else value
    if isinstance(value, float) and not np.isfinite(value):
        return "nan" if np.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    return value


@dataclasses.dataclass(frozen=True)
class OpRule:
    kind: str
    lower: Callable[[LoweringContext], Sequence[str]]
    static_inputs: Tuple[int, ...] = ()   # inputs that must be constants (axes, shapes)


def _unary(prim: str) -> OpRule:
    def lower(ctx):
        x = ctx.input(0)
        t = ctx.out_type(0)
        return [ctx.emit(prim, [x], t)]
    return OpRule(ELEMENTWISE, lower)


def _binary(prim: str) -> OpRule:
    def lower(ctx):
        return [ctx.emit(prim, [ctx.input(0), ctx.input(1)], ctx.out_type(0))]
    return OpRule(ELEMENTWISE, lower)


def _add_n(ctx):
    """Gradient accumulation: a chain of adds (TF's kernel sums in groups, so
    the rounding differs within the elementwise-chain tolerance)."""
    t = ctx.out_type(0)
    total = ctx.input(0)
    for i in range(1, int(ctx.attr("N"))):
        total = ctx.emit("add", [total, ctx.input(i)], t)
    if total == ctx.input(0):   # one input: a copy
        return [ctx.emit("reshape", [total], t, shape=list(t.shape))]
    return [total]


def _pow(ctx):
    """x ** c for a small integer or half-integer constant c becomes multiplies
    (and a sqrt): what gelu's tanh form does with x ** 3, at a few ulp from
    std::pow and an order of magnitude faster, since it vectorises."""
    x, y = ctx.input(0), ctx.input(1)
    t = ctx.out_type(0)
    c = ctx.scalar_input(1)
    if c is None or t.dtype not in ir.FLOAT_DTYPES or ctx.type_of(x).shape != t.shape:
        return [ctx.emit("pow", [x, y], t)]
    c = float(c)
    if c == 0.5:
        return [ctx.emit("sqrt", [x], t)]
    if c == -0.5:
        return [ctx.emit("rsqrt", [x], t)]
    if c == -1.0:
        return [ctx.emit("reciprocal", [x], t)]
    if c == 1.0:
        return [ctx.emit("reshape", [x], t, shape=list(t.shape))]
    if c in (2.0, 3.0, 4.0):
        sq = ctx.emit("square", [x], t)
        if c == 2.0:
            return [sq]
        return [ctx.emit("mul", [sq, x if c == 3.0 else sq], t)]
    return [ctx.emit("pow", [x, y], t)]


def _cast(ctx):
    if ctx.attr("Truncate", False):
        raise NotFusible("Cast with Truncate=True")
    return [ctx.emit("cast", [ctx.input(0)], ctx.out_type(0))]


def _channel_param(ctx, value: str, rank: int, data_format: str) -> str:
    """Align a per-channel vector with NHWC (last axis) or NCHW (axis 1)."""
    if data_format.startswith("NC") and rank > 2:
        t = ctx.type_of(value)
        shape = tuple(t.shape) + (1,) * (rank - 2)
        return ctx.emit("reshape", [value], ir.TensorType(t.dtype, shape), shape=list(shape))
    if data_format not in ("NHWC", "NDHWC", "NCHW", "NCDHW", ""):
        raise NotFusible(f"data_format {data_format}")
    return value


def _bias_add(ctx):
    x, b = ctx.input(0), ctx.input(1)
    rank = ctx.type_of(x).rank
    b = _channel_param(ctx, b, rank, ctx.attr("data_format", "NHWC"))
    return [ctx.emit("add", [x, b], ctx.out_type(0))]


def _select_v1(ctx):
    c, a, b = ctx.input(0), ctx.input(1), ctx.input(2)
    ct, at = ctx.type_of(c), ctx.type_of(a)
    if ct.rank == 1 and at.rank > 1:  # Select v1 picks whole rows by a vector
        shape = tuple(ct.shape) + (1,) * (at.rank - 1)
        c = ctx.emit("reshape", [c], ir.TensorType("bool", shape), shape=list(shape))
    elif ct.rank != at.rank:
        raise NotFusible("Select condition rank does not match")
    return [ctx.emit("select", [c, a, b], ctx.out_type(0))]


def _select_v2(ctx):
    return [ctx.emit("select", [ctx.input(0), ctx.input(1), ctx.input(2)], ctx.out_type(0))]


def _axes(ctx, i: int, rank: int) -> list:
    axes = np.asarray(ctx.constant(i)).reshape(-1)
    if axes.dtype.kind not in "iu":
        raise NotFusible("reduction axes must be integers")
    return sorted({int(a) % rank for a in axes}) if rank else []


def _reduce(prim: str) -> OpRule:
    def lower(ctx):
        x = ctx.input(0)
        rank = ctx.type_of(x).rank
        for a in np.asarray(ctx.constant(1)).reshape(-1):
            if not -rank <= int(a) < max(rank, 1):
                raise NotFusible(f"axis {int(a)} out of range")
        axes = _axes(ctx, 1, rank)
        return [ctx.emit(prim, [x], ctx.out_type(0), axes=axes,
                         keep_dims=bool(ctx.attr("keep_dims", False)))]
    return OpRule(REDUCTION, lower, static_inputs=(1,))


def _keep(t: ir.TensorType, axis: int) -> ir.TensorType:
    shape = list(t.shape)
    shape[axis] = 1
    return ir.TensorType(t.dtype, tuple(shape))


def _softmax(log: bool) -> OpRule:
    def lower(ctx):
        x = ctx.input(0)
        t = ctx.type_of(x)
        if t.rank < 1:
            raise NotFusible("softmax of a scalar")
        last = t.rank - 1
        kept = _keep(t, last)
        m = ctx.emit("reduce_max", [x], kept, axes=[last], keep_dims=True)
        d = ctx.emit("sub", [x, m], t)
        e = ctx.emit("exp", [d], t)
        s = ctx.emit("reduce_sum", [e], kept, axes=[last], keep_dims=True)
        if log:
            return [ctx.emit("sub", [d, ctx.emit("log", [s], kept)], t)]
        return [ctx.emit("div", [e, s], t)]
    return OpRule(COMPOSITE, lower)


def _fused_batch_norm(ctx):
    """Inference-mode batch norm, in TensorFlow's own arithmetic order."""
    if ctx.attr("is_training", True):
        raise NotFusible("FusedBatchNorm in training mode")
    if float(ctx.attr("exponential_avg_factor", 1.0)) != 1.0:
        raise NotFusible("FusedBatchNorm with a running-average factor")
    x = ctx.input(0)
    xt = ctx.type_of(x)
    fmt = ctx.attr("data_format", "NHWC")
    params = [ctx.input(i) for i in range(1, 5)]
    pdtype = ctx.type_of(params[0]).dtype
    if pdtype != "float32" or xt.dtype not in ("float32", "float16", "bfloat16"):
        raise NotFusible("FusedBatchNorm dtypes")
    xf = x if xt.dtype == "float32" else ctx.emit("cast", [x], ir.TensorType("float32", xt.shape))
    scale, offset, mean, var = (_channel_param(ctx, p, xt.rank, fmt) for p in params)
    pt = ctx.type_of(scale)
    eps = ctx.scalar(float(ctx.attr("epsilon", 1e-3)), "float32")
    inv = ctx.emit("rsqrt", [ctx.emit("add", [var, eps], pt)], pt)
    factor = ctx.emit("mul", [scale, inv], pt)
    shift = ctx.emit("sub", [offset, ctx.emit("mul", [mean, factor], pt)], pt)
    ft = ir.TensorType("float32", xt.shape)
    y = ctx.emit("add", [ctx.emit("mul", [xf, factor], ft), shift], ft)
    if xt.dtype != "float32":
        y = ctx.emit("cast", [y], xt)
    return [y]


# -- gradients, in the arithmetic order of TF's CPU kernels (Eigen functors in
# relu_op_functor.h and cwise_ops_gradients.h), so results round alike.

def _float_grad(ctx):
    """(gradient, other operand, output type); both operands have the output's
    shape (TF does not broadcast these ops)."""
    t = ctx.out_type(0)
    if t.dtype not in ir.FLOAT_DTYPES:
        raise NotFusible(f"{ctx.node.op} on {t.dtype}")
    return t


def _cmp(ctx, prim: str, x: str, value, t: ir.TensorType) -> str:
    return ctx.emit(prim, [x, ctx.scalar(value, t.dtype)], ir.TensorType("bool", t.shape))


def _mul_no_nan(ctx, a: str, b: str, t: ir.TensorType) -> str:
    """Eigen's mul_no_nan: 0 where b == 0 (even if a is Inf or NaN), else a * b."""
    zero = ctx.scalar(0, t.dtype)
    return ctx.emit("select", [_cmp(ctx, "equal", b, 0, t), zero, ctx.emit("mul", [a, b], t)], t)


def _relu_grad(ctx):        # gradients * cast(features > 0)
    t = _float_grad(ctx)
    g, x = ctx.input(0), ctx.input(1)
    return [ctx.emit("mul", [g, ctx.emit("cast", [_cmp(ctx, "greater", x, 0, t)], t)], t)]


def _relu6_grad(ctx):       # gradients * cast((features > 0) & (features < 6))
    t = _float_grad(ctx)
    g, x = ctx.input(0), ctx.input(1)
    inside = ctx.emit("logical_and", [_cmp(ctx, "greater", x, 0, t), _cmp(ctx, "less", x, 6, t)],
                      ir.TensorType("bool", t.shape))
    return [ctx.emit("mul", [g, ctx.emit("cast", [inside], t)], t)]


def _leaky_relu(ctx):       # features > 0 ? features : features * alpha
    t = _float_grad(ctx)
    x = ctx.input(0)
    scaled = ctx.emit("mul", [x, ctx.scalar(float(ctx.attr("alpha", 0.2)), t.dtype)], t)
    return [ctx.emit("select", [_cmp(ctx, "greater", x, 0, t), x, scaled], t)]


def _leaky_relu_grad(ctx):  # features > 0 ? gradients : gradients * alpha
    t = _float_grad(ctx)
    g, x = ctx.input(0), ctx.input(1)
    scaled = ctx.emit("mul", [g, ctx.scalar(float(ctx.attr("alpha", 0.2)), t.dtype)], t)
    return [ctx.emit("select", [_cmp(ctx, "greater", x, 0, t), g, scaled], t)]


def _elu_grad(ctx):         # activations < 0 ? (activations + 1) * gradients : gradients
    t = _float_grad(ctx)
    g, y = ctx.input(0), ctx.input(1)
    inner = ctx.emit("mul", [ctx.emit("add", [y, ctx.scalar(1, t.dtype)], t), g], t)
    return [ctx.emit("select", [_cmp(ctx, "less", y, 0, t), inner, g], t)]


def _selu_grad(ctx):        # y < 0 ? gradients * (y + scale * alpha) : gradients * scale
    t = _float_grad(ctx)
    g, y = ctx.input(0), ctx.input(1)
    scale, scale_alpha = 1.0507009873554804934193349852946, 1.7580993408473768599402175208123
    neg = ctx.emit("mul", [g, ctx.emit("add", [y, ctx.scalar(scale_alpha, t.dtype)], t)], t)
    pos = ctx.emit("mul", [g, ctx.scalar(scale, t.dtype)], t)
    return [ctx.emit("select", [_cmp(ctx, "less", y, 0, t), neg, pos], t)]


def _softplus_grad(ctx):    # gradients / (exp(-features) + 1)
    t = _float_grad(ctx)
    g, x = ctx.input(0), ctx.input(1)
    e = ctx.emit("exp", [ctx.emit("neg", [x], t)], t)
    return [ctx.emit("div", [g, ctx.emit("add", [e, ctx.scalar(1, t.dtype)], t)], t)]


def _tanh_grad(ctx):        # dy * (1 - y * y); inputs are (y, dy)
    t = _float_grad(ctx)
    y, dy = ctx.input(0), ctx.input(1)
    one_minus = ctx.emit("sub", [ctx.scalar(1, t.dtype), ctx.emit("mul", [y, y], t)], t)
    return [ctx.emit("mul", [dy, one_minus], t)]


def _sigmoid_grad(ctx):     # dy * (y * (1 - y))
    t = _float_grad(ctx)
    y, dy = ctx.input(0), ctx.input(1)
    one_minus = ctx.emit("sub", [ctx.scalar(1, t.dtype), y], t)
    return [ctx.emit("mul", [dy, ctx.emit("mul", [y, one_minus], t)], t)]


def _sqrt_grad(ctx):        # mul_no_nan(0.5 / y, dy)
    t = _float_grad(ctx)
    y, dy = ctx.input(0), ctx.input(1)
    half_over = ctx.emit("div", [ctx.scalar(0.5, t.dtype), y], t)
    return [_mul_no_nan(ctx, half_over, dy, t)]


def _rsqrt_grad(ctx):       # mul_no_nan(-0.5 * (y * y), mul_no_nan(y, dy))
    t = _float_grad(ctx)
    y, dy = ctx.input(0), ctx.input(1)
    factor = ctx.emit("mul", [ctx.scalar(-0.5, t.dtype), ctx.emit("mul", [y, y], t)], t)
    return [_mul_no_nan(ctx, factor, _mul_no_nan(ctx, y, dy, t), t)]


def _reciprocal_grad(ctx):  # mul_no_nan(-(y * y), dy)
    t = _float_grad(ctx)
    y, dy = ctx.input(0), ctx.input(1)
    return [_mul_no_nan(ctx, ctx.emit("neg", [ctx.emit("mul", [y, y], t)], t), dy, t)]


def _bias_add_grad(ctx):
    """Sum over every axis but the channel one (last for NHWC, 1 for NCHW)."""
    g = ctx.input(0)
    rank = ctx.type_of(g).rank
    if rank < 2:
        raise NotFusible("BiasAddGrad of rank < 2")
    fmt = ctx.attr("data_format", "NHWC")
    if fmt not in ("NHWC", "NCHW", ""):
        raise NotFusible(f"data_format {fmt}")
    channel = 1 if fmt == "NCHW" else rank - 1
    axes = [a for a in range(rank) if a != channel]
    return [ctx.emit("reduce_sum", [g], ctx.out_type(0), axes=axes, keep_dims=False)]


def _segment_sum(ctx):
    """An embedding gradient's dense form: rows added into the segments their
    ids name (a kernel of its own kind, codegen/scatter.py)."""
    data, ids = ctx.input(0), ctx.input(1)
    if ctx.type_of(ids).rank != 1:
        raise NotFusible("segment ids of rank other than 1")
    n = np.asarray(ctx.constant(2)).reshape(-1)
    return [ctx.emit("segment_sum", [data, ids], ctx.out_type(0), num_segments=int(n[0]))]


def _identity(ctx):
    x = ctx.input(0)
    t = ctx.type_of(x)
    return [ctx.emit("reshape", [x], t, shape=list(t.shape))]


def _reshape_to_output(ctx):
    """ExpandDims, Squeeze (and Reshape, below): fused when they only add or
    drop size-1 dims, the other dims keeping their order."""
    x = ctx.input(0)
    out = ctx.out_type(0)
    return [ctx.emit("reshape", [x], out, shape=list(out.shape))]


def _reshape(ctx):
    """A Reshape keeps its sizes in order only where its types prove it: with
    at most one size unknown when optimized, the known ones and the element
    count fix it. With two, the target may place them otherwise (keras_hub's
    XLNet reshapes its [batch, seq] mask to [seq, batch]); a Reshape that
    rewriters/decided_shapes.py proved to keep them is an Identity by now."""
    unknown = sum(d is None for d in ctx.type_of(ctx.input(0)).shape)
    if unknown > 1:
        raise NotFusible(f"a Reshape of {unknown} sizes unknown when optimized "
                         "(where each goes is not known)")
    return _reshape_to_output(ctx)


def _transpose(ctx):
    """Transpose with a constant permutation: an index map inside a kernel."""
    x = ctx.input(0)
    perm = [int(p) for p in np.asarray(ctx.constant(1)).reshape(-1)]
    rank = ctx.type_of(x).rank
    if sorted(perm) != list(range(rank)):   # TF raises for it at run time
        raise NotFusible(f"Transpose permutation {perm} is not one of rank {rank}")
    if perm == list(range(rank)):
        return _identity(ctx)
    return [ctx.emit("transpose", [x], ctx.out_type(0), perm=perm)]


def _broadcast_to(ctx):
    out = ctx.out_type(0)
    if any(d is None for d in out.shape):
        raise NotFusible("BroadcastTo with a dynamic target shape")
    return [ctx.emit("broadcast_to", [ctx.input(0)], out, shape=list(out.shape))]


OP_TABLE: Dict[str, OpRule] = {
    **{tf: _unary(p) for tf, p in {
        "Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Log1p": "log1p",
        "Expm1": "expm1", "Sqrt": "sqrt", "Rsqrt": "rsqrt", "Square": "square",
        "Reciprocal": "reciprocal", "Inv": "reciprocal", "Tanh": "tanh", "Sigmoid": "sigmoid",
        "Relu": "relu", "Relu6": "relu6", "Elu": "elu", "Selu": "selu", "Softplus": "softplus",
        "Erf": "erf", "Erfc": "erfc", "Sin": "sin", "Cos": "cos", "Floor": "floor",
        "Ceil": "ceil", "Round": "round", "Sign": "sign", "IsFinite": "isfinite",
        "IsNan": "isnan", "LogicalNot": "logical_not"}.items()},
    "Cast": OpRule(ELEMENTWISE, _cast),
    **{tf: _binary(p) for tf, p in {
        "Add": "add", "AddV2": "add", "Sub": "sub", "Mul": "mul", "RealDiv": "div",
        "Div": "div", "DivNoNan": "div_no_nan", "Maximum": "maximum", "Minimum": "minimum",
"SquaredDifference": "squared_difference", "FloorDiv": "floor_div",
        "FloorMod": "floor_mod", "Less": "less", "Greater": "greater", "Equal": "equal",
        "NotEqual": "not_equal", "LessEqual": "less_equal", "GreaterEqual": "greater_equal",
        "LogicalAnd": "logical_and", "LogicalOr": "logical_or"}.items()},
    "Pow": OpRule(ELEMENTWISE, _pow),
    "AddN": OpRule(ELEMENTWISE, _add_n),
    "BiasAdd": OpRule(ELEMENTWISE, _bias_add),
    "BiasAddV1": OpRule(ELEMENTWISE, _bias_add),
    "Select": OpRule(ELEMENTWISE, _select_v1),
    "SelectV2": OpRule(ELEMENTWISE, _select_v2),
    **{tf: _reduce(p) for tf, p in {
        "Sum": "reduce_sum", "Mean": "reduce_mean", "Max": "reduce_max", "Min": "reduce_min",
        "Prod": "reduce_prod", "Any": "reduce_any", "All": "reduce_all"}.items()},
    "Softmax": _softmax(log=False),
    "LogSoftmax": _softmax(log=True),
    "FusedBatchNorm": OpRule(COMPOSITE, _fused_batch_norm),
    "FusedBatchNormV2": OpRule(COMPOSITE, _fused_batch_norm),
    "FusedBatchNormV3": OpRule(COMPOSITE, _fused_batch_norm),
    "LeakyRelu": OpRule(COMPOSITE, _leaky_relu),
    # Backward ops that training graphs are full of.
    "ReluGrad": OpRule(COMPOSITE, _relu_grad),
    "Relu6Grad": OpRule(COMPOSITE, _relu6_grad),
    "LeakyReluGrad": OpRule(COMPOSITE, _leaky_relu_grad),
    "EluGrad": OpRule(COMPOSITE, _elu_grad),
    "SeluGrad": OpRule(COMPOSITE, _selu_grad),
    "SoftplusGrad": OpRule(COMPOSITE, _softplus_grad),
    "TanhGrad": OpRule(COMPOSITE, _tanh_grad),
    "SigmoidGrad": OpRule(COMPOSITE, _sigmoid_grad),
    "SqrtGrad": OpRule(COMPOSITE, _sqrt_grad),
    "RsqrtGrad": OpRule(COMPOSITE, _rsqrt_grad),
    "ReciprocalGrad": OpRule(COMPOSITE, _reciprocal_grad),
    "InvGrad": OpRule(COMPOSITE, _reciprocal_grad),
    "BiasAddGrad": OpRule(REDUCTION, _bias_add_grad),
    "Identity": OpRule(SHAPE, _identity),
    # Forward-only graphs: StopGradient is Identity (Keras LayerNormalization
    # puts one between the mean and the variance).
    "StopGradient": OpRule(SHAPE, _identity),
    "Reshape": OpRule(SHAPE, _reshape, static_inputs=(1,)),
    "ExpandDims": OpRule(SHAPE, _reshape_to_output, static_inputs=(1,)),
    "Squeeze": OpRule(SHAPE, _reshape_to_output),
    "BroadcastTo": OpRule(SHAPE, _broadcast_to, static_inputs=(1,)),
    "Transpose": OpRule(MOVE, _transpose, static_inputs=(1,)),
    "UnsortedSegmentSum": OpRule(SCATTER, _segment_sum, static_inputs=(2,)),
}

# TF ops that run as one memory-intensive kernel each (the paper's count).
MEMORY_INTENSIVE_KINDS = (ELEMENTWISE, REDUCTION, COMPOSITE, SCATTER, MOVE)


def is_memory_intensive(op_type: str) -> bool:
    rule = OP_TABLE.get(op_type)
    return rule is not None and rule.kind in MEMORY_INTENSIVE_KINDS
