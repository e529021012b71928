"""Proofs of equal dynamic sizes through function calls, loops and TensorLists
(rewriters/call_dims.py, rewriters/dim_origins.py), and what they buy: the
gradient Sums of a recurrent layer's backward loop are decided, its cell
fuses, and a kernel learns which of its inputs' extents are equal.

Optimized functions are compared with TF's on fresh random inputs, at a
batch of 1 too: that is where a wrong proof (a size taken as equal that may
broadcast) would give wrong results."""

import keras
import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs
from optimize_testlib import assert_same, quiet_call, random, rng
from test_decided_shapes import _bga_sums, _prepared
from test_function_bodies import _rnn_model, _while_bodies
from tf_fusionstitch.rewriters import call_dims, function_graphs
from tf_fusionstitch.rewriters.dim_origins import BOTTOM, DimOrigins, Facts
from tf_fusionstitch.rewriters.graph_view import GraphView

_TOL = dict(rtol=1e-5, atol=1e-6)


def _origins(fn, *specs):
    """(DimOrigins of the traced graph, with its calls analysed; its inputs
    and outputs as tensors)."""
    concrete = tf.function(fn).get_concrete_function(*specs)
    graph_def, types, fetches = _prepared(concrete)
    calls = call_dims.CallDims(function_graphs.FunctionGraphs(graph_def.library,
                                                              graph_def.versions))
    origins = DimOrigins(GraphView(graph_def, types), fetches, calls=calls)

    def tensor(t):
        name, port = t.name.split(":")
        return name, int(port)
    return origins, [tensor(t) for t in concrete.inputs], [tensor(t) for t in concrete.outputs]


def _loop(h0, xs, step):
    """A while loop over the rows of xs carrying h, stacking every h."""
    steps = tf.shape(xs)[0]
    ta = tf.TensorArray(tf.float32, size=steps).unstack(xs)
    out = tf.TensorArray(tf.float32, size=steps)

    def body(i, h, out):
        h = step(h, ta.read(i))
        return i + 1, h, out.write(i, h)

    _, h, out = tf.while_loop(lambda i, h, out: i < steps, body, (0, h0, out),
                              shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, 5]),
                                                tf.TensorShape(None)))
    return h, out.stack()


class LoopInvariantTest(tf.test.TestCase):

    def test_a_loop_keeps_the_sizes_every_iteration_keeps(self):
        def f(xs):
            return _loop(tf.zeros_like(xs[0]), xs, lambda h, x: tf.tanh(h * x + 1.0))

        origins, (xs,), (h, stacked) = _origins(f, tf.TensorSpec([None, None, 5]))
        batch = origins.dims(xs)[1]
        self.assertEqual(origins.dims(h), [batch, 5])
        self.assertEqual(origins.dims(stacked)[1:], [batch, 5])

    def test_a_loop_variable_that_may_broadcast_is_not_kept(self):
        """h0's batch may be 1 while the steps' is 4: after one iteration h has
        the steps' batch, so nothing ties h to h0 or to the steps."""
        def f(h0, xs):
            return _loop(h0, xs, lambda h, x: h * x)

        origins, (h0, xs), (h, _) = _origins(
            f, tf.TensorSpec([None, 5]), tf.TensorSpec([None, None, 5]))
        self.assertNotIn(origins.dims(h)[0], (origins.dims(h0)[0], origins.dims(xs)[1]))

        @tf.function(input_signature=[tf.TensorSpec([None, 5]), tf.TensorSpec([None, None, 5])])
        def g(h0, xs):
            with tf.GradientTape() as tape:
                tape.watch([h0, xs])
                h, stacked = f(h0, xs)
                loss = tf.reduce_sum(tf.tanh(h)) + tf.reduce_sum(stacked * stacked)
            return tape.gradient(loss, [h0, xs])

        opt = fs.optimize(g, specialize=False)
        gen = rng(7)
        for rows_h, rows_x in ((1, 4), (4, 4), (4, 1)):
            h0 = random(gen, (rows_h, 5), "float32", "small")
            xs = random(gen, (3, rows_x, 5), "float32", "small")
            for got, want, what in zip(quiet_call(opt, h0, xs), g(h0, xs), ("h0", "xs")):
                assert_same(self, got, want, msg=f"d{what}, batches {rows_h}/{rows_x}", **_TOL)

    def test_list_elements_carry_what_was_pushed(self):
        """An accumulator the forward loop pushes shapes into pops them back,
        by value, in another function: the gradient loop's view."""
        def f(xs):
            empty = tf.raw_ops.EmptyTensorList(element_shape=tf.constant([-1], tf.int32),
                                               max_num_elements=-1, element_dtype=tf.int32)
            steps = tf.shape(xs)[0]

            def body(i, h, acc):
                h = tf.sigmoid(h + xs[i])
                return i + 1, h, tf.raw_ops.TensorListPushBack(input_handle=acc,
                                                               tensor=tf.shape(h))
            _, h, acc = tf.while_loop(lambda i, h, acc: i < steps, body,
                                      (0, tf.zeros_like(xs[0]), empty),
                                      shape_invariants=(tf.TensorShape([]),
                                                        tf.TensorShape([None, 5]),
                                                        tf.TensorShape(None)))
            _, shape = tf.raw_ops.TensorListPopBack(
                input_handle=acc, element_shape=tf.constant([-1], tf.int32),
                element_dtype=tf.int32)
            return h, shape

        origins, (xs,), (_, shape) = _origins(f, tf.TensorSpec([None, None, 5]))
        self.assertEqual(origins.value(shape), [origins.dims(xs)[1], 5])

    def test_portable_facts_name_keys_in_order_of_appearance(self):
        a, b = ("dim", "a", 0, 0), ("dim", "b", 0, 0)
        facts = [Facts(dims=(b, 5)), Facts(elem_dims=(a, b, BOTTOM), elem_dtype="float32")]
        self.assertEqual(call_dims.portable(facts),
                         (Facts(dims=(("k", 0), 5)),
                          Facts(elem_dims=(("k", 1), ("k", 0), BOTTOM), elem_dtype="float32")))


