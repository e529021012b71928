"""Gradient reductions decided at rewrite time (rewriters/decided_shapes.py,
rewriters/dim_origins.py): the axes, the proofs of equal dynamic dimensions,
static sizes TF's shape inference misses, and optimized gradients against
TF's where the batch is dynamic."""

import tensorflow as tf

import tf_fusionstitch as fs
from optimize_testlib import quiet_call, random, rng, traced_types
from tf_fusionstitch.rewriters import decided_shapes, grappler
from tf_fusionstitch.rewriters.decided_shapes import summed_axes
from tf_fusionstitch.rewriters.dim_origins import DimOrigins
from tf_fusionstitch.rewriters.graph_view import GraphView

B, S = ("dim", "batch"), ("dim", "seq")     # two unknown sizes of different origins


def _bga_sums(graph_def):
    producers = {n.name: n.op for n in graph_def.node}
    return [n.name for n in graph_def.node
            if n.op == "Sum" and producers[n.input[1].split(":")[0]] == "BroadcastGradientArgs"]


def _computed_reshapes(graph_def):
    producers = {n.name: n.op for n in graph_def.node}
    return [n.name for n in graph_def.node
            if n.op == "Reshape" and producers[n.input[1].split(":")[0]] != "Const"]


def _prepared(concrete):
    """(GraphDef after Grappler, types, fetches) of a concrete function, as the pass gets them."""
    graph = concrete.graph
    outputs = [t.name for t in concrete.outputs]
    graph_def = grappler.run_grappler(graph.as_graph_def(), graph, outputs)
    types = traced_types(graph_def, graph)
    return graph_def, types, {(name.split(":")[0], 0) for name in outputs}


class SummedAxesTest(tf.test.TestCase):

    def test_static_sizes_decide_as_tf_does(self):
        self.assertEqual(summed_axes([4, 1, 3], [4, 5, 3]), [1])
        self.assertEqual(summed_axes([3], [2, 3]), [0])           # missing axes are summed
        self.assertEqual(summed_axes([2, 3], [3]), [])
        self.assertEqual(summed_axes([1, 1], [1, 7]), [1])        # both 1: nothing to sum

    def test_an_unknown_size_against_a_static_one_or_the_same_origin_is_kept(self):
        self.assertEqual(summed_axes([B, 16, 32], [32]), [])
        self.assertEqual(summed_axes([32], [B, 16, 32]), [0, 1])
        self.assertEqual(summed_axes([B, S, 1], [B, S, 8]), [2])

    def test_undecided_sizes_give_none(self):
        self.assertIsNone(summed_axes([B, 4], [S, 4]))            # either may be 1
        self.assertIsNone(summed_axes([B, 4], [3, 4]))            # B may be 1 or 3


