"""Variable add/sub updates folded into the kernel that computes them
(rewriters/variable_updates.py): results, ordering around reads, and the cases
that must stay TF's in-place update."""

import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs
from optimize_testlib import fusion_stitch_nodes, quiet_call, random, rng

_SHAPE = (37, 19)


def _ops(opt):
    return [n.op for n in opt.graph_def.node]


class VariableUpdateTest(tf.test.TestCase):

    def _pair(self, make_fn, shape=_SHAPE, seed=0):
        """Two copies of the same variables, one driven by the original
        function and one by its optimized version."""
        init = [random(rng(seed + k), shape, "float32").numpy() for k in range(3)]
        ref_vars = [tf.Variable(v) for v in init]
        opt_vars = [tf.Variable(v) for v in init]
        return make_fn(ref_vars), fs.optimize(make_fn(opt_vars)), ref_vars, opt_vars

    def test_adam_like_updates_fuse_and_match_over_steps(self):
        def make(vs):
            m, v, w = vs

            @tf.function
            def step(g, lr):
                m.assign_add((g - m) * 0.1)
                v.assign_add((tf.square(g) - v) * 0.001)
                w.assign_sub(m * lr / (tf.sqrt(tf.abs(v)) + 1e-7))
                return tf.reduce_sum(w)
            return step

        ref, opt, ref_vars, opt_vars = self._pair(make)
        gen = rng(7)
        for _ in range(3):
            g = random(gen, _SHAPE, "float32")
            lr = tf.constant(0.01)
            self.assertAllClose(ref(g, lr), quiet_call(opt, g, lr), rtol=1e-5, atol=1e-5)
            for a, b in zip(ref_vars, opt_vars):
                self.assertAllClose(a, b, rtol=1e-6, atol=1e-6)
        ops = _ops(opt)
        self.assertNotIn("AssignAddVariableOp", ops)
        self.assertNotIn("AssignSubVariableOp", ops)
        self.assertEqual(ops.count("AssignVariableOp"), 3)
        # Each update's arithmetic, the add included, is inside a kernel.
        self.assertEqual([n for n in opt.graph_def.node if n.op in ("AddV2", "Sub")], [])
        # The weight update reads the moments just assigned: with those reads
        # forwarded, the three updates and the sum are one kernel.
        self.assertEqual(len(fusion_stitch_nodes(opt.graph_def)), 1, str(opt.report()))

    def test_reads_before_and_after_an_update_see_the_old_and_new_values(self):
        def make(vs):
            a, b, _ = vs

            @tf.function
            def step(d):
                before = a.read_value()
                a.assign_add(d * 2.0 + b)
                after = a.read_value()
                a.assign_sub(tf.exp(d) * 0.5)
                return before * 3.0, after * 3.0, a.read_value()
            return step

        ref, opt, ref_vars, opt_vars = self._pair(make, seed=3)
        d = random(rng(11), _SHAPE, "float32")
        for r, o in zip(ref(d), quiet_call(opt, d)):
            self.assertAllClose(r, o, rtol=1e-6, atol=1e-6)
        self.assertAllClose(ref_vars[0], opt_vars[0], rtol=1e-6, atol=1e-6)
        self.assertNotIn("AssignAddVariableOp", _ops(opt))

    def test_an_update_after_a_write_ordered_through_a_read_sees_that_write(self):
        def make(vs):
            a, _, _ = vs

            @tf.function
            def step(x, d):
                a.assign(x * 2.0)
                # The update's delta reads `a`; Grappler drops the direct
                # read -> update control edge, which the data path implies.
                a.assign_add(a.read_value() * 0.5 + d)
                return a.read_value() + 1.0
            return step

        ref, opt, ref_vars, opt_vars = self._pair(make, seed=5)
        gen = rng(12)
        for _ in range(2):
            x, d = random(gen, _SHAPE, "float32"), random(gen, _SHAPE, "float32")
            self.assertAllClose(ref(x, d), quiet_call(opt, x, d), rtol=1e-6, atol=1e-6)
            self.assertAllClose(ref_vars[0], opt_vars[0], rtol=1e-6, atol=1e-6)
        self.assertNotIn("AssignAddVariableOp", _ops(opt))

    def test_a_variable_also_used_by_a_function_call_keeps_its_update(self):
        def make(vs):
            a, b, _ = vs

            @tf.function
            def inner(d):
                a.assign_add(d * b)

            @tf.function
            def step(d):
                inner(d)
                a.assign_add(d * 3.0 + a)
                return a.read_value() * 2.0
            return step

        ref, opt, ref_vars, opt_vars = self._pair(make, seed=9)
        d = random(rng(13), _SHAPE, "float32")
        self.assertAllClose(ref(d), quiet_call(opt, d), rtol=1e-6, atol=1e-6)
        self.assertAllClose(ref_vars[0], opt_vars[0], rtol=1e-6, atol=1e-6)
        self.assertIn("AssignAddVariableOp", _ops(opt))

    def test_a_delta_not_known_to_match_the_variable_keeps_tfs_shape_check(self):
        v = tf.Variable(np.ones(4, np.float32))

        # An add would broadcast a one-element delta; TF's update rejects it.
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def step(d):
            v.assign_add(d * 2.0 + 1.0)
            return tf.constant(0.0)

        one = tf.constant([1.0])
        with self.assertRaises(tf.errors.InvalidArgumentError):
            step(one)
        opt = fs.optimize(step)
        with self.assertRaises(tf.errors.InvalidArgumentError):
            quiet_call(opt, one)
        self.assertIn("AssignAddVariableOp", _ops(opt))
        self.assertAllEqual(v, np.ones(4, np.float32))
        d = random(rng(4), (4,), "float32")
        quiet_call(opt, d)
        self.assertAllClose(v, 1.0 + d.numpy() * 2.0 + 1.0, rtol=1e-6, atol=1e-6)

    def test_an_update_from_a_matmul_stays_in_place(self):
        w = tf.Variable(random(rng(5), (8, 8), "float32"))

        @tf.function
        def step(x):
            w.assign_add(tf.matmul(x, x))
            return tf.reduce_sum(w)

        x = random(rng(6), (8, 8), "float32")
        expected = w.numpy() + (x.numpy() @ x.numpy())
        opt = fs.optimize(step)
        quiet_call(opt, x)
        self.assertAllClose(w, expected, rtol=1e-5, atol=1e-5)
        self.assertIn("AssignAddVariableOp", _ops(opt))

    def test_integer_counters_keep_their_update(self):
        step_count = tf.Variable(0, dtype=tf.int64)
        w = tf.Variable(random(rng(8), _SHAPE, "float32"))

        @tf.function
        def step(d):
            step_count.assign_add(tf.constant(1, tf.int64) * 1)
            w.assign_add(d * 0.5 + w)   # a read of w tells its shape
            return step_count.read_value()

        d = random(rng(9), _SHAPE, "float32")
        expected = 2.0 * w.numpy() + d.numpy() * 0.5
        opt = fs.optimize(step)
        self.assertEqual(int(quiet_call(opt, d)), 1)
        self.assertAllClose(w, expected, rtol=1e-6, atol=1e-6)
        self.assertEqual(_ops(opt).count("AssignAddVariableOp"), 1)


if __name__ == "__main__":
    tf.test.main()
