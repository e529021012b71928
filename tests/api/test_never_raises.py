"""`optimize` never raises for its own failures, and the failures third-party
models found are fixed.

- A rewrite that fails (any exception inside tf_fusionstitch while rewriting
  one trace) leaves that trace as the original function: TF's results, one
  RuntimeWarning, and the reason in the report (`failure`, and one fallback),
  so a test that asserts no fallback cannot miss it.
- Errors TF raises for bad arguments stay TF's.
- A captured eager constant (a Keras Normalization layer's statistics) is a
  Const in the traced GraphDef that Grappler may fold away.
- Sparse (IndexedSlices) gradients under RMSprop and Adagrad run a tf.cond
  whose branches Grappler specialises into new library functions, which the
  runtime must be told about.
"""

import warnings

import keras
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

import tf_fusionstitch as fs
from tf_fusionstitch import graph_check, trace_rewrite
from optimize_testlib import assert_same, quiet_call, rng


def _layernorm_like():
    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
    def f(x):
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        return tf.tanh(x - mean) * 2.0 + 1.0
    return f


class RewriteFailureTest(tf.test.TestCase):

    def _failing_pass(self, error):
        original = trace_rewrite.run_fusion_pass

        def fail(*args, **kwargs):
            raise error
        trace_rewrite.run_fusion_pass = fail
        self.addCleanup(setattr, trace_rewrite, "run_fusion_pass", original)

    def test_the_rewrite_runs_with_the_collector_paused_and_resumes_it(self):
        """runtime/gc_pause.py: the fusion pass and the plan's import see the
        collector off; after the call, failed or not, it is on again."""
        import gc
        seen = {}
        for name in ("run_fusion_pass", "_input_map"):   # the pass; a step of the import
            original = getattr(trace_rewrite, name)

            def watched(*args, _original=original, _name=name, **kwargs):
                seen.setdefault(_name, []).append(gc.isenabled())
                return _original(*args, **kwargs)
            setattr(trace_rewrite, name, watched)
            self.addCleanup(setattr, trace_rewrite, name, original)
        self.assertTrue(gc.isenabled())
        opt = fs.optimize(_layernorm_like(), rewrite_cache=False)
        x = tf.constant(rng(0).standard_normal((5, 16)), tf.float32)
        assert_same(self, quiet_call(opt, x), _layernorm_like()(x), "transcendental")
        self.assertEqual(seen, {"run_fusion_pass": [False], "_input_map": [False]})
        self.assertTrue(gc.isenabled())
        self._failing_pass(KeyError("some_node"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # the fallback's warning
            fs.optimize(_layernorm_like(), rewrite_cache=False)(x)
        self.assertTrue(gc.isenabled())

    def test_a_failing_rewrite_runs_the_original_with_one_warning(self):
        for error in (RecursionError("maximum recursion depth exceeded"),
                      KeyError("some_node"), AssertionError("an internal check")):
            with self.subTest(error=type(error).__name__):
                self._failing_pass(error)
                f = _layernorm_like()
                opt = fs.optimize(f, rewrite_cache=False)
                x = tf.constant(rng(0).standard_normal((5, 16)), tf.float32)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    y = opt(x)
                    y2 = opt(tf.constant(rng(1).standard_normal((7, 16)), tf.float32))
                ours = [w for w in caught if "tf_fusionstitch" in str(w.message)]
                self.assertLen(ours, 1, [str(w.message) for w in caught])
                self.assertIn(type(error).__name__, str(ours[0].message))
                self.assertAllEqual(y, f(x))   # the original, so exactly TF's
                self.assertEqual(y2.shape, (7, 16))
                report = opt.report()
                self.assertLen(opt.reports(), 1)   # the fallback trace is reused
                self.assertIn(type(error).__name__, report.failure)
                self.assertLen(report.fallbacks, 1)
                self.assertIn("not optimized", str(report))
                self.assertIsNone(opt.graph_def)

    def test_a_rewritten_graph_that_cannot_run_falls_back(self):
        # A rewrite that names a function the runtime lacks fails at check
        # time instead of at the user's first call.
        original = trace_rewrite.rewrite

        def broken(concrete, inputs, options, name):
            graph_def, outputs, report = original(concrete, inputs, options, name)
            graph_def.node.add(name="dangling_call", op="no_such_function_anywhere")
            return graph_def, outputs, report
        trace_rewrite.rewrite = broken
        self.addCleanup(setattr, trace_rewrite, "rewrite", original)
        f = _layernorm_like()
        opt = fs.optimize(f, rewrite_cache=False)
        x = tf.constant(rng(2).standard_normal((3, 16)), tf.float32)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            self.assertAllEqual(opt(x), f(x))
        self.assertIn("no_such_function_anywhere", opt.report().failure)

    def test_tf_errors_for_bad_arguments_stay_tfs(self):
        f = _layernorm_like()
        opt = fs.optimize(f)
        for bad in (tf.zeros([2, 3]), tf.zeros([2, 16], tf.int32)):
            with self.assertRaises((TypeError, ValueError)) as original_error:
                f(bad)
            with self.assertRaises(type(original_error.exception)):
                opt(bad)


class GraphCheckTest(tf.test.TestCase):

    def test_unknown_op_types_and_function_references_are_named(self):
        gd = graph_pb2.GraphDef()
        gd.node.add(name="x", op="Placeholder").attr["dtype"].type = 1
        graph_check.check_runnable(gd, ["x:0"])
        call = gd.node.add(name="branchy", op="StatelessIf")
        call.attr["then_branch"].func.name = "specialized_branch_that_is_gone"
        with self.assertRaisesRegex(graph_check.NotRunnable,
                                    "branchy.*specialized_branch_that_is_gone"):
            graph_check.check_runnable(gd)
        del gd.node[-1]
        gd.node.add(name="call", op="missing_fn")
        with self.assertRaisesRegex(graph_check.NotRunnable, "call.*missing_fn"):
            graph_check.check_runnable(gd)
        del gd.node[-1]
        with self.assertRaisesRegex(graph_check.NotRunnable, "y:0"):
            graph_check.check_runnable(gd, ["y:0"])


class CapturedConstantTest(tf.test.TestCase):

    def test_a_captured_eager_constant_that_grappler_folds(self):
        var = tf.constant([1.0, 4.0, 9.0])

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
        def f(x):
            return (x - 1.0) / tf.sqrt(var)
        opt = fs.optimize(f)
        x = tf.constant(rng(3).standard_normal((4, 3)), tf.float32)
        assert_same(self, quiet_call(opt, x), f(x), "chain")
        self.assertEmpty(opt.report().fallbacks)

    def test_keras_normalization_statistics_next_to_a_variable(self):
        norm = keras.layers.Normalization(mean=[1.0, 2.0, 3.0, 4.0],
                                          variance=[1.0, 4.0, 9.0, 16.0])
        dense = keras.layers.Dense(5)
        dense.build((None, 4))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
        def f(x):
            return tf.nn.gelu(dense(norm(x)))
        opt = fs.optimize(f)
        for batch in (2, 9):
            x = tf.constant(rng(batch).standard_normal((batch, 4)), tf.float32)
            assert_same(self, quiet_call(opt, x), f(x), "transcendental")
        self.assertNotEmpty(opt.report().fused_clusters)
        self.assertEmpty(opt.report().fallbacks)


class SparseGradientOptimizerTest(tf.test.TestCase):
    """Embedding -> Flatten -> Dense trained with optimizers whose sparse
    update is a tf.cond that Grappler specialises."""

    def _model_and_step(self, make_optimizer):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,), dtype="int32"),
                                  keras.layers.Embedding(50, 8), keras.layers.Flatten(),
                                  keras.layers.Dense(3)])
        optimizer = make_optimizer()
        optimizer.build(model.trainable_variables)

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.int32),
                                      tf.TensorSpec([None], tf.int32)])
        def step(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=y, logits=logits))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return model, step

    def test_three_steps_match_tf(self):
        optimizers = {"rmsprop": lambda: keras.optimizers.RMSprop(0.01),
                      "adagrad": lambda: keras.optimizers.Adagrad(0.1)}
        for name, make in optimizers.items():
            with self.subTest(optimizer=name):
                reference, tf_step = self._model_and_step(make)
                fused, fused_step = self._model_and_step(make)
                opt = fs.optimize(fused_step)
                gen = np.random.default_rng(7)
                for _ in range(3):
                    x = tf.constant(gen.integers(0, 50, (6, 4)), tf.int32)
                    y = tf.constant(gen.integers(0, 3, 6), tf.int32)
                    assert_same(self, quiet_call(opt, x, y), tf_step(x, y), "transcendental")
                for r, f in zip(reference.weights, fused.weights):
                    assert_same(self, tf.convert_to_tensor(f), tf.convert_to_tensor(r),
                                "transcendental", msg=r.path)
                self.assertEqual(opt.report().failure, "")
                self.assertNotEmpty(opt.report().fused_clusters)
                self.assertEmpty(opt.report().fallbacks)


if __name__ == "__main__":
    tf.test.main()
