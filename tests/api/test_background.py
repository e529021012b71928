"""optimize(fn, background=True): the first calls run the original function
while the rewrite runs on a thread (tf_fusionstitch/background.py); calls run
the optimized function once it is ready. Every call does its work once and
returns the original's results either way. The rewrite is held back by an
event, so which function ran is the test's choice, not a race."""

import threading
import warnings
from unittest import mock

import tensorflow as tf

import tf_fusionstitch as fs
from tf_fusionstitch import api, trace_rewrite
from optimize_testlib import assert_same, fusion_stitch_nodes, quiet_call, rng


def _held_back_prepare(release: threading.Event):
    """OptimizedFunction.prepare that waits for `release` first."""
    real = api.OptimizedFunction.prepare

    def prepare(self, *args, **kwargs):
        release.wait(60)
        return real(self, *args, **kwargs)
    return mock.patch.object(api.OptimizedFunction, "prepare", prepare)


class BackgroundTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        self.counter = tf.Variable(0.0)
        counter = self.counter

        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
        def step(x):
            counter.assign_add(1.0)
            mean = tf.reduce_mean(x, axis=-1, keepdims=True)
            return tf.tanh(x - mean) * 3.0 + mean
        self.step = step
        gen = rng(3)
        self.inputs = [tf.constant(gen.standard_normal((5, 64)), tf.float32) for _ in range(4)]

    def _check(self, opt, x, call=quiet_call):
        """One call of `opt`: TF's result, and the step's side effect once."""
        before = float(self.counter.numpy())
        got = call(opt, x)
        self.assertEqual(float(self.counter.numpy()), before + 1.0)
        want = self.step(x)
        self.counter.assign(before + 1.0)        # the reference call does not count
        assert_same(self, got, want, "transcendental")

    def test_first_calls_run_the_original_then_the_optimized_function(self):
        release = threading.Event()
        with _held_back_prepare(release):
            opt = fs.optimize(self.step, background=True)
            for x in self.inputs[:2]:
                self._check(opt, x)
            self.assertIsNone(opt.report(), "the rewrite ran before it was released")
            self.assertFalse(opt.wait(0.05))
            release.set()
            self.assertTrue(opt.wait(120))
        self.assertLen(opt.reports(), 1)
        self.assertNotEmpty(opt.report().fused_clusters)
        self.assertNotEmpty(fusion_stitch_nodes(opt.graph_def))
        runs = []
        real_run = api.OptimizedFunction._run

        def counted_run(self_, version, args, kwargs):   # the optimized function's calls
            runs.append(version)
            return real_run(self_, version, args, kwargs)
        with mock.patch.object(api.OptimizedFunction, "_run", counted_run):
            for x in self.inputs[2:]:
                self._check(opt, x)
        self.assertLen(runs, 2)
        self.assertLen(opt.reports(), 1)            # no second rewrite

    def test_a_call_inside_another_trace_waits_for_the_optimized_function(self):
        opt = fs.optimize(self.step, background=True)

        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
        def outer(x):
            return opt(x) * 2.0
        x = self.inputs[0]
        got = quiet_call(outer, x)
        self.assertNotEmpty(opt.report().fused_clusters)
        ops = {n.op for f in outer.get_concrete_function().graph.as_graph_def().library.function
               for n in f.node_def}
        self.assertIn("FusionStitch", ops)
        self.counter.assign(0.0)
        assert_same(self, got, self.step(x) * 2.0, "transcendental")

    def test_a_failed_rewrite_leaves_the_original_running(self):
        def broken(concrete, inputs, options, name):
            raise RuntimeError("a bug in the rewrite")
        with mock.patch.object(trace_rewrite, "rewrite", broken):
            opt = fs.optimize(self.step, background=True)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", RuntimeWarning)
                for x in self.inputs[:2]:       # the second after the rewrite gave up
                    self._check(opt, x, call=lambda f, x: f(x))
                    self.assertTrue(opt.wait(120))
        self.assertIn("a bug in the rewrite", opt.report().failure)
        self.assertTrue(any("runs unoptimized" in str(w.message) for w in caught))

    def test_off_by_default_and_validated(self):
        opt = fs.optimize(self.step)
        self.assertTrue(opt.wait(0))
        self._check(opt, self.inputs[0])
        self.assertNotEmpty(opt.report().fused_clusters)     # the first call was fused
        with self.assertRaisesRegex(TypeError, "background"):
            fs.optimize(self.step, background=1)


if __name__ == "__main__":
    tf.test.main()
