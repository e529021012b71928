"""A loop's weight gradients, summed once after it instead of once per step.

TF's gradient of a While loop (a recurrent layer's backward pass) keeps each
weight's gradient in a loop variable and adds one step's share to it per
iteration:

    acc' = AddN(acc, MatMul(x_t, dz_t, transpose_a=True))     a kernel
    acc' = AddN(acc, BiasAddGrad(dz_t))                        a bias

so every time step writes an [in, out] outer product and reads and writes the
whole accumulator: for ASR's 640 x 2048 LSTM kernel, 16 MB of traffic per
step for a gradient of batch 2. The sum over the steps of x_t^T dz_t is
X^T dZ, with X and dZ the steps' rows stacked. So the body pushes x_t and dz_t
into two TensorLists the loop carries (one list per tensor, shared by the
sums that read it), passes the accumulator through unchanged, and after the
loop one MatMul (or one Sum over rows) of the lists' concatenations is
added to it. An empty loop concatenates to zero rows, and adds zeros.

The result is the same sum in another order (the matrix product's blocks
instead of time steps): a reassociation within the reduction tolerance.

A sum is moved only where nothing else reads the accumulator or the step's
product inside the body, the loop returns the sum as that variable, the
product is a 2-D MatMul with transpose_a alone (how TF differentiates
x @ w with respect to w) or an NHWC BiasAddGrad of a matrix, the weight's
size is static, and the loop's output is not itself fetched.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Dict, List, Optional, Set, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import function_pb2, tensor_shape_pb2, types_pb2

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters import function_bodies
from tf_fusionstitch.rewriters.function_graphs import WHILE_OPS
from tf_fusionstitch.rewriters.graph_view import Tensor, edited_copy, fresh_name, parse_input

_FLOATS = (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE, types_pb2.DT_HALF, types_pb2.DT_BFLOAT16)


@dataclasses.dataclass
class _Sum:
    """One accumulator moved out of the loop."""
    var: int                  # loop variable index
    kind: str                 # "matmul" or "bias"
    reads: Tuple[str, ...]    # the body tensors (function naming) whose steps are stacked
    drop: Tuple[str, ...]     # body nodes that are dead once the sum moves out


def sum_after_loops(graph_def, types: Dict[Tensor, Optional[ir.TensorType]],
                    fetches: Set[Tensor]):
    """(GraphDef, types, number of sums moved) for the graph's own While nodes."""
    fdefs = {f.signature.name: f for f in graph_def.library.function}
    consumers: Dict[Tensor, int] = {}
    for node in graph_def.node:
        for s in node.input:
            src, port, ctrl = parse_input(s)
            if not ctrl:
                consumers[(src, port)] = consumers.get((src, port), 0) + 1
    plans = {}
    for node in graph_def.node:
        if node.op in WHILE_OPS and node.attr["body"].func.name in fdefs:
            body = fdefs[node.attr["body"].func.name]
            sums = [s for s in _sums(body)
                    if (node.name, s.var) not in fetches and _static(types, (node.name, s.var))]
            if sums:
                plans[node.name] = sums
    if not plans:
        return graph_def, types, 0

    types = dict(types)
    after: List = []   # (While node, its sums, where each stacked tensor's rows are)

    def move(new, node, out, taken):
        sums = plans[node.name]
        body, cond = fdefs[node.attr["body"].func.name], fdefs[node.attr["cond"].func.name]
        stacked = list(dict.fromkeys(r for s in sums for r in s.reads))
        dtype = {r: d for s in sums for r, d in _read_dtypes(body, s)}
        width = {}                       # stacked tensor -> its rows' width (static)
        for s in sums:
            shape = types[(node.name, s.var)].shape
            widths = shape if s.kind == "matmul" else shape[-1:]
            width.update(zip(s.reads, widths))
        new_body, new_cond = _edited_body(body, sums, stacked, dtype), _edited_cond(cond, stacked)
        try:   # as TF will build them when the loop runs
            for f in (new_body, new_cond):
                function_bodies.check_function(f, graph_def.library)
        except Exception:  # noqa: BLE001  (this loop stays as it was)
            del plans[node.name]
            return
        for f in (new_body, new_cond):
            if f.signature.name not in {g.signature.name for g in out.library.function}:
                out.library.function.add().CopyFrom(f)
        first = len(node.attr["T"].list.type)
        lists = []
        for j, r in enumerate(stacked):
            base = f"{node.name}/fs_steps_{j}"
            lists.append(_node(out, taken, base, "EmptyTensorList",
                               [_int32(out, taken, f"{base}/element_shape", [-1, width[r]]),
                                _int32(out, taken, f"{base}/max_num_elements", -1)],
                               element_dtype=dtype[r], shape_type=types_pb2.DT_INT32))
        data = [s for s in new.input if not s.startswith("^")]
        control = [s for s in new.input if s.startswith("^")]
        del new.input[:]
        new.input.extend(data + lists + control)
        new.attr["T"].list.type.extend([types_pb2.DT_VARIANT] * len(stacked))
        new.attr["output_shapes"].list.shape.extend(
            [tensor_shape_pb2.TensorShapeProto()] * len(stacked))
        if "_num_original_outputs" in new.attr:
            new.attr["_num_original_outputs"].i += len(stacked)
        new.attr["body"].func.name = new_body.signature.name
        new.attr["cond"].func.name = new_cond.signature.name
        for j in range(len(stacked)):
            types[(node.name, first + j)] = None
        rows = {r: (node.name, first + j, dtype[r], width[r]) for j, r in enumerate(stacked)}
        after.append((node, sums, rows))

    out = edited_copy(graph_def, dict(plans), move)
    if not after:
        return graph_def, types, 0
    taken = {n.name for n in out.node}
    renamed: Dict[Tensor, str] = {}      # accumulator output -> its total after the loop
    for node, sums, rows in after:
        for s in sums:
            renamed[(node.name, s.var)] = _total(out, taken, types, node, s, rows)
    for n in out.node:
        if n.name in {r.split(":")[0] for r in renamed.values()}:
            continue
        for i, s in enumerate(n.input):
            src, port, ctrl = parse_input(s)
            if not ctrl and (src, port) in renamed:
                n.input[i] = renamed[(src, port)]
    function_bodies.register_functions(out)
    return out, types, sum(len(s) for s in plans.values())


