"""Static dtypes and shapes of every tensor in a GraphDef, by TF's shape inference."""

from __future__ import annotations

from typing import Dict, Optional

import tensorflow as tf

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters.graph_view import Tensor, parse_input

_DTYPES = {tf.float16: "float16", tf.bfloat16: "bfloat16", tf.float32: "float32",
           tf.float64: "float64", tf.int32: "int32", tf.int64: "int64", tf.bool: "bool"}


def to_tensor_type(dtype: tf.DType, shape: tf.TensorShape) -> Optional[ir.TensorType]:
    if dtype not in _DTYPES or shape.rank is None:
        return None
    return ir.TensorType(_DTYPES[dtype], tuple(shape.as_list()))


# Rounds of patching hints before giving up on the rest (they stay as inferred):
# each round settles one more layer of ops that shape inference cannot see through.
_MAX_HINT_ROUNDS = 16


def infer_types(graph_def, hints: Dict[str, tf.TensorSpec]) -> Dict[Tensor, Optional[ir.TensorType]]:
    """`hints` maps tensor names ('op:0') to specs known from the traced function;
    they stand in for tensors whose shape inference cannot see through (a
    variable read after its handle was re-imported loses the variable's
    shape; the reads' hints give each variable's handle its shape first).

    A hint is a name's shape before Grappler, which may have rewired the node
    under that name (the arithmetic pass turns relu(x) -> max_pool into
    max_pool -> relu, keeping the name Relu and its pre-pool shape). So hints
    are patched in dependency order: only where every input of the op is
    already as known as hints can make it, and the op's own inference still
    knows less; a stale hint then meets a known shape it contradicts and is
    dropped."""
    variables = _variable_specs(graph_def, hints)
    names = {node.name for node in graph_def.node}
    # The feeds live under a scope no node of the graph uses: an imported
    # node whose name is taken would be renamed, and its type lost.
    scope = "fs_shape_feeds"
    while any(n == scope or n.startswith(scope + "/") for n in names):
        scope += "_"

    def imported(input_map):
        g = tf.Graph()
        with g.as_default():
            with g.name_scope(scope + "/"):
                feeds = {name: tf.compat.v1.placeholder(spec.dtype, spec.shape)
                         for name, spec in input_map.items()}
                # A variable's handle as the function receives it (a resource
                # placeholder) carries no shape; a VarHandleOp does, and every
                # read of the variable is then known from the first import on.
                for k, (name, spec) in enumerate(sorted(variables.items())):
                    feeds[name] = tf.raw_ops.VarHandleOp(
                        dtype=spec.dtype, shape=spec.shape, shared_name=f"{scope}/variable_{k}")
            tf.graph_util.import_graph_def(graph_def, input_map=feeds, name="")
        return g

    def wanted(t):
        hint = hints.get(t.name)
        if hint is not None and t.name not in patch and hint.dtype == t.dtype and \
                _known_dims(hint.shape) > _known_dims(t.shape) and \
                hint.shape.is_compatible_with(t.shape):
            return hint
        return None

    patch: Dict[str, tf.TensorSpec] = {}
    g = imported(patch)
    for _ in range(_MAX_HINT_ROUNDS):
        candidates = {t.name: wanted(t) for op in g.get_operations() if op.name in names
                      for t in op.outputs}
        candidates = {name: hint for name, hint in candidates.items() if hint is not None}
        frontier = {name: hint for name, hint in candidates.items()
                    if not any(i.name in candidates for i in g.get_tensor_by_name(name).op.inputs)}
        if not frontier:
            break
        patch.update(frontier)
        g = imported(patch)
    types: Dict[Tensor, Optional[ir.TensorType]] = {}
    for op in g.get_operations():
        if op.name not in names:
            continue
        for k, t in enumerate(op.outputs):
            types[(op.name, k)] = to_tensor_type(t.dtype, t.shape)
    for name, spec in patch.items():  # the patched tensors themselves keep no shape
        op_name, _, port = name.rpartition(":")
        types[(op_name, int(port))] = to_tensor_type(spec.dtype, spec.shape)
    return types


def _variable_specs(graph_def, hints: Dict[str, tf.TensorSpec]) -> Dict[str, tf.TensorSpec]:
    """The variable each resource placeholder stands for ('name:0' -> spec),
    from the hints of the ReadVariableOps that read it directly: only where
    it has such readers, all with hints that agree with each other and with
    the read's dtype."""
    # The resource placeholders and their reads, in one pass over the nodes.
    handles, reads = set(), []
    for node in graph_def.node:
        op = node.op
        if op == "ReadVariableOp":
            reads.append(node)
        elif op == "Placeholder" and node.attr["dtype"].type == tf.resource.as_datatype_enum:
            handles.add(node.name)
    specs: Dict[str, tf.TensorSpec] = {}
    conflicting = set()
    for node in reads:
        src, port, _ = parse_input(node.input[0])
        if src not in handles:
            continue
        name = f"{src}:{port}"
        hint = hints.get(f"{node.name}:0")
        spec = None if hint is None else tf.TensorSpec(hint.shape, hint.dtype)
        if spec is None or spec.dtype.as_datatype_enum != node.attr["dtype"].type or \
                specs.get(name, spec) != spec:
            conflicting.add(name)
        else:
            specs[name] = spec
    return {name: spec for name, spec in specs.items() if name not in conflicting}


def _known_dims(shape: tf.TensorShape) -> int:
    if shape.rank is None:
        return -1
    return sum(d is not None for d in shape.as_list())
