"""Per-op facts the planner needs, keyed by TF op type names (strings only; TF-free).

For each op: its FLOPs and bytes moved, and its *axis rule*: which axes of its inputs and
outputs are the same axis (ties), which input axes it sums over linearly (contractions: a
split there leaves a partial sum), and which it needs whole (a split there must be gathered
first). An op this table does not know gets the conservative rule: no ties, every input axis
needed whole, no partial sums passed through.
"""

import dataclasses
import math
import re

from tf_fusionstitch.planner import conv_rules

# Ops that move no data and do no arithmetic (views, handles, metadata).
_FREE = frozenset("""
Const Placeholder PlaceholderWithDefault Shape ShapeN Size Rank NoOp Identity IdentityN Reshape
Squeeze ExpandDims ReadVariableOp VarHandleOp VariableV2 StopGradient PreventGradient Snapshot
BroadcastGradientArgs EnsureShape _Arg _Retval Range InvertPermutation ConcatOffset
""".split())

# Ops on shapes, permutations and handles: they bind no axis of the data.
_METADATA = frozenset("""
Const Placeholder NoOp VarHandleOp Shape Size Rank BroadcastGradientArgs ShapeN Range
InvertPermutation ConcatOffset
""".split())

# Ops whose output is generated from a shape and a seed: no input axis is one of the output's
# (dropout masks; the product with the activation ties the mask's axes to it).
_GENERATORS = frozenset("""
StatelessRandomGetKeyCounter StatelessRandomGetKeyCounterAlg StatelessRandomGetAlg
StatelessRandomUniformV2 StatelessRandomNormalV2 StatelessTruncatedNormalV2
StatelessRandomUniformIntV2 StatelessRandomUniformFullIntV2 StatelessRandomUniform
StatelessRandomNormal StatelessTruncatedNormal RandomUniform RandomStandardNormal
TruncatedNormal RandomUniformInt
""".split())

_UNARY = frozenset("""
Abs Acos Acosh Asin Asinh Atan Atanh Cast Ceil Cos Cosh Erf Erfc Exp Expm1 Floor Identity Inv
IsFinite IsInf IsNan Log Log1p LogicalNot Neg OnesLike ZerosLike Reciprocal Relu Relu6 Elu
Selu Rint Round Rsqrt Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Square Tan Tanh
StopGradient PreventGradient CheckNumerics Snapshot LeakyRelu EnsureShape Digamma Lgamma
""".split())

_NARY = frozenset("""
Add AddV2 Sub Mul RealDiv Div DivNoNan FloorDiv FloorMod Maximum Minimum Pow SquaredDifference
Equal NotEqual Less LessEqual Greater GreaterEqual LogicalAnd LogicalOr ReluGrad Relu6Grad
EluGrad SeluGrad SigmoidGrad TanhGrad RsqrtGrad SqrtGrad ReciprocalGrad SoftplusGrad
LeakyReluGrad Select SelectV2 AddN MulNoNan Atan2 Xdivy Xlogy ClipByValue
""".split())

# Ops linear in their inputs taken together, through which partial sums pass unreduced.
# (Sums of partial sums are partial sums; a view of a partial sum is one.)
_PASS_PARTIAL = frozenset("Identity Reshape Transpose Squeeze ExpandDims Snapshot Neg".split())
_ADDITIVE = frozenset("Add AddV2 AddN Sub".split())

_LINEAR_REDUCE = frozenset("Sum Mean".split())
_OTHER_REDUCE = frozenset("Max Min Prod All Any EuclideanNorm".split())

_MATMUL = frozenset("MatMul BatchMatMul BatchMatMulV2 BatchMatMulV3".split())

# Scans along the axis their `axis` input names (exclusive and reverse change no axis).
_SCANS = frozenset("Cumsum Cumprod CumulativeLogsumexp".split())

_WRITES_VARIABLE = re.compile(r"^(Assign(Add|Sub)?VariableOp|ResourceApply\w+|"
                              r"ResourceSparseApply\w+|ResourceScatter\w+)$")


def writes_variable(op_type):
    return bool(_WRITES_VARIABLE.match(op_type))


def is_free(op_type):
    return op_type in _FREE


