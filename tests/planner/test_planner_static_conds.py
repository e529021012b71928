"""Conds whose outputs' extents depend on data (planner/static_conds.py): Keras divides an
embedding's sparse gradient by a dense tensor under a tf.cond whose first branch's row count
is known only when it runs; the planner imports the branch with static shapes."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

from tf_fusionstitch.planner import graph_import, op_rules

ROWS, WIDTH, IDS = 8, 4, [1, 3, 3]


def _sparse_update(table, accumulator, gradient):
    """Adagrad's update of an embedding table as Keras' optimizer writes it: the gradient
    (IndexedSlices of len(IDS) rows) divided by a dense square root with keras.ops.divide,
    which guards against zero or NaN divisors with a tf.cond; returns the scatter op."""
    return table.scatter_sub(keras.ops.divide(gradient, tf.sqrt(accumulator + 1e-7)))


def _scatters(graph):
    return [op for op in graph.ops.values() if op.type == "ResourceScatterSub"]


class SparseDivisionTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        self.values = np.random.default_rng(0).normal(size=(ROWS, WIDTH)).astype(np.float32)

    def _check(self, graph):
        self.assertFalse([op.name for op in graph.ops.values()
                          if op.type in ("If", "StatelessIf")])
        # The gradient's rows (3), not the table's (8), are divided and scattered...
        scatter, = _scatters(graph)
        self.assertEqual(graph.tensors[scatter.inputs[2]].shape, (len(IDS), WIDTH))
        self.assertEqual(scatter.flops, len(IDS) * WIDTH)
        # ... by the divisor's rows gathered at the gradient's indices.
        gathers = [op for op in graph.ops.values() if op.type == "GatherV2" and
                   "/static_branch/" in op.name]
        self.assertEqual([graph.tensors[op.outputs[0]].shape for op in gathers],
                         [(len(IDS), WIDTH)])
        self.assertEqual(op_rules.conservative_ops(graph), {})

    def test_traced_function(self):
        table = tf.Variable(self.values, name="table")
        accumulator = tf.Variable(tf.ones((ROWS, WIDTH)), name="accumulator")

        @tf.function
        def step(ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.gather(table, ids) ** 2)
            _sparse_update(table, accumulator, tape.gradient(loss, table))
            return loss

        ids = tf.constant(IDS)
        graph, _, concrete = graph_import.from_function(step, (ids,))
        self.assertIn("StatelessIf", [op.type for op in concrete.graph.get_operations()])
        self._check(graph)
        # Names stay TF's, the inputs' and the variables' too.
        self.assertEqual(graph.inputs, ["ids:0"])
        self.assertLen(graph.variables, 2)
        scatter, = _scatters(graph)
        self.assertEqual(graph.tensors[scatter.inputs[0]].variable, table.name)

    def test_graph_def(self):
        with tf.Graph().as_default() as built:
            table = tf.Variable(self.values, name="table")
            accumulator = tf.Variable(tf.ones((ROWS, WIDTH)), name="accumulator")
            ids = tf.compat.v1.placeholder(tf.int32, (len(IDS),), name="ids")
            loss = tf.reduce_sum(tf.gather(table, ids) ** 2)
            gradient, = tf.gradients(loss, [table])
            scatter = _sparse_update(table, accumulator, gradient)
        self.assertIsInstance(gradient, tf.IndexedSlices)
        graph = graph_import.from_graph_def(built.as_graph_def(), ["ids:0"], [loss.name],
                                            [scatter.op.name])
        self._check(graph)


class OtherCondsTest(tf.test.TestCase):

    def _import(self, then_branch, else_branch):
        @tf.function
        def step(x):
            chosen = tf.cond(tf.reduce_sum(x) > 0, lambda: then_branch(x),
                             lambda: else_branch(x))
            return tf.reduce_sum(x) * tf.cast(tf.reduce_sum(chosen), tf.float32)
        return graph_import.from_function(step, (tf.ones((4, 3)),))[0]

    def test_unknown_integer_extents_alone_leave_the_cond_as_one_op(self):
        # As before: integer metadata of unknown extent costs nothing and reads as 1.
        graph = self._import(lambda x: tf.range(2), lambda x: tf.range(4))
        self.assertIn("StatelessIf", [op.type for op in graph.ops.values()])

    def test_both_branches_static_but_of_different_rows(self):
        with self.assertRaisesRegex(ValueError, "both of its branches has static"):
            self._import(lambda x: x[:2] * 2.0, lambda x: x * 3.0)

    def test_neither_branch_static(self):
        with self.assertRaisesRegex(ValueError, "neither of its branches has static"):
            self._import(lambda x: tf.boolean_mask(x, x[:, 0] > 0),
                         lambda x: tf.boolean_mask(x, x[:, 0] < 0))


if __name__ == "__main__":
    tf.test.main()
