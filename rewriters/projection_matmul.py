"""Projections as one MatMul: contractions in which no label is a batch label.

Keras' EinsumDense (`"abc,cde->abde"`, a query, key or value projection;
`"abcd,cde->abe"`, attention's output), a rank-3 `x @ w`, and the gradients
of both reach the graph as Einsum or BatchMatMulV2 ops whose operands share
no batch dimension. TF's CPU kernels run these as batch matrix products
over the leading axes with a broadcast weight, which oneDNN does up to 3x
slower than one matrix product of the flattened operands (measured on a
Xeon, [4,128,3072] x [3072,32,96]: 108 ms against 35 ms; XLA's dot emitter
makes the same flattening). So each becomes

    [Transpose] -> Reshape -> MatMul -> Reshape -> [Transpose]

with the label groups M (first operand and output), K (both operands,
summed) and N (second operand and output) flattened: the first operand to
[M, K] (or [K, M] with transpose_a), the second to [K, N] (or [N, K]), and
the product back to M's and N's sizes, read with Shape where unknown, in
the output's order. The reshapes and transposes are memory-intensive ops
the fusion pass may then put in a neighbour's kernel.

Rewritten: two operands of a floating dtype, no ellipsis, no label twice in
one term, every label in two of the three terms, no batch label, and M, K
and N not empty. An operand's group with an unknown size flattens to -1, so
its other group must be static (and not of size 0). Where K has several
labels, their sizes in the two operands must be proven equal
(dim_origins.py): the flattened product would only check their product,
where Einsum raises.

Small projections are left as they are: the flattening adds a few shape ops
per product, which a small product does not repay. Measured on the Xeon,
interleaved, Einsum's time over the flattened product's at [4,128,H] x
[H,H/64,64]: 0.95x at H=256, 0.93x at 384, 0.97x at 512, 1.02x at 768,
3.10x at 3072. So a product is rewritten only where its statically sized
labels hold at least MIN_STATIC_ELEMENTS (a weight's K x N; 768 x 768 is
589,824). Anything else is left as it is (rewriters/einsum_matmul.py takes
the products with batch labels).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters import einsum_matmul
from tf_fusionstitch.rewriters.dim_origins import DimOrigins
from tf_fusionstitch.rewriters.graph_view import Tensor, edited_copy, fresh_name, parse_input

_FLOATS = (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE, types_pb2.DT_HALF, types_pb2.DT_BFLOAT16)
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
MIN_STATIC_ELEMENTS = 1 << 19


@dataclasses.dataclass(frozen=True)
class Plan:
    """The flattened product of `a` (labels `a`) and `b` (labels `b`)."""
    a: str
    b: str
    out: str
    m: str                  # labels of each group, in the order the product lays them out
    k: str
    n: str

    def layout(self, operand: str, rows: str, cols: str) -> Tuple[Optional[Tuple[int, ...]],
                                                                   bool]:
        """(perm or None, transpose flag) laying `operand` out as rows + cols,
        or as cols + rows with the MatMul's transpose flag."""
        if operand == rows + cols:
            return None, False
        if operand == cols + rows:
            return None, True
        return tuple(operand.index(c) for c in rows + cols), False

    @property
    def perm_out(self) -> Optional[Tuple[int, ...]]:
        product = self.m + self.n
        return None if product == self.out else tuple(product.index(c) for c in self.out)


def plan(equation: str) -> Optional[Plan]:
    """The single-MatMul form of a two-operand equation without batch labels, or None."""
    terms = einsum_matmul.two_operand_terms(equation)
    if terms is None:
        return None
    a, b, out = terms
    if any(c in a and c in b and c in out for c in out):
        return None             # a batch label: einsum_matmul.py
    if any((c in a) + (c in b) + (c in out) != 2 for c in set(a + b + out)):
        return None             # summed within one operand, or an output label from nowhere
    k = "".join(c for c in a if c in b)
    if not k:
        return None
    # K keeps the first operand's order where that needs no transpose of it,
    # else the second's; M and N keep their operands' orders.
    m = "".join(c for c in a if c not in b)
    n = "".join(c for c in b if c not in a)
    if not m or not n:
        return None
    b_k = "".join(c for c in b if c in a)
    if a not in (m + k, k + m) and b in (b_k + n, n + b_k):
        k = b_k
    return Plan(a, b, out, m, k, n)


def matmul_equation(rank_x: int, rank_y: int, adj_x: bool, adj_y: bool) -> Optional[str]:
    """BatchMatMulV2's product as an equation where one operand is a matrix
    and the other has more axes (then the extra axes are no batch: they are
    M or N labels), else None."""
    if min(rank_x, rank_y) != 2 or max(rank_x, rank_y) < 3 or rank_x + rank_y > 20:
        return None
    letters = iter(_LETTERS)
    lead = "".join(next(letters) for _ in range(max(rank_x, rank_y) - 2))
    m, k, n = next(letters), next(letters), next(letters)
    x = (lead if rank_x > 2 else "") + (k + m if adj_x else m + k)
    y = (lead if rank_y > 2 else "") + (n + k if adj_y else k + n)
    return f"{x},{y}->{lead}{m}{n}"


