"""Shape decisions TF leaves to runtime with a dynamic batch, settled at rewrite
time where dim_origins.py proves them: gradient reductions, the reshapes
back to an operand's shape, shape arithmetic, and sizes TF's shape
inference leaves unknown that are static (static_sizes).

The gradient of a broadcasting op (Add, Mul, BatchMatMul, ...) sums the
incoming gradient over the axes an operand was broadcast along:

    r0, r1 = BroadcastGradientArgs(Shape(x), Shape(y))
    dx = Reshape(Sum(g, r0), Shape(x))

With a dynamic batch, TF cannot fold the axes, so every such Sum stays a TF
op that a fused kernel cannot take in (its axes are not constant). Yet the
axes are usually decided: an operand's axis is summed exactly when its size
is 1 and the other's is not, so

- a static size decides it (1: summed, unless the other is a static 1 too);
- an unknown size is never summed when the other operand's size there is a
  static 1 or provably the same (dim_origins.py): then the gradient has the
  operand's size on that axis.

Anything else (an unknown size against another unknown one of a different
origin, or against a static size other than 1) stays as TF built it, unless
both unknown sizes are the function's input sizes and the caller, which
checks them on every call (versions.py), lets `fold` assume them equal
(InputEqualities): then the operand has the other's size there, as above. A Sum
over no axes becomes an Identity (TF's own Sum forwards its input then too);
otherwise its axes become a constant. Both differ from TF's runtime answer
at most by summing a size-1 axis, so this is done only for Sums read by
Reshapes alone, as TF's gradients read them.

The Reshape back to `Shape(x)` is then often no reshape at all: where its
input's dimensions are provably its target's, it becomes an Identity; where
they differ by static sizes and one unknown size of the same origin, its
target becomes a constant with -1 there. Either way it can join a kernel.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Set, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters.dim_origins import Dim, DimOrigins, Facts, InputDim, monomial
from tf_fusionstitch.rewriters.graph_view import (GraphView, Tensor, edited_copy, fresh_name,
                                                  parse_input)


InputPair = Tuple[InputDim, InputDim]


@dataclasses.dataclass
class InputEqualities:
    """Equalities between the function's input sizes that `fold` may assume,
    for a caller that checks them before every call (api.py keeps one
    version of the function per set of them). `allowed(pair)`: whether the
    caller will guarantee the pair. `fold` fills in `wanted`, the pairs that
    would decide a gradient Sum or that reach a call (a loop) together, and
    `assumed`, those it relied on; each pair is sorted."""
    allowed: Callable[[InputPair], bool]
    wanted: Set[InputPair] = dataclasses.field(default_factory=set)
    assumed: Set[InputPair] = dataclasses.field(default_factory=set)


@dataclasses.dataclass(frozen=True)
class Context:
    """What a graph's proofs may use beyond its own nodes: facts the caller
    proves of a function body's arguments, and the analysis of the
    functions the graph calls (dim_origins.py, call_dims.py)."""
    arg_facts: Optional[Dict[str, Facts]] = None
    calls: Optional[object] = None      # call_dims.CallDims
    # A loop body's variables, (argument node, value returned for it), in order.
    loop_vars: tuple = ()

    def origins(self, view: GraphView, fetches: Set[Tensor],
                equal_inputs: Set["InputPair"] = frozenset()) -> DimOrigins:
        return DimOrigins(view, fetches, equal_inputs, self.arg_facts, self.calls)


class Analyses:
    """The GraphView and DimOrigins of a graph, built once per (graph_def,
    types) and set of input sizes taken as equal. Each walks the whole graph,
    and the steps of `fold` (and the fusion pass after it) read the same
    graph whenever a step decided nothing: it then returns the very objects
    it was given. Neither is changed by its readers."""

    def __init__(self, context: Context, fetches: Set[Tensor]):
        self._context, self._fetches = context, fetches
        self._graph = None            # (graph_def, types) the entries below are of
        self._view: Optional[GraphView] = None
        self._origins: Dict[frozenset, DimOrigins] = {}

    def view(self, graph_def, types) -> GraphView:
        if self._graph is None or self._graph[0] is not graph_def \
                or self._graph[1] is not types:
            self._graph = (graph_def, types)
            self._view = GraphView(graph_def, types)
            self._origins = {}
        return self._view

    def origins(self, graph_def, types, equal_inputs=frozenset()) -> DimOrigins:
        view = self.view(graph_def, types)
        key = frozenset(equal_inputs)
        if key not in self._origins:
            self._origins[key] = self._context.origins(view, self._fetches, key)
        return self._origins[key]


def fold(graph_def, types: Dict[Tensor, Optional[ir.TensorType]], fetches: Set[Tensor],
         inputs: Optional[InputEqualities] = None, context: Context = Context(),
         analyses: Optional[Analyses] = None):
    """(GraphDef, types) with every decision below taken that can be, also
    those `inputs` lets it take by assuming input sizes equal (the pairs it
    relied on are then in inputs.assumed). `analyses`: of `context` and
    `fetches`, for a caller that reads the result's too."""
    analyses = analyses or Analyses(context, fetches)
    graph_def, types, _ = fold_shape_arithmetic(graph_def, types, fetches, analyses)
    equal = _assumed_equalities(graph_def, types, fetches, inputs, context, analyses) \
        if inputs else set()
    graph_def, types, _ = fold_broadcast_gradients(graph_def, types, fetches, equal, analyses)
    graph_def, types, _ = fold_reshapes(graph_def, types, fetches, equal, analyses)
    types, _ = static_sizes(graph_def, types, fetches, equal, analyses)
    return graph_def, types


