"""Building the TF ops of a case: the case's ops emitted with tf.raw_ops,
and one tf.function that runs several cases side by side.
"""

from __future__ import annotations

from typing import List, Sequence

import tensorflow as tf

from tf_fusionstitch.tools.fuzzing.ops import (BINARY_OPS, CaseError, FEATURES_ARG, REDUCE_OPS,
                                               UNARY_OPS)


def build_outputs(case, args: Sequence) -> list:
    """Emits the case's ops on `args` (tensors for case['inputs']); returns the outputs."""
    raw = tf.raw_ops
    env = {inp["name"]: t for inp, t in zip(case["inputs"], args)}
    dts = {inp["name"]: inp["dtype"] for inp in case["inputs"]}
    for node in case["nodes"]:
        op, a = node["op"], node.get("attrs", {})
        xs = []
        for k, ref in enumerate(node["inputs"]):
            if isinstance(ref, str):
                xs.append(env[ref])
            else:
                other = next(dts[r] for r in node["inputs"] if isinstance(r, str))
                xs.append(tf.constant(ref["const"], dtype=other))
        if op in UNARY_OPS:
            y = getattr(raw, op)(**{("features" if op in FEATURES_ARG else "x"): xs[0]})
        elif op in BINARY_OPS:
            y = getattr(raw, op)(x=xs[0], y=xs[1])
        elif op == "Select":
            y = raw.Select(condition=xs[0], x=xs[1], y=xs[2])
        elif op == "SelectV2":
            y = raw.SelectV2(condition=xs[0], t=xs[1], e=xs[2])
        elif op in REDUCE_OPS:
            y = getattr(raw, op)(input=xs[0], axis=tf.constant(a["axis"], tf.int32),
                                 keep_dims=bool(a["keep_dims"]))
        elif op == "Softmax":
            y = raw.Softmax(logits=xs[0])
        elif op == "LogSoftmax":
            y = raw.LogSoftmax(logits=xs[0])
        elif op == "BiasAdd":
            y = raw.BiasAdd(value=xs[0], bias=xs[1], data_format=a.get("data_format", "NHWC"))
        elif op == "Cast":
            y = raw.Cast(x=xs[0], DstT=tf.as_dtype(a["to"]))
        elif op == "Reshape":
            y = raw.Reshape(tensor=xs[0], shape=tf.constant(a["shape"], tf.int32))
        elif op == "ExpandDims":
            y = raw.ExpandDims(input=xs[0], axis=tf.constant(a["axis"], tf.int32))
        elif op == "Squeeze":
            y = raw.Squeeze(input=xs[0], axis=list(a["axis"]))
        elif op == "BroadcastTo":
            y = raw.BroadcastTo(input=xs[0], shape=tf.constant(a["shape"], tf.int32))
        elif op == "Transpose":
            y = raw.Transpose(x=xs[0], perm=tf.constant(a["perm"], tf.int32))
        else:
            raise CaseError(f"unknown op {op}")
        env[node["name"]] = y
        dts[node["name"]] = y.dtype.name
    return [env[o] for o in case["outputs"]]


def signature(case) -> List[tf.TensorSpec]:
    return [tf.TensorSpec(inp.get("static", inp["shape"]), inp["dtype"])
            for inp in case["inputs"]]


def combined_function(cases) -> tf.types.experimental.GenericFunction:
    """One tf.function running all `cases` side by side (inputs and outputs concatenated)."""
    sig = [s for c in cases for s in signature(c)]
    sizes = [len(c["inputs"]) for c in cases]

    def body(*flat):
        outs, k = [], 0
        for case, n in zip(cases, sizes):
            outs += build_outputs(case, flat[k:k + n])
            k += n
        return outs

    return tf.function(body, input_signature=sig, autograph=False)