def _static(types, t: Tensor) -> bool:
    tt = types.get(t)
    return tt is not None and tt.rank in (1, 2) and None not in tt.shape


def _sums(body) -> List[_Sum]:
    """The accumulators of `body` whose sum can move out of the loop."""
    args = [a.name for a in body.signature.input_arg]
    nodes = {n.name: n for n in body.node_def}
    reads: Dict[str, int] = {}
    for n in body.node_def:
        for s in n.input:
            if not s.startswith("^"):
                reads[s] = reads.get(s, 0) + 1
    for value in body.ret.values():
        reads[value] = reads.get(value, 0) + 1
    found = []
    for k, out in enumerate(body.signature.output_arg):
        if k >= len(args):
            break
        total = nodes.get(body.ret[out.name].split(":")[0])
        if total is None or total.op != "AddN" or total.attr["N"].i != 2 \
                or body.ret[out.name] != f"{total.name}:sum:0" \
                or reads[body.ret[out.name]] != 1 or total.attr["T"].type not in _FLOATS:
            continue
        ins = list(total.input)
        if args[k] not in ins or reads.get(args[k], 0) != 1:
            continue
        step_ref = ins[1 - ins.index(args[k])]
        step = nodes.get(step_ref.split(":")[0])
        if step is None or reads.get(step_ref, 0) != 1:
            continue
        if step.op == "MatMul" and step_ref == f"{step.name}:product:0" \
                and step.attr["transpose_a"].b and not step.attr["transpose_b"].b \
                and all(not s.startswith("^") for s in step.input):
            found.append(_Sum(k, "matmul", tuple(step.input[:2]), (total.name, step.name)))
        elif step.op == "BiasAddGrad" and step_ref == f"{step.name}:output:0" \
                and step.attr["data_format"].s in (b"", b"NHWC") \
                and all(not s.startswith("^") for s in step.input):
            found.append(_Sum(k, "bias", (step.input[0],), (total.name, step.name)))
    return found


def _read_dtypes(body, s: _Sum):
    step = next(n for n in body.node_def if n.name == s.drop[1])
    return [(r, step.attr["T"].type) for r in s.reads]


def _edited_body(body, sums: List[_Sum], stacked: List[str], dtype):
    """`body` pushing each stacked tensor's step into a list it carries, and
    passing the moved accumulators through."""
    fdef = function_pb2.FunctionDef()
    fdef.CopyFrom(body)
    dead = {n for s in sums for n in s.drop}
    del fdef.node_def[:]
    fdef.node_def.extend(n for n in body.node_def if n.name not in dead)
    names = {a.name for a in body.signature.input_arg} | {n.name for n in body.node_def}
    for s in sums:
        out = body.signature.output_arg[s.var].name
        fdef.ret[out] = body.signature.input_arg[s.var].name
    first = len(body.signature.input_arg)
    for j, r in enumerate(stacked):
        arg = fresh_name(f"fs_steps_{j}", names)
        fdef.signature.input_arg.add(name=arg, type=types_pb2.DT_VARIANT)
        fdef.arg_attr[first + j].attr["_output_shapes"].list.shape.add()
        push = fdef.node_def.add(name=fresh_name(f"fs_steps_{j}/push", names),
                                 op="TensorListPushBack", input=[arg, r])
        push.attr["element_dtype"].type = dtype[r]
        out = fresh_name(f"fs_steps_{j}_out", names | {a.name for a in fdef.signature.output_arg})
        fdef.signature.output_arg.add(name=out, type=types_pb2.DT_VARIANT)
        fdef.ret[out] = f"{push.name}:output_handle:0"
    fdef.signature.name = _renamed(body, fdef)
    return fdef


