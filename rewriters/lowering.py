"""Lower a set of GraphDef nodes to one fusion-IR cluster through the op table."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Set

import numpy as np
import tensorflow as tf

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor
from tf_fusionstitch.rewriters.op_table import OP_TABLE, LoweringContext, NotFusible, json_number


@dataclasses.dataclass
class LoweredCluster:
    nodes: List[str]              # TF nodes replaced, topological order
    cluster: ir.Cluster
    input_tensors: List[Tensor]   # feeds, in the order of cluster.inputs
    output_tensors: List[Tensor]  # TF tensors each cluster output replaces


_MISSING = object()


def constant_value(view: GraphView, name: str) -> Optional[np.ndarray]:
    """The value of Const node `name` (read-only: it is shared), else None."""
    key = ("const", name)
    value = view.memo.get(key, _MISSING)
    if value is _MISSING:
        value = _read_constant(view, name)
        view.memo[key] = value
    return value


def _read_constant(view: GraphView, name: str) -> Optional[np.ndarray]:
    node = view.nodes.get(name)
    if node is None or node.op != "Const":
        return None
    try:
        value = tf.make_ndarray(node.attr["value"].tensor)
    except (TypeError, ValueError):
        return None
    value.flags.writeable = False
    return value


def inlinable_scalar(view: GraphView, t: Tensor) -> Optional[np.ndarray]:
    key = ("scalar", t)
    value = view.memo.get(key, _MISSING)
    if value is _MISSING:
        value = constant_value(view, t[0])
        tt = view.type_of(t)
        if value is None or tt is None or value.shape != () or tt.dtype not in ir.DTYPES:
            value = None
        view.memo[key] = value
    return value


def lower_nodes(view: GraphView, nodes: Sequence[str], fetches: Set[Tensor],
                validate: bool = True) -> LoweredCluster:
    """Raises NotFusible / ir.SpecError when the nodes cannot form one cluster.
    validate=False skips the cluster's own checks (ir.Cluster.validate, about
    a third of the time) but its size's: for a search that only prices
    clusters, which must never price one too large to build; whatever is
    built from one is lowered again with them."""
    members = set(nodes)
    ordered = sorted(members, key=view.position.get)
    ops: List[ir.Op] = []
    types: Dict[str, ir.TensorType] = {}
    inputs: List[tuple] = []
    input_tensors: List[Tensor] = []
    value_of: Dict[Tensor, str] = {}
    inlined: Dict[Tensor, str] = {}

    def emit(prim, op_inputs, t, attrs):
        name = f"t{len(ops)}"
        op = ir.make_op(name, prim, op_inputs, t, **attrs)
        ops.append(op)
        types[name] = t
        return name

    def feed(t: Tensor) -> str:
        if t in value_of:  # produced in the cluster, or already an input
            return value_of[t]
        if t in inlined:
            return inlined[t]
        scalar = inlinable_scalar(view, t)
        if scalar is not None:
            inlined[t] = emit("const", [], view.type_of(t), {"value": json_number(scalar.item())})
            return inlined[t]
        tt = view.type_of(t)
        if tt is None:
            raise NotFusible(f"tensor {t} has an unknown shape")
        name = f"in{len(inputs)}"
        inputs.append((name, tt))
        input_tensors.append(t)
        types[name] = tt
        value_of[t] = name
        return name

    for node_name in ordered:
        node = view.nodes[node_name]
        rule = OP_TABLE.get(node.op)
        if rule is None:
            raise NotFusible(f"{node.op} is not in the op table")
        data = view.data_inputs[node_name]
        values, constants, scalars = [], [], []
        for i, t in enumerate(data):
            scalar = inlinable_scalar(view, t)
            scalars.append(None if scalar is None else scalar.item())
            if i in rule.static_inputs:
                values.append(None)
                constants.append(constant_value(view, t[0]))
            else:
                values.append(feed(t))
                constants.append(None)
        n_out = view.num_outputs[node_name]
        out_types = [view.type_of((node_name, k)) for k in range(n_out)]
        ctx = LoweringContext(node, values, types, out_types, constants, emit, scalars)
        produced = rule.lower(ctx)
        for k, v in enumerate(produced):
            value_of[(node_name, k)] = v

    outputs, output_tensors = [], []
    for node_name in ordered:
        for k in range(view.num_outputs[node_name]):
            t = (node_name, k)
            used_outside = any(c not in members for c in view.data_consumers.get(t, ()))
            if used_outside or t in fetches:
                if t not in value_of:
                    raise NotFusible(f"output {k} of {node_name} is used but not lowered")
                if value_of[t] in outputs:
                    raise NotFusible("one value leaves the cluster twice")
                outputs.append(value_of[t])
                output_tensors.append(t)
    if not outputs:
        raise NotFusible("cluster has no outputs")
    cluster = ir.Cluster(tuple(inputs), tuple(ops), tuple(outputs),
                         _equal_dims(view, inputs, input_tensors))
    if validate:
        cluster.validate()
    else:
        cluster.check_size()
    return LoweredCluster(ordered, cluster, input_tensors, output_tensors)


def _equal_dims(view: GraphView, inputs, tensors) -> tuple:
    """Classes of the inputs' dynamic extents the view proves equal."""
    if view.dims is None:
        return ()
    classes: Dict[object, list] = {}
    for (name, t), tensor in zip(inputs, tensors):
        symbols = view.dims(tensor)
        if symbols is None or len(symbols) != t.rank:
            continue
        for d, (extent, symbol) in enumerate(zip(t.shape, symbols)):
            if extent is None and symbol is not None and not isinstance(symbol, int):
                classes.setdefault(symbol, []).append((name, d))
    return tuple(sorted(tuple(sorted(c)) for c in classes.values() if len(c) > 1))