class DimOriginsTest(tf.test.TestCase):

    def _origins(self, fn, *specs):
        concrete = tf.function(fn).get_concrete_function(*specs)
        graph = concrete.graph
        graph_def = graph.as_graph_def()
        types = traced_types(graph_def, graph)
        return DimOrigins(GraphView(graph_def, types)), concrete

    def test_reshape_back_to_a_shape_and_products_keep_the_batch_origin(self):
        def f(x, w):
            flat = tf.reshape(x, [-1, 8])                     # (B*S, 8): a new size
            y = tf.matmul(flat, w)
            back = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [4]], 0))
            z = tf.einsum("bsk,kn->bsn", x, w) + back
            return back, z, flat

        origins, concrete = self._origins(
            f, tf.TensorSpec([None, None, 8]), tf.TensorSpec([8, 4]))
        x = concrete.graph.inputs[0]
        back, z, flat = concrete.outputs
        x_dims = origins.dims((x.op.name, 0))
        # Outputs are Identity nodes of the traced results.
        back_dims = origins.dims((back.op.name, 0))
        self.assertEqual(back_dims[:2], x_dims[:2])
        self.assertEqual(origins.dims((z.op.name, 0))[:2], x_dims[:2])
        self.assertNotIn(origins.dims((flat.op.name, 0))[0], x_dims)

    def test_a_minus_one_reshape_round_trip_keeps_the_batch_origin(self):
        def f(x):
            flat = tf.reshape(x, [-1, 8])                     # (4B, 8): a product
            return tf.reshape(flat * 2.0, [-1, 4, 8])          # back: B again

        origins, concrete = self._origins(f, tf.TensorSpec([None, 4, 8]))
        x = concrete.graph.inputs[0]
        (back,) = concrete.outputs
        batch = origins.dims((x.op.name, 0))[0]
        self.assertEqual(origins.dims((back.op.name, 0))[0], batch)

    def test_a_contraction_proves_two_batches_equal(self):
        def f(a, b):
            return a + b, tf.matmul(a, b, transpose_a=True)   # runs only if a, b agree

        origins, concrete = self._origins(f, tf.TensorSpec([None, 4]), tf.TensorSpec([None, 4]))
        a, b = concrete.graph.inputs[:2]
        self.assertEqual(origins.dims((a.op.name, 0))[0], origins.dims((b.op.name, 0))[0])

    def test_a_concatenation_or_a_stack_proves_the_other_axes_equal(self):
        def f(a, b, c, d):
            return tf.concat([a, b], axis=-1), tf.stack([c, d])   # raise unless they agree

        origins, concrete = self._origins(f, *[tf.TensorSpec([None, 4])] * 4)
        a, b, c, d = (origins.dims((t.op.name, 0)) for t in concrete.graph.inputs[:4])
        joined, stacked = (origins.dims((t.op.name, 0)) for t in concrete.outputs)
        self.assertEqual(a[0], b[0])
        self.assertEqual(joined, [a[0], 8])
        self.assertEqual(c[0], d[0])
        self.assertEqual(stacked, [2, c[0], 4])
        self.assertNotEqual(a[0], c[0])

    def test_a_strided_slice_keeps_the_origins_of_whole_axes(self):
        def f(x):
            return x[:, None, :], x[..., 1:], x[0], x[:, ::-1]

        origins, concrete = self._origins(f, tf.TensorSpec([None, None]))
        x = origins.dims((concrete.graph.inputs[0].op.name, 0))
        new_axis, part, row, reversed_ = (origins.dims((t.op.name, 0))
                                          for t in concrete.outputs)
        self.assertEqual(new_axis, [x[0], 1, x[1]])
        self.assertEqual(part[0], x[0])
        self.assertNotIn(part[1], x)                          # a part of an axis: a new size
        self.assertEqual(row, [x[1]])
        self.assertEqual(reversed_, x)

    def test_a_bias_runs_along_the_channel_axis_and_a_select_vector_along_rows(self):
        def f(x, bias, cond, a, b):
            return (tf.nn.bias_add(x, bias, data_format="NCHW"), tf.nn.bias_add(x, bias),
                    tf.raw_ops.Select(condition=cond, x=a, y=b))

        origins, concrete = self._origins(
            f, tf.TensorSpec([None, None, 16, None]), tf.TensorSpec([7]),
            tf.TensorSpec([None], tf.bool), tf.TensorSpec([None, 3]), tf.TensorSpec([None, 3]))
        x = origins.dims((concrete.graph.inputs[0].op.name, 0))
        nchw, nhwc, picked = (origins.dims((t.op.name, 0)) for t in concrete.outputs)
        self.assertEqual(nchw, [x[0], 7, 16, x[3]])
        self.assertEqual(nhwc, [x[0], x[1], 16, 7])
        self.assertLen(picked, 2)
        self.assertEqual(picked[1], 3)

    def test_batchnorm_parameters_run_along_the_channel_axis(self):
        def f(x, scale, offset):
            y, *_ = tf.raw_ops.FusedBatchNormV3(
                x=x, scale=scale, offset=offset, mean=tf.zeros([5]), variance=tf.ones([5]),
                is_training=False, data_format="NCHW")
            return y

        origins, concrete = self._origins(f, tf.TensorSpec([None, None, 6, None]),
                                          tf.TensorSpec([5]), tf.TensorSpec([5]))
        x = origins.dims((concrete.graph.inputs[0].op.name, 0))
        (y,) = (origins.dims((t.op.name, 0)) for t in concrete.outputs)
        self.assertEqual(y, [x[0], 5, 6, x[3]])

    def test_independent_inputs_have_different_origins(self):
        origins, concrete = self._origins(lambda a, b: a + b, tf.TensorSpec([None, 4]),
                                          tf.TensorSpec([None, 4]))
        a, b = concrete.graph.inputs[:2]
        self.assertNotEqual(origins.dims((a.op.name, 0))[0], origins.dims((b.op.name, 0))[0])


