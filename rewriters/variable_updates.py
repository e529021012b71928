"""Variable updates the fusion pass can take into its kernels.

1. A variable's add/sub update becomes a plain assignment of a computed value,
   so the arithmetic can join the fused kernel that computes the update.
2. A read right after an assignment takes the assigned value directly, so the
   kernel that computed it can also compute what reads it.

`AssignAddVariableOp(v, delta)` reads the variable, adds and writes back in
place: one more pass over memory after the kernel that wrote `delta`. It is
rewritten as

    read = ReadVariableOp(v)            (after every op the update waited for)
    new  = AddV2(read, delta)           (Sub for AssignSubVariableOp)
    AssignVariableOp(v, new)            (same name, inputs, and control edges)

`AddV2` is fusible, so it joins `delta`'s cluster, which then writes the new
value instead of the delta; the assignment adopts that buffer without a copy
when nothing else holds it. An optimizer's moment and weight updates (Adam's
`m += (g - m) * (1 - beta1)`) lose a read-modify-write pass each.

Ordering is kept: the new read waits for the update's control inputs (the
ops TF ordered before it on that resource), and every later op on the
resource already waits for the node that keeps the update's name. The read is
not made to wait for `delta`, which would put a path from `delta`'s cluster
through the read back into it and stop the add from fusing; no op can write
the variable between them without a control edge to the update (TF's
automatic control dependencies chain every op on one resource).

Only float updates whose delta comes from an op the fusion pass can fuse, and
whose delta has the variable's static shape (from the graph's own reads of
it), are rewritten: anywhere else the add would be a kernel of its own, as
expensive as the in-place update it replaced, or would broadcast a delta TF
rejects.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Set, Tuple

from tensorflow.core.framework import graph_pb2, types_pb2

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters.graph_view import (GraphView, Tensor, fresh_name,
                                                  parse_input)

UPDATES = {"AssignAddVariableOp": "AddV2", "AssignSubVariableOp": "Sub"}
_FLOAT_TYPES = (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16, types_pb2.DT_FLOAT,
                types_pb2.DT_DOUBLE)
# Ops whose effect on a variable is known: reads, writes, and aliases of the
# handle. A variable also reached by any other op (a function call, a loop)
# keeps its updates as they are.
_RESOURCE_OPS = frozenset({
    "ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "ResourceGather", "ResourceGatherNd", "VariableShape", "VarIsInitializedOp", "Identity",
})


class _Variables:
    """The ops on each variable of a graph: handles are followed through
    Identity to their root (a placeholder or VarHandleOp)."""

    def __init__(self, graph_def):
        nodes = {n.name: n for n in graph_def.node}
        self.root: Dict[Tensor, Tensor] = {}
        self.ops: Dict[Tensor, List[str]] = {}
        self.untracked: Set[Tensor] = set()
        consumers: Dict[Tensor, List[str]] = {}
        for n in graph_def.node:
            for s in n.input:
                src, port, ctrl = parse_input(s)
                if not ctrl:
                    consumers.setdefault((src, port), []).append(n.name)
        for n in graph_def.node:
            if n.op in ("Placeholder", "VarHandleOp") and \
                    n.attr["dtype"].type == types_pb2.DT_RESOURCE:
                self._walk((n.name, 0), (n.name, 0), nodes, consumers)

    def _walk(self, root: Tensor, handle: Tensor, nodes, consumers) -> None:
        """The ops on `root` through chains of Identity, in depth-first order
        (an explicit stack of the consumers each handle has left: a chain
        may be as long as the graph)."""
        self.root[handle] = root
        stack = [iter(consumers.get(handle, []))]
        while stack:
            for name in stack[-1]:
                op = nodes[name].op
                if op not in _RESOURCE_OPS:
                    self.untracked.add(root)
                elif op == "Identity":
                    self.root[(name, 0)] = root
                    stack.append(iter(consumers.get((name, 0), [])))
                    break
                else:
                    self.ops.setdefault(root, []).append(name)
            else:
                stack.pop()

    def of(self, node) -> Optional[Tensor]:
        """The variable `node` acts on, if every op on it is known."""
        src, port, _ = parse_input(node.input[0])
        root = self.root.get((src, port))
        return None if root is None or root in self.untracked else root


def fold_variable_updates(graph_def, types: Dict[Tensor, Optional[ir.TensorType]],
                          fusible_op: Callable[[str], bool]) -> Tuple[object, Dict, int]:
    """(GraphDef, types, number of updates rewritten). `fusible_op(op_type)`
    says whether the fusion pass may fuse an op of that type."""
    producers = {n.name: n for n in graph_def.node}
    variables = _Variables(graph_def)
    read_types = _variable_types(graph_def, types, variables)
    updates = [n for n in graph_def.node
               if _foldable(n, producers, types, read_types, variables, fusible_op)]
    if not updates:
        return graph_def, types, 0
    position = {name: i for i, name in enumerate(GraphView(graph_def, types).order)}
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    del out.node[:]
    types = dict(types)
    taken: Set[str] = set(producers)
    folded = {n.name for n in updates}
    for node in graph_def.node:
        if node.name not in folded:
            out.node.add().CopyFrom(node)
            continue
        # The new read follows every op on the variable that precedes the
        # update in topological order: TF ordered them before it, though
        # Grappler may have dropped the direct control edge for a longer path.
        earlier = sorted((p for p in variables.ops[variables.of(node)]
                          if p != node.name and position[p] < position[node.name]),
                         key=position.get)
        _fold_one(node, out, types, taken, ["^" + p for p in earlier])
    return out, types, len(updates)


def _variable_types(graph_def, types, variables: _Variables) -> Dict[Tensor, ir.TensorType]:
    """Variable -> the type its reads have, where that is static."""
    found: Dict[Tensor, ir.TensorType] = {}
    for n in graph_def.node:
        if n.op == "ReadVariableOp" and n.input and variables.of(n) is not None:
            t = types.get((n.name, 0))
            if t is not None and None not in t.shape:
                found[variables.of(n)] = t
    return found


def _foldable(node, producers, types, read_types, variables: _Variables, fusible_op) -> bool:
    if node.op not in UPDATES or node.attr["dtype"].type not in _FLOAT_TYPES:
        return False
    if len(node.input) < 2 or node.input[1].startswith("^") or variables.of(node) is None:
        return False
    src, port, _ = parse_input(node.input[1])
    # The add would broadcast a delta that TF's in-place update rejects, so
    # both shapes must be known and equal (a variable's shape is static).
    return fusible_op(producers[src].op) and \
        types.get((src, port)) is not None and \
        types[(src, port)] == read_types.get(variables.of(node))


def _fold_one(node, out, types, taken: Set[str], after: List[str]) -> None:
    resource, delta = node.input[0], node.input[1]
    control = [s for s in node.input[2:] if s.startswith("^")]
    dtype = node.attr["dtype"].type
    src, port, _ = parse_input(delta)

    read = out.node.add()
    read.name, read.op, read.device = fresh_name(f"{node.name}/fs_read", taken), \
        "ReadVariableOp", node.device
    read.input.extend([resource] + list(dict.fromkeys(control + after)))
    read.attr["dtype"].type = dtype

    update = out.node.add()
    update.name, update.op, update.device = fresh_name(f"{node.name}/fs_value", taken), \
        UPDATES[node.op], node.device
    update.input.extend([read.name, delta])
    update.attr["T"].type = dtype

    assign = out.node.add()
    assign.name, assign.op, assign.device = node.name, "AssignVariableOp", node.device
    assign.input.extend([resource, update.name] + control)
    assign.attr["dtype"].type = dtype
    # TF's in-place update requires equal shapes; so does this assignment.
    assign.attr["validate_shape"].b = True
    for key in node.attr:
        if key.startswith("_"):  # TF's own annotations (e.g. read-only inputs)
            assign.attr[key].CopyFrom(node.attr[key])

    value_type = types[(src, port)]
    types[(read.name, 0)] = value_type
    types[(update.name, 0)] = value_type


def forward_assigned_reads(graph_def, fetches: Set[Tensor]) -> Tuple[object, int]:
    """(GraphDef, number of reads removed): a ReadVariableOp ordered right after
    an AssignVariableOp of the same variable (the only op on that variable
    among its control inputs) reads the value just assigned, so its readers
    take that value directly and its control dependents wait for the
    assignment. The kernel that computed the value can then also compute
    what reads it: Adam's weight update joins its moment updates. Fetched
    reads stay."""
    nodes = {n.name: n for n in graph_def.node}
    variables = _Variables(graph_def)
    fetched = {name for name, _ in fetches}
    forwarded: Dict[str, object] = {}  # read -> the assignment it follows
    for n in graph_def.node:
        if n.op != "ReadVariableOp" or n.name in fetched or variables.of(n) is None:
            continue
        writers = [nodes[s[1:]] for s in n.input[1:] if s.startswith("^")]
        same = [w for w in writers if w.op in _RESOURCE_OPS and w.op != "Identity"
                and variables.of(w) == variables.of(n)]
        if len(same) == 1 and same[0].op == "AssignVariableOp" and \
                same[0].attr["dtype"].type == n.attr["dtype"].type:
            forwarded[n.name] = same[0]
    if not forwarded:
        return graph_def, 0

    def remap(s: str) -> str:
        # A forwarded read's value may itself be a forwarded read: follow the chain.
        while True:
            src, _, ctrl = parse_input(s)
            if src not in forwarded:
                return s
            assign = forwarded[src]
            if ctrl:
                return "^" + assign.name
            s = assign.input[1]

    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    del out.node[:]
    for n in graph_def.node:
        if n.name in forwarded:
            continue
        new = out.node.add()
        new.CopyFrom(n)
        inputs = [remap(s) for s in n.input]
        # Control edges after data edges, each once (GraphDef's convention).
        data = [s for s in inputs if not s.startswith("^")]
        control = list(dict.fromkeys(s for s in inputs if s.startswith("^")
                                     and s[1:] != n.name))
        del new.input[:]
        new.input.extend(data + control)
    return out, len(forwarded)