def is_matmul(op_type):
    """A (batch) matrix product; Einsum is not one here (it has its own rule)."""
    return op_type in _MATMUL


def is_elementwise(op_type):
    """A unary or n-ary elementwise op (with broadcasting)."""
    return op_type in _UNARY or op_type in _NARY


def is_generator(op_type):
    """A random-number op whose output comes from a shape and a seed, not from data."""
    return op_type in _GENERATORS


def is_reduction(op_type):
    """A reduction over axes given as an input (Sum, Mean, Max, ...)."""
    return op_type in _LINEAR_REDUCE or op_type in _OTHER_REDUCE


@dataclasses.dataclass
class AxisRule:
    """Axis facts of one op. Ports are ("i", k) for input k, ("o", k) for output k.

    ties: pairs ((port, axis), (port, axis)) that are one axis (same extent, same split).
    contract: (input k, axis) summed linearly: splitting it leaves partial sums in the output.
    whole: (input k, axis) that must be whole: a split there is all-gathered first.
    pass_partial: a partial-sum input yields a partial-sum output without reduction.
    additive: inputs are added: partial inputs combine, and one reduction serves them all.
    """
    ties: list = dataclasses.field(default_factory=list)
    contract: list = dataclasses.field(default_factory=list)
    whole: list = dataclasses.field(default_factory=list)
    pass_partial: bool = False
    additive: bool = False
    conservative: bool = False   # the fallback for an op (or its attributes) this table lacks


def _conservative(ins):
    return AxisRule(whole=[(k, a) for k, t in enumerate(ins) for a in range(t.rank)],
                    conservative=True)


def conservative_ops(graph):
    """{op type: count} of a graph's ops whose axis rule is the conservative fallback and
    that read an axis it can bind (extent > 1): where a split would be gathered for want of
    a rule. Ops the table knows but whose attributes it could not read count too."""
    counts = {}
    for op in graph.ops.values():
        ins = [graph.tensors[n] for n in op.inputs]
        outs = [graph.tensors[n] for n in op.outputs]
        if axis_rule(op, ins, outs).conservative and any(d > 1 for t in ins for d in t.shape):
            counts[op.type] = counts.get(op.type, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _broadcast_ties(ins, out, input_indices):
    """Numpy broadcasting: equal extents aligned from the right are one axis."""
    ties, whole = [], []
    r = out.rank
    for k in input_indices:
        t = ins[k]
        if t.rank > r:
            whole.extend((k, a) for a in range(t.rank))
            continue
        for a in range(t.rank):
            j = a + r - t.rank
            if t.shape[a] == out.shape[j] and t.shape[a] != 1:
                ties.append(((("i", k), a), (("o", 0), j)))
            elif t.shape[a] != 1:
                whole.append((k, a))
    return ties, whole


def reshape_ties(in_shape, out_shape):
    """Pairs (in axis, out axis) that are one axis under a row-major reshape.

    Axes are grouped into runs of equal product; within a run only the outermost axes are
    tied, because splitting the outer factor of a merged axis into contiguous blocks is the
    same partition as splitting the merged axis.
    """
    if math.prod(in_shape) != math.prod(out_shape):
        return []
    pairs, i, j = [], 0, 0
    a, b = list(in_shape), list(out_shape)
    while i < len(a) and j < len(b):
        if a[i] == 1:
            i += 1
            continue
        if b[j] == 1:
            j += 1
            continue
        i0, j0, pa, pb = i, j, a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                if i >= len(a):
                    return pairs
                pa *= a[i]
                i += 1
            else:
                if j >= len(b):
                    return pairs
                pb *= b[j]
                j += 1
        pairs.append((i0, j0))
    return pairs


def _matmul_rule(op, ins, outs):
    a, b, out = ins[0], ins[1], outs[0]
    if op.type == "MatMul":
        ta, tb = op.attrs.get("transpose_a", False), op.attrs.get("transpose_b", False)
        am, ak = (1, 0) if ta else (0, 1)
        bk, bn = (1, 0) if tb else (0, 1)
        ties = [((("i", 0), am), (("o", 0), 0)), ((("i", 1), bn), (("o", 0), 1)),
                ((("i", 0), ak), (("i", 1), bk))]
        return AxisRule(ties=ties, contract=[(0, ak), (1, bk)])
    adj_x, adj_y = op.attrs.get("adj_x", False), op.attrs.get("adj_y", False)
    ra, rb, ro = a.rank, b.rank, out.rank
    ties, whole = [], []
    for j in range(ro - 2):
        for k, t in ((0, a), (1, b)):
            ax = j - (ro - t.rank)
            if ax >= 0:
                if t.shape[ax] == out.shape[j] and t.shape[ax] != 1:
                    ties.append(((("i", k), ax), (("o", 0), j)))
                elif t.shape[ax] != 1:
                    whole.append((k, ax))
    am, ak = (ra - 1, ra - 2) if adj_x else (ra - 2, ra - 1)
    bk, bn = (rb - 1, rb - 2) if adj_y else (rb - 2, rb - 1)
    ties += [((("i", 0), am), (("o", 0), ro - 2)), ((("i", 1), bn), (("o", 0), ro - 1)),
             ((("i", 0), ak), (("i", 1), bk))]
    return AxisRule(ties=ties, contract=[(0, ak), (1, bk)], whole=whole)


def einsum_terms(equation, ins, outs):
    """An Einsum's (input terms, output term) with any `...` spelled out as letters of their
    own, one per broadcast axis (EinsumDense writes `...b,bc->...c`); None if malformed."""
    eq = equation.replace(" ", "")
    if "->" not in eq:
        return None
    lhs, rhs = eq.split("->")
    terms = lhs.split(",")
    if len(terms) != len(ins) or len(outs) != 1:
        return None
    used = set(eq)
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in used]
    ellipsis_rank = max((x.rank - len(term) + 3 for term, x in zip(terms, ins)
                         if "..." in term), default=0)
    fill = "".join(free[:ellipsis_rank])

    def spell(term, rank):
        if "..." not in term:
            return term if len(term) == rank else None
        extra = rank - (len(term) - 3)
        return term.replace("...", fill[len(fill) - extra:]) if 0 <= extra <= len(fill) \
            else None

    spelled = [spell(term, x.rank) for term, x in zip(terms, ins)]
    out = spell(rhs, outs[0].rank)
    if out is None or None in spelled:
        return None
    return spelled, out


