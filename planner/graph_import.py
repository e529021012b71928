"""TensorFlow -> planner IR. With the modules it uses (`tf_functions`, `static_conds`), the only
planner module besides `reference_models` that imports TF.

`from_function` traces a tf.function (a training step: forward, backward, optimizer update;
or inference) with example inputs and reads its graph: static shapes come from TF's shape
inference, and the placeholders that carry captured variable handles are mapped back to the
variables (named as TF names them, e.g. `wq:0`). `from_tf_graph` reads a graph built in
graph mode (variables as VarHandleOp nodes), which lets large models be planned without
allocating their weights.
"""

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util

from tf_fusionstitch.planner import ir, op_rules, static_conds, tf_functions
from tf_fusionstitch.rewriters.decided_shapes import summed_axes

# Attributes the axis rules read, copied as plain Python values.
_ATTRS = ("transpose_a", "transpose_b", "adj_x", "adj_y", "keep_dims", "batch_dims",
          "data_format", "equation", "axis", "ellipsis_mask", "new_axis_mask",
          "shrink_axis_mask")
# Inputs holding constants the rules need: op type -> (input index, attrs key).
_CONST_INPUTS = {
    "Transpose": (1, "perm"), "Sum": (1, "axes"), "Mean": (1, "axes"), "Max": (1, "axes"),
    "Min": (1, "axes"), "Prod": (1, "axes"), "All": (1, "axes"), "Any": (1, "axes"),
    "EuclideanNorm": (1, "axes"), "GatherV2": (2, "axis"), "ConcatV2": (-1, "axis"),
    "StridedSlice": (3, "strides"), "StridedSliceGrad": (3, "strides"), "Split": (0, "axis"),
    "SplitV": (2, "axis"), "Cumsum": (1, "axis"), "Cumprod": (1, "axis"),
    "CumulativeLogsumexp": (1, "axis"),
}


def _plain(value):
    return value.decode() if isinstance(value, bytes) else value


def _itemsize(dtype):
    try:
        return int(dtype.size)
    except (TypeError, ValueError, AttributeError):
        return 0


def _shape(t, unknown_dim=None):
    shape = t.shape
    if shape.rank is None:
        return ()
    dims = []
    for d in shape.as_list():
        if d is None:
            # Integer metadata (shapes, indices of dynamic size) does not matter to the cost;
            # an unknown floating extent does: it takes `unknown_dim` (a batch size) if
            # given, else finalize() refuses it.
            if t.dtype.is_integer or t.dtype == tf.bool:
                d = 1
            else:
                d = unknown_dim if unknown_dim else -1
        dims.append(d)
    return tuple(dims)


# Integer arithmetic TF's gradients build permutations and axes with (a gather's gradient
# concatenates ranges whose bounds are sums of constants), folded when get_static_value is not.
_FOLDABLE = {
    "AddV2": lambda a, b: a + b, "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b, "Range": np.arange,
    "Pack": lambda *xs: np.stack(xs), "ConcatV2": lambda *xs: np.concatenate(xs[:-1], xs[-1]),
}


def _static_value(tensor, depth=8):
    value = tf.get_static_value(tensor)
    op = tensor.op
    if value is None and op.type == "InvertPermutation":
        # Transpose gradients permute by the inverse of a constant permutation.
        perm = _static_value(op.inputs[0], depth - 1) if depth else None
        if perm is not None:
            value = perm.argsort()
    if value is None and op.type == "BroadcastGradientArgs":
        value = _broadcast_gradient_axes(tensor)
    if value is None and op.type in _FOLDABLE and depth and tensor.dtype.is_integer and \
            not (op.type == "Pack" and op.get_attr("axis") != 0):
        args = [_static_value(t, depth - 1) for t in op.inputs]
        if all(a is not None for a in args):
            value = np.asarray(_FOLDABLE[op.type](*args), tensor.dtype.as_numpy_dtype)
    return value