class StaticSizesTest(tf.test.TestCase):

    def test_a_tensordot_weight_gradient_gets_its_static_rows(self):
        # TF's shape inference loses the contracted size through tensordot's
        # computed reshapes: the weight gradient is (?, 5), yet a matrix
        # product's output rows are its operand's columns, here 8.
        w = tf.Variable(random(rng(80), (8, 5), "float32"))

        @tf.function(input_signature=[tf.TensorSpec([None, 6, 8])])
        def grads(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.tanh(tf.tensordot(x, w, axes=1)))
            return tape.gradient(loss, w)

        graph_def, types, fetches = _prepared(grads.get_concrete_function())
        (dw,) = [(n.name, 0) for n in graph_def.node if n.op == "MatMul" and "gradient" in n.name]
        self.assertEqual(types[dw].shape, (None, 5))
        _, folded = decided_shapes.fold(graph_def, types, fetches)
        self.assertEqual(folded[dw].shape, (8, 5))
        opt = fs.optimize(grads)
        for batch in (1, 4):
            x = random(rng(81 + batch), (batch, 6, 8), "float32")
            self.assertAllClose(grads(x), quiet_call(opt, x), rtol=1e-5, atol=1e-5)


class InputEqualitiesTest(tf.test.TestCase):
    """fold() under assumed equal input sizes (a caller that checks them)."""

    def _folded(self, allowed):
        @tf.function
        def grads(a, b, c):
            with tf.GradientTape() as tape:
                tape.watch([a, b, c])
                loss = tf.reduce_sum(tf.exp(a * 0.5) * b + a) + tf.reduce_sum(c * 2.0)
            return tape.gradient(loss, [a, b, c])

        graph_def, types, fetches = _prepared(
            grads.get_concrete_function(*[tf.TensorSpec([None, 4])] * 3))
        inputs = decided_shapes.InputEqualities(allowed)
        folded, _ = decided_shapes.fold(graph_def, types, fetches, inputs)
        return graph_def, folded, inputs

    def test_an_allowed_equality_decides_the_sums_it_names(self):
        before, after, inputs = self._folded(lambda pair: True)
        self.assertNotEmpty(_bga_sums(before))
        self.assertEmpty(_bga_sums(after))
        self.assertEqual(inputs.wanted, {(("a", 0), ("b", 0))})   # c broadcasts with nothing
        self.assertEqual(inputs.assumed, inputs.wanted)

    def test_a_refused_equality_is_only_reported_as_wanted(self):
        before, after, inputs = self._folded(lambda pair: False)
        self.assertEqual(len(_bga_sums(after)), len(_bga_sums(before)))
        self.assertEqual(inputs.wanted, {(("a", 0), ("b", 0))})
        self.assertEqual(inputs.assumed, set())