def _einsum_rule(op, ins, outs):
    terms = einsum_terms(op.attrs.get("equation", ""), ins, outs)
    if terms is None:
        return _conservative(ins)
    terms, rhs = terms
    seen, ties, contract = {}, [], []
    ports = [(("i", k), term) for k, term in enumerate(terms)] + [(("o", 0), rhs)]
    extents = [x.shape for x in ins] + [outs[0].shape]
    for (port, term), shape in zip(ports, extents):
        for axis, label in enumerate(term):
            if shape[axis] == 1:
                continue   # a broadcast (or size-1) axis ties nothing
            if label in seen:
                ties.append((seen[label], (port, axis)))
            else:
                seen[label] = (port, axis)
            if port[0] == "i" and label not in rhs:
                contract.append((port[1], axis))
    return AxisRule(ties=ties, contract=contract)


def _reduce_rule(op, ins, outs, linear):
    x = ins[0]
    axes = op.attrs.get("axes")
    if axes is None:
        return _conservative(ins)
    axes = sorted({a % x.rank for a in axes}) if x.rank else []
    keep = op.attrs.get("keep_dims", False)
    ties, j = [], 0
    for a in range(x.rank):
        if a in axes:
            if keep:
                j += 1
            continue
        ties.append(((("i", 0), a), (("o", 0), j)))
        j += 1
    reduced = [(0, a) for a in axes]
    # A sum (or mean) of partial sums is a partial sum of the result.
    return AxisRule(ties=ties, contract=reduced if linear else [],
                    whole=[] if linear else reduced, pass_partial=linear)


