"""optimize(fn, measured_choice=N): the first calls alternate between the fused
and the original function, and the faster one is kept (measured_choice.py).
Every call does its work once, whichever function runs it; the report says
which was kept. No timing is asserted: the clock is the test's own."""

import tensorflow as tf

import tf_fusionstitch as fs
from tf_fusionstitch import measured_choice as mc
from optimize_testlib import assert_same, quiet_call, rng


class MeasuredChoiceTest(tf.test.TestCase):

    def test_untimed_first_calls_then_pairs_decide(self):
        choice = mc.MeasuredChoice(3)
        order = []
        for seconds in (9.0, 9.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0):
            who = choice.next_contender()
            order.append(who)
            choice.record(who, seconds)
        self.assertEqual(order, [mc.FUSED, mc.ORIGINAL] * 4)
        self.assertEqual(choice.times(mc.FUSED), [2.0, 2.0, 2.0])   # warm-up left out
        self.assertEqual(choice.choice, mc.ORIGINAL)
        self.assertEqual(choice.next_contender(), mc.ORIGINAL)
        self.assertIn("runs the original function", choice.summary())
        self.assertIn("2", choice.summary())

    def test_a_tie_keeps_the_fused_function(self):
        choice = mc.MeasuredChoice(2)
        for _ in range(6):
            choice.record(choice.next_contender(), 1.0)
        self.assertEqual(choice.choice, mc.FUSED)

    def test_calls_run_once_each_with_tfs_results_and_the_report_says_which(self):
        for fused_seconds, kept in ((2.0, mc.ORIGINAL), (0.5, mc.FUSED)):
            with self.subTest(kept=kept):
                self._check_kept(fused_seconds, kept)

    def _check_kept(self, fused_seconds, kept):
        class Scripted(mc.MeasuredChoice):
            """The fused calls take `fused_seconds`, the original ones 1 s."""
            def record(self, contender, seconds):
                super().record(contender, fused_seconds if contender == mc.FUSED else 1.0)

        real, mc.MeasuredChoice = mc.MeasuredChoice, Scripted
        try:
            self._run_nine_calls(kept)
        finally:
            mc.MeasuredChoice = real

    def _run_nine_calls(self, kept):
        counter = tf.Variable(0.0)

        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
        def step(x):
            counter.assign_add(1.0)
            mean = tf.reduce_mean(x, axis=-1, keepdims=True)
            return tf.tanh(x - mean) * 3.0 + mean

        opt = fs.optimize(step, measured_choice=2)
        gen = rng(0)
        inputs = [tf.constant(gen.standard_normal((5, 64)), tf.float32) for _ in range(9)]
        for x in inputs:
            got = quiet_call(opt, x)
            before = float(counter.numpy())
            assert_same(self, got, step(x), "transcendental")
            counter.assign(before)             # the reference call does not count
        self.assertEqual(float(counter.numpy()), 9.0)   # every call ran its step once
        report = opt.report()
        self.assertIn(f"runs the {kept} function", report.choice)
        self.assertIn(report.choice, str(report))
        self.assertNotEmpty(report.fused_clusters)

    def test_the_option_is_validated(self):
        f = tf.function(lambda x: x * 2.0)
        with self.assertRaisesRegex(ValueError, "measured_choice=-1 is out of range"):
            fs.optimize(f, measured_choice=-1)
        with self.assertRaisesRegex(TypeError, "measured_choice"):
            fs.optimize(f, measured_choice=True)


if __name__ == "__main__":
    tf.test.main()
