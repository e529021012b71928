"""Reductions that keep the innermost axis (a bias gradient's sum over the
batch, NHWC batchnorm statistics) fuse on the CPU as blocks of adjacent kept
elements, but stay with TensorFlow when a long or dynamic outer extent would
leave one work item for one thread; and a reduction that is the same for
every row stays out of a kernel over rows (rewriters/clustering.py
cpu_schedule)."""

import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs


def _fused_ops(opt):
    return [op_type for c in opt.report().clusters for _, op_type in c.tf_ops]


class StridedReductionTest(tf.test.TestCase):

    def _check(self, fn, *shapes):
        rng = np.random.default_rng(5)
        args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        opt = fs.optimize(tf.function(fn))
        got, want = opt(*args), tf.function(fn)(*args)
        self.assertAllClose(got, want, rtol=1e-5, atol=1e-4 * float(np.abs(want).max()))
        return opt

    def test_bias_gradient_over_a_long_batch_fuses_as_blocks_of_kept_elements(self):
        opt = self._check(lambda dy: tf.reduce_sum(dy * 2.0, axis=0), (5000, 64))
        self.assertIn("Sum", _fused_ops(opt))

    def test_too_few_kept_elements_for_two_threads_stay_with_tensorflow(self):
        opt = self._check(lambda dy: tf.reduce_sum(dy * 2.0, axis=0), (5000, 8))
        self.assertNotIn("Sum", _fused_ops(opt))
        self.assertIn("keeps the innermost axis over 8 kept elements", opt.report().details())

    def test_dynamic_batch_stays_with_tensorflow(self):
        fn = tf.function(lambda x: tf.reduce_mean(tf.square(x - 1.0), axis=[0, 1, 2]),
                         input_signature=[tf.TensorSpec([None, 4, 4, 8], tf.float32)])
        opt = fs.optimize(fn)
        x = np.random.default_rng(6).standard_normal((3, 4, 4, 8)).astype(np.float32)
        self.assertAllClose(opt(x), fn(x), rtol=1e-5, atol=1e-6)
        self.assertNotIn("Mean", _fused_ops(opt))

    def test_short_outer_reduction_and_innermost_reduction_still_fuse(self):
        opt = self._check(lambda dy: tf.reduce_sum(dy * 2.0, axis=0), (300, 64))
        self.assertIn("Sum", _fused_ops(opt))
        # NCHW: the reduced H and W are innermost; runs of H*W are contiguous.
        opt = self._check(lambda x: tf.reduce_sum(x * x, axis=[0, 2, 3]), (64, 8, 16, 16))
        self.assertIn("Sum", _fused_ops(opt))


class RowInvariantReductionTest(tf.test.TestCase):

    def test_a_count_from_shape_sizes_stays_out_of_the_elementwise_kernel(self):
        # A batchnorm gradient's shape: the element count is a Prod of sizes.
        fn = tf.function(
            lambda x, g: g * 2.0 + x / tf.cast(tf.reduce_prod(tf.shape(x)[:3]), tf.float32),
            input_signature=[tf.TensorSpec([None, 6, 5, 8], tf.float32)] * 2)
        opt = fs.optimize(fn)
        rng = np.random.default_rng(7)
        x, g = (rng.standard_normal((3, 6, 5, 8)).astype(np.float32) for _ in range(2))
        self.assertAllClose(opt(x, g), fn(x, g), rtol=1e-6, atol=1e-6)
        kernels = [[op for _, op in c.tf_ops] for c in opt.report().clusters if c.fused]
        (elementwise,) = [ops for ops in kernels if "RealDiv" in ops]
        self.assertNotIn("Prod", elementwise, str(opt.report()))


if __name__ == "__main__":
    tf.test.main()