def _scatter_nd_rule(ins, outs):
    # ScatterNd(indices [B..., q], updates [B..., *shape[q:]], shape): updates[b] is added at
    # out[indices[b]]. The first q output axes are addressed by index values: no input axis
    # is one of them. B is summed over, as UnsortedSegmentSum's ids: a split leaves partial
    # sums. The rank check also refuses a q read wrong (an unknown integer extent reads 1).
    indices, updates, out = ins[0], ins[1], outs[0]
    if not indices.rank:
        return _conservative(ins)
    b, q = indices.rank - 1, indices.shape[-1]
    if q > out.rank or updates.rank != b + out.rank - q or \
            tuple(updates.shape[b:]) != tuple(out.shape[q:]):
        return _conservative(ins)
    ties = [((("i", 0), a), (("i", 1), a)) for a in range(b)
            if indices.shape[a] == updates.shape[a]]
    ties += [((("i", 1), b + j), (("o", 0), q + j)) for j in range(out.rank - q)]
    return AxisRule(ties=ties, contract=[(1, a) for a in range(b)])


def strided_slice_axes(op, rank):
    """(input axis or None, output axis or None) pairs of a StridedSlice on a rank-`rank`
    input, from its masks and the length of its `strides`; None where they are unknown.

    A new axis has no input axis; a shrunk (indexed) axis has no output axis."""
    strides = op.attrs.get("strides")
    if strides is None or any(s <= 0 for s in strides):
        return None     # unknown, or a reversal (not the same axis in the same order)
    bits = {m: op.attrs.get(m + "_mask", 0) for m in ("ellipsis", "new_axis", "shrink_axis")}
    specs = len(strides)
    pairs, a, j = [], 0, 0
    for i in range(specs):
        if bits["ellipsis"] >> i & 1:
            named = sum(1 for k in range(specs) if k != i and not bits["new_axis"] >> k & 1)
            for _ in range(rank - named):
                pairs.append((a, j))
                a, j = a + 1, j + 1
        elif bits["new_axis"] >> i & 1:
            pairs.append((None, j))
            j += 1
        elif bits["shrink_axis"] >> i & 1:
            pairs.append((a, None))
            a += 1
        else:
            pairs.append((a, j))
            a, j = a + 1, j + 1
    pairs.extend((k, j + k - a) for k in range(a, rank))
    return pairs


def _strided_slice_rule(op, ins, outs):
    # StridedSlice(x, begin, end, strides) -> y; StridedSliceGrad(shape, begin, end, strides,
    # dy) -> dx of x's shape: the same axes, read the other way.
    grad = op.type == "StridedSliceGrad"
    full, sliced = (outs[0], ins[4]) if grad else (ins[0], outs[0])
    pairs = strided_slice_axes(op, full.rank)
    if pairs is None:
        return _conservative(ins)
    full_port, sliced_port = (("o", 0), ("i", 4)) if grad else (("i", 0), ("o", 0))
    ties, whole = [], []
    for a, j in pairs:
        if a is not None and j is not None and j < sliced.rank and \
                full.shape[a] == sliced.shape[j]:
            ties.append(((full_port, a), (sliced_port, j)))
        elif grad and j is not None and j < sliced.rank and sliced.shape[j] > 1:
            whole.append((4, j))
        elif not grad and a is not None and full.shape[a] > 1:
            whole.append((0, a))
    return AxisRule(ties=ties, whole=whole)


