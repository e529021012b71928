"""Which dynamic dimensions of a graph are equal: every unknown dimension gets
an origin, and two dimensions with one origin are equal whenever the graph
runs. TF's shape inference says only "unknown" (-1) for both.

Origins are found in one pass in topological order. A function input's
unknown dimension is its own origin; ops pass origins on where their output
dimension is, by the op's definition, one of their input dimensions:
elementwise ops (an operand whose dimension is a static 1 broadcasts, the
others must agree), reductions and transposes (the kept or permuted axes),
matrix products and einsums (the labels that survive), gathers, strided
slices (the axes taken whole), splits and unstacks (the axes not split),
concatenations and stacks, and reshapes
whose target shape is built from `Shape` of other tensors (TF's gradients
build every reshape back to an input's shape that way) or has one -1 that
only one unknown input size can fill. Any other unknown dimension is an
origin of its own. Small int vectors (shapes, their slices, packs and
concatenations) are tracked by value, component by component.

Ops that fail unless two sizes are equal (a matrix product's contracted
sizes, an einsum label's sizes, the operands of AddN and Pack, a
concatenation's other axes) make their origins one: a graph in which they
differ raises before anything of this rewrite could matter.

An origin equality is a proof; a missing one is only "not known".

TensorLists (what a recurrent layer reads its steps from and pushes what
its gradient needs into) carry their elements' dimensions and, for small
int vectors, values, so an element read back has the dimensions and value
of what was put in: the join of everything pushed or set, where a list
with no elements yet agrees with anything (BOTTOM). Inside a function,
the arguments may come with `Facts` from the caller (`arg_facts`); calls
of functions (While loops, If, PartitionedCall) are analysed by
call_dims.py, which gives each call's outputs what its body proves of
them.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List, Optional, Set, Tuple, Union

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters import op_table
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor

# A dimension: a static size, the origin of an unknown one ("dim", node,
# port, axis), or a product of origins and a static factor ("prod", origins,
# factor), as a reshape that flattens axes makes.
Dim = Union[int, Tuple]

_REDUCTIONS = ("Sum", "Mean", "Max", "Min", "Prod", "All", "Any")
_BATCH_MATMULS = ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
_PASS_VALUE = ("Identity", "Cast", "StopGradient")
# Ops whose operands after the first are vectors along the input's channel axis
# (its last, or 1 where data_format is NC...).
_CHANNEL_OPS = ("BiasAdd", "BiasAddV1", "FusedBatchNorm", "FusedBatchNormV2",
                "FusedBatchNormV3")
# Int vectors longer than this are not shapes; they are not tracked.
_MAX_VECTOR = 16


# An unknown size of a function input: (Placeholder name, axis).
InputDim = Tuple[str, int]

# What a TensorList with no elements holds, per component or whole: it
# agrees with anything pushed later.
BOTTOM = ("bottom",)

_LIST_DTYPE_OPS = ("EmptyTensorList", "TensorListReserve", "TensorListFromTensor")


@dataclasses.dataclass(frozen=True)
class Facts:
    """What is known of one tensor, in a form that crosses into a function
    it is passed to: its dimensions, its value (a small int vector) and,
    for a TensorList, its elements' dimensions and values. Each component
    is a static int, None (nothing known), BOTTOM (a list with no elements:
    agrees with anything) or a key; components with one key are equal.
    A whole field may be None (rank unknown) and a list's elements BOTTOM."""
    dims: Optional[tuple] = None
    value: Optional[tuple] = None
    elem_dims: object = None
    elem_value: object = None
    elem_dtype: Optional[str] = None


