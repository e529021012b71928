"""Replace each fused cluster in a GraphDef by one `FusionStitch` node."""

from __future__ import annotations

import dataclasses
from typing import Dict, List

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2

from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor, parse_input, tensor_name
from tf_fusionstitch.rewriters.lowering import LoweredCluster


@dataclasses.dataclass
class Replacement:
    lowered: LoweredCluster
    kernel_key: str
    spec: str


def _unique_name(base: str, taken: set) -> str:
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def substitute(view: GraphView, replacements: List[Replacement]):
    """Returns (new GraphDef, {old tensor: new tensor name}) for every tensor
    produced by a removed node that something may still refer to."""
    taken = set(view.nodes)
    removed: Dict[str, str] = {}         # removed node -> FusionStitch node name
    tensor_map: Dict[Tensor, str] = {}   # removed tensor -> "fs:k"
    fs_nodes: List[node_def_pb2.NodeDef] = []
    names = []
    for r in replacements:
        first = r.lowered.nodes[-1]
        names.append(_unique_name(f"{first}/FusionStitch", taken))
    for r, fs_name in zip(replacements, names):
        for n in r.lowered.nodes:
            removed[n] = fs_name
        for k, t in enumerate(r.lowered.output_tensors):
            tensor_map[t] = f"{fs_name}:{k}"

    def remap(s: str) -> str:
        src, port, ctrl = parse_input(s)
        if src not in removed:
            return s
        if ctrl:
            return "^" + removed[src]
        mapped = tensor_map.get((src, port))
        if mapped is None:
            raise ValueError(f"{s} was fused away but is still read")
        return mapped

    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(view.graph_def.versions)
    out.library.CopyFrom(view.graph_def.library)
    for node in view.graph_def.node:
        if node.name in removed:
            continue
        new = out.node.add()
        new.CopyFrom(node)
        del new.input[:]
        seen_ctrl = set()
        for s in node.input:
            m = remap(s)
            if m.startswith("^"):
                if m in seen_ctrl:
                    continue
                seen_ctrl.add(m)
            new.input.append(m)

    for r, fs_name in zip(replacements, names):
        c = r.lowered.cluster
        node = out.node.add()
        node.name = fs_name
        node.op = "FusionStitch"
        node.input.extend(remap(tensor_name(t)) for t in r.lowered.input_tensors)
        members = set(r.lowered.nodes)
        ctrl = []
        for n in r.lowered.nodes:
            for src in view.control_inputs[n]:
                if src not in members:
                    m = remap("^" + src)
                    if m not in ctrl and m != "^" + fs_name:
                        ctrl.append(m)
        node.input.extend(ctrl)
        devices = {view.nodes[n].device for n in r.lowered.nodes}
        if len(devices) == 1:
            node.device = devices.pop()
        types = c.types()
        node.attr["Tin"].CopyFrom(_type_list([t.dtype for _, t in c.inputs]))
        node.attr["Tout"].CopyFrom(_type_list([types[o].dtype for o in c.outputs]))
        shapes = attr_value_pb2.AttrValue()
        for o in c.outputs:
            shapes.list.shape.add().CopyFrom(
                tf.TensorShape(list(types[o].shape)).as_proto())
        node.attr["output_shapes"].CopyFrom(shapes)
        node.attr["spec"].s = r.spec.encode()
        node.attr["kernel_key"].s = r.kernel_key.encode()
        fs_nodes.append(node)
    return out, tensor_map


def _type_list(dtypes: List[str]) -> attr_value_pb2.AttrValue:
    a = attr_value_pb2.AttrValue()
    a.list.type.extend(tf.dtypes.as_dtype(d).as_datatype_enum for d in dtypes)
    return a