def _broadcast_gradient_axes(tensor):
    """The axes a broadcasting op's gradient sums over (`Sum(g, BroadcastGradientArgs(...)[k])`,
    as TF builds the gradient of a rank-3 x rank-2 BatchMatMulV2), decided from the operands'
    static shapes as the rewriters decide them; None where a shape is not static."""
    shapes = [tensor_util.constant_value_as_shape(t) for t in tensor.op.inputs]
    if not all(s.is_fully_defined() for s in shapes):
        return None
    k = tensor.value_index
    return np.array(summed_axes(shapes[k].as_list(), shapes[1 - k].as_list()), dtype=np.int64)


def _live(ops, outputs, graph):
    """The ops a run executes: ancestors of the outputs and of stateful ops (variable writes).

    Dead ops (e.g. a tape's gradient with respect to a label input) are pruned, as TF does.
    """
    allowed = {op.name for op in ops}
    roots = [graph.get_tensor_by_name(n).op for n in outputs]
    roots += [op for op in ops if op_rules.writes_variable(op.type)]
    live, stack = set(), [op for op in roots if op.name in allowed]
    while stack:
        op = stack.pop()
        if op.name in live:
            continue
        live.add(op.name)
        stack.extend(x for x in [t.op for t in op.inputs] + list(op.control_inputs)
                     if x.name in allowed)
    return [op for op in ops if op.name in live]


def from_tf_graph(graph, variables, inputs, outputs, ops=None, name="graph", unknown_dim=None):
    """Builds an `ir.Graph` from a tf.Graph (or FuncGraph).

    variables: {handle tensor name: (variable name, trainable[, shape, tf dtype])}; without
    shape and dtype the handle must come from a VarHandleOp.
    inputs / outputs: data input and output tensor names. ops: the tf.Operations to import
    (default all; graph-mode builds pass the step's ops, leaving out initialisers).
    unknown_dim: extent given to unknown floating dimensions (else they are refused).
    """
    g = ir.Graph(name)
    # A cond with data-dependent output shapes becomes the branch the planner prices; the
    # graph is then rebuilt around placeholders of its own, which keep their names here.
    graph, ops, renamed = static_conds.resolve(graph, ops)
    original = {name: new for new, name in renamed.items()}
    chosen = _live(list(ops) if ops is not None else graph.get_operations(),
                   [original.get(n, n) for n in outputs], graph)
    chosen_names = {op.name for op in chosen}
    # Tensors read from ops left out (e.g. VarHandleOps) enter as placeholders.
    for op in chosen:
        for t in op.inputs:
            name = renamed.get(t.name, t.name)
            if t.op.name not in chosen_names and name not in g.tensors:
                g.add_tensor(ir.Tensor(name, _shape(t, unknown_dim), t.dtype.name,
                                       _itemsize(t.dtype)))
                g.add_op(ir.Op(t.op.name + "/external:" + str(t.value_index), "Placeholder",
                               [], [name]))
    calls = any(op.type in tf_functions.CALLS for op in chosen)
    library = tf_functions.FunctionLibrary(graph) if calls else None
    for op in chosen:
        _add_op(g, op, renamed, "", unknown_dim, library)
    for handle, info in variables.items():
        if handle not in g.tensors:
            continue
        var_name, trainable = info[:2]
        shape, dtype = info[2:] if len(info) == 4 else _variable_shape_dtype(
            graph.get_tensor_by_name(original.get(handle, handle)))
        g.add_variable(ir.Variable(var_name, shape, dtype.name, _itemsize(dtype), handle,
                                   trainable))
    _propagate_handles(g)
    g.inputs = [n for n in inputs if n in g.tensors]
    g.outputs = [n for n in outputs if n in g.tensors]
    return g.finalize()