class DimOrigins:
    def __init__(self, view: GraphView, fetches: Optional[Set[Tensor]] = None,
                 equal_inputs: Iterable[Tuple[InputDim, InputDim]] = (),
                 arg_facts: Optional[Dict[str, Facts]] = None, calls=None):
        """With `fetches`, only ops that run (those the fetches or a stateful
        op depend on) may make origins one: TF prunes the others unrun, so
        they prove nothing. Without, every op counts. `equal_inputs`: pairs
        of input sizes taken as equal (a caller that checks them on every
        call: versions.py). `arg_facts`: {Placeholder name: Facts} proven by
        the caller of this function body. `calls`: a call_dims.CallDims
        that analyses the functions this graph calls (else their outputs
        are origins of their own)."""
        self._view = view
        self._parent: Dict[Tuple, Tuple] = {}            # union-find of equal origins
        self._dims: Dict[Tensor, List[Dim]] = {}
        self._values: Dict[Tensor, List[Dim]] = {}      # int vectors (a scalar: length 1)
        self._scalar: Dict[Tensor, bool] = {}
        # TensorLists: their elements' dimensions and values (BOTTOM, or a
        # list of components), and dtype; resources: the variable's type.
        self._elem_dims: Dict[Tensor, object] = {}
        self._elem_values: Dict[Tensor, object] = {}
        self._elem_dtype: Dict[Tensor, str] = {}
        self._variables: Dict[Tensor, ir.TensorType] = {}
        self._arg_facts = dict(arg_facts or {})
        self._outer: Dict[Dim, object] = {}             # seed origin -> the caller's key
        self._calls = calls
        self._call_outputs: Dict[str, List[Facts]] = {}
        self.call_args: Dict[str, Dict[str, List[Facts]]] = {}   # node -> function -> args
        self._runs = None if fetches is None else _ops_that_run(view, fetches)
        self._may_unify = True
        for a, b in equal_inputs:
            self.unify(_input_origin(a), _input_origin(b))
        for name in view.order:   # a variable's reads tell its type, wherever they are
            node = view.nodes[name]
            if node.op == "ReadVariableOp" and view.data_inputs[name]:
                known = view.type_of((name, 0))
                if known is not None:
                    self._variables.setdefault(view.data_inputs[name][0], known)
        for name in view.order:
            self._may_unify = self._runs is None or name in self._runs
            self._visit(view.nodes[name])
        # Each class of equal sizes that holds an input's unknown size: one of them.
        self._input_of: Dict[Dim, InputDim] = {}
        for name, node in view.nodes.items():
            if node.op == "Placeholder":
                for axis, d in enumerate(self._dims.get((name, 0), ())):
                    if _is_origin(d):
                        self._input_of.setdefault(self._find(d), (name, axis))

    def dims(self, t: Tensor) -> Optional[List[Dim]]:
        """The tensor's dimensions, or None if its rank is unknown."""
        dims = self._dims.get(t)
        return None if dims is None else [self._find(d) for d in dims]

    def value(self, t: Tensor) -> Optional[List[Dim]]:
        """The components of a small int vector (a shape), or None."""
        value = self._values.get(t)
        return None if value is None else [self._find(d) for d in value]

    def input_dim(self, d: Dim) -> Optional[InputDim]:
        """A function input's size proven equal to `d`, if there is one."""
        return None if not _is_origin(d) else self._input_of.get(self._find(d))

    def facts(self, t: Tensor) -> Facts:
        """What is known of `t`, for a function it is passed to; keys are
        this graph's origins (call_dims.py makes them portable)."""
        def comps(value):
            if value is None or value is BOTTOM:
                return value
            return tuple(c if c is BOTTOM or c is None else self._find(c) for c in value)
        return Facts(comps(self.dims(t)), comps(self.value(t)),
                     comps(self._elem_dims.get(t)), comps(self._elem_values.get(t)),
                     self._elem_dtype.get(t))

    def held_type(self, t: Tensor) -> Optional[ir.TensorType]:
        """What a resource or TensorList tensor holds (a variable's value, a
        list's element), as far as static sizes go; None if not known."""
        if t in self._variables:
            return self._variables[t]
        elems, dtype = self._elem_dims.get(t), self._elem_dtype.get(t)
        if elems is None or elems is BOTTOM or dtype not in ir.DTYPES:
            return None
        return ir.TensorType(dtype, tuple(c if isinstance(c, int) else None for c in elems))

    def outer_keys(self, d: Dim) -> frozenset:
        """The caller's keys of the arguments' components proven equal to `d`."""
        if not _is_origin(d):
            return frozenset()
        root = self._find(d)
        return frozenset(key for seed, key in self._outer.items() if self._find(seed) == root)

    def join(self, a, b):
        """The component both `a` and `b` are (BOTTOM agrees with anything)."""
        if a is BOTTOM:
            return b
        if b is BOTTOM:
            return a
        if a is None or b is None:
            return None
        a, b = self._find(a), self._find(b)
        return a if a == b else None

    def join_all(self, a, b):
        """Component by component (None: the rank is not known)."""
        if a is BOTTOM:
            return b
        if b is BOTTOM:
            return a
        if a is None or b is None or len(a) != len(b):
            return None
        return [self.join(x, y) for x, y in zip(a, b)]

    def _seed(self, component):
        """This graph's dimension for a caller's component of an argument."""
        if component is None or component is BOTTOM or isinstance(component, int):
            return component
        seed = ("dim", ("outer", component), 0, 0)
        self._outer[seed] = component
        return seed

    def _seeded(self, value):
        if value is None or value is BOTTOM:
            return value
        return [self._seed(c) for c in value]

    def _find(self, d: Dim) -> Dim:
        if isinstance(d, int):
            return d
        if d[0] == "prod":
            return ("prod", tuple(sorted(self._find(t) for t in d[1])), d[2])
        root = d
        while root in self._parent:
            root = self._parent[root]
        while d != root:
            self._parent[d], d = root, self._parent[d]
        return root

    def unify(self, a: Dim, b: Dim) -> None:
        """Records that two sizes are equal whenever the graph runs."""
        if not self._may_unify:
            return
        a, b = self._find(a), self._find(b)
        if a == b or isinstance(a, int) or isinstance(b, int):
            return
        (fa, oa), (fb, ob) = monomial([a]), monomial([b])
        if fa == fb and len(oa) == len(ob) == 1:   # k*x == k*y: x == y
            self._parent[oa[0]] = ob[0]

    # -- the pass ------------------------------------------------------------
    def _visit(self, node) -> None:
        inputs = self._view.data_inputs[node.name]
        for port in range(self._view.num_outputs[node.name]):
            t = (node.name, port)
            known = self._view.type_of(t)
            if known is None:
                try:
                    self._visit_list(node, inputs, port)
                except (KeyError, IndexError, ValueError, TypeError):
                    pass   # an op form the rule does not cover: nothing known of it
                continue
            try:
                derived = _dims_rule(self, node, inputs, port, known.rank)
            except (KeyError, IndexError, ValueError, TypeError):
                derived = None  # an op form the rule does not cover: origins of its own
            if derived is None or len(derived) != known.rank:
                derived = [None] * known.rank
            # A static size wins; an unknown one the rule could not place
            # (None) is an origin of its own, equal to nothing else.
            dims = [size if size is not None else
                    derived[axis] if derived[axis] is not None else
                    ("dim", node.name, port, axis)
                    for axis, size in enumerate(known.shape)]
            self._dims[t] = dims
            if known.dtype in ("int32", "int64") and known.rank <= 1:
                try:
                    value = _value_rule(self, node, inputs, port)
                except (KeyError, IndexError, ValueError, TypeError):
                    value = None
                if value is not None and len(value) <= _MAX_VECTOR:
                    # a component nothing places is a size of its own
                    self._values[t] = [c if c is not None else ("dim", node.name, port, ("v", k))
                                       for k, c in enumerate(value)]
                    self._scalar[t] = known.rank == 0

    def _visit_list(self, node, inputs, port: int) -> None:
        """A TensorList output: its elements' dimensions, values and dtype."""
        t, op = (node.name, port), node.op
        if op in _LIST_DTYPE_OPS or op in ("TensorListPushBack", "TensorListSetItem"):
            self._elem_dtype[t] = _dtype_name(node.attr["element_dtype"].type)
        if op == "EmptyTensorList":
            dims, values = BOTTOM, BOTTOM
        elif op == "TensorListReserve":
            # Elements not set read as zeros of this shape; set ones must fit it.
            shape = self.value(inputs[0])
            dims = BOTTOM if shape is None or self._scalar.get(inputs[0]) \
                else [BOTTOM if c == -1 else c for c in shape]
            values = BOTTOM
        elif op == "TensorListFromTensor":
            x = self.dims(inputs[0])
            dims, values = (None if x is None else x[1:]), None
        elif op in ("TensorListPushBack", "TensorListSetItem"):
            lst, item = inputs[0], inputs[-1]
            dims = self.join_all(self._elem_dims.get(lst), self.dims(item))
            values = self.join_all(self._elem_values.get(lst), self.value(item))
        elif op in ("TensorListPopBack", "Identity", "ZerosLike") and port == 0:
            dims = self._elem_dims.get(inputs[0])
            values = None if op == "ZerosLike" else self._elem_values.get(inputs[0])
            if inputs[0] in self._elem_dtype:
                self._elem_dtype[t] = self._elem_dtype[inputs[0]]
        elif op == "Placeholder" and node.name in self._arg_facts:
            facts = self._arg_facts[node.name]
            dims, values = self._seeded(facts.elem_dims), self._seeded(facts.elem_value)
            if facts.elem_dtype:
                self._elem_dtype[t] = facts.elem_dtype
        elif self._calls is not None and self._calls.handles(node):
            facts = self._call_facts(node, port)
            dims, values = facts.elem_dims, facts.elem_value
            if facts.elem_dtype:
                self._elem_dtype[t] = facts.elem_dtype
        else:
            return
        for store, value in ((self._elem_dims, dims), (self._elem_values, values)):
            if value is not None:
                store[t] = value

    def _call_facts(self, node, port: int) -> Facts:
        """What the function `node` calls proves of its output `port`."""
        if node.name not in self._call_outputs:
            inputs = self._view.data_inputs[node.name]
            try:
                args, outputs = self._calls.analyse(self, node, inputs)
            except Exception:  # noqa: BLE001  (nothing proven: origins of their own)
                args, outputs = {}, []
            self.call_args[node.name] = args
            self._call_outputs[node.name] = outputs
        outputs = self._call_outputs[node.name]
        return outputs[port] if port < len(outputs) else Facts()

    def _const(self, t: Tensor) -> Optional[np.ndarray]:
        node = self._view.nodes[t[0]]
        if node.op != "Const":
            return None
        return tf.make_ndarray(node.attr["value"].tensor)


