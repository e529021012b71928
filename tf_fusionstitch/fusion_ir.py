"""Fusion IR: a framework-free description of one fused cluster.

A `Cluster` is a small SSA program: named inputs with a dtype and a (possibly
partly dynamic) shape, a topologically ordered list of primitive `Op`s, and the
names of the values that leave the cluster. It is the contract between the
rewriters (which lower TensorFlow ops to primitives) and code generation (which
regenerates source from it). A `FusionStitch` node carries it as JSON; that JSON
is validated here before anything is generated from it, so a graph can never
smuggle code in through names or attributes.

No TensorFlow import here, by design (see docs/DESIGN.md, "TF-free core").
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Iterable, Optional, Sequence

Shape = tuple  # tuple[Optional[int], ...]; None is an extent known only at run time

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int32", "int64")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8,
               "bool": 1}
# fs_meta dtype codes: TF's DataType enum numbers, so the op checks Tin/Tout against them as is.
DTYPE_CODES = {"float32": 1, "float64": 2, "int32": 3, "int64": 9, "bool": 10,
               "bfloat16": 14, "float16": 19}

# Primitive classes. The op table in rewriters/ maps every TF op to these.
UNARY = (
    "neg", "abs", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "square",
    "reciprocal", "tanh", "sigmoid", "relu", "relu6", "elu", "selu", "softplus",
    "erf", "erfc", "sin", "cos", "floor", "ceil", "round", "sign",
    "isfinite", "isnan", "logical_not", "cast",
)
BINARY = (
    "add", "sub", "mul", "div", "div_no_nan", "maximum", "minimum", "pow",
    "squared_difference", "floor_div", "floor_mod",
    "less", "greater", "equal", "not_equal", "less_equal", "greater_equal",
    "logical_and", "logical_or",
)
TERNARY = ("select",)
REDUCE = ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod",
          "reduce_any", "reduce_all")
SHAPE_ONLY = ("reshape", "broadcast_to")
# transpose(x, perm): out dim d is x's dim perm[d]. No arithmetic, but unlike
# the shape-only ops TF runs it as a kernel that moves every element.
MOVE = ("transpose",)
CONSTANT = ("const",)
# segment_sum(data, ids): out[s] = sum of data[i] over the rows i with ids[i] == s
# (TF's UnsortedSegmentSum); a cluster with one has a kernel of its own
# (codegen/scatter.py).
SCATTER = ("segment_sum",)
PRIMITIVES = UNARY + BINARY + TERNARY + REDUCE + SHAPE_ONLY + MOVE + CONSTANT + SCATTER
# Inputs each primitive takes.
_ARITY = {**{p: 1 for p in UNARY + REDUCE + SHAPE_ONLY + MOVE},
          **{p: 2 for p in BINARY + SCATTER},
          **{p: 3 for p in TERNARY}, "const": 0}

# Expensive elementwise ops (docs/PAPERS.md, "Op classes"): worth buffering rather than
# recomputing when a value is needed after a reduction.
EXPENSIVE = frozenset({
    "exp", "log", "log1p", "expm1", "tanh", "sigmoid", "elu", "selu", "softplus",
    "erf", "erfc", "sin", "cos", "pow", "div", "reciprocal", "rsqrt", "sqrt",
})

_COMPARE = ("less", "greater", "equal", "not_equal", "less_equal", "greater_equal")
_LOGICAL = ("logical_not", "logical_and", "logical_or", "reduce_any", "reduce_all")
_FLOAT_ONLY = frozenset({
    "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid",
    "relu6", "elu", "selu", "softplus", "erf", "erfc", "sin", "cos", "floor", "ceil",
    "round", "isfinite", "isnan", "div", "div_no_nan", "pow", "floor_div", "floor_mod",
})

# JSON has no Inf/NaN; constants spell them as strings.
NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")

# The largest cluster a kernel is generated for (Cluster.validate refuses a
# larger one). The strategies grow clusters within them and packing sizes
# its packs by them (rewriters/pack_limits.py), so no cluster they form
# fails for its size.
MAX_INPUTS = 512
MAX_OPS = 10000
# fs_meta's counts (inputs, outputs, run-time extents) at most: the op and
# runtime/cpu_kernel.py refuse a kernel past them (docs/KERNEL_ABI.md).
MAX_META_COUNT = 1 << 16


class SpecError(ValueError):
    """A fusion spec that cannot describe a valid cluster."""


@dataclasses.dataclass(frozen=True)
class TensorType:
    dtype: str
    shape: Shape

    @property
    def rank(self) -> int:
        return len(self.shape)

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape)}

    @staticmethod
    def from_json(obj: Any) -> "TensorType":
        _expect(isinstance(obj, dict) and set(obj) == {"dtype", "shape"},
                f"a tensor type must be {{dtype, shape}}, got {obj!r:.80}")
        dtype, shape = obj["dtype"], obj["shape"]
        _expect(isinstance(shape, list), f"shape must be a list, got {shape!r:.80}")
        return TensorType(dtype, tuple(shape))

    def validate(self, where: str) -> None:
        _expect(self.dtype in DTYPES, f"{where}: unsupported dtype {self.dtype!r:.40}")
        _expect(len(self.shape) <= 8, f"{where}: rank {len(self.shape)} exceeds 8")
        for d in self.shape:
            _expect(d is None or (type(d) is int and 0 <= d < 2**62),
                    f"{where}: bad extent {d!r:.40} in shape")


@dataclasses.dataclass(frozen=True)
class Op:
    """One primitive producing the value `name` (SSA)."""
    name: str
    prim: str
    inputs: tuple
    type: TensorType
    attrs: tuple = ()  # sorted (key, value) pairs; values are JSON scalars or int tuples

    def attr(self, key: str, default: Any = None) -> Any:
        return dict(self.attrs).get(key, default)

    def to_json(self) -> dict:
        return {"name": self.name, "prim": self.prim, "inputs": list(self.inputs),
                "type": self.type.to_json(),
                "attrs": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.attrs}}

    @staticmethod
    def from_json(obj: Any) -> "Op":
        _expect(isinstance(obj, dict) and set(obj) == {"name", "prim", "inputs", "type", "attrs"},
                f"an op must be {{name, prim, inputs, type, attrs}}, got keys {sorted(obj)!r:.120}"
                if isinstance(obj, dict) else f"an op must be an object, got {obj!r:.80}")
        _expect(isinstance(obj["inputs"], list) and isinstance(obj["attrs"], dict),
                "op inputs must be a list and attrs an object")
        return make_op(obj["name"], obj["prim"], obj["inputs"],
                       TensorType.from_json(obj["type"]), **obj["attrs"])


def make_op(name: str, prim: str, inputs: Iterable[str], type: TensorType, **attrs: Any) -> Op:
    frozen = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))
    return Op(name, prim, tuple(inputs), type, frozen)


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The fusion spec of one cluster."""
    inputs: tuple   # ((name, TensorType), ...)
    ops: tuple      # (Op, ...), topologically ordered
    outputs: tuple  # (value name, ...)
    # Classes of the inputs' dynamic extents that are equal whenever the graph
    # runs (the rewriter proved it): ((("in0", 0), ("in3", 0)), ...), sorted.
    # None of them broadcasts against another; the kernel's shape function
    # still checks them on every call.
    equal_dims: tuple = ()

    def subset(self, inputs: Sequence[int], ops: Sequence["Op"],
               outputs: Sequence[int]) -> "Cluster":
        """The cluster of some of this one's inputs (indices), ops and outputs
        (indices), with what is known of those inputs' extents."""
        kept = {self.inputs[i][0] for i in inputs}
        classes = [tuple(m for m in cls if m[0] in kept) for cls in self.equal_dims]
        return Cluster(tuple(self.inputs[i] for i in inputs), tuple(ops),
                       tuple(self.outputs[j] for j in outputs),
                       tuple(c for c in classes if len(c) > 1))

    def types(self) -> dict:
        out = {n: t for n, t in self.inputs}
        out.update((op.name, op.type) for op in self.ops)
        return out

    def op_by_name(self) -> dict:
        return {op.name: op for op in self.ops}

    def to_json(self) -> str:
        """Canonical JSON: equal clusters give byte-identical text (it is hashed)."""
        obj = {"version": 1,
               "inputs": [{"name": n, "type": t.to_json()} for n, t in self.inputs],
               "ops": [op.to_json() for op in self.ops],
               "outputs": list(self.outputs)}
        if self.equal_dims:  # absent when empty: older specs keep their text and hash
            obj["equal_dims"] = [[list(m) for m in cls] for cls in self.equal_dims]
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)

    @staticmethod
    def from_json(text: str) -> "Cluster":
        """Parse and validate; raises SpecError naming the problem."""
        try:
            obj = json.loads(text)
        except (TypeError, ValueError) as e:
            raise SpecError(f"fusion spec is not valid JSON: {e}") from None
        _expect(isinstance(obj, dict) and obj.get("version") == 1,
                "fusion spec must be an object with version 1")
        _expect(set(obj) - {"equal_dims"} == {"version", "inputs", "ops", "outputs"},
                f"fusion spec has unexpected keys {sorted(obj)!r:.120}")
        _expect(isinstance(obj["inputs"], list) and isinstance(obj["ops"], list)
                and isinstance(obj["outputs"], list), "inputs, ops and outputs must be lists")
        inputs = []
        for item in obj["inputs"]:
            _expect(isinstance(item, dict) and set(item) == {"name", "type"},
                    f"an input must be {{name, type}}, got {item!r:.80}")
            inputs.append((item["name"], TensorType.from_json(item["type"])))
        classes = obj.get("equal_dims", [])
        _expect(isinstance(classes, list) and all(
            isinstance(c, list) and all(isinstance(m, list) and len(m) == 2 for m in c)
            for c in classes), "equal_dims must be a list of lists of [input, dim] pairs")
        cluster = Cluster(tuple(inputs), tuple(Op.from_json(o) for o in obj["ops"]),
                          tuple(obj["outputs"]),
                          tuple(tuple(tuple(m) for m in c) for c in classes))
        cluster.validate()
        return cluster

    def check_size(self) -> None:
        """Raises SpecError when the cluster has more than MAX_INPUTS inputs
        or MAX_OPS ops (validate checks this first)."""
        _expect(len(self.inputs) <= MAX_INPUTS and len(self.ops) <= MAX_OPS,
                f"cluster too large: {len(self.inputs)} inputs (at most {MAX_INPUTS}), "
                f"{len(self.ops)} ops (at most {MAX_OPS})")

    def validate(self) -> None:
        """Checks names, arity, attributes, dtypes and every shape (re-inferred)."""
        _expect(len(self.ops) > 0, "a cluster needs at least one op")
        _expect(len(self.outputs) > 0, "a cluster needs at least one output")
        self.check_size()
        known: dict = {}
        for name, t in self.inputs:
            _check_name(name)
            _expect(name not in known, f"duplicate value name {name!r}")
            t.validate(f"input {name}")
            known[name] = t
        for op in self.ops:
            _check_name(op.name)
            _expect(op.name not in known, f"duplicate value name {op.name!r}")
            _expect(op.prim in PRIMITIVES, f"op {op.name}: unknown primitive {op.prim!r:.40}")
            for i in op.inputs:
                _expect(isinstance(i, str) and i in known,
                        f"op {op.name}: input {i!r:.40} is not defined before it")
            ins = tuple(known[i] for i in op.inputs)
            checked = (op.prim, op.attrs, op.type, ins)   # all a check reads but the name
            if checked not in _CHECKED_OPS:
                op.type.validate(f"op {op.name}")
                expected = infer_type(op, ins)
                _expect(_shape_compatible(expected.shape, op.type.shape)
                        and expected.dtype == op.type.dtype,
                        f"op {op.name} ({op.prim}): declared "
                        f"{op.type.dtype}{list(op.type.shape)} "
                        f"but inputs give {expected.dtype}{list(expected.shape)}")
                if len(_CHECKED_OPS) < _MAX_CHECKED_OPS:
                    _CHECKED_OPS.add(checked)
            known[op.name] = op.type
        for o in self.outputs:
            _expect(isinstance(o, str) and o in known and o not in dict(self.inputs),
                    f"output {o!r:.40} is not a value computed by the cluster")
        _expect(len(set(self.outputs)) == len(self.outputs), "duplicate outputs")
        inputs = dict(self.inputs)
        seen = set()
        for cls in self.equal_dims:
            _expect(isinstance(cls, tuple) and len(cls) > 1 and list(cls) == sorted(set(cls)),
                    "each class of equal_dims is a sorted list of two or more members")
            for name, d in cls:
                _expect(name in inputs and type(d) is int and 0 <= d < inputs[name].rank
                        and inputs[name].shape[d] is None,
                        f"equal_dims names {name!r:.40} dimension {d!r:.10}, which is not a "
                        "dynamic extent of an input")
                _expect((name, d) not in seen, f"equal_dims names ({name}, {d}) twice")
                seen.add((name, d))
        _expect(list(self.equal_dims) == sorted(self.equal_dims), "equal_dims must be sorted")