def _add_op(g, op, rename, prefix, unknown_dim, library):
    """Adds `op` to `g`: tensors named `prefix` + TF's name unless `rename` maps them (a
    function body's arguments are its caller's tensors). A call of a function the graph's
    library holds (Keras compiles some layers, such as grouped convolutions, as functions)
    is replaced by the function's body."""
    def name_of(t):
        return rename.get(t.name, prefix + t.name)

    for t in op.outputs:
        g.add_tensor(ir.Tensor(name_of(t), _shape(t, unknown_dim), t.dtype.name,
                               _itemsize(t.dtype)))
    body = library.body(op) if library is not None and op.type in tf_functions.CALLS else None
    if body is not None:
        inner = {b.name: name_of(t) for b, t in zip(body.inputs, op.inputs)}
        inner_prefix = prefix + op.name + "/"
        for body_op in body.ops:
            if body_op.type == "Placeholder" and body_op.outputs[0].name in inner:
                continue
            _add_op(g, body_op, inner, inner_prefix, unknown_dim, library)
        # The call's outputs are the body's: one IdentityN ties them.
        g.add_op(ir.Op(prefix + op.name, "IdentityN",
                       [inner.get(t.name, inner_prefix + t.name) for t in body.outputs],
                       [name_of(t) for t in op.outputs]))
        return
    attrs = {}
    present = op.node_def.attr   # asking get_attr for absent keys costs an exception each
    for key in _ATTRS:
        if key in present:
            attrs[key] = _plain(op.get_attr(key))
    if op.type in _CONST_INPUTS:
        index, key = _CONST_INPUTS[op.type]
        value = _static_value(op.inputs[index])
        if value is not None:
            value = value.tolist()
            attrs[key] = value if key != "axes" or isinstance(value, list) else [value]
    g.add_op(ir.Op(prefix + op.name, op.type, [name_of(t) for t in op.inputs],
                   [name_of(t) for t in op.outputs], attrs))


def _variable_shape_dtype(handle):
    op = handle.op
    if op.type == "VarHandleOp":
        return tuple(tf.TensorShape(op.get_attr("shape")).as_list()), op.get_attr("dtype")
    raise ValueError(f"cannot tell the shape of the variable behind {handle.name}")


def _propagate_handles(g):
    # tf.identity(handle) and the like carry the same variable.
    for op in g.ops.values():
        if op.type in ("Identity", "IdentityN") and op.inputs:
            src = g.tensors[op.inputs[0]]
            if src.variable:
                for out in op.outputs:
                    t = g.tensors[out]
                    t.variable, t.shape, t.dtype = src.variable, src.shape, src.dtype
                    t.itemsize = src.itemsize


def trace(fn, example_inputs):
    """Traces `fn` (a tf.function or a Python function) and returns its ConcreteFunction.

    A tf.function whose input signature leaves sizes unknown (a dynamic batch, as Keras'
    and the zoo's train steps declare) is traced again at the example inputs' shapes: the
    planner prices static shapes.
    """
    if not callable(fn):
        raise ValueError(f"fn must be a tf.function or callable, got {type(fn).__name__}")
    signature = getattr(fn, "input_signature", None)
    if signature and example_inputs and hasattr(fn, "python_function") and any(
            not spec.shape.is_fully_defined() for spec in tf.nest.flatten(signature)
            if isinstance(spec, tf.TensorSpec)):
        fn = fn.python_function
    if not hasattr(fn, "get_concrete_function"):
        fn = tf.function(fn)
    return fn.get_concrete_function(*example_inputs)


def _from_concrete(concrete, variables, name, unknown_dim=None):
    graph = concrete.graph
    by_handle = {id(v.handle): v for v in list(concrete.variables) + list(variables)}
    found, captured = {}, set()
    for external, internal in graph.captures:
        var = by_handle.get(id(external))
        if var is not None:
            found[internal.name] = (var.name, bool(var.trainable), tuple(var.shape.as_list()),
                                    var.dtype)
        captured.add(internal.name)
    unknown = [internal.name for external, internal in graph.captures
               if internal.dtype == tf.resource and internal.name not in found]
    if unknown:
        raise ValueError(f"captured resource handle(s) {unknown[:3]} belong to no known "
                         "variable: pass those variables as `variables=`")
    inputs = [t.name for t in graph.inputs if t.name not in captured
              and t.dtype != tf.resource]
    outputs = [t.name for t in graph.outputs]
    return from_tf_graph(graph, found, inputs, outputs, name=name, unknown_dim=unknown_dim)