class RecurrentGradientTest(tf.test.TestCase):

    def _train_step(self, layer, seed):
        model = _rnn_model(layer, seed=seed)
        optimizer = keras.optimizers.Adam(1e-2)

        @tf.function(input_signature=[tf.TensorSpec([None, 6, 5]), tf.TensorSpec([None, 8])])
        def step(x, y):
            with tf.GradientTape() as tape:
                out = model(x, training=True)
                out = out[:, -1] if len(out.shape) == 3 else out
                loss = tf.reduce_mean(tf.square(out - y))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss, grads
        return model, step

    def _check(self, layer_fn, seed):
        """Gradients of the optimized step match TF's at batches 1 and 3, and
        no gradient Sum of the backward loop's cell is left to run time."""
        reference_model, reference = self._train_step(layer_fn(), seed)
        model, step = self._train_step(layer_fn(), seed)
        opt = fs.optimize(step)
        gen = rng(seed)
        for batch in (3, 1, 3):
            x = random(gen, (batch, 6, 5), "float32")
            y = random(gen, (batch, 8), "float32")
            (loss, grads), (want_loss, want_grads) = quiet_call(opt, x, y), reference(x, y)
            assert_same(self, loss, want_loss, msg=f"loss, batch {batch}", **_TOL)
            for g, w, v in zip(grads, want_grads, model.trainable_variables):
                assert_same(self, g, w, msg=f"{v.path}, batch {batch}", rtol=2e-5, atol=2e-6)
        for name, body in _while_bodies(opt.graph_def).items():
            if "_grad" in name:
                self.assertEmpty(_bga_sums(_as_graph_def(body)), name)
                self.assertTrue(any(n.op == "FusionStitch" for n in body.node_def), name)
        return opt

    def test_gru(self):
        self._check(lambda: keras.layers.GRU(8, return_sequences=True), seed=31)

    def test_lstm(self):
        self._check(lambda: keras.layers.LSTM(8), seed=32)


def _as_graph_def(fdef):
    """A FunctionDef's nodes as a GraphDef, inputs named by node (enough for _bga_sums)."""
    from tensorflow.core.framework import graph_pb2
    gd = graph_pb2.GraphDef()
    for node in fdef.node_def:
        new = gd.node.add()
        new.CopyFrom(node)
        del new.input[:]
        new.input.extend(s.split(":")[0] for s in node.input)
    names = {n.name for n in gd.node}
    for arg in fdef.signature.input_arg:
        if arg.name not in names:
            gd.node.add(name=arg.name, op="Placeholder")
    return gd


if __name__ == "__main__":
    tf.test.main()