def _ops_that_run(view: GraphView, fetches: Set[Tensor]) -> Set[str]:
    """The fetched ops, the stateful ones (TF runs them even unfetched), and
    every op they depend on."""
    stack = [name for name, _ in fetches]
    for name, node in view.nodes.items():
        op_def = op_def_registry.get(node.op)
        if op_def is not None and op_def.is_stateful:
            stack.append(name)
    runs: Set[str] = set()
    while stack:
        name = stack.pop()
        if name in runs:
            continue
        runs.add(name)
        stack += [src for src, _ in view.data_inputs[name]] + view.control_inputs[name]
    return runs


def _combine(dims: List[Dim]) -> Optional[Dim]:
    """The common size of operands that must agree, where static 1s broadcast."""
    rest = {d for d in dims if d != 1}
    if not rest:
        return 1
    if len(rest) == 1:
        return rest.pop()
    static = {d for d in rest if isinstance(d, int)}
    return static.pop() if len(static) == 1 else None


def _broadcast(operands: List[List[Dim]], rank: int) -> List[Optional[Dim]]:
    padded = [[1] * (rank - len(o)) + list(o) for o in operands if len(o) <= rank]
    return [_combine([o[axis] for o in padded]) for axis in range(rank)]


def _dims_rule(origins: DimOrigins, node, inputs, port: int, rank: int):
    op = node.op
    if op == "Placeholder" and node.name in origins._arg_facts:
        return origins._seeded(origins._arg_facts[node.name].dims)
    if origins._calls is not None and origins._calls.handles(node):
        return _elements(origins._call_facts(node, port).dims)
    if (op, port) in (("TensorListPopBack", 1), ("TensorListGetItem", 0)):
        return _elements(origins._elem_dims.get(inputs[0]))
    if op == "TensorListStack":
        elems = _elements(origins._elem_dims.get(inputs[0]))
        return None if elems is None else [None] + elems
    dims = [origins.dims(t) for t in inputs]
    if op in _PASS_VALUE or op in ("ZerosLike", "OnesLike", "Snapshot"):
        return dims[0]
    if op == "AddN":                     # no broadcasting: equal shapes, or it raises
        _unify_all(origins, dims)
        return dims[0]
    if op in _REDUCTIONS:
        axes = origins._const(inputs[1])
        x = dims[0]
        reduced = {int(a) % len(x) for a in np.asarray(axes).reshape(-1)}
        keep = node.attr["keep_dims"].b
        return [1 if a in reduced else d for a, d in enumerate(x)
                if keep or a not in reduced]
    if op == "Transpose":
        perm = origins._const(inputs[1])
        return [dims[0][int(p)] for p in np.asarray(perm).reshape(-1)]
    if op in ("Reshape", "BroadcastTo", "Fill"):
        shape = origins.value(inputs[1] if op != "Fill" else inputs[0])
        if shape is None:
            return None
        if op == "Reshape" and shape.count(-1) == 1:
            return _fill_minus_one(dims[0], shape)
        return [None if d == -1 else d for d in shape]
    if op == "ExpandDims":
        axis = int(np.asarray(origins._const(inputs[1])).reshape(-1)[0])
        x = list(dims[0])
        x.insert(axis % (len(x) + 1), 1)
        return x
    if op == "Squeeze":
        drop = {int(a) % len(dims[0]) for a in node.attr["squeeze_dims"].list.i}
        return [d for a, d in enumerate(dims[0]) if a not in drop and (drop or d != 1)]
    if op == "MatMul":
        a, b = dims[0], dims[1]
        ta, tb = node.attr["transpose_a"].b, node.attr["transpose_b"].b
        origins.unify(a[0] if ta else a[1], b[1] if tb else b[0])
        return [a[1] if ta else a[0], b[0] if tb else b[1]]
    if op in _BATCH_MATMULS:
        a, b = dims[0], dims[1]
        ta, tb = node.attr["adj_x"].b, node.attr["adj_y"].b
        origins.unify(a[-2] if ta else a[-1], b[-1] if tb else b[-2])
        batch = _broadcast([a[:-2], b[:-2]], rank - 2)
        return batch + [a[-1] if ta else a[-2], b[-2] if tb else b[-1]]
    if op == "Einsum":
        return _einsum(origins, node.attr["equation"].s.decode(), dims)
    if op == "GatherV2" and node.attr["batch_dims"].i == 0:
        axis = int(np.asarray(origins._const(inputs[2])).reshape(-1)[0])
        params = dims[0]
        axis %= len(params)
        return params[:axis] + dims[1] + params[axis + 1:]
    if op == "ConcatV2":             # no broadcasting: other axes equal, or it raises
        axis = int(np.asarray(origins._const(inputs[-1])).reshape(-1)[0]) % rank
        parts = dims[:-1]
        _unify_all(origins, [p[:axis] + p[axis + 1:] for p in parts])
        sizes = [p[axis] for p in parts]
        total = sum(sizes) if all(isinstance(d, int) for d in sizes) else None
        return parts[0][:axis] + [total] + parts[0][axis + 1:]
    if op == "Pack":                 # equal shapes, or it raises
        _unify_all(origins, dims)
        axis = node.attr["axis"].i % rank
        return dims[0][:axis] + [len(dims)] + dims[0][axis:]
    if op == "StridedSlice":
        return _sliced_dims(origins, node, inputs, dims[0])
    if op == "UnsortedSegmentSum":   # the ids run along the data's leading axes, or it raises
        data, ids = dims[0], dims[1]
        for a, b in zip(data, ids):
            origins.unify(a, b)
        n = origins.value(inputs[2])
        return [n[0] if n else None] + list(data[len(ids):])
    if op in ("Split", "SplitV"):    # the split axis is TF's static size, the others kept
        value, axis_input = (inputs[1], inputs[0]) if op == "Split" else (inputs[0], inputs[2])
        x = list(origins.dims(value))
        x[int(np.asarray(origins._const(axis_input)).reshape(-1)[0]) % len(x)] = None
        return x
    if op == "Unpack":
        x = list(dims[0])
        del x[node.attr["axis"].i % len(x)]
        return x
    if op == "SparseSoftmaxCrossEntropyWithLogits":   # one label per row, or it raises
        origins.unify(dims[0][0], dims[1][0])
        return dims[0][:1] if port == 0 else dims[0]
    if op == "Tile":
        multiples = origins.value(inputs[1])
        return [_size(*monomial([d, m])) for d, m in zip(dims[0], multiples)]
    if op in _CHANNEL_OPS:   # per-channel parameters run along the channel axis only
        if port != 0:
            return None
        x = list(dims[0])
        channel = 1 if node.attr["data_format"].s.startswith(b"NC") else len(x) - 1
        for param in dims[1:]:
            origins.unify(x[channel], param[0])   # TF requires the sizes equal
            x[channel] = _combine([x[channel], param[0]])
        return x
    if op == "Select" and len(dims[0]) == 1 < len(dims[1]):   # a vector picks rows
        return _broadcast(dims[1:], rank)
    rule = op_table.OP_TABLE.get(op)
    if rule is not None and rule.kind in (op_table.ELEMENTWISE, op_table.COMPOSITE) \
            and port == 0 and all(d is not None for d in dims):
        return _broadcast(dims, rank)
    return None


