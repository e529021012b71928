"""Contractions without batch labels become one MatMul of the flattened
operands (rewriters/projection_matmul.py): Keras' EinsumDense equations, a
rank-3 `x @ w` and their gradients, at dynamic sizes, on fresh random
inputs, against TF's results."""

from unittest import mock

import numpy as np
import tensorflow as tf

from tests.optimize_testlib import (assert_as_accurate_as_tf, assert_same, graph_ops, quiet_call,
                                    random, rng, to_numpy)
from tf_fusionstitch.rewriters import projection_matmul
import tf_fusionstitch as fs

# Equation, first operand's shape (None: dynamic), second's. Every label has
# its own size, so a group flattened in the wrong order gives wrong numbers.
EQUATIONS = [
    ("abc,cde->abde", (None, None, 6), (6, 3, 4)),      # query/key/value projection
    ("abcd,cde->abe", (None, None, 3, 4), (3, 4, 5)),   # attention's output
    ("abc,cd->abd", (None, None, 6), (6, 5)),
    ("abc,dec->abde", (None, None, 6), (3, 4, 6)),      # weight laid out [N, K]
    ("abc,cde->adbe", (None, None, 6), (6, 3, 4)),      # output transposed
    ("bac,cde->abde", (None, 2, 6), (6, 3, 4)),         # first operand transposed
    ("abcd,dce->abe", (None, None, 3, 4), (4, 3, 5)),   # K in another order
    ("abde,cde->abc", (None, None, 3, 4), (6, 3, 4)),   # the projection's input gradient
    ("cd,abd->abc", (6, 5), (None, None, 5)),           # the weight first
]


def _concrete(shape, first: int, second: int):
    dynamic = iter((first, second))
    return tuple(next(dynamic) if d is None else d for d in shape)


class PlanTest(tf.test.TestCase):

    def test_groups_and_layouts(self):
        p = projection_matmul.plan("abc,cde->abde")
        self.assertEqual((p.m, p.k, p.n, p.perm_out), ("ab", "c", "de", None))
        self.assertEqual(p.layout(p.a, p.m, p.k), (None, False))
        self.assertEqual(p.layout(p.b, p.k, p.n), (None, False))
        p = projection_matmul.plan("abc,dec->abde")
        self.assertEqual(p.layout(p.b, p.k, p.n), (None, True))   # transpose_b, no Transpose
        p = projection_matmul.plan("bac,cde->abde")
        self.assertEqual((p.m, p.perm_out), ("ba", (1, 0, 2, 3)))

    def test_k_follows_the_operand_that_needs_no_transpose(self):
        self.assertEqual(projection_matmul.plan("abcd,dce->abe").k, "cd")
        self.assertEqual(projection_matmul.plan("acbd,dce->abe").k, "dc")

    def test_equations_that_are_not_projections_are_kept(self):
        for equation in ("abc,acd->abd",      # a batch label: einsum_matmul.py's
                         "abc,cd->ad",        # b summed within the first operand
                         "ab,c->abc",         # no K: an outer product
                         "abc,bc->a",         # no N
                         "...c,cd->...d", "ab,bc,cd->ad", "aab,bc->ac", "ab,bc->abz"):
            self.assertIsNone(projection_matmul.plan(equation), equation)

    def test_batch_matmul_with_a_matrix_operand_as_an_equation(self):
        self.assertEqual(projection_matmul.matmul_equation(3, 2, False, False), "abc,cd->abd")
        self.assertEqual(projection_matmul.matmul_equation(4, 2, True, True), "abdc,ed->abce")
        self.assertEqual(projection_matmul.matmul_equation(2, 3, False, False), "bc,acd->abd")
        self.assertIsNone(projection_matmul.matmul_equation(3, 3, False, False))  # batch
        self.assertIsNone(projection_matmul.matmul_equation(2, 2, False, False))  # a MatMul