def axis_rule(op, ins, outs):
    """The AxisRule of `op` given its input and output Tensors (static shapes)."""
    t = op.type
    if t in _METADATA or t in _GENERATORS:
        return AxisRule()
    if t in ("Reshape", "Squeeze", "ExpandDims"):
        ties = [((("i", 0), i), (("o", 0), j)) for i, j in reshape_ties(ins[0].shape,
                                                                       outs[0].shape)]
        tied = {i for (_, i), _ in ties}
        whole = [(0, a) for a in range(ins[0].rank) if a not in tied and ins[0].shape[a] != 1]
        return AxisRule(ties=ties, whole=whole, pass_partial=True)
    if t == "Transpose":
        perm = op.attrs.get("perm")
        if perm is None:
            return _conservative(ins)
        return AxisRule(ties=[((("i", 0), p), (("o", 0), j)) for j, p in enumerate(perm)],
                        pass_partial=True)
    if t == "IdentityN":
        # Each output is its input (Keras passes gradients through one before the update).
        return AxisRule(ties=[((("i", k), a), (("o", k), a)) for k, x in enumerate(ins)
                              for a in range(x.rank)], pass_partial=True)
    if t == "ReadVariableOp" or t in _UNARY:
        n = min(ins[0].rank, outs[0].rank) if outs else 0
        same = ins[0].shape == outs[0].shape
        ties = [((("i", 0), a), (("o", 0), a)) for a in range(n)] if same else []
        return AxisRule(ties=ties, pass_partial=t in _PASS_PARTIAL or t == "ReadVariableOp")
    if t in _NARY:
        ties, whole = _broadcast_ties(ins, outs[0], range(len(ins)))
        return AxisRule(ties=ties, whole=whole, additive=t in _ADDITIVE)
    if t == "BroadcastTo":
        ties, whole = _broadcast_ties(ins, outs[0], [0])
        return AxisRule(ties=ties, whole=whole)
    if t == "BiasAdd":
        x = ins[0]
        c = 1 if op.attrs.get("data_format", "NHWC") == "NCHW" else x.rank - 1
        ties = [((("i", 0), a), (("o", 0), a)) for a in range(x.rank)]
        ties.append(((("i", 1), 0), (("o", 0), c)))
        return AxisRule(ties=ties)
    if t == "BiasAddGrad":
        x = ins[0]
        c = 1 if op.attrs.get("data_format", "NHWC") == "NCHW" else x.rank - 1
        return AxisRule(ties=[((("i", 0), c), (("o", 0), 0))],
                        contract=[(0, a) for a in range(x.rank) if a != c])
    if t in _MATMUL:
        return _matmul_rule(op, ins, outs)
    if t in conv_rules.OPS:
        return AxisRule(**conv_rules.axis_facts(op, ins, outs))
    if t == "Einsum":
        return _einsum_rule(op, ins, outs)
    if t in _LINEAR_REDUCE:
        return _reduce_rule(op, ins, outs, linear=True)
    if t in _OTHER_REDUCE:
        return _reduce_rule(op, ins, outs, linear=False)
    if t in ("Softmax", "LogSoftmax"):
        r = ins[0].rank
        return AxisRule(ties=[((("i", 0), a), (("o", 0), a)) for a in range(r)],
                        whole=[(0, r - 1)])
    if t in _SCANS:
        # As Softmax: the output keeps the input's axes; the scanned one is read whole.
        axis, r = op.attrs.get("axis"), ins[0].rank
        if not isinstance(axis, int) or not -r <= axis < r:
            return _conservative(ins)
        return AxisRule(ties=[((("i", 0), a), (("o", 0), a)) for a in range(r)],
                        whole=[(0, axis % r)])
    if t == "MatrixBandPart":
        # Which elements are kept depends on their row and column in the whole matrix: the
        # last two axes are read whole; batch axes pass through.
        r = ins[0].rank
        return AxisRule(ties=[((("i", 0), a), (("o", 0), a)) for a in range(r)],
                        whole=[(0, a) for a in range(max(r - 2, 0), r)])
    if t == "TopKV2":
        # The k largest along the last axis, which is read whole and becomes k entries of
        # values and of indices; the leading axes pass through to both outputs.
        r = ins[0].rank
        if not r:
            return _conservative(ins)
        return AxisRule(ties=[((("i", 0), a), (("o", k), a)) for k in range(len(outs))
                              for a in range(r - 1)], whole=[(0, r - 1)])
    if t == "ScatterNd":
        return _scatter_nd_rule(ins, outs)
    if t in ("SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits"):
        ties = [((("i", 0), 0), (("i", 1), 0)), ((("i", 0), 0), (("o", 0), 0)),
                ((("i", 0), 0), (("o", 1), 0)), ((("i", 0), 1), (("o", 1), 1))]
        whole = [(0, 1)]
        if t == "SoftmaxCrossEntropyWithLogits":
            ties.append(((("i", 0), 1), (("i", 1), 1)))
            whole.append((1, 1))
        return AxisRule(ties=ties, whole=whole)
    if t in ("GatherV2", "ResourceGather"):
        params, indices = ins[0], ins[1]
        axis = 0 if t == "ResourceGather" else op.attrs.get("axis")
        if axis is None:
            return _conservative(ins)
        axis %= params.rank
        # Output: params[:axis] + indices[batch_dims:] + params[axis + 1:]; the first
        # batch_dims axes of params and indices are one (take_along_axis).
        b = op.attrs.get("batch_dims", 0) % (indices.rank + 1)
        ties = [((("i", 0), a), (("o", 0), a)) for a in range(axis)]
        ties += [((("i", 1), k), (("o", 0), k)) for k in range(b)]
        ties += [((("i", 1), k), (("o", 0), axis + k - b)) for k in range(b, indices.rank)]
        ties += [((("i", 0), a), (("o", 0), a - 1 + indices.rank - b))
                 for a in range(axis + 1, params.rank)]
        # A lookup into a table split along the gathered axis is a masked lookup plus a sum
        # (vocabulary-parallel embedding): linear, so it leaves a partial sum.
        return AxisRule(ties=ties, contract=[(0, axis)])
    if t == "UnsortedSegmentSum":
        data, ids = ins[0], ins[1]
        q = ids.rank
        ties = [((("i", 0), a), (("i", 1), a)) for a in range(q)]
        ties += [((("i", 0), a), (("o", 0), a - q + 1)) for a in range(q, data.rank)]
        return AxisRule(ties=ties, contract=[(0, a) for a in range(q)])
    if t == "ConcatV2":
        axis = op.attrs.get("axis")
        if axis is None:
            return _conservative(ins)
        data = ins[:-1]
        out = outs[0]
        axis %= out.rank
        ties, whole = [], []
        for k, x in enumerate(data):
            for a in range(x.rank):
                if a == axis:
                    whole.append((k, a))
                elif x.shape[a] == out.shape[a]:
                    ties.append(((("i", k), a), (("o", 0), a)))
        return AxisRule(ties=ties, whole=whole)
    if t in ("StridedSlice", "StridedSliceGrad"):
        return _strided_slice_rule(op, ins, outs)
    if t in ("Pack", "Unpack"):
        # Stacking adds the `axis` axis (Unpack removes it); the others are one axis.
        many, one = (ins, outs[0]) if t == "Pack" else (outs, ins[0])
        axis = op.attrs.get("axis", 0) % one.rank
        side = "i" if t == "Pack" else "o"
        ties = [(((side, k), a), (("o" if t == "Pack" else "i", 0), a + (a >= axis)))
                for k, x in enumerate(many) for a in range(x.rank)]
        return AxisRule(ties=ties, whole=[] if t == "Pack" else [(0, axis)])
    if t in ("Split", "SplitV"):
        axis, value = op.attrs.get("axis"), 1 if t == "Split" else 0
        if axis is None:
            return _conservative(ins)
        x = ins[value]
        axis %= x.rank
        ties = [((("i", value), a), (("o", k), a)) for k in range(len(outs))
                for a in range(x.rank) if a != axis]
        return AxisRule(ties=ties, whole=[(value, axis)])
    if t in ("Slice", "StridedSlice", "Pad", "PadV2", "MirrorPad", "Tile"):
        x, out = ins[0], outs[0]
        if x.rank != out.rank:
            return _conservative(ins)
        ties = [((("i", 0), a), (("o", 0), a)) for a in range(x.rank)
                if x.shape[a] == out.shape[a]]
        whole = [(0, a) for a in range(x.rank) if x.shape[a] != out.shape[a]]
        return AxisRule(ties=ties, whole=whole)
    if t == "OneHot":
        axis = op.attrs.get("axis", -1)
        r = ins[0].rank
        axis = r if axis == -1 else axis
        return AxisRule(ties=[((("i", 0), a), (("o", 0), a if a < axis else a + 1))
                              for a in range(r)])
    if t == "Fill":
        return AxisRule()
    if t in ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"):
        return AxisRule(ties=[((("i", 0), a), (("i", 1), a)) for a in range(ins[0].rank)
                              if ins[1].rank == ins[0].rank])
    if t.startswith("ResourceApply"):
        var = ins[0]
        ties = [((("i", 0), a), (("i", k), a)) for k in range(1, len(ins))
                if ins[k].shape == var.shape and var.rank for a in range(var.rank)]
        return AxisRule(ties=ties)
    if t.startswith("ResourceScatter"):
        # (variable, indices, updates): updates are indices.shape + the rows' shape. A row
        # split (vocabulary-parallel) is written by the device that holds each row.
        var, indices, updates = ins[0], ins[1], ins[2]
        q = indices.rank
        ties = [((("i", 1), a), (("i", 2), a)) for a in range(q)]
        if updates.rank == q + var.rank - 1:
            ties += [((("i", 0), a), (("i", 2), q + a - 1)) for a in range(1, var.rank)]
        return AxisRule(ties=ties)
    return _conservative(ins)


