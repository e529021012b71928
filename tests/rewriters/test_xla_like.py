"""`optimize(fn, fusion="xla_like")`: XLA's fusion rules (rewriters/xla_like.py)
and the memory-intensive kernel count (rewriters/kernel_count.py).

xla_like clusters are smaller than stitch's but go through the same codegen,
so their results must equal TF's under docs/DESIGN.md, "Numerics" (see
optimize_testlib.py) on fresh seeded random inputs; their kernel counts are the
comparison with XLA this option exists for.
"""

import warnings

import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs
from optimize_testlib import (EPS, assert_reduction_close, assert_same, fusion_stitch_nodes,
                              random, rng)
from tf_fusionstitch import fusion_ir as ir

HIDDEN = 64
# two reductions of HIDDEN terms, an rsqrt and a few products (as in
# test_optimize_functions.py)
_NORM_TOL = (HIDDEN + 8) * EPS["float32"]


def _layernorm(x, gamma, beta):
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
    return centered * tf.math.rsqrt(var + 1e-5) * gamma + beta


def _optimized_call(fn, args, fusion):
    """(optimized function, its result); a fallback to TF ops fails the test."""
    opt = fs.optimize(fn, fusion=fusion)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        return opt, opt(*args)


class XlaLikeTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        gen = rng(9100 + len(self.id()))
        self.x = random(gen, (5, 16, HIDDEN), "float32")
        self.res = random(gen, (5, 16, HIDDEN), "float32")
        self.gamma = tf.constant(1.0 + 0.1 * gen.standard_normal(HIDDEN), tf.float32)
        self.beta = tf.constant(0.1 * gen.standard_normal(HIDDEN), tf.float32)
        self.bias = random(gen, (HIDDEN,), "float32")
        self.scale = random(gen, (5, 16, 1), "float32")

    def _compare(self, fn, args, *, xla_like_kernels, stitch_kernels=1, **tolerance):
        """Checks xla_like's result against TF's and the kernel counts of both
        strategies; every xla_like kernel must obey XLA's reduction rule."""
        expected = fn(*args)
        counts = {}
        for fusion in ("xla_like", "stitch"):
            opt, actual = _optimized_call(fn, args, fusion)
            for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected)):
                assert_same(self, a, e, msg=f"{fusion}\n{opt.report()}", **tolerance)
            report = opt.report()
            self.assertEqual(report.fusion, fusion)
            self.assertEqual(report.kernels_after, fs.memory_intensive_kernels(opt.graph_def))
            self.assertIn(f"TF {report.kernels_before} -> this plan {report.kernels_after}",
                          str(report))
            counts[fusion] = report.kernels_after
            if fusion == "xla_like":
                for node in fusion_stitch_nodes(opt.graph_def):
                    self._assert_reductions_end_the_kernel(node)
        self.assertEqual(counts, {"xla_like": xla_like_kernels, "stitch": stitch_kernels},
                         str(opt.report()))

    def _assert_reductions_end_the_kernel(self, node):
        cluster = ir.Cluster.from_json(node.attr["spec"].s.decode())
        reduced = {op.name for op in cluster.ops if op.prim in ir.REDUCE}
        for op in cluster.ops:
            self.assertFalse(reduced.intersection(op.inputs),
                             f"{node.name}: {op.prim} reads a reduction in its own kernel")

    # -- the reference patterns ------------------------------------------------

    def test_layernorm(self):
        f = tf.function(_layernorm, input_signature=[
            tf.TensorSpec([None, 16, HIDDEN]), tf.TensorSpec([HIDDEN]), tf.TensorSpec([HIDDEN])])
        # xla_like: 3 kernels. mean (a TF Mean: one op is no fused kernel);
        # sub-square-mean (the subtract reads the first mean, so it starts a new
        # fusion, which the second mean ends); add-rsqrt-mul-mul-add (reads the
        # second mean). stitch: the whole layernorm is one kernel.
        self._compare(f, (self.x, self.gamma, self.beta), xla_like_kernels=3,
                      rtol=_NORM_TOL, atol=_NORM_TOL)

    def test_residual_add_layernorm(self):
        f = tf.function(lambda x, r, g, b: _layernorm(x + r, g, b), input_signature=[
            tf.TensorSpec([None, 16, HIDDEN])] * 2 + [tf.TensorSpec([HIDDEN])] * 2)
        # The residual add fuses into the first mean (and is also read by the
        # subtract: a multi-output fusion); then as layernorm: 3 kernels.
        self._compare(f, (self.x, self.res, self.gamma, self.beta), xla_like_kernels=3,
                      rtol=_NORM_TOL, atol=_NORM_TOL)

    def test_softmax_and_log_softmax(self):
        for fn in (tf.nn.softmax, tf.nn.log_softmax):
            f = tf.function(lambda x, fn=fn: fn(x * 3.0),
                            input_signature=[tf.TensorSpec([None, 16, HIDDEN])])
            # Expanded as tf2xla does: mul-max | sub-exp-sum | div (or log-sub):
            # 3 kernels, the first and last a fused mul/max and a TF RealDiv, or
            # a fused log-sub. TF counts the Mul and the one Softmax op: 2.
            with self.subTest(fn.__name__):
                self._compare(f, (self.x,), xla_like_kernels=3, stitch_kernels=1,
                              rtol=1e-5, atol=1e-5)

    def test_bias_gelu(self):
        f = tf.function(lambda x, b: tf.nn.gelu(x + b, approximate=False),
                        input_signature=[tf.TensorSpec([None, 16, HIDDEN]),
                                         tf.TensorSpec([HIDDEN])])
        # Elementwise only: both branches of gelu meet in one root, one kernel.
        self._compare(f, (self.x, self.bias), xla_like_kernels=1, kind="transcendental")

    def test_broadcasting_chain(self):
        @tf.function(input_signature=[tf.TensorSpec([None, 16, HIDDEN]),
                                      tf.TensorSpec([None, 16, 1]), tf.TensorSpec([HIDDEN])])
        def f(x, scale, bias):
            y = tf.tanh(x * scale + bias)                        # [B,16,1] and [H] broadcast
            z = y - tf.reduce_max(y, axis=-1, keepdims=True)     # the max broadcast back
            return z * 0.5 + bias
        # mul-add-tanh-max (tanh also an output) | sub-mul-add: 2 kernels.
        self._compare(f, (self.x, self.scale, self.bias), xla_like_kernels=2,
                      kind="transcendental")

    # -- XLA's rules -------------------------------------------------------------

    def test_no_sibling_fusion(self):
        @tf.function(input_signature=[tf.TensorSpec([None, HIDDEN])])
        def f(x):
            h = x * 2.0 + 1.0
            return tf.reduce_sum(h, axis=-1), tf.reduce_max(h, axis=-1)
        # stitch packs both reductions with their shared producer (1 kernel);
        # XLA fuses the producer into one reduction only, and the other
        # reduction reads its output: 2 kernels.
        x = tf.reshape(self.x, [-1, HIDDEN])
        h = x.numpy() * 2.0 + 1.0
        expected = f(x)
        for fusion, kernels in (("xla_like", 2), ("stitch", 1)):
            opt, actual = _optimized_call(f, (x,), fusion)
            assert_reduction_close(self, actual[0], expected[0], h, -1, "sum", False, fusion)
            assert_same(self, actual[1], expected[1], "exact", msg=fusion)
            self.assertEqual(opt.report().kernels_after, kernels, str(opt.report()))

    def test_half_softmax_stays_a_tf_op(self):
        f = tf.function(lambda x: tf.nn.softmax(x),
                        input_signature=[tf.TensorSpec([None, HIDDEN], tf.float16)])
        x = tf.cast(tf.reshape(self.x, [-1, HIDDEN]), tf.float16)
        # Not expanded (separate float16 ops would round after every step), and
        # one op that reads its own reduction is more than one XLA fusion.
        opt, actual = _optimized_call(f, (x,), "xla_like")
        assert_same(self, actual, f(x), "exact")
        reasons = [why for _, op, why in opt.report().unfused_ops if op == "Softmax"]
        self.assertLen(reasons, 1, str(opt.report()))
        self.assertIn("fusion='xla_like' would split this op", reasons[0])
        self.assertEmpty(fusion_stitch_nodes(opt.graph_def))

    # -- the kernel count and the option -----------------------------------------

    def test_unfused_count_is_the_memory_intensive_tf_ops(self):
        w = tf.constant(np.eye(HIDDEN, dtype=np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 16, HIDDEN])])
        def f(x):
            y = tf.reshape(x, [-1, HIDDEN])                     # shape only: no kernel
            y = tf.nn.relu(tf.matmul(y, w) + 1.0) * 2.0         # MatMul: not memory-intensive
            return tf.reduce_sum(y, axis=-1)
        graph_def = f.get_concrete_function().graph.as_graph_def()
        # AddV2, Relu, Mul, Sum; Reshape, MatMul, Identity and the Consts are not counted.
        self.assertEqual(fs.memory_intensive_kernels(graph_def), 4)
        for fusion in ("stitch", "xla_like"):
            opt = fs.optimize(f, fusion=fusion, grappler=False, min_cluster_ops=1000)
            opt(self.x)
            report = opt.report()
            self.assertEqual((report.kernels_before, report.kernels_after), (4, 4), str(report))

    def test_bad_fusion_value(self):
        f = tf.function(lambda x: x + 1.0)
        with self.assertRaisesRegex(ValueError, r"fusion='xla'.*'stitch', 'xla_like'"):
            fs.optimize(f, fusion="xla")
        with self.assertRaisesRegex(TypeError, r"fusion=1"):
            fs.optimize(f, fusion=1)


if __name__ == "__main__":
    tf.test.main()
