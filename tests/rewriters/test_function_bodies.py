"""The fusion pass inside functions the graph calls (rewriters/function_bodies.py):
While bodies of Keras GRU/LSTM layers (and of their gradients), a plain
tf.while_loop, and the fallback when a body cannot be rewritten.

Results are compared with TF's on fresh random inputs under optimize_testlib's
tolerances (docs/DESIGN.md, "Numerics"): a recurrent layer is a chain of elementwise
ops and small matmuls per step, so the whole-function tolerance of
test_optimize_functions.test_train_step (rtol 1e-5, atol 1e-6) applies; train
steps are compared by optimize_testlib.assert_train_steps_match.
"""

import warnings

import keras
import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs
from optimize_testlib import assert_same, assert_train_steps_match, quiet_call, random, rng
from tf_fusionstitch.rewriters import function_bodies

from benchmarks.models import common  # the repository root (pyproject.toml's pytest pythonpath)

_TOL = dict(rtol=1e-5, atol=1e-6)


def _while_bodies(graph_def):
    """{body function name: FunctionDef} of every While the graph runs, at any depth."""
    library = {f.signature.name: f for f in graph_def.library.function}
    found, visited, stack = {}, set(), list(graph_def.node)
    while stack:
        node = stack.pop()
        for attr, name, _ in function_bodies.called_functions(node, set(library)):
            if node.op in function_bodies.WHILE_OPS and attr == "body":
                found[name] = library[name]
            if name not in visited:
                visited.add(name)
                stack.extend(library[name].node_def)
    return found


def _fused_bodies(graph_def):
    return {name: f for name, f in _while_bodies(graph_def).items()
            if any(n.op == "FusionStitch" for n in f.node_def)}


def _rnn_model(layer, steps=6, features=5, seed=0):
    inputs = keras.Input((steps, features))
    outputs = layer(inputs)
    model = keras.Model(inputs, outputs)
    common.randomize_weights(model, seed)
    return model


