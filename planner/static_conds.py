"""Conditionals whose outputs' extents depend on data, decided statically for the planner.

The planner prices static shapes, and a cond's outputs have them only when both branches
agree. Keras' TF backend divides an embedding's IndexedSlices gradient by a dense tensor
(Adagrad's, RMSprop's and Adafactor's square root of a running average) as
`tf.cond(any zero or NaN in the divisor, the union of the gradient's rows with those rows,
the gradient's rows)`: the first branch's row count is known only once it runs. It runs
only on a zero or NaN divisor, which the epsilon those optimizers add rules out in a finite
run, so the planner prices the second: the gradient's rows, gathered and scattered as the
step really moves them, not the whole table. In general a cond whose outputs lack static
shapes is replaced by its one branch whose outputs have them at the cond's input shapes,
and TF's shape inference is run again so that the ops after it get static shapes too.
"""

import tensorflow as tf
from tensorflow.python.framework import function_def_to_graph
from tensorflow.python.ops import handle_data_util

from tf_fusionstitch.planner import tf_functions

CONDS = ("If", "StatelessIf")
# Where a replaced cond's branch lives in the rebuilt graph: under the cond's own name.
_BRANCH_SCOPE = "/static_branch/"


def resolve(graph, ops=None):
    """(graph, ops, renamed). When no cond among `ops` (default: all of `graph`'s) lacks
    static output shapes: `graph`, `ops` and {}. Else a new tf.Graph in which each such cond
    is its one branch with static shapes, `ops` mapped to it (None stays None), and renamed:
    {the new graph's placeholder tensor name: the original's} (the new graph feeds each of
    `graph`'s placeholders, with its shape and handle data, through a placeholder of its own;
    every other op keeps its name, a replaced cond's outputs included)."""
    conds = [op for op in (ops if ops is not None else graph.get_operations())
             if op.type in CONDS and any(not _static(t) for t in op.outputs)]
    branches = {}
    library = tf_functions.FunctionLibrary(graph) if conds else None
    for cond in conds:
        branch = _static_branch(cond, library)
        if branch is not None:
            branches[cond.name] = (cond, branch)
    if not branches:
        return graph, ops, {}
    graph_def = graph.as_graph_def()
    nodes = []
    for node in graph_def.node:
        if node.name in branches:
            cond, branch = branches[node.name]
            nodes.extend(_inlined(cond, library.definitions[branch]))
        else:
            nodes.append(node)
    del graph_def.node[:]
    graph_def.node.extend(nodes)
    placeholders = [op.outputs[0] for op in graph.get_operations() if op.type == "Placeholder"]
    rebuilt = tf.Graph()
    with rebuilt.as_default():
        feeds = {}
        for k, t in enumerate(placeholders):
            feed = tf.compat.v1.placeholder(t.dtype, t.shape, name=f"planner_input_{k}")
            if t.dtype == tf.resource:
                handle_data_util.copy_handle_data(t, feed)
            feeds[t.name] = feed
        tf.graph_util.import_graph_def(graph_def, feeds, name="")
    if ops is not None:
        kept = {op.name for op in ops}
        ops = [op for op in rebuilt.get_operations() if op.name in kept or
               op.name.split(_BRANCH_SCOPE)[0] in branches]
    return rebuilt, ops, {feed.name: name for name, feed in feeds.items()}


def _static(t):
    """Whether `t`'s shape is static (an unknown rank reads as a scalar, as graph_import
    reads it)."""
    return t.shape.rank is None or t.shape.is_fully_defined()


def _static_branch(cond, library):
    """The name of `cond`'s one branch whose outputs have static shapes at the cond's input
    shapes; None where the cond's unknown extents are only integer or boolean metadata (a
    cond's row indices: they cost nothing and graph_import takes them as 1), which the
    planner then reads as one op as it is. Else refused: the planner could not price it."""
    static = []
    for attr in ("then_branch", "else_branch"):
        name = cond.get_attr(attr).name
        body = library.instantiate(name, list(cond.inputs[1:]))
        if body is not None and all(_static(t) for t in body.outputs):
            static.append(name)
    if len(static) == 1:
        return static[0]
    if all(_static(t) or t.dtype.is_integer or t.dtype == tf.bool for t in cond.outputs):
        return None
    raise ValueError(
        f"cond {cond.name!r} has outputs of data-dependent shape and "
        f"{'both' if static else 'neither'} of its branches has static ones: the planner "
        "cannot tell statically which one to price")


def _inlined(cond, definition):
    """NodeDefs that replace `cond` by the body of its branch `definition`: the body's nodes
    under the cond's name + _BRANCH_SCOPE, its arguments the cond's inputs, and an IdentityN
    named as the cond that passes the branch's outputs on."""
    operands = cond.inputs[1:]   # inputs[0] is the predicate
    body, flat_names = function_def_to_graph.function_def_to_graph_def(
        definition, [t.shape for t in operands])
    args = {flat_names[a.name].split(":")[0]: t
            for a, t in zip(definition.signature.input_arg, operands)}
    scope = cond.name + _BRANCH_SCOPE

    def mapped(name):
        control = name.startswith("^")
        node = name.lstrip("^").split(":")[0]
        if node in args:
            return "^" + args[node].op.name if control else args[node].name
        return ("^" if control else "") + scope + name.lstrip("^")

    nodes = []
    for node in body.node:
        if node.name in args:
            continue
        inlined = tf.compat.v1.NodeDef()
        inlined.CopyFrom(node)
        inlined.name = scope + node.name
        inlined.input[:] = [mapped(name) for name in node.input]
        if "_class" in inlined.attr:   # colocation with nodes named in the branch's scope
            del inlined.attr["_class"]
        nodes.append(inlined)
    passed = tf.compat.v1.NodeDef(name=cond.name, op="IdentityN")
    passed.input.extend([mapped(flat_names[definition.ret[a.name]])
                         for a in definition.signature.output_arg])
    passed.input.extend("^" + op.name for op in cond.control_inputs)
    passed.attr["T"].list.type.extend(t.dtype.as_datatype_enum for t in cond.outputs)
    nodes.append(passed)
    return nodes
