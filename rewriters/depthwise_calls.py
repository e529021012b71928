"""Depthwise convolutions that reach the graph as a call XLA compiles, as
TF's own DepthwiseConv2dNative op.

Keras writes `Conv2D(groups=channels)` (ConvNeXt's 7x7 convolutions, any
model that spells a depthwise convolution as a grouped one) as a Conv2D
whose filter has one input channel. TF's CPU Conv2D kernel refuses groups,
so Keras wraps that Conv2D in a nested `tf.function(jit_compile=True)`: the
graph calls a function XLA compiles, and XLA's CPU grouped convolution is
slow (ConvNeXtTiny's [4, 56, 56, 96] 7x7: 96 ms, against 0.84 ms for
DepthwiseConv2dNative on the same values). The same arithmetic as
DepthwiseConv2dNative takes it: a filter [kh, kw, 1, C * m] is the depthwise
filter [kh, kw, C, m] reshaped (output channel c * m + j is input channel c's
j-th), so the results differ only by the order of each output's 49
products' sums, as any two convolution kernels do.

Rewritten: a (Stateful)PartitionedCall with one output whose function is one
NHWC Conv2D (its filter an argument, or a variable the body reads) between
its arguments and its result, where the input's channels C (> 1) are known,
the filter is [kh, kw, 1, C * m], the dilations are 1, the two spatial
strides are equal, and the dtype is float32 or float64. Anything else stays
a call (`why_not` says why), and a caller's control edges stay on the new
ops.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters.graph_view import Tensor, edited_copy, fresh_name, parse_input

CALLS = ("PartitionedCall", "StatefulPartitionedCall")
_DTYPES = {types_pb2.DT_FLOAT: "float32", types_pb2.DT_DOUBLE: "float64"}
_BODY_OPS = {"Conv2D", "ReadVariableOp", "Identity", "NoOp"}


class Body:
    """What a function that is one convolution computes: which of its
    arguments are the input and the filter, and the Conv2D's attributes."""

    def __init__(self, conv, x_arg: int, filter_arg: int, filter_is_variable: bool):
        self.conv, self.x_arg, self.filter_arg = conv, x_arg, filter_arg
        self.filter_is_variable = filter_is_variable


def _node_of(reference: str) -> str:
    """A function body's input reference ("node:output:0", "arg") as its node or arg."""
    return reference.lstrip("^").split(":")[0]


def convolution_body(fdef) -> Optional[Body]:
    """The Body of a function that is one Conv2D from its arguments to its
    single result (Identity and NoOp around it, the filter possibly read from
    a variable argument), else None."""
    if len(fdef.signature.output_arg) != 1 or any(n.op not in _BODY_OPS
                                                  for n in fdef.node_def):
        return None
    convs = [n for n in fdef.node_def if n.op == "Conv2D"]
    reads = {n.name: n for n in fdef.node_def if n.op == "ReadVariableOp"}
    if len(convs) != 1 or len(reads) > 1:
        return None
    conv = convs[0]
    nodes = {n.name: n for n in fdef.node_def}
    result = _node_of(fdef.ret[fdef.signature.output_arg[0].name])
    while result in nodes and nodes[result].op == "Identity":
        result = _node_of(nodes[result].input[0])
    if result != conv.name:
        return None
    args = [a.name for a in fdef.signature.input_arg]
    data = [i for i in conv.input if not i.startswith("^")]
    if len(data) != 2 or data[0] not in args:
        return None
    if data[1] in args:
        return Body(conv, args.index(data[0]), args.index(data[1]), False)
    read = reads.get(_node_of(data[1]))
    if read is None or read.input[0] not in args:
        return None
    return Body(conv, args.index(data[0]), args.index(read.input[0]), True)