class ProjectionMatmulTest(tf.test.TestCase):
    """Small operands, with the size threshold off (SizeThresholdTest checks it)."""

    def setUp(self):
        super().setUp()
        patch = mock.patch.object(projection_matmul, "MIN_STATIC_ELEMENTS", 1)
        patch.start()
        self.addCleanup(patch.stop)

    def test_einsums_match_tf_and_become_one_matmul(self):
        gen = rng(9500)
        for equation, sa, sb in EQUATIONS:
            sig = [tf.TensorSpec(sa, tf.float32), tf.TensorSpec(sb, tf.float32)]

            @tf.function(input_signature=sig)
            def f(x, w):
                return tf.einsum(equation, x * 2.0, w) + 1.0

            opt = fs.optimize(f)
            for first, second in ((3, 5), (1, 1), (0, 2)):
                x = random(gen, _concrete(sa, first, second), "float32")
                w = random(gen, _concrete(sb, first, second), "float32")
                got, want = quiet_call(opt, x, w), f(x, w)
                self.assertEqual(got.shape, want.shape, equation)
                assert_same(self, got, want, "chain", msg=f"{equation} {first}x{second}",
                            rtol=1e-5, atol=1e-5)
            ops = graph_ops(opt.graph_def)
            self.assertNotIn("Einsum", ops, equation)
            self.assertEqual(ops.count("MatMul"), 1, equation)

    def test_rank3_matmuls_match_tf(self):
        """`x @ w` with a rank-3 x (BatchMatMulV2 broadcasting w) in each
        adjoint, and a matrix times a rank-3 tensor."""
        gen = rng(9600)
        cases = [((None, None, 6), (6, 5), False, False),
                 ((None, None, 6), (5, 6), False, True),
                 ((None, 6, None), (6, 5), True, False),
                 ((5, 6), (None, 6, None), False, False)]
        for sa, sb, adj_a, adj_b in cases:
            sig = [tf.TensorSpec(sa, tf.float32), tf.TensorSpec(sb, tf.float32)]

            @tf.function(input_signature=sig)
            def f(x, w):
                return tf.matmul(x + 1.0, w, adjoint_a=adj_a, adjoint_b=adj_b) * 0.5

            opt = fs.optimize(f)
            for first, second in ((2, 7), (1, 1)):
                x = random(gen, _concrete(sa, first, second), "float32")
                w = random(gen, _concrete(sb, first, second), "float32")
                assert_same(self, quiet_call(opt, x, w), f(x, w), "chain", rtol=1e-5,
                            atol=1e-5, msg=str((sa, sb, adj_a, adj_b)))
            ops = graph_ops(opt.graph_def)
            self.assertNotIn("BatchMatMulV2", ops)
            self.assertIn("MatMul", ops)

    def test_dtypes(self):
        gen = rng(9700)
        for dtype in ("float64", "bfloat16", "float16"):
            sig = [tf.TensorSpec((None, None, 8), dtype), tf.TensorSpec((8, 2, 3), dtype)]

            @tf.function(input_signature=sig)
            def f(x, w):
                return tf.einsum("abc,cde->abde", x, w)

            opt = fs.optimize(f)
            x, w = random(gen, (3, 4, 8), dtype), random(gen, (8, 2, 3), dtype)
            # The exact sums (16-bit products are exact in long double). Against TF's
            # bfloat16 result elementwise, 3 of 72 sums that cancel were 1-2 ulp of
            # their terms apart on an AVX2-only machine; from exact, TF's 3.2e-3 and
            # the rewrite's 3.5e-3 (normwise).
            exact = np.einsum("abc,cde->abde", to_numpy(x).astype(np.longdouble),
                              to_numpy(w).astype(np.longdouble))
            assert_as_accurate_as_tf(self, quiet_call(opt, x, w), f(x, w), exact, msg=dtype)
            self.assertNotIn("Einsum", graph_ops(opt.graph_def), dtype)

    def test_keras_einsum_dense_train_step_gradients(self):
        """EinsumDense projections and their gradients (einsums whose K is
        the dynamic batch and sequence, proven equal through the forward
        product): every one becomes a MatMul; the gradients equal TF's."""
        gen = rng(9800)
        qkv = tf.keras.layers.EinsumDense("abc,cde->abde", output_shape=(None, 3, 4),
                                          bias_axes="de")
        out = tf.keras.layers.EinsumDense("abcd,cde->abe", output_shape=(None, 6),
                                          bias_axes="e")
        out(qkv(tf.zeros([1, 2, 6])))
        weights = qkv.trainable_variables + out.trainable_variables

        @tf.function(input_signature=[tf.TensorSpec([None, None, 6], tf.float32)])
        def grads(x):
            with tf.GradientTape() as tape:
                y = out(tf.nn.gelu(qkv(x))) + x
                loss = tf.reduce_sum(tf.square(y))
            return tape.gradient(loss, weights)

        opt = fs.optimize(grads)
        for batch, seq in ((2, 5), (1, 1), (3, 2)):
            x = random(gen, (batch, seq, 6), "float32")
            for got, want in zip(quiet_call(opt, x), grads(x)):
                assert_same(self, got, want, "chain", rtol=1e-5, atol=1e-5,
                            msg=f"{batch}x{seq}")
        ops = graph_ops(opt.graph_def)
        self.assertNotIn("Einsum", ops)
        # 2 products and 3 gradients (x's own is not asked for, and pruned)
        self.assertEqual(ops.count("MatMul"), 5)

    def test_the_product_keeps_its_proven_sizes(self):
        """The reshape back reads the dynamic sizes with Shape, so the
        product's sizes are proven those of its input: its bias add, the
        residual add and the layer norm after it are one kernel."""
        w = tf.constant(np.random.default_rng(0).standard_normal((3, 4, 6)), tf.float32)

        @tf.function(input_signature=[tf.TensorSpec([None, None, 3, 4], tf.float32),
                                      tf.TensorSpec([None, None, 6], tf.float32)])
        def f(h, x):
            y = tf.einsum("abcd,cde->abe", h, w) + 0.5 + x
            mean, var = tf.nn.moments(y, axes=[-1], keepdims=True)
            return (y - mean) * tf.math.rsqrt(var + 1e-5)

        opt = fs.optimize(f)
        gen = rng(9900)
        h, x = random(gen, (2, 5, 3, 4), "float32"), random(gen, (2, 5, 6), "float32")
        assert_same(self, quiet_call(opt, h, x), f(h, x), "chain", rtol=1e-5, atol=1e-5)
        self.assertNotIn("Einsum", graph_ops(opt.graph_def))
        self.assertEqual(opt.report().kernels_after, 1, str(opt.report()))

    def test_unproven_k_sizes_keep_the_einsum_and_its_error(self):
        """K of two dynamic labels from separate inputs: their sizes are not
        proven equal, and a product of flattened operands would check only
        their product (2*3 == 3*2) where Einsum raises."""
        sig = [tf.TensorSpec([None, None, 4], tf.float32),
               tf.TensorSpec([None, None, 5], tf.float32)]

        @tf.function(input_signature=sig)
        def f(x, y):
            return tf.einsum("abc,abd->cd", x + 1.0, y * 2.0)

        opt = fs.optimize(f)
        gen = rng(9950)
        x, y = random(gen, (2, 3, 4), "float32"), random(gen, (2, 3, 5), "float32")
        assert_same(self, quiet_call(opt, x, y), f(x, y), "chain", rtol=1e-5, atol=1e-5)
        self.assertIn("Einsum", graph_ops(opt.graph_def))
        with self.assertRaises(tf.errors.InvalidArgumentError):
            opt(x, random(gen, (3, 2, 5), "float32"))


class SizeThresholdTest(tf.test.TestCase):

    def test_only_products_with_large_static_operands_are_flattened(self):
        """Below MIN_STATIC_ELEMENTS (a 256 x 256 weight) the Einsum stays;
        a 768 x 768 weight is flattened. Both match TF."""
        gen = rng(9990)
        for hidden, flattened in ((256, False), (768, True)):
            sig = [tf.TensorSpec((None, None, hidden), tf.float32),
                   tf.TensorSpec((hidden, hidden // 64, 64), tf.float32)]

            @tf.function(input_signature=sig)
            def f(x, w):
                return tf.einsum("abc,cde->abde", x, w)

            opt = fs.optimize(f)
            # scaled so that each output is of order 1 (a sum of `hidden` products)
            x = random(gen, (2, 3, hidden), "float32") / hidden ** 0.5
            w = random(gen, (hidden, hidden // 64, 64), "float32")
            assert_same(self, quiet_call(opt, x, w), f(x, w), "chain", rtol=1e-5, atol=1e-5)
            self.assertEqual("Einsum" not in graph_ops(opt.graph_def), flattened, hidden)


if __name__ == "__main__":
    tf.test.main()