def _equation(node, types) -> Optional[str]:
    """The product `node` computes as an equation, where it is one of a
    floating dtype that this rewrite may take, else None."""
    if node.op not in ("Einsum", "BatchMatMulV2") or node.attr["T"].type not in _FLOATS:
        return None   # (the op first: reading a missing attr would add it to the node)
    if node.op == "Einsum" and node.attr["N"].i == 2:
        return node.attr["equation"].s.decode()
    if node.op == "BatchMatMulV2":
        ranks = [getattr(types.get(parse_input(s)[:2]), "rank", None)
                 for s in node.input[:2]]
        if None in ranks:
            return None
        return matmul_equation(*ranks, node.attr["adj_x"].b, node.attr["adj_y"].b)
    return None


def _group_size(shape: Sequence[Optional[int]], labels: str, group: str) -> Optional[int]:
    """The static product of `group`'s sizes, or None where one is unknown."""
    sizes = [shape[labels.index(c)] for c in group]
    return None if None in sizes else math.prod(sizes)


def _static_elements(p: Plan, shapes) -> int:
    """The product of the sizes of the labels whose size is static."""
    sizes = {c: shape[labels.index(c)] for labels, shape in zip((p.a, p.b), shapes)
             for c in labels}
    return math.prod(s for s in sizes.values() if s is not None)


def _flattenable(shape, labels: str, rows: str, cols: str) -> bool:
    """One of the two groups static and not 0 (the other may be a -1)."""
    r, c = _group_size(shape, labels, rows), _group_size(shape, labels, cols)
    return (r is not None and r > 0) or (c is not None and c > 0)


def candidates(graph_def) -> bool:
    return any(n.op in ("Einsum", "BatchMatMulV2") for n in graph_def.node)


def rewrite(graph_def, types: Dict[Tensor, Optional[ir.TensorType]],
            origins_of: Callable[..., DimOrigins]):
    """(GraphDef, types, number of products rewritten). `origins_of(graph_def,
    types)`: the DimOrigins of a graph, for the proof that several K labels'
    sizes agree in the rewritten graph (where no Einsum's check is that proof)."""
    plans = {}
    for node in graph_def.node:
        equation = _equation(node, types)
        if equation is None:
            continue
        p = plan(equation)
        operands = [types.get(parse_input(s)[:2]) for s in node.input[:2]]
        if p is None or any(t is None for t in operands) \
                or operands[0].rank != len(p.a) or operands[1].rank != len(p.b):
            continue
        if _flattenable(operands[0].shape, p.a, p.m, p.k) \
                and _flattenable(operands[1].shape, p.b, p.k, p.n) \
                and _static_elements(p, [t.shape for t in operands]) >= MIN_STATIC_ELEMENTS:
            plans[node.name] = p
    # Several K labels: their sizes must be proven equal (one K: MatMul checks it).
    return einsum_matmul.apply_proven(
        graph_def, types, plans, _apply, origins_of,
        lambda p: [(p.a.index(c), p.b.index(c)) for c in p.k] if len(p.k) > 1 else [])


