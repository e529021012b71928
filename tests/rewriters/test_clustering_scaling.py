"""The greedy clustering's shortcuts (rewriters/uniform_merge.py: merges of
uniform elementwise clusters decided from summaries; failures memoised by
structure) form exactly the clusters of the full check, which lowers and
schedules every merged node set (form_clusters(summaries=False)).

Graphs where the two could part: long elementwise chains (one cluster
grown by thousands of merges), scalar arithmetic shared by many updates,
reductions with broadcast consumers, shapes that change along a chain,
diamonds whose merge would close a cycle through an op that is never
fused, a chain past the size limits of one kernel, and a node with no
reader. Behaviour only: nothing here is timed."""

import os
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from clustering_testlib import plans, recorded_results, traced_view
from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters import uniform_merge

F32 = tf.float32


class ClusteringScalingTest(tf.test.TestCase):

    def assertSamePlans(self, fn, *specs, largest_at_least=1):
        fast, full = plans(fn, specs, {"summaries": True}, {"summaries": False})
        self.assertEqual(fast, full)
        self.assertGreaterEqual(max(map(len, fast)), largest_at_least)
        return fast

    def test_a_long_elementwise_chain(self):
        # one cluster grown by a merge per op (the reference is quadratic
        # in the chain: it stays a few hundred ops long)
        def f(x):
            for i in range(150):
                x = tf.tanh(x) * 0.5 + float(i % 7)
            return x
        with recorded_results(uniform_merge.UniformMerges, "legal") as decided:
            self.assertSamePlans(f, tf.TensorSpec([8, 16], F32), largest_at_least=450)
        self.assertGreater(sum(decided), 400)   # the summaries decided nearly every merge

    def test_a_chain_longer_than_one_kernel_may_be(self):
        # at most MAX_OPS ops per kernel (lowered here to keep the reference
        # fast): the chain is cut where the full check's size limit cuts it
        def f(x):
            for _ in range(100):
                x = x * 1.5 + x
            return x
        with mock.patch.object(ir, "MAX_OPS", 37):
            plan = self.assertSamePlans(f, tf.TensorSpec([4], F32), largest_at_least=20)
        self.assertGreater(len(plan), 5)

    def test_many_kernel_inputs(self):
        # past MAX_INPUTS distinct inputs (lowered here) a kernel is cut,
        # as the full check cuts it; inputs read twice count once
        def f(xs):
            total = xs[0]
            for i, x in enumerate(xs[1:]):
                total = total * x + xs[i // 2]
            return total
        specs = [tf.TensorSpec([3], F32)] * 60
        with mock.patch.object(ir, "MAX_INPUTS", 13):
            plan = self.assertSamePlans(f, specs, largest_at_least=20)
        self.assertGreater(len(plan), 4)

    def test_scalar_arithmetic_shared_by_many_updates(self):
        # an optimizer's per-variable scalars, all from one step counter
        def f(step, weights):
            t = tf.cast(step + 1, F32)
            out = []
            for i, w in enumerate(weights):
                lr = 0.01 * tf.sqrt(1.0 - tf.pow(0.999, t)) / (1.0 - tf.pow(0.9 + 0.001 * i, t))
                out.append(w - lr * tf.sign(w))
            return out
        specs = [tf.TensorSpec([], tf.int64),
                 [tf.TensorSpec([4 + i % 3, 5], F32) for i in range(30)]]
        self.assertSamePlans(f, *specs, largest_at_least=30)

    def test_reductions_with_broadcast_consumers(self):
        def f(x):
            for _ in range(15):
                mean = tf.reduce_mean(x, axis=-1, keepdims=True)
                centred = x - mean
                var = tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True)
                x = tf.nn.relu(centred * tf.math.rsqrt(var + 1e-5)) * 2.0 + 1.0
                x = tf.nn.softmax(x) + x
            return x
        self.assertSamePlans(f, tf.TensorSpec([None, 32], F32), largest_at_least=5)

    def test_shapes_that_change_along_a_chain(self):
        def f(x, row, col):
            for i in range(90):
                if i % 3 == 0:
                    x = x + row          # [8, 16] + [16]
                elif i % 3 == 1:
                    x = x * col          # [8, 16] * [8, 1]
                else:
                    x = tf.exp(x) - 1.0
            return x
        self.assertSamePlans(f, tf.TensorSpec([8, 16], F32), tf.TensorSpec([16], F32),
                             tf.TensorSpec([8, 1], F32), largest_at_least=60)

    def test_diamonds_that_would_close_a_cycle(self):
        # a -> matmul -> b beside a -> b: a and b may not share a kernel
        def f(x, w):
            for _ in range(40):
                a = tf.nn.relu(x) + 1.0
                b = tf.matmul(a, w)
                x = tf.tanh(a) * b - a
            return x
        self.assertSamePlans(f, tf.TensorSpec([4, 4], F32), tf.TensorSpec([4, 4], F32),
                             largest_at_least=3)

    def test_a_chain_whose_end_has_no_reader(self):
        # a cluster needs an output: a dead end of the chain stays apart
        def f(x):
            y = x
            for _ in range(50):
                y = y * 2.0 + 1.0
            tf.exp(y)        # read by nothing, fetched by nothing
            return y - 3.0
        self.assertSamePlans(f, tf.TensorSpec([6], F32), largest_at_least=100)


class NodeSummaryTest(tf.test.TestCase):

    def test_uniform_nodes_and_others(self):
        def f(x, s):
            a = tf.tanh(x) + s            # [4, 5] with a scalar
            b = tf.reduce_sum(a, axis=1)  # a reduction
            c = tf.reshape(a, [20])       # a reshape
            return a * 2.0, b, c
        view, fetches = traced_view(f, tf.TensorSpec([4, 5], F32), tf.TensorSpec([], F32))
        by_op = {view.nodes[n].op: n for n in view.order}
        summary = uniform_merge.node_summary(view, by_op["AddV2"], fetches)
        self.assertIsNotNone(summary)
        self.assertEqual(summary.shape, (4, 5))
        self.assertLen(summary.feeds, 2)
        for op in ("Sum", "Reshape"):
            self.assertIsNone(uniform_merge.node_summary(view, by_op[op], fetches), op)


if __name__ == "__main__":
    tf.test.main()
