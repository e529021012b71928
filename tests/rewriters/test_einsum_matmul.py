"""Einsums that are batch matrix products become Transpose + BatchMatMulV2
(rewriters/einsum_matmul.py), so their transposes can fuse: the equations
and shapes Keras' attention writes, fresh random inputs, TF's results."""

import tensorflow as tf

from tests.optimize_testlib import (assert_as_accurate_as_tf, assert_same, fused_clusters_with,
                                    graph_ops, quiet_call, random, rng)
from tf_fusionstitch.rewriters import einsum_matmul
import tf_fusionstitch as fs

# Equation, operand shapes: attention scores and values as Keras and
# keras_hub write them, and plainer products.
EQUATIONS = [
    ("BTNH,BSNH->BNTS", (2, 7, 3, 4), (2, 5, 3, 4)),
    ("BNTS,BSNH->BTNH", (2, 3, 7, 5), (2, 5, 3, 4)),
    ("aecd,abcd->acbe", (2, 5, 3, 4), (2, 7, 3, 4)),
    ("acbe,aecd->abcd", (2, 3, 7, 5), (2, 5, 3, 4)),
    ("bij,bjk->bik", (3, 4, 5), (3, 5, 6)),
    ("bji,bkj->bik", (3, 5, 4), (3, 6, 5)),
    ("ij,jk->ki", (4, 5), (5, 6)),
]


class PlanTest(tf.test.TestCase):

    def test_attention_scores_transpose_both_operands(self):
        p = einsum_matmul.plan("BTNH,BSNH->BNTS")
        self.assertEqual((p.perm_a, p.adj_x, p.perm_b, p.adj_y, p.perm_out),
                         ((0, 2, 1, 3), False, (0, 2, 3, 1), False, None))

    def test_an_operand_already_laid_out_uses_the_adjoint_flag(self):
        p = einsum_matmul.plan("bji,bkj->bik")
        self.assertEqual((p.perm_a, p.adj_x, p.perm_b, p.adj_y, p.perm_out),
                         (None, True, None, True, None))

    def test_equations_that_are_not_one_batch_matmul_are_kept(self):
        for equation in ("abc,cde->abde",     # M and N of two labels each
                         "...ij,...jk->...ik", "ii->i", "ij->ji", "ab,bc->a",
                         "ij,jk,kl->il", "bij,bjk->ik", "ij,ij->ij", "i,i->"):
            self.assertIsNone(einsum_matmul.plan(equation), equation)


class EinsumMatmulTest(tf.test.TestCase):

    def test_products_match_tf_and_leave_no_einsum(self):
        """Static batch sizes (equal by their shapes), every layout above."""
        gen = rng(9100)
        for equation, sa, sb in EQUATIONS:
            sig = [tf.TensorSpec(sa, tf.float32), tf.TensorSpec(sb, tf.float32)]

            @tf.function(input_signature=sig)
            def f(x, y):
                return tf.einsum(equation, x * 2.0, y) + 1.0

            opt = fs.optimize(f)
            x, y = random(gen, sa, "float32"), random(gen, sb, "float32")
            assert_same(self, quiet_call(opt, x, y), f(x, y), "chain", msg=equation,
                        rtol=1e-5, atol=1e-5)
            self.assertNotIn("Einsum", graph_ops(opt.graph_def), equation)

    def test_keras_attention_head_transposes_fuse_with_their_bias_adds(self):
        """Keras' MultiHeadAttention at a dynamic batch and sequence: the
        scores and values einsums become batch matmuls, and the transposes of
        the query, key and value join the kernels of their projections' bias."""
        layer = tf.keras.layers.MultiHeadAttention(num_heads=3, key_dim=4)
        x0 = tf.zeros([1, 2, 12])
        layer(x0, x0)

        @tf.function(input_signature=[tf.TensorSpec([None, None, 12], tf.float32)])
        def attend(x):
            return layer(x, x)

        opt = fs.optimize(attend)
        gen = rng(9200)
        for batch, seq in ((2, 9), (1, 1), (3, 4)):
            x = random(gen, (batch, seq, 12), "float32")
            assert_same(self, quiet_call(opt, x), attend(x), "chain", rtol=1e-5, atol=1e-6,
                        msg=f"{batch}x{seq}")
        ops = graph_ops(opt.graph_def)
        self.assertIn("BatchMatMulV2", ops)
        fused = fused_clusters_with(opt, "Transpose")
        self.assertNotEmpty(fused, str(opt.report()))
        self.assertTrue(any("AddV2" in [t for _, t in c.tf_ops] for c in fused),
                        str(opt.report()))

    def test_gradients_of_rewritten_einsums(self):
        """A train-style function: the einsum and its gradients (einsums
        themselves) rewritten, the gradients as accurate as TF's."""
        gen = rng(9300)
        w_value = random(gen, (6, 3, 4), "float32")

        def gradients_in(dtype):
            w = tf.Variable(tf.cast(w_value, dtype))

            @tf.function(input_signature=[tf.TensorSpec([None, None, 6], dtype)])
            def grads(x):
                with tf.GradientTape() as tape:
                    q = tf.einsum("abc,cde->abde", x, w)
                    s = tf.einsum("BTNH,BSNH->BNTS", q, q * 0.5)
                    loss = tf.reduce_sum(tf.nn.softmax(s) * s)
                return tape.gradient(loss, w)
            return grads

        grads = gradients_in(tf.float32)
        opt = fs.optimize(grads)
        x = random(gen, (2, 5, 6), "float32")
        # The softmax of large scores is ill-conditioned: on an AVX2-only machine
        # TF's gradients were 2.6e-5 from exact (normwise), the rewrite's 5.4e-7,
        # and elementwise they differed by up to 1.7e-4 relative.
        exact = gradients_in(tf.float64)(tf.cast(x, tf.float64))
        assert_as_accurate_as_tf(self, quiet_call(opt, x), grads(x), exact, "chain")
        self.assertGreater(graph_ops(opt.graph_def).count("BatchMatMulV2"), 1)

    def test_unproven_batch_sizes_keep_the_einsum_and_its_error(self):
        """Operands from separate inputs: their batch sizes are not proven
        equal, and BatchMatMulV2 would broadcast a 1 where Einsum raises."""
        sig = [tf.TensorSpec([None, None, 3, 4], tf.float32)] * 2

        @tf.function(input_signature=sig)
        def f(q, k):
            return tf.einsum("BTNH,BSNH->BNTS", q + 1.0, k * 2.0)

        opt = fs.optimize(f)
        gen = rng(9400)
        q, k = random(gen, (2, 5, 3, 4), "float32"), random(gen, (2, 6, 3, 4), "float32")
        assert_same(self, quiet_call(opt, q, k), f(q, k), "chain")
        self.assertIn("Einsum", graph_ops(opt.graph_def))
        with self.assertRaises(tf.errors.InvalidArgumentError):
            opt(random(gen, (1, 5, 3, 4), "float32"), k)


if __name__ == "__main__":
    tf.test.main()