def _sliced_dims(origins: DimOrigins, node, inputs, x: List[Dim]) -> List[Optional[Dim]]:
    """A StridedSlice's dimensions: an axis taken whole (both masks, stride
    +-1) keeps its size, a new axis is 1, a shrunk axis is gone; any other
    slice's size is left to TF's static shape (None here)."""
    begin, end, strides = (np.asarray(origins._const(t)).reshape(-1) for t in inputs[1:4])
    mask = {k: node.attr[k].i for k in ("begin_mask", "end_mask", "shrink_axis_mask",
                                        "ellipsis_mask", "new_axis_mask")}
    specs = len(strides)
    consuming = sum(1 for i in range(specs)
                    if not (mask["new_axis_mask"] >> i) & 1 and not (mask["ellipsis_mask"] >> i) & 1)
    out, axis = [], 0
    for i in range(specs):
        if (mask["ellipsis_mask"] >> i) & 1:
            covered = len(x) - consuming
            out += x[axis:axis + covered]
            axis += covered
        elif (mask["new_axis_mask"] >> i) & 1:
            out.append(1)
        elif (mask["shrink_axis_mask"] >> i) & 1:
            axis += 1
        else:
            whole = (mask["begin_mask"] >> i) & 1 and (mask["end_mask"] >> i) & 1 \
                and abs(int(strides[i])) == 1
            out.append(x[axis] if whole else None)
            axis += 1
    return out + x[axis:]