# Ops (but for their names) that passed validate's checks: the clustering
# validates every candidate merge, mostly ops it has seen before. Bounded, as
# a long-lived process may see many.
_CHECKED_OPS: set = set()
_MAX_CHECKED_OPS = 1 << 18


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise SpecError(message)


def _check_name(name: Any) -> None:
    _expect(isinstance(name, str) and bool(_NAME.match(name)),
            f"value name {name!r:.40} is not an identifier of at most 64 characters")


def _shape_compatible(inferred: Shape, declared: Shape) -> bool:
    if len(inferred) != len(declared):
        return False
    return all(a is None or b is None or a == b for a, b in zip(inferred, declared))


def broadcast_shapes(*shapes: Shape) -> Shape:
    """NumPy broadcasting over static extents; None (dynamic) matches anything.

    Statically, a dynamic extent takes the other operand's extent; if it is 1 at
    run time the kernel broadcasts it with a run-time stride (schedule.py,
    "maybe_broadcast"), except along a reduced axis, which is not fused.
    """
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        static = {d for d in dims if d is not None and d != 1}
        if len(static) > 1:
            raise SpecError(f"shapes {[list(s) for s in shapes]} do not broadcast")
        if static:
            out.append(static.pop())
        elif any(d is None for d in dims):
            out.append(None)
        else:
            out.append(1)
    return tuple(out)