def static_sizes(graph_def, types: Dict[Tensor, Optional[ir.TensorType]],
                 fetches: Set[Tensor], equal_inputs: Set[InputPair],
                 analyses: Analyses):
    """(types, number of tensors refined): sizes TF's shape inference left
    unknown that dim_origins derives as static (a weight gradient's rows
    through a tensordot's reshapes: a matrix product's output size is its
    operand's). A fused kernel then gets static extents, which its shape
    function checks on every call. Unrefined types are returned as given."""
    origins = analyses.origins(graph_def, types, equal_inputs)
    refined = dict(types)
    count = 0
    for t, tt in types.items():
        if tt is None or None not in tt.shape:
            continue
        dims = origins.dims(t)
        if dims is None or len(dims) != tt.rank:
            continue
        shape = tuple(d if d is not None or not isinstance(o, int) else o
                      for d, o in zip(tt.shape, dims))
        if shape != tt.shape:
            refined[t] = ir.TensorType(tt.dtype, shape)
            count += 1
    return (refined if count else types), count


def _assumed_equalities(graph_def, types, fetches: Set[Tensor],
                        inputs: InputEqualities, context: Context,
                        analyses: Analyses) -> Set[InputPair]:
    """The input size pairs that decide a gradient Sum nothing else decides,
    where `inputs` allows every pair that Sum needs; and the allowed pairs
    of input sizes that reach a loop (or another call) together: inside,
    a loop invariant or a gradient Sum may need them equal, and nothing
    but the caller's check can tell."""
    view = analyses.view(graph_def, types)
    sums = [n for n in graph_def.node if (n.name, 0) not in fetches and _candidate(view, n)]
    calls = context.calls is not None and any(context.calls.handles(n) for n in graph_def.node)
    if not sums and not calls:
        return set()
    origins = analyses.origins(graph_def, types)
    if calls:
        reaching = sorted(_input_dims_of_calls(origins, view))
        # (one input size per class of equal ones: each pair joins two classes)
        pairs = {(x, y) for i, x in enumerate(reaching) for y in reaching[i + 1:]}
        inputs.wanted |= pairs
        allowed = {p for p in pairs if inputs.allowed(p)}
        if allowed:
            inputs.assumed |= allowed
            origins = analyses.origins(graph_def, types, allowed)
    for node in sums:
        this, other = _operand_shapes(view, origins, node)
        if this is None or other is None:
            continue
        pairs = _input_pairs_deciding(origins, this, other)
        if pairs:
            inputs.wanted |= pairs
            if all(inputs.allowed(p) for p in pairs):
                inputs.assumed |= pairs
    return set(inputs.assumed)


def _input_dims_of_calls(origins: DimOrigins, view: GraphView) -> Set[InputDim]:
    """The function inputs' unknown sizes that some call's arguments carry."""
    found: Set[InputDim] = set()
    for node in view.graph_def.node:
        if not origins._calls.handles(node):
            continue
        for t in view.data_inputs[node.name]:
            facts = origins.facts(t)
            for field in (facts.dims, facts.value, facts.elem_dims, facts.elem_value):
                if isinstance(field, tuple):
                    found.update(d for d in map(origins.input_dim, field) if d is not None)
    return found


