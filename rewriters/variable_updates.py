"""Turn a variable's add/sub update into a plain assignment of a computed value,
so the arithmetic can join the fused kernel that computes the update.

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

from typing import Callable, Dict, Optional, Set, Tuple

from tensorflow.core.framework import graph_pb2, types_pb2

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters.graph_view import Tensor, parse_input

UPDATES = {"AssignAddVariableOp": "AddV2", "AssignSubVariableOp": "Sub"}
_FLOAT_TYPES = (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16, types_pb2.DT_FLOAT,
                types_pb2.DT_DOUBLE)


def fold_variable_updates(graph_def, types: Dict[Tensor, Optional[ir.TensorType]],
                          fusible_op: Callable[[str], bool]) -> Tuple[object, Dict, int]:
    """(GraphDef, types, number of updates rewritten). `fusible_op(op_type)`
    says whether the fusion pass may fuse an op of that type."""
    producers = {n.name: n for n in graph_def.node}
    read_types = _variable_types(graph_def, types)
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    del out.node[:]
    types = dict(types)
    taken: Set[str] = set(producers)
    rewritten = 0
    for node in graph_def.node:
        if not _foldable(node, producers, types, read_types, fusible_op):
            out.node.add().CopyFrom(node)
            continue
        _fold_one(node, out, types, taken)
        rewritten += 1
    return out, types, rewritten


def _variable_types(graph_def, types) -> Dict[str, ir.TensorType]:
    """Resource tensor name -> the type its reads have, where that is static."""
    found: Dict[str, ir.TensorType] = {}
    for n in graph_def.node:
        if n.op == "ReadVariableOp" and n.input:
            t = types.get((n.name, 0))
            if t is not None and None not in t.shape:
                found[n.input[0]] = t
    return found


def _foldable(node, producers, types, read_types, fusible_op) -> bool:
    if node.op not in UPDATES or node.attr["dtype"].type not in _FLOAT_TYPES:
        return False
    if len(node.input) < 2 or node.input[1].startswith("^"):
        return False
    src, port, _ = parse_input(node.input[1])
    # The add would broadcast a delta that TF's in-place update rejects, so
    # both shapes must be known and equal (a variable's shape is static).
    return fusible_op(producers[src].op) and \
        types.get((src, port)) is not None and \
        types[(src, port)] == read_types.get(node.input[0])


def _fresh(base: str, taken: Set[str]) -> str:
    name = base
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _fold_one(node, out, types, taken: Set[str]) -> None:
    resource, delta = node.input[0], node.input[1]
    control = [s for s in node.input[2:] if s.startswith("^")]
    dtype = node.attr["dtype"].type
    src, port, _ = parse_input(delta)

    read = out.node.add()
    read.name, read.op, read.device = _fresh(f"{node.name}/fs_read", taken), \
        "ReadVariableOp", node.device
    read.input.extend([resource] + control)
    read.attr["dtype"].type = dtype

    update = out.node.add()
    update.name, update.op, update.device = _fresh(f"{node.name}/fs_value", taken), \
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