def _axes(op: Op, rank: int) -> tuple:
    axes = op.attr("axes")
    _expect(isinstance(axes, tuple) and all(type(a) is int for a in axes),
            f"op {op.name}: axes must be a list of ints")
    for a in axes:
        _expect(-rank <= a < rank, f"op {op.name}: axis {a} out of range for rank {rank}")
    norm = tuple(sorted({a % rank for a in axes})) if rank else ()
    _expect(len(norm) == len(axes), f"op {op.name}: repeated axis in {list(axes)}")
    return norm


def reduced_axes(op: Op, rank: int) -> tuple:
    """Normalised (sorted, non-negative) reduction axes of a reduce op."""
    return _axes(op, rank)


def infer_type(op: Op, ins: Sequence[TensorType]) -> TensorType:
    """Result type of `op` given its input types; raises SpecError if illegal."""
    arity = _ARITY[op.prim]
    _expect(len(ins) == arity, f"op {op.name}: {op.prim} takes {arity} inputs, got {len(ins)}")
    p = op.prim
    allowed = {"axes", "keep_dims", "shape", "value", "num_segments", "perm"}
    for k, _ in op.attrs:
        _expect(k in allowed, f"op {op.name}: unknown attribute {k!r:.40}")
    if p == "const":
        value = op.attr("value")
        _expect(op.type.shape == (), f"op {op.name}: only scalar constants are inlined")
        _expect(type(value) in (int, float, bool) or value in NONFINITE,
                f"op {op.name}: constant value must be a number, 'inf', '-inf' or 'nan'")
        return op.type
    if p in UNARY:
        (x,) = ins
        if p == "cast":
            return TensorType(op.type.dtype, x.shape)
        _check_dtype(op, x.dtype)
        dtype = "bool" if p in ("isfinite", "isnan") else x.dtype
        return TensorType(dtype, x.shape)
    if p in BINARY:
        a, b = ins
        _expect(a.dtype == b.dtype, f"op {op.name}: {p} of {a.dtype} and {b.dtype}")
        _check_dtype(op, a.dtype)
        dtype = "bool" if p in _COMPARE else a.dtype
        return TensorType(dtype, broadcast_shapes(a.shape, b.shape))
    if p == "select":
        c, a, b = ins
        _expect(c.dtype == "bool", f"op {op.name}: select condition must be bool")
        _expect(a.dtype == b.dtype, f"op {op.name}: select of {a.dtype} and {b.dtype}")
        return TensorType(a.dtype, broadcast_shapes(c.shape, a.shape, b.shape))
    if p in REDUCE:
        (x,) = ins
        _check_dtype(op, x.dtype)
        axes = _axes(op, x.rank)
        keep = op.attr("keep_dims")
        _expect(type(keep) is bool, f"op {op.name}: keep_dims must be a bool")
        if keep:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return TensorType(x.dtype, shape)
    if p == "segment_sum":
        data, ids = ins
        n = op.attr("num_segments")
        _expect(type(n) is int and 0 <= n < 2**62,
                f"op {op.name}: num_segments must be a non-negative int")
        _expect(ids.dtype in INT_DTYPES and ids.rank == 1,
                f"op {op.name}: segment ids must be a vector of int32 or int64")
        _expect(data.rank >= 1 and data.dtype != "bool", f"op {op.name}: segment_sum of "
                f"{data.dtype}{list(data.shape)}: a numeric tensor of rank >= 1 is summed")
        _expect(data.shape[0] is None or ids.shape[0] is None or data.shape[0] == ids.shape[0],
                f"op {op.name}: {ids.shape[0]} segment ids for {data.shape[0]} rows")
        return TensorType(data.dtype, (n,) + tuple(data.shape[1:]))
    if p == "transpose":
        (x,) = ins
        perm = op.attr("perm")
        _expect(isinstance(perm, tuple) and all(type(d) is int for d in perm)
                and sorted(perm) == list(range(x.rank)),
                f"op {op.name}: perm must be a permutation of 0..{x.rank - 1}")
        return TensorType(x.dtype, tuple(x.shape[d] for d in perm))
    if p in SHAPE_ONLY:
        (x,) = ins
        target = op.attr("shape")
        _expect(isinstance(target, tuple) and all(d is None or (type(d) is int and d >= 0)
                                                  for d in target),
                f"op {op.name}: shape attribute must be a list of extents")
        if p == "broadcast_to":
            _expect(broadcast_shapes(x.shape, target) == broadcast_shapes(target, x.shape)
                    and _shape_compatible(broadcast_shapes(x.shape, target), target),
                    f"op {op.name}: cannot broadcast {list(x.shape)} to {list(target)}")
        else:
            _expect(_squeezed(x.shape) == _squeezed(target),
                    f"op {op.name}: only reshapes that add or remove size-1 dimensions are "
                    f"fused ({list(x.shape)} -> {list(target)})")
        return TensorType(x.dtype, target)
    raise SpecError(f"op {op.name}: unknown primitive {p!r}")