class GradientTest(tf.test.TestCase):

    def test_layer_gradients_with_a_dynamic_batch_fuse_and_match(self):
        gen = rng(21)
        gamma = tf.Variable(random(gen, (16,), "float32"))
        w = tf.Variable(random(gen, (16, 16), "float32") * 0.3)

        @tf.function(input_signature=[tf.TensorSpec([None, 8, 16])])
        def grads(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                h = tf.einsum("bsk,kn->bsn", x, w)
                y = x * gamma + h                            # residual, broadcast gamma
                mean = tf.reduce_mean(y, axis=-1, keepdims=True)
                loss = tf.reduce_sum(tf.tanh(y - mean))
            return tape.gradient(loss, [x, gamma, w])

        opt = fs.optimize(grads)
        for batch in (3, 5):
            x = random(rng(batch), (batch, 8, 16), "float32")
            for r, o in zip(grads(x), quiet_call(opt, x)):
                self.assertAllClose(r, o, rtol=2e-5, atol=2e-5)
        before = grappler.run_grappler(grads.get_concrete_function().graph.as_graph_def(),
                                       grads.get_concrete_function().graph,
                                       [t.name for t in grads.get_concrete_function().outputs])
        self.assertNotEmpty(_bga_sums(before))
        self.assertEmpty(_bga_sums(opt.graph_def))
        # The reshapes back to each operand's shape are gone or constant.
        self.assertNotEmpty(_computed_reshapes(before))
        self.assertEmpty(_computed_reshapes(opt.graph_def))

    def test_static_shape_arithmetic_of_a_dynamic_tensordot_becomes_constants(self):
        w = tf.constant(random(rng(31), (8, 5), "float32"))

        @tf.function(input_signature=[tf.TensorSpec([None, 6, 8])])
        def f(x):
            return tf.tanh(tf.tensordot(x, w, axes=1)) * 2.0

        def prods(graph_def):
            return [n.name for n in graph_def.node if n.op == "Prod"]

        opt = fs.optimize(f, pack=False)  # the dynamic Prod would join the Tanh's launch
        for batch in (2, 7):
            x = random(rng(40 + batch), (batch, 6, 8), "float32")
            self.assertAllClose(f(x), quiet_call(opt, x), rtol=1e-5, atol=1e-6)
        concrete = f.get_concrete_function()
        before = grappler.run_grappler(concrete.graph.as_graph_def(), concrete.graph,
                                       [t.name for t in concrete.outputs])
        # The contracted size (8) is static; the free sizes' product is not.
        self.assertLen(prods(before), 2)
        self.assertLen(prods(opt.graph_def), 1)

    def test_an_unused_contraction_proves_nothing(self):
        @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None, 4])])
        def grads(a, b):
            tf.matmul(a, b, transpose_a=True)   # never runs: TF prunes it
            with tf.GradientTape() as tape:
                tape.watch([a, b])
                loss = tf.reduce_sum(tf.exp(a * 0.5) * b)
            return tape.gradient(loss, [a, b])

        # Without Grappler, whose dependency pass would delete the unused op.
        opt = fs.optimize(grads, grappler=False)
        a, b = random(rng(50), (1, 4), "float32"), random(rng(51), (3, 4), "float32")
        for r, o in zip(grads(a, b), quiet_call(opt, a, b)):
            self.assertAllClose(r, o, rtol=1e-5, atol=1e-5)

    def test_a_concatenation_decides_the_gradient_of_a_broadcast_between_inputs(self):
        @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None, 4])])
        def grads(a, b):
            with tf.GradientTape() as tape:
                tape.watch([a, b])
                both = tf.concat([a, b], axis=1)              # a and b have one batch
                loss = tf.reduce_sum(tf.exp(a * 0.5) * b) + tf.reduce_sum(both * both)
            return tape.gradient(loss, [a, b])

        opt = fs.optimize(grads)
        for rows in (1, 3):
            a = random(rng(60 + rows), (rows, 4), "float32")
            b = random(rng(70 + rows), (rows, 4), "float32")
            for r, o in zip(grads(a, b), quiet_call(opt, a, b)):
                self.assertAllClose(r, o, rtol=1e-5, atol=1e-5)
        self.assertEmpty(_bga_sums(opt.graph_def))

    def test_a_runtime_broadcast_between_independent_batches_stays_tfs(self):
        @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None, 4])])
        def grads(a, b):
            with tf.GradientTape() as tape:
                tape.watch([a, b])
                loss = tf.reduce_sum(tf.exp(a * 0.5) * b + a)
            return tape.gradient(loss, [a, b])

        # Without versions that assume the batches equal (test_versions.py).
        opt = fs.optimize(grads, specialize=False)
        for rows_a, rows_b in ((1, 3), (3, 1), (3, 3)):
            a = random(rng(rows_a), (rows_a, 4), "float32")
            b = random(rng(10 + rows_b), (rows_b, 4), "float32")
            for r, o in zip(grads(a, b), quiet_call(opt, a, b)):
                self.assertAllClose(r, o, rtol=1e-5, atol=1e-5)
        self.assertNotEmpty(_bga_sums(opt.graph_def))