class _Builder:
    """Adds the nodes of one rewritten product to `out`, with their types."""

    def __init__(self, out, taken, types, node, control: List[str]):
        self.out, self.taken, self.types, self.node = out, taken, types, node
        self.control = control
        self.dtype = node.attr["T"].type

    def add(self, suffix: str, op: str, inputs: List[str], out_type, target=None) -> str:
        t = target if target is not None else self.out.node.add()
        name = self.node.name if target is not None else fresh_name(
            f"{self.node.name}/fs_{suffix}", self.taken)
        t.name, t.op, t.device = name, op, self.node.device
        del t.input[:]
        t.input.extend(inputs + self.control)
        t.attr.clear()
        if target is None:
            self.types[(name, 0)] = out_type
        return name

    def const(self, suffix: str, values) -> str:
        values = np.asarray(values, np.int32)
        name = self.add(suffix, "Const", [], ir.TensorType("int32", values.shape))
        c = self.out.node[-1]
        del c.input[:]          # a constant needs no control edge
        c.attr["dtype"].type = types_pb2.DT_INT32
        c.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(values))
        return name

    def transpose(self, suffix: str, source: str, perm, shape, target=None) -> str:
        perm_name = self.const(f"{suffix}_perm", perm)
        dtype = ir.TensorType(self._dtype_name(), tuple(shape[d] for d in perm))
        name = self.add(suffix, "Transpose", [source, perm_name], dtype, target)
        node = target if target is not None else self.out.node[-1]
        node.attr["T"].type = self.dtype
        node.attr["Tperm"].type = types_pb2.DT_INT32
        return name

    def reshape(self, suffix: str, source: str, shape_name: str, shape, target=None) -> str:
        dtype = ir.TensorType(self._dtype_name(), tuple(shape))
        name = self.add(suffix, "Reshape", [source, shape_name], dtype, target)
        node = target if target is not None else self.out.node[-1]
        node.attr["T"].type = self.dtype
        node.attr["Tshape"].type = types_pb2.DT_INT32
        return name

    def size_of(self, source: str, axis: int, rank: int, shapes: Dict[str, str]) -> str:
        """A scalar int32: `source`'s size along `axis`, read with Shape."""
        if source not in shapes:
            s = self.add("shape", "Shape", [source], ir.TensorType("int32", (rank,)))
            node = self.out.node[-1]
            node.attr["T"].type = self.dtype
            node.attr["out_type"].type = types_pb2.DT_INT32
            shapes[source] = s
        begin, end = self.const("at", [axis]), self.const("at_end", [axis + 1])
        stride = self.const("step", [1])
        name = self.add("size", "StridedSlice", [shapes[source], begin, end, stride],
                        ir.TensorType("int32", ()))
        node = self.out.node[-1]
        node.attr["T"].type = node.attr["Index"].type = types_pb2.DT_INT32
        for mask in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask"):
            node.attr[mask].i = 0
        node.attr["shrink_axis_mask"].i = 1
        return name

    def _dtype_name(self) -> str:
        return tf.dtypes.as_dtype(self.dtype).name


def _apply(graph_def, types, plans: Dict[str, Plan]):
    """(GraphDef, types, {product: its two operands}) with `plans` applied."""
    types = dict(types)
    operands: Dict[str, Tuple[Tensor, Tensor]] = {}

    def edit(new, node, out, taken):
        p = plans[node.name]
        control = [s for s in node.input if s.startswith("^")]
        sources = [s for s in node.input if not s.startswith("^")][:2]
        operands[node.name] = tuple(parse_input(s)[:2] for s in sources)
        shapes = [types[parse_input(s)[:2]].shape for s in sources]
        build = _Builder(out, taken, types, node, control)
        flat = []
        for tag, source, labels, shape, (rows, cols) in (
                ("a", sources[0], p.a, shapes[0], (p.m, p.k)),
                ("b", sources[1], p.b, shapes[1], (p.k, p.n))):
            perm, flag = p.layout(labels, rows, cols)
            laid = labels if perm is None else rows + cols
            if perm is not None:
                source = build.transpose(f"transpose_{tag}", source, perm, shape)
            first, second = (cols, rows) if flag else (rows, cols)
            sizes = [_group_size(shape, labels, g) for g in (first, second)]
            if len(laid) != 2:
                target = [-1 if s is None else s for s in sizes]
                source = build.reshape(f"flat_{tag}", source, build.const(f"flat_{tag}_shape",
                                                                          target), sizes)
            flat.append((source, flag, sizes))
        (a, ta, sa), (b, tb, sb) = flat
        rows = sa[1] if ta else sa[0]
        cols = sb[0] if tb else sb[1]
        product_shape = (rows, cols)
        unflat = [shapes[0][p.a.index(c)] for c in p.m] + [shapes[1][p.b.index(c)] for c in p.n]
        last = p.perm_out is None and len(p.m) == len(p.n) == 1
        matmul = build.add("matmul", "MatMul", [a, b],
                           ir.TensorType(build._dtype_name(), product_shape),
                           new if last else None)
        mm = new if last else out.node[-1]
        mm.attr["T"].type = build.dtype
        mm.attr["transpose_a"].b, mm.attr["transpose_b"].b = ta, tb
        result = matmul
        if not (len(p.m) == len(p.n) == 1):
            if None in unflat:
                read: Dict[str, str] = {}
                parts = []
                for c in p.m + p.n:
                    i, (src, labels) = ((0, (sources[0], p.a)) if c in p.m
                                        else (1, (sources[1], p.b)))
                    size = shapes[i][labels.index(c)]
                    parts.append(build.const("dim", size) if size is not None else
                                 build.size_of(src, labels.index(c), len(labels), read))
                shape_name = build.add("unflat_shape", "Pack", parts,
                                       ir.TensorType("int32", (len(parts),)))
                pack = out.node[-1]
                pack.attr["T"].type = types_pb2.DT_INT32
                pack.attr["N"].i = len(parts)
                pack.attr["axis"].i = 0
            else:
                shape_name = build.const("unflat_shape", unflat)
            result = build.reshape("unflat", result, shape_name, unflat,
                                   new if p.perm_out is None else None)
        if p.perm_out is not None:
            build.transpose("transpose_out", result, p.perm_out, unflat, new)

    return edited_copy(graph_def, plans, edit), types, operands
