"""Static dtypes and shapes of every tensor in a GraphDef, by TF's shape inference."""

from __future__ import annotations

from typing import Dict, Optional

import tensorflow as tf

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters.graph_view import Tensor

_DTYPES = {tf.float16: "float16", tf.bfloat16: "bfloat16", tf.float32: "float32",
           tf.float64: "float64", tf.int32: "int32", tf.int64: "int64", tf.bool: "bool"}


def to_tensor_type(dtype: tf.DType, shape: tf.TensorShape) -> Optional[ir.TensorType]:
    if dtype not in _DTYPES or shape.rank is None:
        return None
    return ir.TensorType(_DTYPES[dtype], tuple(shape.as_list()))


def infer_types(graph_def, hints: Dict[str, tf.TensorSpec]) -> Dict[Tensor, Optional[ir.TensorType]]:
    """`hints` maps tensor names ('op:0') to specs known from the traced function;
    they stand in for tensors whose shape inference cannot see through (a
    variable read after its handle was re-imported loses the variable's shape)."""
    def imported(input_map):
        g = tf.Graph()
        with g.as_default():
            feeds = {name: tf.compat.v1.placeholder(spec.dtype, spec.shape)
                     for name, spec in input_map.items()}
            tf.graph_util.import_graph_def(graph_def, input_map=feeds, name="")
        return g

    g = imported({})
    patch = {}
    for op in g.get_operations():
        for k, t in enumerate(op.outputs):
            hint = hints.get(f"{op.name}:{k}")
            if hint is not None and hint.dtype == t.dtype and _known_dims(hint.shape) > \
                    _known_dims(t.shape) and hint.shape.is_compatible_with(t.shape):
                patch[f"{op.name}:{k}"] = hint
    if patch:
        g = imported(patch)
    types: Dict[Tensor, Optional[ir.TensorType]] = {}
    for op in g.get_operations():
        for k, t in enumerate(op.outputs):
            types[(op.name, k)] = to_tensor_type(t.dtype, t.shape)
    for name, spec in patch.items():  # the patched tensors themselves keep no shape
        op_name, _, port = name.rpartition(":")
        types[(op_name, int(port))] = to_tensor_type(spec.dtype, spec.shape)
    return types


def _known_dims(shape: tf.TensorShape) -> int:
    if shape.rank is None:
        return -1
    return sum(d is not None for d in shape.as_list())