def why_not(body: Body, x_type: Optional[ir.TensorType],
            filter_type: Optional[ir.TensorType]) -> str:
    """"" where the call's convolution is a depthwise one DepthwiseConv2dNative
    runs, else the reason it stays a call."""
    attr = body.conv.attr
    if attr["data_format"].s != b"NHWC":
        return "not NHWC"
    if _DTYPES.get(attr["T"].type) is None:
        return f"dtype {tf.as_dtype(attr['T'].type).name} (float32 and float64 only)"
    if list(attr["dilations"].list.i) != [1, 1, 1, 1]:
        return "dilated"
    strides = list(attr["strides"].list.i)
    if strides[0] != 1 or strides[3] != 1 or strides[1] != strides[2]:
        return f"strides {strides} (DepthwiseConv2dNative takes equal spatial strides)"
    if x_type is None or len(x_type.shape) != 4 or not isinstance(x_type.shape[3], int):
        return "the input's channels are not known"
    if filter_type is None or len(filter_type.shape) != 4 or \
            not all(isinstance(d, int) for d in filter_type.shape):
        return "the filter's shape is not known"
    channels, (_, _, per_group, out_channels) = x_type.shape[3], filter_type.shape
    if per_group != 1 or channels < 2:
        return "not grouped by single channels"
    if out_channels % channels:
        return f"{out_channels} output channels are not a multiple of {channels}"
    return ""


def rewrite(graph_def, types: Dict[Tensor, Optional[ir.TensorType]],
            variable_types: Dict[Tensor, ir.TensorType]):
    """(GraphDef, types, [(call node, what it called, what it became)]):
    `graph_def` with its depthwise convolution calls as DepthwiseConv2dNative.
    `variable_types`: what the graph's resource inputs hold."""
    fdefs = {f.signature.name: f for f in graph_def.library.function}
    plans: Dict[str, Tuple[Body, List[int]]] = {}
    done = []
    for node in graph_def.node:
        if node.op not in CALLS or node.attr["f"].func.name not in fdefs:
            continue
        fname = node.attr["f"].func.name
        body = convolution_body(fdefs[fname])
        if body is None:
            continue
        data = [i for i in node.input if not i.startswith("^")]
        x = parse_input(data[body.x_arg])[:2]
        w = parse_input(data[body.filter_arg])[:2]
        filter_type = variable_types.get(w) if body.filter_is_variable else types.get(w)
        if why_not(body, types.get(x), filter_type):
            continue
        kh, kw, _, out_channels = filter_type.shape
        channels = types[x].shape[3]
        plans[node.name] = (body, [kh, kw, channels, out_channels // channels])
        done.append((node.name, f"{node.op} of {fname} (grouped Conv2D)",
                     "DepthwiseConv2dNative"))
    if not plans:
        return graph_def, types, []
    types = dict(types)

    def edit(new, node, out, taken):
        body, shape = plans[node.name]
        conv = body.conv
        control = [i for i in node.input if i.startswith("^")]
        data = [i for i in node.input if not i.startswith("^")]
        dtype = _DTYPES[conv.attr["T"].type]
        kernel = data[body.filter_arg]
        if body.filter_is_variable:
            read = out.node.add(name=fresh_name(f"{node.name}/fs_depthwise_kernel", taken),
                                op="ReadVariableOp", input=[kernel] + control,
                                device=node.device)
            read.attr["dtype"].type = conv.attr["T"].type
            types[(read.name, 0)] = ir.TensorType(dtype, (shape[0], shape[1], 1,
                                                          shape[2] * shape[3]))
            kernel = read.name
        const = out.node.add(name=fresh_name(f"{node.name}/fs_depthwise_shape", taken),
                             op="Const", device=node.device)
        const.attr["dtype"].type = types_pb2.DT_INT32
        const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.asarray(shape, np.int32)))
        types[(const.name, 0)] = ir.TensorType("int32", (4,))
        reshape = out.node.add(name=fresh_name(f"{node.name}/fs_depthwise_filter", taken),
                               op="Reshape", input=[kernel, const.name], device=node.device)
        reshape.attr["T"].type = conv.attr["T"].type
        reshape.attr["Tshape"].type = types_pb2.DT_INT32
        types[(reshape.name, 0)] = ir.TensorType(dtype, tuple(shape))
        new.op = "DepthwiseConv2dNative"
        del new.input[:]
        new.input.extend([data[body.x_arg], reshape.name] + control)
        new.attr.clear()
        for key in ("T", "strides", "padding", "data_format", "dilations"):
            new.attr[key].CopyFrom(conv.attr[key])
        if conv.attr["padding"].s == b"EXPLICIT":
            new.attr["explicit_paddings"].CopyFrom(conv.attr["explicit_paddings"])

    return edited_copy(graph_def, plans, edit), types, done
