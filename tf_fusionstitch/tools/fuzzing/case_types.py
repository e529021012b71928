"""Types of a case's values: the dtype and shape of every value, inferred
from the case's JSON (the generator's and the shrinker's shape inference).
"""

from __future__ import annotations

import math
from typing import Dict

import numpy as np

from tf_fusionstitch.tools.fuzzing.ops import (BINARY_OPS, COMPARISONS, CaseError, DTYPES, FI,
                                               FLOATS, INTS, REDUCE_OPS, UNARY_OPS)


def broadcast(*shapes) -> tuple:
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise CaseError(f"shapes {[list(s) for s in shapes]} do not broadcast") from None


def norm_axes(axes, rank) -> list:
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
        return ("bool" if op in COMPARISONS else dts[0]), broadcast(*shapes)
    if op == "Select":
        need(len(ins) == 3 and dts[0] == "bool" and dts[1] == dts[2], f"dtypes {dts}")
        need(shapes[1] == shapes[2], "Select needs x and y of one shape")
        need(shapes[0] == shapes[1] or (len(shapes[0]) == 1 and len(shapes[1]) > 1
                                        and shapes[0][0] == shapes[1][0]),
             "Select condition must match x or be a vector over its first dim")
        return dts[1], shapes[1]
    if op == "SelectV2":
        need(len(ins) == 3 and dts[0] == "bool" and dts[1] == dts[2], f"dtypes {dts}")
        return dts[1], broadcast(*shapes)
    if op in REDUCE_OPS:
        need(len(ins) == 1 and dts[0] in REDUCE_OPS[op], f"dtype {dts}")
        shape = shapes[0]
        axes = norm_axes(a["axis"], len(shape)) if shape else (
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
        axes = norm_axes(a["axis"], len(shapes[0]))
        need(axes and all(shapes[0][i] == 1 for i in axes), "Squeeze of a dim that is not 1")
        return dts[0], tuple(d for i, d in enumerate(shapes[0]) if i not in axes)
    if op == "BroadcastTo":
        target = tuple(a["shape"])
        need(broadcast(shapes[0], target) == target, "BroadcastTo target")
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
