"""Einsums that are batch matrix products, as Transpose and BatchMatMulV2 ops.

Keras' attention (`"BTNH,BSNH->BNTS"`, `"BNTS,BSNH->BTNH"`) reaches the
graph as Einsum ops. TF's Einsum kernel transposes its operands into
[batch..., M, K] and [batch..., K, N], runs a batch matrix product and
transposes the result, all inside the op, so none of those transposes can
join the kernel of the bias add that produces an operand. Written in the
graph as Transpose -> BatchMatMulV2 -> Transpose, the fusion pass can put
each transpose in its neighbour's kernel (tests/rewriters/test_transpose_fusion.py);
the product itself is the same batch matmul on the same operands.

Rewritten: two operands of a floating dtype, no ellipsis, no label twice in
one term, and exactly one label each for M (first operand and output),
N (second operand and output) and K (both operands, summed); the other
labels are batch labels, in both operands and the output, whose sizes are
equal by the graph's own proof (dim_origins.py), since BatchMatMulV2 would
broadcast a size 1 where Einsum raises. Anything else stays an Einsum.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters.dim_origins import DimOrigins
from tf_fusionstitch.rewriters.graph_view import Tensor, edited_copy, fresh_name, parse_input

_FLOATS = (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE, types_pb2.DT_HALF, types_pb2.DT_BFLOAT16)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Transpose a by perm_a and b by perm_b (None: as they are), multiply
    with adj_x/adj_y, transpose the [batch..., M, N] product by perm_out."""
    perm_a: Optional[Tuple[int, ...]]
    adj_x: bool
    perm_b: Optional[Tuple[int, ...]]
    adj_y: bool
    perm_out: Optional[Tuple[int, ...]]
    batch: Tuple[str, ...]                 # the batch labels, leading in both operands


def two_operand_terms(equation: str) -> Optional[Tuple[str, str, str]]:
    """(first operand's labels, second's, output's) of an equation with two
    operands, an explicit output, no ellipsis and no label twice in one
    term; else None."""
    if "." in equation or "->" not in equation:
        return None
    inputs, out = equation.replace(" ", "").split("->")
    terms = inputs.split(",")
    if len(terms) != 2 or any(len(set(t)) != len(t) for t in terms + [out]):
        return None
    return terms[0], terms[1], out


def plan(equation: str) -> Optional[Plan]:
    """The batch-matmul form of a two-operand equation, or None."""
    terms = two_operand_terms(equation)
    if terms is None:
        return None
    a, b, out = terms
    if not set(out) <= set(a) | set(b):
        return None
    batch = [c for c in out if c in a and c in b]
    m = [c for c in a if c in out and c not in b]
    n = [c for c in b if c in out and c not in a]
    k = [c for c in a if c in b and c not in out]
    if len(m) != 1 or len(n) != 1 or len(k) != 1 or len(batch) + 3 != len(set(a + b)):
        return None   # a label summed in one operand only, or groups of several labels
    perm_a, adj_x = _operand(a, batch, m[0], k[0])
    perm_b, adj_y = _operand(b, batch, k[0], n[0])
    product = batch + [m[0], n[0]]
    perm_out = tuple(product.index(c) for c in out)
    return Plan(perm_a, adj_x, perm_b, adj_y, None if _identity(perm_out) else perm_out,
                tuple(batch))


def _operand(term: str, batch: List[str], rows: str, cols: str):
    """(perm or None, adjoint) laying `term` out as batch + [rows, cols], or
    as batch + [cols, rows] with the adjoint flag when that needs no transpose."""
    straight = tuple(term.index(c) for c in batch + [rows, cols])
    swapped = tuple(term.index(c) for c in batch + [cols, rows])
    if _identity(straight):
        return None, False
    if _identity(swapped):
        return None, True
    return straight, False


def _identity(perm) -> bool:
    return list(perm) == list(range(len(perm)))


def candidates(graph_def) -> bool:
    return any(n.op == "Einsum" for n in graph_def.node)


def rewrite(graph_def, types: Dict[Tensor, Optional[ir.TensorType]],
            origins_of: Callable[..., DimOrigins]):
    """(GraphDef, types, number of Einsums rewritten). `origins_of(graph_def,
    types)`: the DimOrigins of a graph. The batch sizes are proven equal in
    the rewritten graph, where no Einsum's own check can be the proof."""
    plans = {}
    for node in graph_def.node:
        if node.op == "Einsum" and node.attr["T"].type in _FLOATS and node.attr["N"].i == 2:
            p = plan(node.attr["equation"].s.decode())
            if p is not None:
                plans[node.name] = p
    return apply_proven(graph_def, types, plans, _apply, origins_of,
                        lambda p: [(d, d) for d in range(len(p.batch))])