def _unify_all(origins: DimOrigins, shapes: List[List[Dim]]) -> None:
    """Records that operands an op requires to have one shape do."""
    for other in shapes[1:]:
        if len(other) == len(shapes[0]):
            for a, b in zip(shapes[0], other):
                origins.unify(a, b)


def _einsum(origins: DimOrigins, equation: str,
            dims: List[List[Dim]]) -> Optional[List[Dim]]:
    if "..." in equation or "->" not in equation:
        return None
    lhs, out = equation.replace(" ", "").split("->")
    by_label: Dict[str, List[Dim]] = {}
    for labels, operand in zip(lhs.split(","), dims):
        for label, d in zip(labels, operand):
            by_label.setdefault(label, []).append(d)
    for sizes in by_label.values():   # TF's Einsum requires a label's sizes equal
        for d in sizes[1:]:
            origins.unify(sizes[0], d)
    return [origins._find(by_label[label][0]) for label in out]


def _input_origin(d: InputDim) -> Dim:
    name, axis = d
    return ("dim", name, 0, axis)


def _is_origin(d: Dim) -> bool:
    return isinstance(d, tuple) and d[0] == "dim"


def monomial(dims: List[Dim]) -> Tuple[int, Tuple]:
    """The product of sizes as (static factor, sorted origins)."""
    factor, origins = 1, []
    for d in dims:
        if isinstance(d, int):
            factor *= d
        elif d[0] == "prod":
            factor *= d[2]
            origins += d[1]
        else:
            origins.append(d)
    return factor, tuple(sorted(origins))


