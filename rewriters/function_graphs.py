"""Functions of a graph's library as GraphDefs that can be typed, analysed and
rewritten: one Placeholder per argument, the body's nodes in GraphDef
naming, TF's shape inference over it, and what each resource or TensorList
tensor holds (shape inference cannot see into an argument's handle, so the
reads of what the caller's handles hold get those types as hints).

`FunctionGraphs` converts each (function, argument shapes, argument
handles) once per fusion pass: the dimension analysis of loops
(dim_origins.py) and the rewrite of function bodies (function_bodies.py)
read the same conversion. A conversion is shared: nobody edits it.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Set, Tuple

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, types_pb2
from tensorflow.python.framework import op_def_registry

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters import shapes as shape_inference
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor, parse_input

Shape = Optional[Tuple[Optional[int], ...]]   # None: unknown rank

WHILE_OPS = ("While", "StatelessWhile")

# Each function-valued attribute of a call op and which of the caller's inputs
# the function receives (a slice start).
FUNC_ATTRS = {
    "While": {"body": 0, "cond": 0},
    "StatelessWhile": {"body": 0, "cond": 0},
    "If": {"then_branch": 1, "else_branch": 1},
    "StatelessIf": {"then_branch": 1, "else_branch": 1},
    "Case": {"branches": 1},
    "StatelessCase": {"branches": 1},
    "PartitionedCall": {"f": 0},
    "StatefulPartitionedCall": {"f": 0},
}


def called_functions(node, library_names: Set[str]) -> List[Tuple[str, str, int]]:
    """(attr, function name, first caller input it receives) of each function
    `node` calls; a node whose op is itself a library function calls it with
    all its inputs."""
    calls = []
    if node.op in library_names:
        calls.append(("", node.op, 0))
    for attr, start in FUNC_ATTRS.get(node.op, {}).items():
        if attr not in node.attr:
            continue
        value = node.attr[attr]
        if value.HasField("func"):
            calls.append((attr, value.func.name, start))
        else:
            calls.extend((attr, f.name, start) for f in value.list.func)
    return calls


def _shape_tuple(t: Optional[ir.TensorType]) -> Shape:
    return None if t is None else tuple(t.shape)


def _proto_shape(p) -> Shape:
    if p.unknown_rank:
        return None
    return tuple(None if d.size < 0 else d.size for d in p.dim)


def site_shapes(node, start: int, types) -> List[Shape]:
    """Input shapes of the function a call node calls from input `start` on."""
    data = [parse_input(s) for s in node.input if not s.startswith("^")][start:]
    shapes = [_shape_tuple(types.get((src, port))) for src, port, _ in data]
    if node.op in WHILE_OPS:
        # The loop's shape invariants hold on every iteration; the first
        # iteration's inputs may be more specific than later ones.
        invariant = [_proto_shape(p) for p in node.attr["output_shapes"].list.shape] \
            if "output_shapes" in node.attr else []
        if len(invariant) != len(shapes):
            return [None] * len(shapes)
        return invariant
    return shapes


def function_to_graph_def(fdef, input_shapes: Sequence[Shape], library, versions):
    """(GraphDef with one Placeholder per argument and the body's nodes in
    GraphDef naming, {nested tensor name: flat name}). `library` goes along so
    nested calls resolve on import; `versions` too (a GraphDef without a
    producer version reads a Placeholder's scalar shape as unknown)."""
    gd = graph_pb2.GraphDef()
    gd.versions.CopyFrom(versions)
    gd.library.CopyFrom(library)
    names = {}
    for arg, shape in zip(fdef.signature.input_arg, input_shapes):
        node = gd.node.add()
        node.name = arg.name
        node.op = "Placeholder"
        node.attr["dtype"].type = arg.type
        if shape is not None and arg.type != types_pb2.DT_RESOURCE:
            # (an AttrValue built whole: copying an empty proto into
            # attr["shape"].shape would leave a scalar's attribute unset)
            node.attr["shape"].CopyFrom(
                attr_value_pb2.AttrValue(shape=tf.TensorShape(list(shape)).as_proto()))
        names[arg.name] = f"{arg.name}:0"
        names["^" + arg.name] = "^" + arg.name
    signatures = {f.signature.name: f.signature for f in library.function}
    for node in fdef.node_def:
        op_def = find_op_def(node.op, signatures)
        flat = 0
        for arg in op_def.output_arg:
            for i in range(num_args(arg, node)):
                names[f"{node.name}:{arg.name}:{i}"] = f"{node.name}:{flat}"
                flat += 1
        names["^" + node.name] = "^" + node.name
    for node in fdef.node_def:
        new = gd.node.add()
        new.CopyFrom(node)
        del new.input[:]
        for s in node.input:
            if s not in names:
                raise ValueError(f"node {node.name} reads {s!r}, which the function lacks")
            new.input.append(names[s])
    return gd, names


def find_op_def(op: str, signatures):
    if op in signatures:
        return signatures[op]
    op_def = op_def_registry.get(op)
    if op_def is None:
        raise ValueError(f"op {op} is not registered")
    return op_def


def num_args(arg, node) -> int:
    if arg.number_attr:
        return node.attr[arg.number_attr].i
    if arg.type_list_attr:
        return len(node.attr[arg.type_list_attr].list.type)
    return 1


# Ops whose output (port) is an element of the TensorList they read (input 0).
_LIST_READS = {"TensorListPopBack": 1, "TensorListGetItem": 0}
_HINT_ROUNDS = 3


def handle_types(gd, order, types, arg_handles, call_handles):
    """The type of what each resource or TensorList tensor holds (a variable's
    value, a list's element), where known: from the reads of a variable, the
    tensors pushed into a list, the lists' sources, and `arg_handles` (the
    arguments') and `call_handles` ({node: [per output]}, call nodes)."""
    nodes = {n.name: n for n in gd.node}
    handles: Dict[Tensor, ir.TensorType] = dict(arg_handles)

    def data(node):
        return [parse_input(s)[:2] for s in node.input if not s.startswith("^")]

    def put(t, value):
        if value is not None and t not in handles:
            handles[t] = value

    for name in order:
        node = nodes[name]
        ins = data(node)
        if node.op == "ReadVariableOp" and ins:
            put(ins[0], types.get((name, 0)))
        elif node.op in ("TensorListPushBack", "TensorListSetItem") and ins:
            held, pushed = handles.get(ins[0]), types.get(ins[-1])
            put((name, 0), pushed if held is None else merge_handles(held, pushed))
        elif node.op in ("TensorListPopBack", "Identity") and ins:
            put((name, 0), handles.get(ins[0]))
        elif node.op == "TensorListFromTensor" and ins:
            t = types.get(ins[0])
            if t is not None and len(t.shape) >= 1:
                put((name, 0), ir.TensorType(t.dtype, tuple(t.shape[1:])))
        elif name in call_handles:
            for k, value in enumerate(call_handles[name]):
                put((name, k), value)
    return handles


def _read_hints(gd, handles) -> Dict[str, tf.TensorSpec]:
    """Shape hints for the outputs of reads of variables and lists whose
    contents are known: shape inference cannot see into an argument handle."""
    hints = {}
    for node in gd.node:
        ins = [parse_input(s)[:2] for s in node.input if not s.startswith("^")]
        port = 0 if node.op == "ReadVariableOp" else _LIST_READS.get(node.op)
        if port is None or not ins or ins[0] not in handles:
            continue
        t = handles[ins[0]]
        hints[f"{node.name}:{port}"] = tf.TensorSpec(list(t.shape), t.dtype)
    return hints


def merge_shapes(a: Shape, b: Shape) -> Shape:
    """The dimensions two shapes agree on."""
    if a is None or b is None or len(a) != len(b):
        return None
    return tuple(x if x == y else None for x, y in zip(a, b))


def merge_handles(a: Optional[ir.TensorType], b: Optional[ir.TensorType]):
    if a is None or b is None or a.dtype != b.dtype:
        return None
    shape = merge_shapes(a.shape, b.shape)
    return None if shape is None else ir.TensorType(a.dtype, shape)


@dataclasses.dataclass(frozen=True)
class ConvertedFunction:
    """A function as a typed GraphDef (shared: not to be edited)."""
    fdef: object
    graph_def: object
    names: Dict[str, str]                 # nested tensor name -> flat name
    types: Dict[Tensor, Optional[ir.TensorType]]
    args: Tuple[str, ...]                 # the Placeholders, in argument order
    rets: Tuple[Tensor, ...]              # the return values, in output order
    fetches: frozenset                    # rets and control outputs: what runs

    def view(self) -> GraphView:
        return GraphView(self.graph_def, self.types)


class FunctionGraphs:
    """Conversions of one library's functions, each made once."""

    def __init__(self, library, versions):
        self.library = library
        self.versions = versions
        self.fdefs = {f.signature.name: f for f in library.function}
        self._done: Dict[tuple, ConvertedFunction] = {}

    def convert(self, fname: str, shapes: Sequence[Shape],
                in_handles: Sequence[Optional[ir.TensorType]]) -> ConvertedFunction:
        """Raises (ValueError, TF's errors) when the function cannot be converted."""
        key = (fname, tuple(shapes), tuple(in_handles))
        done = self._done.get(key)
        if done is None:
            done = self._done[key] = self._convert(fname, shapes, in_handles)
        return done

    def _convert(self, fname, shapes, in_handles) -> ConvertedFunction:
        fdef = self.fdefs[fname]
        args = tuple(a.name for a in fdef.signature.input_arg)
        if len(shapes) != len(args) or len(in_handles) != len(args):
            raise ValueError(f"{fname} takes {len(args)} inputs, not {len(shapes)}")
        arg_handles = {(a, 0): h for a, h in zip(args, in_handles) if h is not None}
        body, names = function_to_graph_def(fdef, shapes, self.library, self.versions)
        hints: Dict[str, tf.TensorSpec] = {}
        for _ in range(_HINT_ROUNDS):
            types = shape_inference.infer_types(body, hints)
            handles = handle_types(body, GraphView(body, types).order, types, arg_handles, {})
            more = _read_hints(body, handles)
            if more == hints:
                break
            hints = more
        rets = tuple(parse_input(names[fdef.ret[a.name]])[:2]
                     for a in fdef.signature.output_arg)
        fetches: Set[Tensor] = set(rets)
        fetches.update((node_name, 0) for node_name in fdef.control_ret.values())
        return ConvertedFunction(fdef, body, names, types, args, rets, frozenset(fetches))

