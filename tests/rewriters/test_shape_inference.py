"""TF's shape inference over a function's GraphDef, seeded with the traced
shapes (rewriters/shapes.py): what every later decision of the pass reads."""

import tensorflow as tf

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters import shapes
from tests.optimize_testlib import traced_types


def _imports(monkeypatch):
    """Counts the GraphDef imports infer_types makes."""
    calls = []
    real = tf.graph_util.import_graph_def

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(shapes.tf.graph_util, "import_graph_def", counted)
    return calls


def test_variable_reads_are_known_from_the_first_import(monkeypatch):
    w = tf.Variable(tf.random.normal((5, 3)))
    b = tf.Variable(tf.random.normal((3,)))

    @tf.function(input_signature=[tf.TensorSpec((None, 5))])
    def f(x):
        return tf.nn.relu(tf.matmul(x, w) + b) * w.read_value()[0]

    graph = f.get_concrete_function().graph
    calls = _imports(monkeypatch)
    types = traced_types(graph.as_graph_def(), graph)
    reads = [op.name for op in graph.get_operations() if op.type == "ReadVariableOp"]
    assert reads and all(types[(r, 0)] is not None and None not in types[(r, 0)].shape
                         for r in reads)
    out = graph.outputs[0].op.inputs[0].op.name   # the multiply behind the Identity
    assert types[(out, 0)] == ir.TensorType("float32", (None, 3))
    assert len(calls) == 1  # nothing left for a hint to add


def test_hints_patch_what_inference_cannot_see_through(monkeypatch):
    # tensordot reshapes by a computed shape: TF's inference loses the 7,
    # the traced shape has it; a node named like a feed keeps its own type
    # (an imported node whose name is taken would be renamed).
    w = tf.Variable(tf.random.normal((5, 3)))

    @tf.function(input_signature=[tf.TensorSpec((None, 7, 5))])
    def f(x):
        y = tf.identity(x, name="Placeholder")
        return tf.identity(tf.tensordot(y, w, 1), name="VarHandleOp")

    graph = f.get_concrete_function().graph
    calls = _imports(monkeypatch)
    types = traced_types(graph.as_graph_def(), graph)
    assert types[("Placeholder", 0)] == ir.TensorType("float32", (None, 7, 5))
    assert types[("VarHandleOp", 0)] == ir.TensorType("float32", (None, 7, 3))
    assert set(types) == {(op.name, k) for op in graph.get_operations()
                          for k in range(len(op.outputs))}
    assert len(calls) == 2  # the reshape's hint patched once
