"""Graph import: variables, phases, FLOPs and shapes from traced TF graphs; reshape axes."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from tf_fusionstitch.planner import graph_import, ir, op_rules, reference_models


class ImportTest(tf.test.TestCase):

    def test_tf_function_training_step(self):
        step, inputs, variables = reference_models.build_eager("mlp", batch=16,
                                                               sizes=(4, 8, 2))
        graph, graph_def, concrete = graph_import.from_function(
            step, inputs, variables=variables.values())
        self.assertEqual(set(graph.variables), set(variables))
        w = graph.variables["layer0/w:0"]
        self.assertEqual((w.shape, w.dtype, w.itemsize, w.trainable), ((4, 8), "float32", 4,
                                                                       True))
        self.assertFalse(graph.variables["layer0/w/m:0"].trainable)
        # The captured placeholder carrying the handle is mapped back to the variable.
        self.assertEqual(graph.tensors[w.handle].variable, "layer0/w:0")
        self.assertEqual(graph.ops[graph.tensors[w.handle].producer].type, "Placeholder")
        self.assertEqual([graph.tensors[n].shape for n in graph.inputs], [(16, 4), (16, 2)])
        phases = {op.phase for op in graph.ops.values()}
        self.assertEqual(phases, {ir.FORWARD, ir.BACKWARD, ir.UPDATE})
        updates = [op for op in graph.ops.values() if op.phase == ir.UPDATE]
        self.assertLen(updates, 4)   # one ResourceApplyAdam per variable
        # Forward x(16,4) @ w(4,8): 2 * 16 * 8 * 4 FLOPs, reads 16*4 + 4*8, writes 16*8 floats.
        first = [op for op in graph.ops.values() if op.type == "MatMul"
                 and op.phase == ir.FORWARD][0]
        self.assertEqual(first.flops, 2 * 16 * 8 * 4)
        self.assertEqual(first.bytes, (16 * 4 + 4 * 8 + 16 * 8) * 4)
        # Everything but dead ops (the tape's gradient with respect to the label input).
        live = {n.name for n in graph_def.node} - set(graph.ops)
        self.assertEqual([n.op for n in graph_def.node if n.name in live], ["Neg"])
        self.assertTrue(graph.is_training)

    def test_inference_function_is_all_forward(self):
        w = tf.Variable(tf.ones([8, 8]), name="w_inference")

        @tf.function
        def infer(x):
            return tf.nn.relu(tf.matmul(x, w))

        graph = graph_import.from_function(infer, [tf.zeros([4, 8])])[0]
        self.assertEqual({op.phase for op in graph.ops.values()}, {ir.FORWARD})
        self.assertFalse(graph.is_training)
        self.assertEqual(list(graph.variables), ["w_inference:0"])

    def test_bare_graph_def_takes_what_the_fetches_need(self):
        tf_graph, inputs, loss, train_op, _ = reference_models.build_graph(
            "mlp", batch=8, sizes=(4, 8, 2))
        graph = graph_import.from_graph_def(tf_graph.as_graph_def(), inputs, [loss],
                                            targets=[train_op])
        trainable = sorted(n for n, v in graph.variables.items() if v.trainable)
        self.assertEqual(trainable, ["layer0/b:0", "layer0/w:0", "layer1/b:0", "layer1/w:0"])
        self.assertLen(graph.variables, 12)   # and their Adam slots
        # Initialisers are not part of the step.
        self.assertLen([op for op in graph.ops.values() if op.phase == ir.UPDATE], 4)
        same = reference_models.build_graph_ir("mlp", batch=8, sizes=(4, 8, 2))
        self.assertEqual(sum(op.flops for op in graph.ops.values()),
                         sum(op.flops for op in same.ops.values()))
        with self.assertRaisesRegex(ValueError, "not in the GraphDef"):
            graph_import.from_graph_def(tf_graph.as_graph_def(), inputs, ["nope:0"])

    def test_errors_name_the_fix(self):
        hidden = tf.Variable(tf.ones([3]), name="hidden_slot")

        @tf.function
        def raw(x):
            tf.raw_ops.AssignAddVariableOp(resource=hidden.handle, value=x)
            return x

        with self.assertRaisesRegex(ValueError, "pass those variables as `variables=`"):
            graph_import.from_function(raw, [tf.ones([3])])
        dynamic = tf.function(lambda x: x * 2.0,
                              input_signature=[tf.TensorSpec([None, 3], tf.float32)])
        with self.assertRaisesRegex(ValueError, "non-static shape.*concrete example inputs"):
            graph_import.from_function(dynamic, [])
        # With example inputs, a dynamic signature is traced again at their shapes.
        graph = graph_import.from_function(dynamic, [tf.ones([5, 3])])[0]
        self.assertEqual(graph.tensors[graph.inputs[0]].shape, (5, 3))
        with self.assertRaisesRegex(ValueError, "tf.function or callable"):
            graph_import.from_function(42, [])


class InlinedCallTest(tf.test.TestCase):

    def test_a_called_function_is_replaced_by_its_body(self):
        w = tf.Variable(tf.ones([8, 16]), name="w_called")

        @tf.function(jit_compile=True)     # as Keras compiles its grouped convolutions
        def inner(x):
            return tf.nn.relu(x @ w)

        @tf.function
        def outer(x):
            return tf.reduce_sum(inner(x) * 2.0)

        g = graph_import.from_function(outer, [tf.ones([4, 8])])[0]
        types = [op.type for op in g.ops.values()]
        self.assertNotIn("StatefulPartitionedCall", types)
        matmul = next(op for op in g.ops.values() if op.type == "MatMul")
        self.assertEqual(g.tensors[matmul.outputs[0]].shape, (4, 16))
        self.assertEqual(matmul.flops, 2 * 4 * 8 * 16)
        # The body reads the caller's variable: its columns are the relu's, and the call's
        # output (an IdentityN of the body's) carries the batch axis of the input.
        link = g.linkage
        (handle,) = [n for n, t in g.tensors.items() if t.variable == "w_called:0"]
        relu = next(op for op in g.ops.values() if op.type == "Relu")
        self.assertEqual(link.group_of[(handle, 1)], link.group_of[(relu.outputs[0], 1)])
        call = next(op for op in g.ops.values() if op.type == "IdentityN")
        self.assertEqual(link.group_of[(call.outputs[0], 0)], link.group_of[(g.inputs[0], 0)])


class ScanAndSelectionRulesTest(tf.test.TestCase):
    """Axis rules of ops read from traced graphs: Cumsum's axis comes from its constant input."""

    def _rules(self, fn, *inputs):
        g = graph_import.from_function(tf.function(fn), list(inputs))[0]
        self.assertEqual(op_rules.conservative_ops(g), {})
        rules = {}
        for op in g.ops.values():
            ins = [g.tensors[n] for n in op.inputs]
            outs = [g.tensors[n] for n in op.outputs]
            rules.setdefault(op.type, []).append((op, op_rules.axis_rule(op, ins, outs)))
        return rules

    def test_cumsum_reads_a_negative_axis_whole(self):
        rules = self._rules(lambda x: tf.math.cumsum(x, axis=-2, exclusive=True, reverse=True),
                            tf.ones([4, 8, 16]))
        ((op, rule),) = rules["Cumsum"]
        self.assertEqual(op.attrs["axis"], -2)
        self.assertEqual(rule.ties, [((("i", 0), a), (("o", 0), a)) for a in range(3)])
        self.assertEqual(rule.whole, [(0, 1)])

    def test_band_part_reads_the_matrix_axes_whole(self):
        rules = self._rules(lambda x: tf.linalg.band_part(x, -1, 0), tf.ones([2, 8, 8]))
        ((_, rule),) = rules["MatrixBandPart"]
        self.assertEqual(rule.ties, [((("i", 0), a), (("o", 0), a)) for a in range(3)])
        self.assertEqual(rule.whole, [(0, 1), (0, 2)])

    def test_top_k_and_its_gradient_scatter(self):
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(tf.math.top_k(x, k=2).values ** 2)
            return tape.gradient(loss, x)

        rules = self._rules(step, tf.random.normal([4, 8]))
        ((_, top_k),) = rules["TopKV2"]
        self.assertEqual(top_k.ties, [((("i", 0), 0), (("o", 0), 0)),
                                      ((("i", 0), 0), (("o", 1), 0))])
        self.assertEqual(top_k.whole, [(0, 1)])
        # The gradient scatters the (4 * 2,) values' gradients into the flat (4 * 8,) input
        # by index: the output axis is addressed by value, the updates' axis summed over.
        ((_, scatter),) = rules["ScatterNd"]
        self.assertEqual(scatter.ties, [((("i", 0), 0), (("i", 1), 0))])
        self.assertEqual(scatter.contract, [(1, 0)])

    def test_scatter_nd_ties_the_slice_axes(self):
        indices = tf.constant([[[0], [3]], [[5], [9]], [[1], [1]]])     # (3, 2, 1)
        rules = self._rules(lambda u: tf.scatter_nd(indices, u, [10, 5]), tf.ones([3, 2, 5]))
        ((_, rule),) = rules["ScatterNd"]
        self.assertEqual(rule.ties, [((("i", 0), 0), (("i", 1), 0)),
                                     ((("i", 0), 1), (("i", 1), 1)),
                                     ((("i", 1), 2), (("o", 0), 1))])
        self.assertEqual(rule.contract, [(1, 0), (1, 1)])


class ReshapeAxesTest(tf.test.TestCase):

    def test_merged_axes_tie_their_outer_factor(self):
        self.assertEqual(op_rules.reshape_ties((32, 64), (2, 16, 4, 16)), [(0, 0), (1, 2)])
        self.assertEqual(op_rules.reshape_ties((2, 16, 4, 16), (32, 64)), [(0, 0), (2, 1)])
        self.assertEqual(op_rules.reshape_ties((1, 8, 1), (8,)), [(1, 0)])
        self.assertEqual(op_rules.reshape_ties((6,), (4,)), [])


if __name__ == "__main__":
    tf.test.main()
