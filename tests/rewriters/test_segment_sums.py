"""Segment sums (UnsortedSegmentSum: an embedding gradient's dense form) as
kernels of their own (tf_fusionstitch/codegen/scatter.py), with the
elementwise ops that compute what they sum: results are TF's, bit for bit
(each segment adds its rows in TF's order), rows with negative ids are
dropped, and ids past the last segment are TF's InvalidArgument."""

import numpy as np
import pytest
import tensorflow as tf

import tf_fusionstitch as fs
from optimize_testlib import quiet_call, random, rng
from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.array_interpreter import interpret
from tf_fusionstitch.kernels import build_cpu_kernel
from tf_fusionstitch.runtime.cpu_kernel import KernelInputError
from tf_fusionstitch.schedule import UnsupportedCluster
from tf_fusionstitch.codegen import scatter

T, op = ir.TensorType, ir.make_op


def _moments(dtype="float32", ids="int32"):
    """Adam's two sums of an embedding's rows: of the rows and of their squares."""
    rows = T(dtype, (None, 18))
    return ir.Cluster((("x", rows), ("ids", T(ids, (None,)))), (
        op("sq", "square", ["x"], rows),
        op("g", "segment_sum", ["x", "ids"], T(dtype, (1000, 18)), num_segments=1000),
        op("g2", "segment_sum", ["sq", "ids"], T(dtype, (1000, 18)), num_segments=1000)),
        ("g", "g2"), equal_dims=((("ids", 0), ("x", 0)),))


class ScatterKernelTest(tf.test.TestCase):

    def test_sums_match_numpy_bit_for_bit_on_any_split(self):
        for dtype, ids_dtype in (("float32", "int32"), ("float64", "int64"), ("int32", "int64")):
            c = _moments(dtype, ids_dtype)
            kernel = build_cpu_kernel(c).runner()
            gen = rng(1)
            x = np.asarray(random(gen, (5000, 18), dtype))
            ids = gen.integers(-3, 1000, 5000).astype(ids_dtype)   # a few dropped rows
            want = interpret(c, np)(x, ids)
            for threads in (1, 2, 3):
                for got, w in zip(kernel.run([x, ids], threads=threads), want):
                    np.testing.assert_array_equal(got, w, err_msg=f"{dtype}, {threads} threads")

    def test_rows_scaled_by_a_scalar(self):
        # SGD with momentum on an embedding: the gradient's rows times the
        # learning rate, summed per segment; the scalar input has no extent.
        rows = T("float32", (None, 16))
        c = ir.Cluster((("x", rows), ("lr", T("float32", ())), ("ids", T("int32", (None,)))), (
            op("scaled", "mul", ["x", "lr"], rows),
            op("g", "segment_sum", ["scaled", "ids"], T("float32", (64, 16)), num_segments=64)),
            ("g",), equal_dims=((("ids", 0), ("x", 0)),))
        kernel = build_cpu_kernel(c).runner()
        gen = rng(4)
        x = np.asarray(random(gen, (300, 16), "float32"))
        lr = np.float32(0.01)
        ids = gen.integers(0, 64, 300).astype(np.int32)
        for got, want in zip(kernel.run([x, lr, ids]), interpret(c, np)(x, lr, ids)):
            np.testing.assert_array_equal(got, want)

    def test_ids_past_the_last_segment_are_refused_before_anything_runs(self):
        kernel = build_cpu_kernel(_moments()).runner()
        ids = np.zeros(40, np.int32)
        ids[7] = 1000
        with pytest.raises(KernelInputError, match=r"segment_ids\[7\] = 1000 is out of range"):
            kernel.run([np.ones((40, 18), np.float32), ids])

    def test_rows_not_proven_to_be_the_ids_rows_are_not_fused(self):
        c = _moments()
        with self.assertRaisesRegex(UnsupportedCluster, "not proven"):
            scatter.scatter_form(ir.Cluster(c.inputs, c.ops, c.outputs))
        with self.assertRaisesRegex(UnsupportedCluster, "outputs are its segment sums alone"):
            scatter.scatter_form(ir.Cluster(c.inputs, c.ops, ("g", "sq"), c.equal_dims))


