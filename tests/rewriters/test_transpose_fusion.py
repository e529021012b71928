"""Transposes inside FusionStitch kernels.

A constant-permutation Transpose is an index map: the kernel iterates in the
order of its outputs and reads (or writes) each transposed tensor through
its own strides, so a bias add, a scale and the head-splitting transposes of
an attention layer are one pass over memory instead of three. Results are
compared with TF's on fresh random inputs at several dynamic shapes.
"""

import numpy as np
import tensorflow as tf

from tests.optimize_testlib import (assert_same, fused_clusters_with, fusion_stitch_nodes,
                                    optimize_and_run, quiet_call, random, rng)
from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.array_interpreter import interpret
from tf_fusionstitch.schedule import UnsupportedCluster, build_schedule


def _tensor(name, dtype, shape):
    return name, ir.TensorType(dtype, tuple(shape))


class TransposeFusionTest(tf.test.TestCase):

    def test_attention_head_split_is_one_kernel(self):
        """Keras attention's query/key path: bias add, scale, and the two
        head-splitting transposes ([0,2,1,3] and [0,2,3,1]) in one kernel,
        at dynamic batch and sequence length."""
        gen = rng(8100)
        bias = random(gen, (4, 8), "float32")

        @tf.function(input_signature=[tf.TensorSpec([None, None, 32], tf.float32)])
        def heads(x):
            y = tf.reshape(x, [-1, tf.shape(x)[1], 4, 8]) + bias
            query = tf.transpose(y * 0.125, [0, 2, 1, 3])
            key = tf.transpose(y, [0, 2, 3, 1])
            return tf.matmul(query, key)

        opt = None
        for batch, seq in ((2, 5), (3, 17), (1, 1)):
            x = random(gen, (batch, seq, 32), "float32")
            if opt is None:
                opt, expected, actual = optimize_and_run(heads, x)
            else:
                expected, actual = heads(x), quiet_call(opt, x)
            assert_same(self, actual, expected, "chain", msg=f"{batch}x{seq}")
        clusters = fused_clusters_with(opt, "Transpose")
        self.assertLen(clusters, 1, str(opt.report()))
        self.assertEqual(sorted(t for _, t in clusters[0].tf_ops),
                         ["AddV2", "Mul", "Transpose", "Transpose"], str(opt.report()))
        self.assertLen(fusion_stitch_nodes(opt.graph_def), 1, str(opt.report()))

    def test_transposed_inputs_and_outputs_of_every_rank(self):
        """A transposed input read through its strides, an elementwise chain
        after it, and a transposed output, for ranks 2 to 5 and dtypes whose
        kernels store differently."""
        gen = rng(8200)
        cases = [((7, 300), [1, 0]), ((2, 3, 5), [2, 0, 1]), ((4, 6, 5, 3), [0, 3, 1, 2]),
                 ((2, 3, 4, 5, 6), [4, 2, 0, 3, 1])]
        for shape, perm in cases:
            for dtype in ("float32", "float16", "bfloat16", "int32"):
                x = random(gen, shape, dtype)
                y = random(gen, [shape[p] for p in perm], dtype)

                @tf.function
                def f(x, y):
                    t = tf.transpose(x, perm) * y           # a transposed input
                    back = tf.transpose(t, np.argsort(perm))
                    return tf.maximum(t, y), back - x       # and a transposed output

                opt, expected, actual = optimize_and_run(f, x, y)
                for a, e in zip(actual, expected):
                    assert_same(self, a, e, "chain", msg=f"{shape} {perm} {dtype}")
                self.assertNotEmpty(fused_clusters_with(opt, "Transpose"),
                                    f"{shape} {perm} {dtype}: {opt.report()}")

    def test_nchw_to_nhwc_with_broadcast_bias_and_relu(self):
        """An NCHW tensor laid out as NHWC with a per-channel bias and a
        Relu: a broadcast operand in the iteration order of the output."""
        gen = rng(8300)
        x = random(gen, (2, 3, 9, 11), "float32")
        b = random(gen, (3,), "float32")

        @tf.function
        def f(x, b):
            return tf.nn.relu(tf.transpose(x, [0, 2, 3, 1]) + b)

        opt, expected, actual = optimize_and_run(f, x, b)
        assert_same(self, actual, expected, "chain")
        self.assertNotEmpty(fused_clusters_with(opt, "Transpose"), str(opt.report()))

    def test_a_transpose_does_not_join_a_reduction(self):
        """Reductions keep their own schedule: a softmax over a transposed
        tensor is still TF's result, with the transpose outside its kernel."""
        gen = rng(8400)
        x = random(gen, (3, 16, 5), "float32")

        @tf.function
        def f(x):
            return tf.nn.softmax(tf.transpose(tf.tanh(x), [0, 2, 1]), axis=-1)

        opt, expected, actual = optimize_and_run(f, x)
        assert_same(self, actual, expected, "transcendental")
        for c in fused_clusters_with(opt, "Transpose"):
            self.assertNotIn("Softmax", [t for _, t in c.tf_ops], str(opt.report()))

    def test_identity_and_invalid_permutations(self):
        """An identity permutation fuses as a no-op; a permutation TF itself
        rejects stays TF's op, so TF raises its own error."""
        gen = rng(8500)
        x = random(gen, (3, 4), "float32")

        @tf.function
        def same(x):
            return tf.transpose(tf.exp(x), [0, 1]) * 2.0

        opt, expected, actual = optimize_and_run(same, x)
        assert_same(self, actual, expected, "transcendental")

        @tf.function
        def bad(x):
            return tf.transpose(tf.exp(x), [0, 0]) * 2.0

        with self.assertRaises((tf.errors.InvalidArgumentError, ValueError)):
            bad(x)