# -- FLOPs and bytes --------------------------------------------------------------------------

_TRANSCENDENTAL = frozenset("Exp Expm1 Log Log1p Tanh Sigmoid Erf Erfc Sqrt Rsqrt Pow Softplus "
                            "Sin Cos Tan Atan Atan2".split())


def flops_and_bytes(op, ins, outs):
    """(FLOPs, bytes read + written) of one execution of `op` on the given tensors."""
    t = op.type
    in_bytes = sum(x.nbytes for x in ins if not x.variable)
    out_bytes = sum(x.nbytes for x in outs)
    if t in _FREE:
        return 0.0, 0.0
    if is_matmul(t):
        a, out = ins[0], outs[0]
        if t == "MatMul":
            k = a.shape[0] if op.attrs.get("transpose_a") else a.shape[1]
        else:
            k = a.shape[-2] if op.attrs.get("adj_x") else a.shape[-1]
        return 2.0 * out.num_elements * k, float(in_bytes + out_bytes)
    if t == "Einsum":
        terms = einsum_terms(op.attrs.get("equation", ""), ins, outs)
        if terms is None:
            return float(outs[0].num_elements), float(in_bytes + out_bytes)
        # Every label's extent once: one multiply-add per point of the joint index space.
        sizes = {}
        for term, x in zip(terms[0], ins):
            for label, extent in zip(term, x.shape):
                sizes[label] = max(extent, sizes.get(label, 1))
        return 2.0 * math.prod(sizes.values()), float(in_bytes + out_bytes)
    if t in conv_rules.OPS:
        return conv_rules.flops(op, ins, outs), float(in_bytes + out_bytes)
    if t.startswith("ResourceScatter"):
        # (variable, indices, updates): each update is applied to its row (an embedding's
        # sparse gradient, not its whole table); the rows are read and written back, at
        # most the table's, however often an index repeats.
        var, indices, updates = ins[0], ins[1], ins[2]
        row = math.prod(var.shape[1:])
        rows = min(indices.num_elements, var.shape[0] if var.rank else 1) * row
        overwrite = t == "ResourceScatterUpdate"
        return (0.0 if overwrite else float(indices.num_elements * row),
                float((1 if overwrite else 2) * rows * var.itemsize + updates.nbytes
                      + indices.nbytes))
    if writes_variable(t):
        var = ins[0]
        resources = [x for x in ins if x.variable]
        dense = [x for x in ins if not x.variable]
        # Each variable and slot is read and written once; dense inputs are read.
        moved = 2 * sum(x.nbytes for x in resources) + sum(x.nbytes for x in dense)
        per_element = 10 if "Adam" in t else 2 * len(resources) + 1
        return float(per_element * math.prod(var.shape)), float(moved)
    if t in ("Softmax", "LogSoftmax", "SoftmaxCrossEntropyWithLogits",
             "SparseSoftmaxCrossEntropyWithLogits"):
        return 5.0 * ins[0].num_elements, float(in_bytes + out_bytes)
    if is_reduction(t) or t == "BiasAddGrad":
        return float(ins[0].num_elements), float(in_bytes + out_bytes)
    if t in ("GatherV2", "ResourceGather"):
        idx = ins[1].nbytes
        return 0.0, float(2 * outs[0].nbytes + idx)
    if is_elementwise(t) or t == "BiasAdd":
        n = outs[0].num_elements if outs else 0
        per = 4.0 if t in _TRANSCENDENTAL else max(1, len(ins) - 1)
        return per * n, float(in_bytes + out_bytes)
    return float(sum(x.num_elements for x in outs)), float(in_bytes + out_bytes)