def _input_pairs_deciding(origins: DimOrigins, this: List[Dim],
                          other: List[Dim]) -> Optional[Set[InputPair]]:
    """The pairs of input sizes whose equality decides which axes the
    gradient of the operand shaped `this` sums (summed_axes), or None if
    such equalities cannot decide it (a size of no input, a static size
    other than 1 against an unknown one); empty if it is decided already."""
    rank = max(len(this), len(other))
    a = [1] * (rank - len(this)) + list(this)
    b = [1] * (rank - len(other)) + list(other)
    pairs: Set[InputPair] = set()
    for mine, theirs in zip(a, b):
        if isinstance(mine, int) or theirs == 1 or theirs == mine:
            continue
        x, y = origins.input_dim(mine), origins.input_dim(theirs)
        if x is None or y is None:
            return None
        pairs.add((min(x, y), max(x, y)))
    return pairs


def _operand_shapes(view: GraphView, origins: DimOrigins, node):
    """The BroadcastGradientArgs operand shapes of a gradient Sum: (the one
    it reduces to, the other)."""
    src, port, _ = parse_input(node.input[1])
    args = view.nodes[src]
    return (origins.value(parse_input(args.input[port])[:2]),
            origins.value(parse_input(args.input[1 - port])[:2]))


def fold_broadcast_gradients(graph_def, types: Dict[Tensor, Optional[ir.TensorType]],
                             fetches: Set[Tensor], equal_inputs: Set[InputPair],
                             analyses: Analyses):
    """(GraphDef, types, number of Sums whose axes were decided), taking the
    input size pairs `equal_inputs` as equal. Fetched Sums keep TF's
    runtime axes, whose shape the caller sees."""
    view = analyses.view(graph_def, types)
    sums = [n for n in graph_def.node
            if (n.name, 0) not in fetches and _candidate(view, n)]
    if not sums:
        return graph_def, types, 0
    origins = analyses.origins(graph_def, types, equal_inputs)
    decided: Dict[str, List[int]] = {}
    for node in sums:
        this, other = _operand_shapes(view, origins, node)
        g = view.type_of(parse_input(node.input[0])[:2])
        if this is None or other is None or g is None:
            continue
        axes = summed_axes(this, other)
        if axes is not None and g.rank >= max(len(this), len(other)):
            decided[node.name] = axes
    if not decided:
        return graph_def, types, 0

    types = dict(types)

    def edit(new, node, out, taken):
        axes = decided[node.name]
        g = view.type_of(parse_input(node.input[0])[:2])
        if not axes:
            _to_identity(new, node, ("Tidx", "keep_dims"))
            types[(node.name, 0)] = g
            return
        new.input[1] = _int32_const(out, f"{node.name}/fs_axes", axes, node.device, taken,
                                    types)
        new.attr["Tidx"].type = types_pb2.DT_INT32
        keep = node.attr["keep_dims"].b
        shape = [1 if a in axes else d for a, d in enumerate(g.shape) if keep or a not in axes]
        types[(node.name, 0)] = ir.TensorType(g.dtype, tuple(shape))
    return edited_copy(graph_def, decided, edit), types, len(decided)


def fold_reshapes(graph_def, types: Dict[Tensor, Optional[ir.TensorType]],
                  fetches: Set[Tensor], equal_inputs: Set[InputPair], analyses: Analyses):
    """(GraphDef, types, number of Reshapes decided): Reshapes whose target
    shape is a computed tensor, where dim_origins proves what it is (taking
    the input size pairs `equal_inputs` as equal)."""
    view = analyses.view(graph_def, types)
    reshapes = [n for n in graph_def.node if n.op == "Reshape" and len(n.input) >= 2
                and view.nodes[parse_input(n.input[1])[0]].op != "Const"]
    if not reshapes:
        return graph_def, types, 0
    origins = analyses.origins(graph_def, types, equal_inputs)
    decided: Dict[str, Optional[List[int]]] = {}   # None: an Identity
    for node in reshapes:
        source = origins.dims(parse_input(node.input[0])[:2])
        target = origins.value(parse_input(node.input[1])[:2])
        if source is None or target is None or -1 in target:
            continue
        if list(source) == list(target):
            decided[node.name] = None
            continue
        if sum(not isinstance(d, int) for d in target) == 1 and \
                monomial(source) == monomial(target):
            decided[node.name] = [d if isinstance(d, int) else -1 for d in target]
    if not decided:
        return graph_def, types, 0
    types = dict(types)

    def edit(new, node, out, taken):
        target = decided[node.name]
        if target is None:
            _to_identity(new, node, ("Tshape",))
            x = view.type_of(parse_input(node.input[0])[:2])
            y = types.get((node.name, 0))
            if x is not None and y is not None:   # equal sizes: keep what either knows
                types[(node.name, 0)] = ir.TensorType(x.dtype, tuple(
                    a if a is not None else b for a, b in zip(x.shape, y.shape)))
            return
        new.input[1] = _int32_const(out, f"{node.name}/fs_shape", target, node.device, taken,
                                    types)
        new.attr["Tshape"].type = types_pb2.DT_INT32
    return edited_copy(graph_def, decided, edit), types, len(decided)