def _size(factor: int, origins: Tuple) -> Dim:
    if not origins:
        return factor
    if factor == 1 and len(origins) == 1:
        return origins[0]
    return ("prod", origins, factor)


def _quotient(num: List[Dim], den: List[Dim]) -> Optional[Dim]:
    """prod(num) / prod(den) where it is a product of origins, else None."""
    (f_num, o_num), (f_den, o_den) = monomial(num), monomial(den)
    left = list(o_num)
    for o in o_den:
        if o not in left:
            return None
        left.remove(o)
    if f_den == 0 or f_num % f_den:
        return None
    return _size(f_num // f_den, tuple(left))


def _fill_minus_one(source: List[Dim], target: List[Dim]) -> List[Optional[Dim]]:
    """A reshape target's -1 is the input's size over the other target sizes."""
    fill = _quotient(source, [d for d in target if d != -1])
    return [fill if d == -1 else d for d in target]


def _elements(value) -> Optional[List[Dim]]:
    """A list's element components as dimensions (BOTTOM: not known)."""
    if value is None or value is BOTTOM:
        return None
    return [None if c is BOTTOM else c for c in value]


def _dtype_name(code: int) -> Optional[str]:
    try:
        return tf.dtypes.as_dtype(code).name
    except TypeError:
        return None


def _value_rule(origins: DimOrigins, node, inputs, port: int) -> Optional[List[Dim]]:
    op = node.op
    if op == "Placeholder" and node.name in origins._arg_facts:
        return origins._seeded(origins._arg_facts[node.name].value)
    if origins._calls is not None and origins._calls.handles(node):
        return _elements(origins._call_facts(node, port).value)
    if op in ("TensorListPopBack", "TensorListGetItem"):
        return _elements(origins._elem_values.get(inputs[0]))
    if op == "Const":
        value = np.asarray(tf.make_ndarray(node.attr["value"].tensor)).reshape(-1)
        return [int(v) for v in value]
    if op == "Shape":
        return origins.dims(inputs[0])
    if op in _PASS_VALUE:
        return origins.value(inputs[0])
    if op == "Pack" and node.attr["axis"].i == 0:
        parts = [origins.value(t) for t in inputs]
        if all(p is not None and origins._scalar.get(t) for p, t in zip(parts, inputs)):
            return [p[0] for p in parts]
        return None
    if op == "ConcatV2":
        parts = [origins.value(t) for t in inputs[:-1]]
        return None if any(p is None for p in parts) else [d for p in parts for d in p]
    if op == "GatherV2":
        vector, index = origins.value(inputs[0]), origins._const(inputs[1])
        return [vector[int(i)] for i in np.asarray(index).reshape(-1)]
    if op == "StridedSlice":
        return _strided_slice(origins, node, inputs)
    if op == "Prod" and not node.attr["keep_dims"].b:
        vector, axes = origins.value(inputs[0]), origins._const(inputs[1])
        if vector is not None and axes is not None and \
                list(np.asarray(axes).reshape(-1)) in ([0], [-1]):
            return [_size(*monomial(vector))]
    return None


def _strided_slice(origins: DimOrigins, node, inputs) -> Optional[List[Dim]]:
    vector = origins.value(inputs[0])
    begin, end, strides = (origins._const(t) for t in inputs[1:4])
    if vector is None or any(v is None or np.asarray(v).size != 1
                             for v in (begin, end, strides)):
        return None
    attr = {k: node.attr[k].i for k in ("begin_mask", "end_mask", "shrink_axis_mask",
                                        "ellipsis_mask", "new_axis_mask")}
    if attr["ellipsis_mask"] or attr["new_axis_mask"]:
        return None
    b, e, s = (int(np.asarray(v).reshape(-1)[0]) for v in (begin, end, strides))
    if attr["shrink_axis_mask"] & 1:
        return [vector[b]]
    return vector[slice(None if attr["begin_mask"] & 1 else b,
                        None if attr["end_mask"] & 1 else e, s)]

