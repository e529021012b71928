"""The gradient of slices that tile an axis, as the concatenation it is.

A recurrent cell that slices one matrix product into gates (Keras' GRU
takes `inner[:, :u]`, `inner[:, u:2u]`, `inner[:, 2u:]`) gets, from TF's
gradient, one StridedSliceGrad per slice (a zero tensor of the full shape
with the slice's gradient written in) and an AddN of them: three zero
fills, three strided writes and a sum of three full tensors, once per time
step. Where the slices are contiguous, take every other axis whole and
together cover their axis exactly once, that sum is the slices' gradients
concatenated in order, which is one ConcatV2. (Each element is then the one
gradient that covers it instead of that gradient plus zeros: the same
value, except that a -0.0 stays -0.0.)

The full shape comes from the StridedSliceGrad's `shape` input, which TF's
gradient builds at run time; dim_origins.py proves its size along the axis.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters.dim_origins import DimOrigins
from tf_fusionstitch.rewriters.graph_view import (GraphView, Tensor, edited_copy, fresh_name,
                                                  parse_input)

_MASKS = ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")


def candidates(graph_def) -> bool:
    """Whether some AddN sums StridedSliceGrads only (a cheap look first)."""
    ops = {n.name: n.op for n in graph_def.node}
    return any(n.op == "AddN" and all(ops.get(parse_input(s)[0]) == "StridedSliceGrad"
                                      for s in n.input if not s.startswith("^"))
               for n in graph_def.node)


def concat_tiled_slice_gradients(graph_def, types: Dict[Tensor, Optional[ir.TensorType]],
                                 origins: DimOrigins, view: Optional[GraphView] = None):
    """(GraphDef, types, number of AddNs made ConcatV2s). `view`: of
    (graph_def, types), where the caller has one."""
    view = view or GraphView(graph_def, types)
    plans: Dict[str, Tuple[int, List[Tensor]]] = {}
    for node in graph_def.node:
        if node.op == "AddN":
            plan = _tiling(view, origins, node)
            if plan is not None:
                plans[node.name] = plan
    if not plans:
        return graph_def, types, 0
    types = dict(types)

    def concat(new, node, out, taken):
        axis, parts = plans[node.name]
        const = out.node.add()
        const.name = fresh_name(f"{node.name}/fs_axis", taken)
        const.op, const.device = "Const", node.device
        const.attr["dtype"].type = types_pb2.DT_INT32
        const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.int32(axis)))
        types[(const.name, 0)] = ir.TensorType("int32", ())
        control = [s for s in node.input if s.startswith("^")]
        new.op = "ConcatV2"
        del new.input[:]
        new.input.extend([f"{src}:{port}" for src, port in parts] + [const.name] + control)
        dtype = node.attr["T"].type
        new.attr.clear()
        new.attr["N"].i = len(parts)
        new.attr["T"].type = dtype
        new.attr["Tidx"].type = types_pb2.DT_INT32
    out = edited_copy(graph_def, plans, concat)
    return out, types, len(plans)


def _tiling(view: GraphView, origins: DimOrigins, node) -> Optional[Tuple[int, List[Tensor]]]:
    """(axis, the slices' gradients in order along it) if the AddN's inputs
    are StridedSliceGrads of slices that tile one axis of one shape."""
    grads = [view.nodes[src] for src, _ in view.data_inputs[node.name]]
    if len(grads) < 2 or any(g.op != "StridedSliceGrad" for g in grads):
        return None
    shapes = [origins.value(view.data_inputs[g.name][0]) for g in grads]
    shape = shapes[0]
    if shape is None or any(other != shape for other in shapes[1:]):
        return None
    ranges = []
    for g in grads:
        r = _slice_range(view, g, shape)
        if r is None:
            return None
        ranges.append(r + (view.data_inputs[g.name][4],))
    axes = {a for a, _, _, _ in ranges}
    if len(axes) != 1:
        return None
    axis = axes.pop()
    ranges.sort(key=lambda r: r[1])
    at = 0
    for _, begin, end, _ in ranges:
        if begin != at or end <= begin:
            return None
        at = end
    if at != shape[axis]:
        return None
    return axis, [dy for _, _, _, dy in ranges]


def _slice_range(view: GraphView, grad, shape) -> Optional[Tuple[int, int, int]]:
    """(axis, begin, end) of a stride-1 slice that takes every other axis of
    `shape` whole, where the sliced axis has a static size."""
    mask = {k: grad.attr[k].i for k in _MASKS}
    if mask["ellipsis_mask"] or mask["new_axis_mask"] or mask["shrink_axis_mask"]:
        return None
    begin, end, strides = (_const(view, t) for t in view.data_inputs[grad.name][1:4])
    if begin is None or end is None or strides is None or len(strides) != len(shape) \
            or np.any(strides != 1):
        return None
    sliced = []
    for a, size in enumerate(shape):
        b = 0 if (mask["begin_mask"] >> a) & 1 else int(begin[a])
        e = None if (mask["end_mask"] >> a) & 1 else int(end[a])
        if isinstance(size, int):
            b = b + size if b < 0 else b
            e = size if e is None else (e + size if e < 0 else min(e, size))
            whole = b == 0 and e == size
        else:   # an axis of unknown size is whole only where the end mask says so
            whole = b == 0 and e is None
        if not whole:
            if not isinstance(size, int):
                return None
            sliced.append((a, b, e))
    return sliced[0] if len(sliced) == 1 else None


def _const(view: GraphView, t: Tensor) -> Optional[np.ndarray]:
    node = view.nodes[t[0]]
    if node.op != "Const":
        return None
    return np.asarray(tf.make_ndarray(node.attr["value"].tensor)).reshape(-1)