class TransposeScheduleTest(tf.test.TestCase):
    """The schedule and the spec grammar of the transpose primitive."""

    def _cluster(self, perm, shape=(2, 3, 4)):
        out_shape = tuple(shape[p] for p in perm)
        return ir.Cluster(
            inputs=(_tensor("x", "float32", shape),),
            ops=(ir.make_op("e", "exp", ["x"], ir.TensorType("float32", shape)),
                 ir.make_op("t", "transpose", ["e"], ir.TensorType("float32", out_shape),
                            perm=list(perm))),
            outputs=("t",))

    def test_iterates_in_the_output_order_and_reads_by_strides(self):
        s = build_schedule(self._cluster((2, 0, 1)))
        out_axes = [a for a in s.dim_axes["t"] if a is not None]
        self.assertEqual(out_axes, sorted(out_axes), "the output is written in order")
        in_axes = [a for a in s.dim_axes["x"] if a is not None]
        self.assertNotEqual(in_axes, sorted(in_axes))
        self.assertEqual(s.forward, [], "a transposed input cannot hold the output")

    def test_interpreter_matches_numpy(self):
        c = self._cluster((1, 2, 0))
        x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
        (t,) = interpret(c, np)(x)
        np.testing.assert_allclose(t, np.transpose(np.exp(x), (1, 2, 0)), rtol=1e-6)

    def test_spec_rejects_a_perm_that_is_not_a_permutation(self):
        for perm in ([0, 0, 1], [0, 1], [0, 1, 3], [0, 1, True]):
            c = self._cluster((0, 1, 2))
            bad = ir.make_op("t", "transpose", ["e"], ir.TensorType("float32", (2, 3, 4)),
                             perm=list(perm))
            c = ir.Cluster(inputs=c.inputs, ops=(c.ops[0], bad), outputs=("t",))
            with self.assertRaisesRegex(ir.SpecError, "permutation", msg=str(perm)):
                c.validate()

    def test_declared_shape_must_follow_the_perm(self):
        c = self._cluster((2, 0, 1))
        wrong = ir.make_op("t", "transpose", ["e"], ir.TensorType("float32", (2, 3, 4)),
                           perm=[2, 0, 1])
        with self.assertRaises(ir.SpecError):
            ir.Cluster(inputs=c.inputs, ops=(c.ops[0], wrong), outputs=("t",)).validate()

    def test_refused_beside_a_reduction(self):
        c = ir.Cluster(
            inputs=(_tensor("x", "float32", (2, 3)),),
            ops=(ir.make_op("t", "transpose", ["x"], ir.TensorType("float32", (3, 2)),
                            perm=[1, 0]),
                 ir.make_op("s", "reduce_sum", ["t"], ir.TensorType("float32", (3,)),
                            axes=[1], keep_dims=False)),
            outputs=("s",))
        with self.assertRaisesRegex(UnsupportedCluster, "transpose"):
            build_schedule(c)


if __name__ == "__main__":
    tf.test.main()