class FunctionBodiesTest(tf.test.TestCase):

    def _check_recurrent(self, layer, seed):
        model = _rnn_model(layer, seed=seed)

        @tf.function(input_signature=[tf.TensorSpec([None, 6, 5])])
        def f(x):
            return model(x, training=False)

        opt = fs.optimize(f)
        gen = rng(seed)
        for batch in (3, 7):  # a new batch size reuses the trace and its kernels
            x = random(gen, (batch, 6, 5), "float32")
            assert_same(self, quiet_call(opt, x), f(x), msg=f"batch {batch}", **_TOL)
        fused = _fused_bodies(opt.graph_def)
        self.assertNotEmpty(fused, str(opt.report()))
        report = opt.report()
        body_clusters = [c for c in report.fused_clusters if "/" in c.name and
                         any(c.name.startswith(name.rsplit("_fs", 1)[0]) for name in fused)]
        self.assertNotEmpty(body_clusters, str(report))
        return opt

    def test_gru_inference(self):
        self._check_recurrent(keras.layers.GRU(8, return_sequences=True), seed=101)

    def test_lstm_inference(self):
        self._check_recurrent(keras.layers.LSTM(8), seed=102)

    def test_plain_while_loop(self):
        @tf.function(input_signature=[tf.TensorSpec([None, 9]), tf.TensorSpec([9])])
        def f(x, w):
            def body(i, a, s):
                a = tf.tanh(a * w + 0.5) - 0.25 * tf.sigmoid(a)
                return i + 1, a, s + tf.reduce_sum(a * a, axis=-1)
            _, a, s = tf.while_loop(lambda i, a, s: i < 4, body,
                                    [tf.constant(0), x, tf.zeros_like(x[:, 0])])
            return a, s

        opt = fs.optimize(f)
        gen = rng(103)
        w = random(gen, (9,), "float32", "small")
        for batch in (2, 5):
            x = random(gen, (batch, 9), "float32")
            got, want = quiet_call(opt, x, w), f(x, w)
            for g, e, what in zip(got, want, ("a", "s")):
                assert_same(self, g, e, msg=f"{what}, batch {batch}", **_TOL)
        fused = _fused_bodies(opt.graph_def)
        self.assertLen(fused, 1, str(opt.report()))
        body = next(iter(fused.values()))
        # The body's signature, return values and attributes are kept.
        original = [f for f in opt.graph_def.library.function
                    if body.signature.name.startswith(f.signature.name + "_fs")]
        self.assertLen(original, 1)
        self.assertEqual(body.signature.input_arg, original[0].signature.input_arg)
        self.assertEqual(body.signature.output_arg, original[0].signature.output_arg)
        self.assertEqual(set(body.ret), set(original[0].ret))

    def test_nested_functions_and_shared_callees(self):
        """A tf.function called from the graph (PartitionedCall) with a loop inside,
        called twice with one signature (one rewritten definition both calls
        share) and once with another (a second trace of its own)."""
        @tf.function
        def g(x):
            _, a = tf.while_loop(lambda i, a: i < 3,
                                 lambda i, a: (i + 1, tf.tanh(a * 1.5) + 0.25),
                                 [tf.constant(0), x])
            return tf.sigmoid(a) * 2.0 + 1.0

        @tf.function
        def f(x, y, z):
            return g(x) + g(y), g(z)

        opt = fs.optimize(f)
        gen = rng(107)
        x, y = random(gen, (3, 4), "float32"), random(gen, (3, 4), "float32")
        z = random(gen, (2, 5), "float32")
        for got, want in zip(quiet_call(opt, x, y, z), f(x, y, z)):
            assert_same(self, got, want, **_TOL)
        calls = [n.attr["f"].func.name for n in opt.graph_def.node
                 if n.op in ("PartitionedCall", "StatefulPartitionedCall")]
        self.assertLen(calls, 3)
        self.assertLen(set(calls), 2)
        library = {fn.signature.name: fn for fn in opt.graph_def.library.function}
        for name in calls:
            self.assertIn(name, library)
            self.assertIn("_fs", name)  # renamed: its body (or a callee) was rewritten
        self.assertLen(_fused_bodies(opt.graph_def), 2)

    def test_one_function_called_with_two_batch_sizes(self):
        """One traced function called on tensors of different static shapes: its
        rewrite is specialised only on what every call agrees on."""
        @tf.function(input_signature=[tf.TensorSpec([None, 4])])
        def inner(x):
            return tf.tanh(x * 2.0) + tf.sigmoid(x) * 0.5

        @tf.function
        def f(a, b):
            return inner(a), inner(b)

        opt = fs.optimize(f)
        gen = rng(108)
        a, b = random(gen, (2, 4), "float32"), random(gen, (3, 4), "float32")
        for got, want in zip(quiet_call(opt, a, b), f(a, b)):
            assert_same(self, got, want, **_TOL)
        calls = {n.attr["f"].func.name for n in opt.graph_def.node
                 if n.op in ("PartitionedCall", "StatefulPartitionedCall")}
        self.assertLen(calls, 1)
        library = {fn.signature.name: fn for fn in opt.graph_def.library.function}
        fused = [n for n in library[calls.pop()].node_def if n.op == "FusionStitch"]
        self.assertLen(fused, 1)
        self.assertIn('"shape":[null,4]', fused[0].attr["spec"].s.decode())

    def test_gru_train_step_matches_tf(self):
        def build():
            model = _rnn_model(keras.layers.GRU(8), seed=104)
            head = keras.layers.Dense(1)
            full = keras.Sequential([model, head])
            full.build((None, 6, 5))

            def make_batch(gen, batch):
                gen = common.generator(gen)
                return common.Batch((common.normal(gen, (batch, 6, 5)),),
                                    common.normal(gen, (batch, 1)))

            return common.assemble(
                "gru", {}, full, [tf.TensorSpec([None, 6, 5])], tf.TensorSpec([None, 1]),
                make_batch, lambda y, p: tf.reduce_mean(tf.square(p - y)), seed=104)

        reference, fused = build(), build()
        opt = fs.optimize(fused.train_step)
        assert_train_steps_match(self, reference, fused, opt, np.random.default_rng(105),
                                 name="gru")
        fused_bodies = _fused_bodies(opt.graph_def)
        # The forward loop and its gradient loop are both rewritten.
        self.assertGreaterEqual(len(fused_bodies), 2, str(opt.report()))

    def test_body_that_cannot_be_rewritten_falls_back(self):
        @tf.function(input_signature=[tf.TensorSpec([None, 4])])
        def f(x):
            _, a = tf.while_loop(lambda i, a: i < 3,
                                 lambda i, a: (i + 1, tf.exp(a * 0.5) - 1.0),
                                 [tf.constant(0), x])
            return tf.nn.relu(a) * 2.0 + 1.0

        original = function_bodies.graph_def_to_function

        def broken(*args, **kwargs):
            raise ValueError("simulated conversion failure")

        function_bodies.graph_def_to_function = broken
        try:
            opt = fs.optimize(f)
            x = random(rng(106), (5, 4), "float32")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = opt(x)
        finally:
            function_bodies.graph_def_to_function = original
        assert_same(self, got, f(x), **_TOL)
        report = opt.report()
        reasons = [c.reason for c in report.fallbacks]
        self.assertTrue(any("simulated conversion failure" in r for r in reasons), str(report))
        self.assertTrue(any("stay as TensorFlow ops" in str(w.message) for w in caught))
        self.assertEmpty(_fused_bodies(opt.graph_def))
        self.assertNotEmpty(report.fused_clusters)  # the graph's own ops still fuse


if __name__ == "__main__":
    tf.test.main()
