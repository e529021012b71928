"""A standalone Python script that reproduces a case on one draw's inputs."""

from __future__ import annotations

import math

import numpy as np

from tf_fusionstitch.tools.fuzzing.case_types import infer_types
from tf_fusionstitch.tools.fuzzing.inputs import make_inputs
from tf_fusionstitch.tools.fuzzing.ops import (BINARY_OPS, FEATURES_ARG, FLOATS, REDUCE_OPS,
                                               UNARY_OPS)


def to_python(case: dict, draw: int = 0) -> str:
    """A standalone script that reproduces the case on the given draw's inputs."""
    types = infer_types(case)
    lines = ["import numpy as np", "import tensorflow as tf", "import tf_fusionstitch as fs",
             "", "raw = tf.raw_ops", "nan, inf = float('nan'), float('inf')"]
    for inp, v in zip(case["inputs"], make_inputs(case, draw)):
        if inp["dtype"] == "bool":
            flat = [str(bool(x)) for x in np.asarray(v).reshape(-1)]
        else:
            flat = [_py(x) for x in np.asarray(v).astype(np.float64).reshape(-1).tolist()]
        src = "float64" if inp["dtype"] in FLOATS else inp["dtype"]
        lines.append(f"{inp['name']} = tf.constant(np.array([{', '.join(flat)}], "
                     f"'{src}').reshape({tuple(inp['shape'])}), tf.{inp['dtype']})")
    sig = ", ".join(f"tf.TensorSpec({inp.get('static', inp['shape'])}, tf.{inp['dtype']})"
                    for inp in case["inputs"])
    args = ", ".join(i["name"] for i in case["inputs"])
    lines += ["", f"@tf.function(input_signature=[{sig}])", f"def f({args}):"]
    for node in case["nodes"]:
        op, a = node["op"], node.get("attrs", {})
        other = next((types[r][0] for r in node["inputs"] if isinstance(r, str)), None)
        refs = [r if isinstance(r, str) else f"tf.constant({_py(r['const'])}, tf.{other})"
                for r in node["inputs"]]
        if op in UNARY_OPS:
            call = f"raw.{op}({'features' if op in FEATURES_ARG else 'x'}={refs[0]})"
        elif op in BINARY_OPS:
            call = f"raw.{op}(x={refs[0]}, y={refs[1]})"
        elif op == "Select":
            call = f"raw.Select(condition={refs[0]}, x={refs[1]}, y={refs[2]})"
        elif op == "SelectV2":
            call = f"raw.SelectV2(condition={refs[0]}, t={refs[1]}, e={refs[2]})"
        elif op in REDUCE_OPS:
            call = f"raw.{op}(input={refs[0]}, axis={a['axis']}, keep_dims={bool(a['keep_dims'])})"
        elif op in ("Softmax", "LogSoftmax"):
            call = f"raw.{op}(logits={refs[0]})"
        elif op == "BiasAdd":
            call = (f"raw.BiasAdd(value={refs[0]}, bias={refs[1]}, "
                    f"data_format={a.get('data_format', 'NHWC')!r})")
        elif op == "Cast":
            call = f"raw.Cast(x={refs[0]}, DstT=tf.{a['to']})"
        elif op == "Reshape":
            call = f"raw.Reshape(tensor={refs[0]}, shape={a['shape']})"
        elif op == "ExpandDims":
            call = f"raw.ExpandDims(input={refs[0]}, axis={a['axis']})"
        elif op == "Squeeze":
            call = f"raw.Squeeze(input={refs[0]}, axis={a['axis']})"
        elif op == "Transpose":
            call = f"raw.Transpose(x={refs[0]}, perm={a['perm']})"
        else:
            call = f"raw.BroadcastTo(input={refs[0]}, shape={a['shape']})"
        lines.append(f"    {node['name']} = {call}")
    lines.append(f"    return [{', '.join(case['outputs'])}]")
    lines += ["", "opt = fs.optimize(f, min_cluster_ops=1)",
              f"for want, got in zip(f({args}), opt({args})):",
              "    print('TF   ', want.numpy().tolist())",
              "    print('fused', got.numpy().tolist())"]
    return "\n".join(lines) + "\n"


def _py(x) -> str:
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)