class SegmentSumsTest(tf.test.TestCase):

    def _embedding_grads(self):
        table = tf.Variable(random(rng(2), (300, 18), "float32"))

        @tf.function(input_signature=[tf.TensorSpec([None, 7], tf.int32),
                                      tf.TensorSpec([None], tf.int32)])
        def grads(history, target):
            with tf.GradientTape() as tape:
                rows = tf.gather(table, history)                      # [B, 7, 18]
                pick = tf.gather(table, target)                       # [B, 18]
                loss = tf.reduce_sum(tf.tanh(rows) * pick[:, None, :]) + tf.reduce_sum(pick)
            g = tf.convert_to_tensor(tape.gradient(loss, table))    # UnsortedSegmentSum
            return g, tf.math.unsorted_segment_sum(
                tf.square(tf.reshape(rows, [-1, 18])), tf.reshape(history, [-1]), 300)
        return grads

    def test_an_embedding_gradient_and_its_squares_match_tf_exactly(self):
        grads = self._embedding_grads()
        opt = fs.optimize(grads)
        gen = rng(3)
        for batch in (5, 1):
            history = tf.constant(gen.integers(0, 300, (batch, 7)), tf.int32)
            target = tf.constant(gen.integers(0, 300, batch), tf.int32)
            for got, want in zip(quiet_call(opt, history, target), grads(history, target)):
                self.assertAllEqual(got, want)
        kernels = [c for c in opt.report().fused_clusters
                   if "UnsortedSegmentSum" in {t for _, t in c.tf_ops}]
        self.assertLen(kernels, 2, str(opt.report()))
        self.assertTrue(any("Square" in {t for _, t in c.tf_ops} for c in kernels))

    def test_explore_puts_two_moments_of_one_gradient_in_one_kernel(self):
        """Adam's two moments of an embedding's gradient rows, g and g * g,
        summed by the same ids: the sums come from patterns of their own
        (their shared rows are a matmul's), and explore's remote fusion
        joins them into one scatter kernel, which reads the rows and walks
        the ids once. Results are TF's, bit for bit."""
        table = tf.Variable(random(rng(5), (300, 18), "float32"))
        w = tf.Variable(random(rng(6), (18, 18), "float32"))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
        def moments(ids):
            g = tf.matmul(tf.gather(table, ids), w)
            return (tf.math.unsorted_segment_sum(g * 0.1, ids, 300),
                    tf.math.unsorted_segment_sum(tf.square(g) * 0.001, ids, 300))

        # explore's own plan: the plan guard could keep a rule plan
        opt = fs.optimize(moments, fusion="explore", explore_guard=False)
        gen = rng(7)
        for batch in (64, 3):
            ids = tf.constant(gen.integers(0, 300, batch), tf.int32)
            for got, want in zip(quiet_call(opt, ids), moments(ids)):
                self.assertAllEqual(got, want)
        kernels = [[t for _, t in c.tf_ops] for c in opt.report().fused_clusters
                   if "UnsortedSegmentSum" in {t for _, t in c.tf_ops}]
        self.assertLen(kernels, 1, str(opt.report()))
        self.assertEqual(kernels[0].count("UnsortedSegmentSum"), 2, kernels)

    def test_bad_ids_raise_invalid_argument_as_tf_does(self):
        @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None], tf.int32)])
        def f(x, ids):
            return tf.math.unsorted_segment_sum(x * 2.0, ids, 10)

        opt = fs.optimize(f)
        x = random(rng(4), (3, 4), "float32")
        ids = tf.constant([-1, 9, 2])
        self.assertAllEqual(quiet_call(opt, x, ids), f(x, ids))
        (kernel,) = opt.report().fused_clusters
        self.assertEqual(sorted(t for _, t in kernel.tf_ops), ["Mul", "UnsortedSegmentSum"])
        for fn in (f, opt):
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "out of range"):
                quiet_call(fn, x, tf.constant([0, 10, 2]))


if __name__ == "__main__":
    tf.test.main()
