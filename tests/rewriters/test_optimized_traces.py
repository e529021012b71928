"""Rewrites of one trace share its Grappler run and shape inference
(rewriters/optimized_traces.py), and each still gets the plan it would get alone."""

import tensorflow as tf

import tf_fusionstitch as fs
from tf_fusionstitch.rewriters import optimized_traces
from optimize_testlib import assert_same, rng


def _norm_step():
    """A layer norm's forward and backward pass and an SGD update: passes that
    edit the GraphDef and the types in place (variable updates, einsum) have
    something to edit."""
    scale = tf.Variable(rng(0).standard_normal(32).astype("float32"))
    weight = tf.Variable(rng(2).standard_normal((32, 16)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec([None, 32], tf.float32)])
    def f(x):
        with tf.GradientTape() as tape:
            centred = x - tf.reduce_mean(x, axis=-1, keepdims=True)
            variance = tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True)
            y = centred * tf.math.rsqrt(variance + 1e-5) * scale
            loss = tf.reduce_mean(tf.tanh(tf.einsum("bi,io->bo", y, weight)))
        grads = tape.gradient(loss, [scale, weight])
        for v, g in zip([scale, weight], grads):
            v.assign_sub(0.1 * g)
        return loss
    return f


def _plan(case, fn, **options):
    opt = fs.optimize(fn, rewrite_cache=False, **options)
    x = tf.constant(rng(1).standard_normal((4, 32)).astype("float32"))
    variables = fn.get_concrete_function().variables
    start = [v.numpy() for v in variables]
    want = fn(x), [v.numpy() for v in variables]
    for v, value in zip(variables, start):
        v.assign(value)
    got = opt(x), [v.numpy() for v in variables]
    for a, b in zip([got[0], *got[1]], [want[0], *want[1]]):
        assert_same(case, tf.constant(a), tf.constant(b))
    return opt.graph_def.SerializeToString(deterministic=True), opt.report()


class SharedStartTest(tf.test.TestCase):

    def test_two_plans_of_one_trace_run_grappler_once(self):
        fn = _norm_step()
        before = optimized_traces.computed
        _plan(self, fn, fusion="stitch")
        _, report = _plan(self, fn, fusion="xla_like")
        self.assertEqual(optimized_traces.computed - before, 1)
        self.assertLess(report.kernels_after, report.kernels_before)

    def test_a_shared_start_gives_the_plan_a_fresh_one_gives(self):
        # The first rewrite edits its copy in place; the second must not see it.
        fn = _norm_step()
        _plan(self, fn, fusion="stitch")
        shared, _ = _plan(self, fn, fusion="xla_like")
        optimized_traces.clear()
        fresh, _ = _plan(self, fn, fusion="xla_like")
        self.assertEqual(shared, fresh)

    def test_grappler_off_is_its_own_start(self):
        fn = _norm_step()
        before = optimized_traces.computed
        _plan(self, fn)
        _plan(self, fn, grappler=False)
        self.assertEqual(optimized_traces.computed - before, 2)


if __name__ == "__main__":
    tf.test.main()