def _edited_cond(cond, stacked: List[str]):
    """`cond` taking the stacked lists too (a While's functions take every
    loop variable), unread."""
    fdef = function_pb2.FunctionDef()
    fdef.CopyFrom(cond)
    names = {a.name for a in cond.signature.input_arg} | {n.name for n in cond.node_def}
    first = len(cond.signature.input_arg)
    for j in range(len(stacked)):
        fdef.signature.input_arg.add(name=fresh_name(f"fs_steps_{j}", names),
                                     type=types_pb2.DT_VARIANT)
        fdef.arg_attr[first + j].attr["_output_shapes"].list.shape.add()
    fdef.signature.name = _renamed(cond, fdef)
    return fdef


def _renamed(original, fdef) -> str:
    digest = hashlib.sha256(fdef.SerializeToString(deterministic=True)).hexdigest()[:10]
    return f"{original.signature.name}_fs_sums{digest}"


def _total(out, taken, types, node, s: _Sum, rows) -> str:
    """After the loop: the accumulator plus the steps' stacked sum."""
    t = types[(node.name, s.var)]
    stacked = []
    for r in s.reads:
        loop, port, dtype, width = rows[r]
        base = f"{node.name}/fs_rows_{port}"
        concat = _node(out, taken, base, "TensorListConcatV2",
                       [f"{loop}:{port}", _int32(out, taken, f"{base}/element_shape", [-1, width]),
                        _int64(out, taken, f"{base}/leading_dims", [])],
                       element_dtype=dtype, shape_type=types_pb2.DT_INT32)
        types[(concat, 0)] = ir.TensorType(t.dtype, (None, width))
        types[(concat, 1)] = ir.TensorType("int64", (None,))
        stacked.append(f"{concat}:0")
    dtype = rows[s.reads[0]][2]
    base = f"{node.name}/fs_sum_{s.var}"
    if s.kind == "matmul":
        step = _node(out, taken, base, "MatMul", stacked,
                     T=dtype, transpose_a=True, transpose_b=False)
    else:
        step = _node(out, taken, base, "Sum", [stacked[0], _int32(out, taken, f"{base}/axes", [0])],
                     T=dtype, Tidx=types_pb2.DT_INT32, keep_dims=False)
    types[(step, 0)] = t
    if _zeros(out, _data_inputs(node)[s.var]):   # the loop starts from zero: the sum is all
        return step
    total = _node(out, taken, f"{base}/total", "AddN", [f"{node.name}:{s.var}", step],
                  T=dtype, N=2)
    types[(total, 0)] = t
    return total


def _data_inputs(node) -> List[str]:
    return [s for s in node.input if not s.startswith("^")]


def _zeros(graph_def, name: str) -> bool:
    """Whether `name` is zeros (TF's gradient starts accumulators from zeros)."""
    nodes = {n.name: n for n in graph_def.node}
    node = nodes.get(parse_input(name)[0])
    if node is None:
        return False
    if node.op == "ZerosLike":
        return True
    value = node if node.op == "Const" else nodes.get(parse_input(node.input[1])[0]) \
        if node.op == "Fill" and len(node.input) > 1 else None
    if value is None or value.op != "Const":
        return False
    return not np.any(tf.make_ndarray(value.attr["value"].tensor))


def _node(out, taken, base: str, op: str, inputs, **attrs) -> str:
    n = out.node.add(name=fresh_name(base, taken), op=op, input=inputs)
    for key, value in attrs.items():
        if isinstance(value, bool):
            n.attr[key].b = value
        elif key in ("N",):
            n.attr[key].i = value
        else:
            n.attr[key].type = value
    return n.name


def _const(out, taken, name: str, value: np.ndarray, dtype) -> str:
    n = out.node.add(name=fresh_name(name, taken), op="Const")
    n.attr["dtype"].type = dtype
    n.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    return n.name


def _int32(out, taken, name: str, value) -> str:
    return _const(out, taken, name, np.array(value, np.int32), types_pb2.DT_INT32)


def _int64(out, taken, name: str, value) -> str:
    return _const(out, taken, name, np.array(value, np.int64), types_pb2.DT_INT64)
