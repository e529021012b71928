"""The fusion strategies behind one interface (rewriters/strategies.py) and the
legality vocabulary they share (rewriters/legality.py): each strategy's
report names the rule that kept an op out of a kernel."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import tf_fusionstitch as fs  # noqa: E402
from tf_fusionstitch import options  # noqa: E402
from tf_fusionstitch.rewriters import legality, strategies  # noqa: E402


class StrategyTest(tf.test.TestCase):

    def test_every_option_value_has_a_strategy(self):
        self.assertEqual(tuple(strategies.STRATEGIES), options.STRATEGIES)
        for name, strategy in strategies.STRATEGIES.items():
            self.assertEqual(strategy.name, name)

    def test_an_op_kept_apart_by_a_cycle_says_so_under_every_strategy(self):
        # exp(x) feeds the matmul and the product: one kernel of exp and the
        # product would need the matmul's output inside it.
        @tf.function(input_signature=[tf.TensorSpec([8, 16]), tf.TensorSpec([16, 16])])
        def f(x, w):
            a = tf.exp(x)
            return a * tf.matmul(a, w)

        x, w = tf.random.normal([8, 16]), tf.random.normal([16, 16])
        for fusion in options.STRATEGIES:
            with self.subTest(fusion=fusion):
                opt = fs.optimize(f, fusion=fusion)
                self.assertAllClose(opt(x, w), f(x, w), rtol=1e-6, atol=1e-6)
                why = {op: reason for _, op, reason in opt.report().unfused_ops}
                self.assertIn("Exp", why)
                self.assertIn("would create a cycle", why["Exp"])

    def test_xla_rules_name_the_reduction_a_fusion_may_not_read(self):
        @tf.function(input_signature=[tf.TensorSpec([8, 16])])
        def g(x):
            return tf.nn.softmax(x * 2.0)

        opt = fs.optimize(g, fusion="xla_like")
        x = tf.random.normal([8, 16])
        self.assertAllClose(opt(x), g(x), rtol=1e-6, atol=1e-6)
        reasons = [reason for _, _, reason in opt.report().unfused_ops]
        self.assertTrue(any("reads the reduction" in r for r in reasons), reasons)


class DecisionTest(tf.test.TestCase):

    def test_ok_is_true_and_a_refusal_carries_its_reason(self):
        self.assertTrue(legality.OK)
        no = legality.refuse("because")
        self.assertFalse(no)
        self.assertEqual(str(no), "because")
        with self.assertRaises(ValueError):
            legality.refuse("")

    def test_first_refusal_stops_at_the_first_no(self):
        ran = []

        def check(decision):
            def run():
                ran.append(decision)
                return decision
            return run
        first = legality.first_refusal(check(legality.OK), check(legality.refuse("a")),
                                       check(legality.refuse("b")))
        self.assertEqual(first.reason, "a")
        self.assertEqual(len(ran), 2)
        self.assertTrue(legality.first_refusal(check(legality.OK)))


if __name__ == "__main__":
    tf.test.main()