def _squeezed(shape: Shape) -> tuple:
    return tuple(d for d in shape if d != 1)


def _check_dtype(op: Op, dtype: str) -> None:
    p = op.prim
    if p in _LOGICAL:
        _expect(dtype == "bool", f"op {op.name}: {p} needs bool, got {dtype}")
    elif p in _FLOAT_ONLY:
        _expect(dtype in FLOAT_DTYPES, f"op {op.name}: {p} is fused for floating types only, "
                                       f"got {dtype}")
    elif p not in ("equal", "not_equal", "select", "cast"):
        _expect(dtype != "bool", f"op {op.name}: {p} does not take bool")


def num_elements(shape: Shape) -> Optional[int]:
    if any(d is None for d in shape):
        return None
    return math.prod(shape)


def tensor_bytes(types: Iterable[TensorType]) -> tuple:
    """(bytes of the tensors whose shapes are static, bytes per unit of the
    dynamic extents of the others): for a report, where a batch left
    dynamic multiplies the second number."""
    fixed, per_dynamic = 0, 0
    for t in types:
        size = DTYPE_BYTES[t.dtype] * math.prod(d for d in t.shape if d is not None)
        if any(d is None for d in t.shape):
            per_dynamic += size
        else:
            fixed += size
    return fixed, per_dynamic