def from_saved_model(path, function=None, unknown_dim=None):
    """IR of a SavedModel's tf.function attribute `function` (default `__call__`).

    Signatures are not used: their graphs only call the function, whose body the planner
    needs. Unknown floating dimensions (a dynamic batch) take `unknown_dim`.
    """
    loaded = tf.saved_model.load(path)
    function = function or "__call__"
    fn = getattr(loaded, function, None)
    concretes = list(getattr(fn, "concrete_functions", None) or [])
    if not concretes:
        known = [n for n in dir(loaded) if not n.startswith("_") and
                 getattr(getattr(loaded, n, None), "concrete_functions", None)]
        raise ValueError(f"the SavedModel at {path} has no traced tf.function {function!r}; "
                         f"its tf.functions: {known or 'none'}")
    variables = list(getattr(loaded, "variables", []) or [])
    g = _from_concrete(concretes[0], variables, function, unknown_dim)
    calls = [op.name for op in g.ops.values() if op.type in tf_functions.CALLS]
    if calls:
        raise ValueError(f"{function!r} calls other functions ({calls[:3]}); the planner "
                         "needs their bodies: plan the called tf.function instead")
    return g


def from_function(fn, example_inputs, variables=(), name=None):
    """IR of `fn` traced on `example_inputs`; returns (ir.Graph, GraphDef, ConcreteFunction).

    Variables the function reads are found by TF; `variables` adds ones it only touches
    through raw handles (e.g. optimizer slots passed to `tf.raw_ops.ResourceApplyAdam`).
    """
    concrete = trace(fn, example_inputs)
    fn_name = name or getattr(fn, "__name__", None) or "function"
    g = _from_concrete(concrete, variables, fn_name)
    return g, concrete.graph.as_graph_def(), concrete


def variables_of_graph(graph):
    """{VarHandleOp output name: (variable name, trainable)} of a graph-mode graph."""
    trainable = {v.handle.name for v in graph.get_collection(
        tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
    found = {}
    for op in graph.get_operations():
        if op.type == "VarHandleOp":
            name = _plain(op.get_attr("shared_name")) or op.name
            found[op.outputs[0].name] = (name + ":0", op.outputs[0].name in trainable)
    return found


def from_graph_def(graph_def, inputs, outputs, targets=(), name="graph"):
    """IR of a GraphDef whose variables are VarHandleOp nodes (shapes from TF's inference).

    As a TF1 session run would, imports what `outputs` (tensor names, e.g. the loss) and
    `targets` (op names, e.g. the train op grouping the updates) need, following data and
    control edges, so initialisers and other unrelated nodes stay out.
    """
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    try:
        roots = [graph.get_tensor_by_name(n).op for n in outputs] + \
            [graph.get_operation_by_name(n) for n in targets]
    except (KeyError, ValueError) as e:
        raise ValueError(f"output or target not in the GraphDef: {e}") from None
    needed, stack = set(), list(roots)
    while stack:
        op = stack.pop()
        if op.name not in needed:
            needed.add(op.name)
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
    ops = [op for op in graph.get_operations() if op.name in needed]
    # A bare GraphDef has no collections: a variable is trainable if the forward pass
    # reads it (optimizer slots are read only by the update).
    variables = {h: (n, True) for h, (n, _) in variables_of_graph(graph).items()}
    g = from_tf_graph(graph, variables, inputs, outputs, ops=ops, name=name)
    for var in g.variables.values():
        readers = [g.ops[c] for c in g.tensors[var.handle].consumers]
        var.trainable = any(op.phase == ir.FORWARD and op.type != "VarHandleOp"
                            for op in readers)
    return g