# Int ops on shapes whose value, once every component is static, is a constant.
_SHAPE_ARITHMETIC = ("Prod", "Shape", "StridedSlice", "GatherV2", "Pack", "ConcatV2")


def fold_shape_arithmetic(graph_def, types: Dict[Tensor, Optional[ir.TensorType]],
                          fetches: Set[Tensor], analyses: Analyses):
    """(GraphDef, types, number of nodes made constants): shape computations
    over static sizes of tensors whose other sizes are dynamic (the product
    of a dense layer's contracted sizes), which Grappler cannot fold."""
    view = analyses.view(graph_def, types)
    nodes = [n for n in graph_def.node if n.op in _SHAPE_ARITHMETIC
             and (n.name, 0) not in fetches and view.num_outputs[n.name] == 1]
    if not nodes:
        return graph_def, types, 0
    origins = analyses.origins(graph_def, types)
    constants = {}
    for node in nodes:
        t = view.type_of((node.name, 0))
        value = origins.value((node.name, 0))
        if t is not None and value is not None and t.rank <= 1 and None not in t.shape \
                and all(isinstance(d, int) for d in value):
            constants[node.name] = np.array(value, t.dtype).reshape(t.shape)
    if not constants:
        return graph_def, types, 0

    def edit(new, node, out, taken):
        new.Clear()
        new.name, new.op, new.device = node.name, "Const", node.device
        # Control inputs keep their order; the data inputs are no longer read.
        new.input.extend(s for s in node.input if s.startswith("^"))
        value = constants[node.name]
        new.attr["dtype"].type = types_pb2.DT_INT32 if value.dtype == np.int32 \
            else types_pb2.DT_INT64
        new.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    return edited_copy(graph_def, constants, edit), types, len(constants)


def summed_axes(this: List[Dim], other: List[Dim]) -> Optional[List[int]]:
    """The axes (of the broadcast shape) the gradient of the operand shaped
    `this` sums over, against an operand shaped `other`; None if the sizes
    do not decide it."""
    rank = max(len(this), len(other))
    a = [1] * (rank - len(this)) + list(this)
    b = [1] * (rank - len(other)) + list(other)
    axes = []
    for axis, (mine, theirs) in enumerate(zip(a, b)):
        if isinstance(mine, int):
            if mine == 1 and theirs != 1:
                axes.append(axis)
        elif not (theirs == 1 or theirs == mine):
            return None
    return axes


def _candidate(view: GraphView, node) -> bool:
    """A Sum of a BroadcastGradientArgs output, read only by Reshapes."""
    if node.op != "Sum" or len(node.input) < 2 or node.input[1].startswith("^"):
        return False
    src, port, _ = parse_input(node.input[1])
    if view.nodes[src].op != "BroadcastGradientArgs" or port > 1:
        return False
    readers = view.data_consumers.get((node.name, 0), [])
    if not readers:
        return False
    for r in readers:
        reader = view.nodes[r]
        if reader.op != "Reshape" or parse_input(reader.input[0])[:2] != (node.name, 0) or \
                any(parse_input(s)[:2] == (node.name, 0) for s in reader.input[1:]):
            return False
    return True


def _to_identity(new, node, dropped_attrs) -> None:
    """Makes `new` (a copy of `node`) an Identity of node's first input."""
    control = [s for s in node.input[1:] if s.startswith("^")]
    new.op = "Identity"
    del new.input[:]
    new.input.extend([node.input[0]] + control)
    for key in dropped_attrs:
        del new.attr[key]


def _int32_const(out, base: str, values, device: str, taken: Set[str], types) -> str:
    const = out.node.add()
    const.name, const.op, const.device = fresh_name(base, taken), "Const", device
    const.attr["dtype"].type = types_pb2.DT_INT32
    const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.array(values, np.int32)))
    types[(const.name, 0)] = ir.TensorType("int32", (len(values),))
    return const.name