class ComputedReshapeTest(tf.test.TestCase):

    def test_a_reshape_that_swaps_two_unknown_sizes_stays_tfs(self):
        # keras_hub's XLNet reshapes its [batch, seq] mask to [seq, batch]: the
        # types ([None, None] both) cannot tell it from one that keeps them in place.
        @tf.function(input_signature=[tf.TensorSpec([None, None])])
        def masks(mask):
            shape = tf.shape(mask)
            swapped = tf.reshape(1.0 - mask, [shape[1], shape[0]])     # [seq, batch]
            data = tf.cast(tf.expand_dims(tf.expand_dims(swapped, 0), -1) > 0, tf.int32)
            positions = tf.range(shape[1])
            eye = tf.where(positions[:, None] == positions[None, :], 1, 0)   # [seq, seq]
            joined = data + tf.expand_dims(tf.expand_dims(-eye, -1), -1)    # [seq, seq, batch, 1]
            return tf.cast(joined > 0, tf.float32) * 2.0 + 1.0

        opt = fs.optimize(masks)
        for batch, seq in ((2, 5), (3, 3), (4, 1)):
            mask = tf.cast(random(rng(batch), (batch, seq), "float32") > 0, tf.float32)
            self.assertAllEqual(masks(mask), quiet_call(opt, mask))
        self.assertLess(opt.report().kernels_after, opt.report().kernels_before)


if __name__ == "__main__":
    tf.test.main()


class AnalysesTest(tf.test.TestCase):
    """decided_shapes.Analyses: one view and one DimOrigins per graph and set
    of equal inputs, while fold's steps change nothing."""

    def test_an_unchanged_graph_is_walked_once_and_a_changed_one_again(self):
        @tf.function(input_signature=[tf.TensorSpec([None, 4])])
        def plain(x):
            return tf.tanh(x) * 2.0

        graph_def, types, fetches = _prepared(plain.get_concrete_function())
        built = {"views": 0, "origins": 0}
        real_view, real_origins = GraphView.__init__, DimOrigins.__init__

        def count(kind, real):
            def init(self, *args, **kwargs):
                built[kind] += 1
                real(self, *args, **kwargs)
            return init

        GraphView.__init__ = count("views", real_view)
        DimOrigins.__init__ = count("origins", real_origins)
        try:
            analyses = decided_shapes.Analyses(decided_shapes.Context(), fetches)
            gd, folded = decided_shapes.fold(graph_def, types, fetches, analyses=analyses)
            self.assertIs(gd, graph_def)     # nothing to decide: the very objects
            self.assertIs(folded, types)
            first = analyses.origins(gd, folded)
            self.assertIs(analyses.origins(gd, folded), first)
            self.assertIs(analyses.view(gd, folded), analyses.view(graph_def, types))
            self.assertEqual(built["views"], 1, built)
            self.assertLessEqual(built["origins"], 1, built)
            other = tf.compat.v1.GraphDef()
            other.CopyFrom(graph_def)
            analyses.view(other, types)      # another graph: a view of its own
            self.assertEqual(built["views"], 2, built)
            self.assertIsNot(analyses.origins(other, types), first)
        finally:
            GraphView.__init__, DimOrigins.__init__ = real_view, real_origins