@dataclasses.dataclass(frozen=True)
class Part:
    """One connected part of a packed cluster, as a cluster of its own."""
    cluster: Cluster
    inputs: tuple   # per input of the part: its index among the whole cluster's inputs
    outputs: tuple  # per output of the part: its index among the whole cluster's outputs


def connected_parts(cluster: Cluster) -> list:
    """The cluster's ops split where no value flows between them, in the
    order of their first op: a packed cluster (kernel packing) has several
    parts, every other one. Inputs that several parts read do not join them,
    and ops without inputs (constants, which lowering shares) are copied
    into every part that reads them."""
    root: dict = {}

    def find(x):
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    sources = {op.name for op in cluster.ops if not op.inputs}
    for op in cluster.ops:
        root[op.name] = op.name
        for i in op.inputs:
            if i in root and i not in sources:
                a, b = find(i), find(op.name)
                if a != b:
                    root[b] = a
    readers: dict = {}  # source op -> roots of the parts that read it
    for op in cluster.ops:
        for i in op.inputs:
            if i in sources:
                readers.setdefault(i, set()).add(find(op.name))
    # A source that is an output is a part of its own (written once, by that
    # part). One that is neither read nor an output (a Pow's exponent that
    # lowering turned into multiplies) joins no part: it computes nothing.
    outputs = set(cluster.outputs)
    order = list(dict.fromkeys(
        find(op.name) for op in cluster.ops
        if op.name not in sources or op.name in outputs))
    input_index = {n: i for i, (n, _) in enumerate(cluster.inputs)}
    parts = []
    for r in order:
        ops = tuple(op for op in cluster.ops
                    if (find(op.name) == r if op.name not in sources
                        else op.name == r or r in readers.get(op.name, ())))
        used = {i for op in ops for i in op.inputs if i in input_index}
        ins = tuple(sorted(input_index[n] for n in used))
        outs = tuple(j for j, o in enumerate(cluster.outputs)
                     if (o not in sources and o in root and find(o) == r) or o == r)
        parts.append(Part(cluster.subset(ins, ops, outs), ins, outs))
    return parts