def apply_proven(graph_def, types, plans: Dict[str, object], apply, origins_of,
                 equal_axes: Callable[[object], List[Tuple[int, int]]]):
    """(GraphDef, types, number applied): `apply(graph_def, types, plans)`
    (-> GraphDef, types, {node: its two operands}) of the plans whose
    operands' axes `equal_axes(plan)` ((axis of the first, axis of the
    second) pairs) are proven equal in the rewritten graph, where the
    rewritten op no longer makes that proof; the others keep their op."""
    if not plans:
        return graph_def, types, 0
    out, out_types, operands = apply(graph_def, types, plans)
    if not any(equal_axes(p) for p in plans.values()):
        return out, out_types, len(plans)
    origins = origins_of(out, out_types)
    proven = {name: p for name, p in plans.items()
              if _equal_axes(origins, *operands[name], equal_axes(p))}
    if len(proven) < len(plans):   # an op put back adds its checks: the rest stay proven
        if not proven:
            return graph_def, types, 0
        out, out_types, _ = apply(graph_def, types, proven)
    return out, out_types, len(proven)


def _equal_axes(origins: DimOrigins, a: Tensor, b: Tensor, pairs) -> bool:
    dims_a, dims_b = origins.dims(a), origins.dims(b)
    return not pairs or (dims_a is not None and dims_b is not None and all(
        dims_a[i] is not None and dims_a[i] == dims_b[j] for i, j in pairs))


def _apply(graph_def, types, plans: Dict[str, Plan]):
    """(GraphDef, types, {einsum: the product's two operands}) with `plans` applied."""
    types = dict(types)
    operands: Dict[str, Tuple[Tensor, Tensor]] = {}

    def edit(new, node, out, taken):
        p = plans[node.name]
        control = [s for s in node.input if s.startswith("^")]
        (a, b) = [s for s in node.input if not s.startswith("^")]
        a = _transposed(out, taken, types, node, a, p.perm_a, "a", control)
        b = _transposed(out, taken, types, node, b, p.perm_b, "b", control)
        operands[node.name] = (parse_input(a)[:2], parse_input(b)[:2])
        einsum_type = types.get((node.name, 0))
        if p.perm_out is None:
            matmul, name = new, node.name
        else:
            matmul = out.node.add()
            name = fresh_name(f"{node.name}/fs_matmul", taken)
        matmul.name, matmul.op, matmul.device = name, "BatchMatMulV2", node.device
        del matmul.input[:]
        matmul.input.extend([a, b] + control)
        matmul.attr.clear()
        matmul.attr["T"].type = node.attr["T"].type
        matmul.attr["adj_x"].b, matmul.attr["adj_y"].b = p.adj_x, p.adj_y
        if p.perm_out is not None:
            types[(name, 0)] = None if einsum_type is None else ir.TensorType(
                einsum_type.dtype, tuple(einsum_type.shape[p.perm_out.index(d)]
                                         for d in range(len(p.perm_out))))
            _make_transpose(new, out, taken, types, node.name, node, name, p.perm_out, control)

    return edited_copy(graph_def, plans, edit), types, operands


def _transposed(out, taken, types, node, source: str, perm, tag: str, control) -> str:
    """The input to the product: `source`, or a new Transpose of it."""
    if perm is None:
        return source
    t = out.node.add()
    name = fresh_name(f"{node.name}/fs_transpose_{tag}", taken)
    src_name, port = parse_input(source)[:2]
    src_type = types.get((src_name, port))
    types[(name, 0)] = None if src_type is None else ir.TensorType(
        src_type.dtype, tuple(src_type.shape[d] for d in perm))
    _make_transpose(t, out, taken, types, name, node, source, perm, control)
    return name


def _make_transpose(t, out, taken, types, name: str, node, source: str, perm,
                    control) -> None:
    """Make `t` the Transpose `name` of `source` by `perm` (a new Const)."""
    const = out.node.add()
    const.name = fresh_name(f"{name}/fs_perm", taken)
    types[(const.name, 0)] = ir.TensorType("int32", (len(perm),))
    const.op, const.device = "Const", node.device
    const.attr["dtype"].type = types_pb2.DT_INT32
    const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.asarray(perm, np.int32)))
    t.name, t.op, t.device = name, "Transpose", node.device
    del t.input[:]
    t.input.extend([source, const.name] + control)
    t.attr.clear()
    t.attr["T"].type = node.attr["T"].type
    t.attr["Tperm"].type = types_pb2.DT_INT32
