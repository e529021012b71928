"""`optimize(fn, fusion="explore")`: FusionStitching's plan exploration
(rewriters/explore.py): top-k candidate patterns per op, a beam search over
plans scored by the delta evaluator, remote fusion (kernel packing).

Explored plans go through the same lowering, schedule and codegen as stitch's,
so their results must equal TF's under docs/DESIGN.md, "Numerics" (see
optimize_testlib.py) on fresh seeded random inputs, and they should need no
more kernels than the greedy plan. The tests of the search turn the plan
guard off (explore_guard=False): its choice depends on this machine's
calibration; PlanGuardTest tests the guard.
"""

import re
from unittest import mock

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

import tf_fusionstitch as fs
from optimize_testlib import (EPS, assert_same, assert_train_steps_match, fusion_stitch_nodes,
                              make_stateful_step, quiet_call, random, rng, to_numpy)
from tf_fusionstitch.rewriters import cpu_cost_model, cpu_costs, explore
from tf_fusionstitch.rewriters.cycles import Reachability, cluster_spans, creates_cycle
from tf_fusionstitch.rewriters.graph_view import GraphView

from benchmarks import models  # the repository root (pyproject.toml's pytest pythonpath)

HIDDEN = 32
# layernorm-like results: two reductions of HIDDEN terms, an rsqrt and a few
# products; |error| <= (n + 8) eps relative to the result's scale
# (docs/DESIGN.md, "Numerics").
_NORM_TOL = (HIDDEN + 8) * EPS["float32"]


def _layernorm(x, gamma, beta, eps=1e-5):
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
    return centered * tf.math.rsqrt(var + eps) * gamma + beta


def _transformer_block(x, mask, wqkv, wo, bo, w1, b1, w2, b2, g1, be1, g2, be2, heads=4):
    """Post-LN encoder block as benchmarks/models/transformer_layers.py builds
    it (attention with additive padding mask, residual + layernorm, bias+GELU
    feed-forward, residual + layernorm), in plain TF ops."""
    batch, seq, hidden = x.shape
    key_dim = hidden // heads
    qkv = tf.reshape(tf.matmul(tf.reshape(x, [-1, hidden]), wqkv), [batch, seq, 3, heads, key_dim])
    q, k, v = qkv[:, :, 0] * (key_dim ** -0.5), qkv[:, :, 1], qkv[:, :, 2]
    scores = tf.einsum("bqhk,bshk->bhqs", q, k)
    scores += (1.0 - mask[:, None, None, :]) * -10000.0
    context = tf.einsum("bhqs,bshk->bqhk", tf.nn.softmax(scores, axis=-1), v)
    attn = tf.matmul(tf.reshape(context, [-1, hidden]), wo) + bo
    h = _layernorm(tf.reshape(x, [-1, hidden]) + attn, g1, be1)
    ffn = tf.matmul(tf.nn.gelu(tf.matmul(h, w1) + b1, approximate=False), w2) + b2
    return tf.reshape(_layernorm(h + ffn, g2, be2), [batch, seq, hidden])


class ExplorePatternTest(tf.test.TestCase):
    """The reference patterns and a transformer block: TF's results, and no
    more kernels than fusion="stitch"."""

    def setUp(self):
        super().setUp()
        gen = rng(9500 + len(self.id()))
        self.gen = gen
        self.x = random(gen, (4, 16, HIDDEN), "float32")
        self.res = random(gen, (4, 16, HIDDEN), "float32")
        self.gamma = tf.constant(1.0 + 0.1 * gen.standard_normal(HIDDEN), tf.float32)
        self.beta = tf.constant(0.1 * gen.standard_normal(HIDDEN), tf.float32)
        self.bias = random(gen, (HIDDEN,), "float32")

    def _compare(self, fn, args, kind="chain", **tolerance):
        expected = tf.nest.flatten(fn(*args))
        kernels = {}
        for fusion in ("explore", "stitch"):
            guard = {"explore_guard": False} if fusion == "explore" else {}
            opt = fs.optimize(fn, fusion=fusion, **guard)
            actual = tf.nest.flatten(quiet_call(opt, *args))
            report = opt.report()
            for a, e in zip(actual, expected):
                assert_same(self, a, e, kind, msg=f"{fusion}\n{report}", **tolerance)
            self.assertEqual(report.fusion, fusion)
            self.assertEqual(report.kernels_after, fs.memory_intensive_kernels(opt.graph_def))
            kernels[fusion] = report.kernels_after
            if fusion == "explore":
                self.assertIn("explore k=3 beam=3", str(report))
                explore_report = report
        self.assertLessEqual(kernels["explore"], kernels["stitch"], str(explore_report))
        self.assertLess(kernels["explore"], explore_report.kernels_before, str(explore_report))
        return kernels

    def test_layernorm(self):
        f = tf.function(_layernorm, input_signature=[
            tf.TensorSpec([None, 16, HIDDEN]), tf.TensorSpec([HIDDEN]), tf.TensorSpec([HIDDEN])])
        kernels = self._compare(f, (self.x, self.gamma, self.beta),
                                rtol=_NORM_TOL, atol=_NORM_TOL)
        self.assertEqual(kernels["explore"], 1)

    def test_softmax(self):
        f = tf.function(lambda x: tf.nn.softmax(x * 3.0),
                        input_signature=[tf.TensorSpec([None, 16, HIDDEN])])
        self.assertEqual(self._compare(f, (self.x,), rtol=1e-5, atol=1e-6)["explore"], 1)

    def test_residual_add_layernorm(self):
        f = tf.function(lambda x, r, g, b: _layernorm(x + r, g, b), input_signature=[
            tf.TensorSpec([None, 16, HIDDEN])] * 2 + [tf.TensorSpec([HIDDEN])] * 2)
        kernels = self._compare(f, (self.x, self.res, self.gamma, self.beta),
                                rtol=_NORM_TOL, atol=_NORM_TOL)
        self.assertEqual(kernels["explore"], 1)

    def test_bias_gelu(self):
        f = tf.function(lambda x, b: tf.nn.gelu(x + b, approximate=False),
                        input_signature=[tf.TensorSpec([None, 16, HIDDEN]),
                                         tf.TensorSpec([HIDDEN])])
        self.assertEqual(self._compare(f, (self.x, self.bias), "transcendental")["explore"], 1)

    def test_batchnorm_inference_relu(self):
        gen = self.gen
        scale, offset, mean = (random(gen, (8,), "float32") for _ in range(3))
        var = random(gen, (8,), "float32", "positive")

        @tf.function(input_signature=[tf.TensorSpec((None, 6, 6, 8))])
        def f(x):
            y, _, _ = tf.compat.v1.nn.fused_batch_norm(
                x, scale, offset, mean=mean, variance=var, epsilon=1e-3, is_training=False)
            return tf.nn.relu(y)

        x = random(gen, (3, 6, 6, 8), "float32")
        self.assertEqual(self._compare(f, (x,))["explore"], 1)

    def test_transformer_block(self):
        gen, h = self.gen, HIDDEN
        weights = [random(gen, shape, "float32") * 0.2 for shape in
                   ((h, 3 * h), (h, h), (h,), (h, 2 * h), (2 * h,), (2 * h, h), (h,))]
        norms = [tf.constant(1.0 + 0.1 * gen.standard_normal(h), tf.float32),
                 tf.constant(0.1 * gen.standard_normal(h), tf.float32)] * 2
        lengths = np.array([16, 9, 3, 12])
        mask = tf.constant(np.arange(16)[None, :] < lengths[:, None], tf.float32)
        f = tf.function(_transformer_block)
        # Elementwise chains through softmax and two layernorms of 32 terms:
        # the whole-function tolerance of test_reference_models.py.
        kernels = self._compare(f, (self.x, mask, *weights, *norms), "transcendental")
        # mask, softmax, two residual layernorms, bias+gelu: at most a handful
        self.assertLessEqual(kernels["explore"], 6)


class WideRowsTest(tf.test.TestCase):

    def test_a_residual_layernorm_of_768_is_one_kernel(self):
        """BERT's residual add + layernorm over rows of 768: a kernel of three
        column loops re-reads each 3 KiB row from the core's cache, far
        cheaper than writing the sum and the statistics out and reading them
        back (one kernel ran 10-15% faster than two here), with the builtin
        costs and with this machine's calibrated ones."""
        hidden, rows = 768, 256
        f = tf.function(lambda x, r, g, b: _layernorm(x + r, g, b, eps=1e-12),
                        input_signature=[tf.TensorSpec([rows, hidden])] * 2
                        + [tf.TensorSpec([hidden])] * 2)
        gen = rng(9585)
        args = (random(gen, (rows, hidden), "float32"), random(gen, (rows, hidden), "float32"),
                tf.constant(1.0 + 0.1 * gen.standard_normal(hidden), tf.float32),
                tf.constant(0.1 * gen.standard_normal(hidden), tf.float32))
        tol = (hidden + 8) * EPS["float32"]
        for costs in ("builtin", "calibrated"):
            opt = fs.optimize(f, fusion="explore", explore_guard=False, costs=costs)
            assert_same(self, quiet_call(opt, *args), f(*args), "chain", rtol=tol, atol=tol,
                        msg=costs)
            self.assertEqual(opt.report().kernels_after, 1, f"{costs}: {opt.report()}")


class UncheckedPricingTest(tf.test.TestCase):

    def test_a_chosen_cluster_that_fails_its_checks_stays_tf_ops(self):
        """Explore prices clusters without ir.Cluster.validate; the kernels it
        chooses are lowered again with it. One that fails there (here: a
        tanh with other ops, by a patched check; the tanh alone passes, so
        it is a candidate) stays TF ops, with the reason in the report, and
        the function's results are TF's."""
        from tf_fusionstitch import fusion_ir as ir

        @tf.function(input_signature=[tf.TensorSpec([None, HIDDEN])] * 2)
        def f(x, y):
            return tf.tanh(x * 2.0 + 1.0), tf.exp(y * 0.5) - 1.0

        def refuse_tanh(cluster):
            if len(cluster.ops) > 1 and any(op.prim == "tanh" for op in cluster.ops):
                raise ir.SpecError("refused by the test")
            return real(cluster)

        gen = rng(9588)
        args = (random(gen, (6, HIDDEN), "float32"), random(gen, (6, HIDDEN), "float32"))
        real, ir.Cluster.validate = ir.Cluster.validate, refuse_tanh
        try:
            opt = fs.optimize(f, fusion="explore", explore_guard=False, pack=False,
                              rewrite_cache=False)
            with self.assertWarnsRegex(RuntimeWarning, "lowering: refused by the test"):
                actual = opt(*args)
        finally:
            ir.Cluster.validate = real
        for a, e in zip(actual, f(*args)):
            assert_same(self, a, e, "transcendental")
        report = opt.report()
        refused = [c for c in report.fallbacks if "refused by the test" in c.reason]
        self.assertLen(refused, 1, str(report))
        self.assertIn("Tanh", {t for _, t in refused[0].tf_ops})
        self.assertLen(report.fused_clusters, 1, str(report))


class NeighbourMergeTest(tf.test.TestCase):

    def test_two_computed_producers_of_one_op_join_one_kernel(self):
        """Patterns grow from a producer to its consumers: {exp, add} or
        {tanh, add}; the neighbour merge adds the other producer. The batch
        is dynamic, so remote fusion (static iteration spaces only) cannot."""
        @tf.function(input_signature=[tf.TensorSpec([None, HIDDEN])] * 2)
        def f(x, y):
            return tf.exp(x * 0.5) + tf.tanh(y)

        gen = rng(9590)
        args = (random(gen, (6, HIDDEN), "float32"), random(gen, (6, HIDDEN), "float32"))
        opt = fs.optimize(f, fusion="explore", explore_guard=False)
        assert_same(self, quiet_call(opt, *args), f(*args), "transcendental")
        self.assertEqual(opt.report().kernels_after, 1, str(opt.report()))
        self.assertRegex(str(opt.report()),
                         r" [1-9]\d* neighbour merge\(s\), 0 kernel\(s\) packed")


class RemoteFusionTest(tf.test.TestCase):

    def test_independent_chains_pack_into_one_kernel(self):
        """Two chains with no data between them: stitch without packing makes
        two kernels; explore's remote fusion and stitch's packing, one."""
        @tf.function(input_signature=[tf.TensorSpec([8, HIDDEN]), tf.TensorSpec([8, HIDDEN])])
        def f(a, b):
            return tf.tanh(a * 2.0 + 1.0), tf.exp(b * 0.5) - 1.0

        gen = rng(9600)
        args = (random(gen, (8, HIDDEN), "float32"), random(gen, (8, HIDDEN), "float32"))
        expected = f(*args)
        counts = {}
        for plan, options in (("unpacked", {"pack": False}), ("stitch", {}),
                              ("explore", {"fusion": "explore", "explore_guard": False})):
            opt = fs.optimize(f, **options)
            actual = quiet_call(opt, *args)
            for a, e in zip(actual, expected):
                assert_same(self, a, e, "transcendental", msg=plan)
            counts[plan] = (opt.report().kernels_after, len(fusion_stitch_nodes(opt.graph_def)))
        self.assertEqual(counts, {"unpacked": (2, 2), "stitch": (1, 1), "explore": (1, 1)})
        self.assertIn("1 kernel(s) packed by remote fusion", str(opt.report()))

    def test_a_remote_fusion_pack_moves_at_most_its_byte_limit(self):
        """Three unconnected chains of one iteration space, 128 KiB moved
        each (in and out): with room for two, remote fusion packs two and
        leaves the third apart; unlimited, it packs all three. (pack=False:
        step 5 would pack the rest apart.) A pack starts when its last
        member can, so big packs made earlier work wait."""
        @tf.function(input_signature=[tf.TensorSpec([64, 256])] * 3)
        def f(a, b, c):
            return tf.tanh(a * 2.0 + 1.0), tf.exp(b * 0.5) - 1.0, tf.sigmoid(c * 3.0) + 2.0

        gen = rng(9602)
        args = tuple(random(gen, (64, 256), "float32") for _ in range(3))
        expected = f(*args)
        kernels = {}
        for limit in (300 << 10, float("inf")):
            with mock.patch.object(explore, "REMOTE_MAX_BYTES", limit):
                opt = fs.optimize(f, fusion="explore", explore_guard=False, pack=False,
                                  rewrite_cache=False)
                for a, e in zip(quiet_call(opt, *args), expected):
                    assert_same(self, a, e, "transcendental", msg=str(limit))
            kernels[limit] = opt.report().kernels_after
        self.assertEqual(kernels, {300 << 10: 2, float("inf"): 1})

    def test_kernels_of_different_spaces_pack_apart(self):
        """Two unconnected kernels whose iteration spaces differ (one has a
        dynamic batch) cannot share loops, but share one launch as a pack of
        two parts; pack=False keeps them two kernels."""
        @tf.function(input_signature=[tf.TensorSpec([None, HIDDEN]), tf.TensorSpec([5, 7])])
        def f(a, b):
            return tf.tanh(a * 2.0 + 1.0), tf.exp(b * 0.5) - 1.0

        gen = rng(9605)
        args = (random(gen, (6, HIDDEN), "float32"), random(gen, (5, 7), "float32"))
        expected = f(*args)
        for pack, kernels in ((True, 1), (False, 2)):
            opt = fs.optimize(f, fusion="explore", explore_guard=False, pack=pack)
            for a, e in zip(quiet_call(opt, *args), expected):
                assert_same(self, a, e, "transcendental", msg=f"pack={pack}")
            report = opt.report()
            self.assertEqual(report.kernels_after, kernels, str(report))
            self.assertEqual([c.parts for c in report.fused_clusters],
                             [2] if pack else [1, 1], str(report))
            self.assertIn(f"{2 - kernels} into packs of separate spaces", str(report))

    def test_packing_never_closes_a_cycle(self):
        """c = x * 0.5 is independent of the chain on y only in appearance:
        y = relu(c) feeds the matmul whose result feeds the chain, so packing
        c with that chain would make a kernel that waits for itself. A
        longer chain of matmuls leaves every kernel time to wait, so that
        only the cycle check keeps them apart."""
        @tf.function(input_signature=[tf.TensorSpec([8, 8])] * 2)
        def f(x, w):
            c = tf.exp(x * 0.5)
            y = tf.matmul(tf.nn.relu(c - 1.0), w)
            longer = w
            for _ in range(6):
                longer = tf.matmul(longer, w)
            return tf.tanh(y * 2.0) + 1.0, tf.sigmoid(x) * 3.0, longer

        gen = rng(9610)
        args = (random(gen, (8, 8), "float32"), random(gen, (8, 8), "float32"))
        opt = fs.optimize(f, fusion="explore", explore_guard=False)
        for a, e in zip(quiet_call(opt, *args), f(*args)):
            assert_same(self, a, e, "transcendental")
        # exp-relu chain and sigmoid-mul pack (both read only x); the chain
        # after the matmul cannot join them: 2 kernels.
        self.assertEqual(opt.report().kernels_after, 2, str(opt.report()))

    def test_remote_fusion_keeps_the_longest_path_from_waiting(self):
        """The tanh kernel starts a path through two matmuls; the exp kernel
        of the same iteration space could run any time before the end.
        Remote fusion would share their loops, so the matmuls would wait for
        2 MB of exp; packing.py's start windows keep them apart."""
        @tf.function(input_signature=[tf.TensorSpec([512, 512])] * 3)
        def f(x, w, side):
            m = tf.matmul(tf.matmul(tf.tanh(x * 2.0) + 1.0, w), w)
            return tf.sigmoid(m) * 3.0, tf.exp(side * 0.5) - 1.0

        gen = rng(9630)
        args = (random(gen, (512, 512), "float32"), random(gen, (512, 512), "float32") * 0.05,
                random(gen, (512, 512), "float32"))
        opt = fs.optimize(f, fusion="explore", explore_guard=False)
        for a, e in zip(quiet_call(opt, *args), f(*args)):
            assert_same(self, a, e, "transcendental")
        report = opt.report()
        self.assertEqual(report.kernels_after, 3, str(report))
        self.assertIn(" 0 kernel(s) packed by remote fusion", str(report))

    def test_plan_never_holds_two_patterns_that_feed_each_other(self):
        """{a1, a2} and {b1, b2} are each legal, but a1 feeds b2 and b1 feeds
        a2 (through matmuls): the beam search may take only one of them."""
        @tf.function(input_signature=[tf.TensorSpec([8, 8])] * 3)
        def f(x, y, w):
            a1, b1 = x * 2.0, tf.exp(y * 0.5)
            return a1 + tf.matmul(b1, w), b1 - tf.matmul(a1, w)

        gen = rng(9615)
        args = tuple(random(gen, (8, 8), "float32") for _ in range(3))
        opt = fs.optimize(f, fusion="explore", explore_guard=False)
        for a, e in zip(quiet_call(opt, *args), f(*args)):
            assert_same(self, a, e, "transcendental")
        # one of the two patterns; the other side's ops stay apart: 3 kernels
        self.assertEqual(opt.report().kernels_after, 3, str(opt.report()))

    def test_packing_sees_cycles_through_other_kernels(self):
        """p1 and p2 are unconnected in the graph, but the kernel {r, u, v}
        reads p1 (through a matmul) and feeds p2 (through another): packing
        p1 with p2 would close a cycle through that kernel."""
        @tf.function(input_signature=[tf.TensorSpec([8, 8])] * 3)
        def f(x, a, w):
            p1 = tf.tanh(a * 2.0)
            r = x * 2.0
            u = r + tf.matmul(p1, w)
            v = r * 3.0
            p2 = tf.sigmoid(tf.matmul(v, w)) * 3.0
            return u, p2

        gen = rng(9620)
        args = tuple(random(gen, (8, 8), "float32") for _ in range(3))
        opt = fs.optimize(f, fusion="explore", explore_guard=False)
        for a, e in zip(quiet_call(opt, *args), f(*args)):
            assert_same(self, a, e, "transcendental")
        self.assertEqual(opt.report().kernels_after, 3, str(opt.report()))


class LoopRecurrenceTest(tf.test.TestCase):

    def test_a_masked_cells_kernel_leaves_the_output_select_to_tf(self):
        """A masked recurrent step as Keras writes it: the state h and the
        output y both take the cell's value where the mask is set. Only h
        feeds the next cell; y's select lies on y's own recurrence. In one
        kernel with the cell it would make every iteration wait for it
        (DIEN's inference ran 10% slower so), so the cell's kernel computes
        h only, under explore and under the default greedy strategy. The
        results equal TF's on fresh random inputs."""
        steps, batch = 5, 8

        @tf.function(input_signature=[tf.TensorSpec([steps, batch, HIDDEN]),
                                      tf.TensorSpec([steps, batch, 1], tf.bool),
                                      tf.TensorSpec([HIDDEN, HIDDEN])])
        def f(xs, mask, w):
            def body(t, h, y):
                cell = tf.sigmoid(tf.matmul(h, w) + xs[t]) * tf.tanh(xs[t] - 0.5)
                return t + 1, tf.where(mask[t], cell, h), tf.where(mask[t], cell, y)

            zeros = tf.zeros([batch, HIDDEN])
            _, h, y = tf.while_loop(lambda t, h, y: t < steps, body, (0, zeros, zeros))
            return h, y

        gen = rng(9640)
        args = (random(gen, (steps, batch, HIDDEN), "float32"),
                tf.constant(gen.random((steps, batch, 1)) < 0.7),
                random(gen, (HIDDEN, HIDDEN), "float32") * 0.2)
        for fusion in ("explore", "stitch"):
            with self.subTest(fusion=fusion):
                opt = fs.optimize(f, fusion=fusion)
                for a, e in zip(quiet_call(opt, *args), f(*args)):
                    assert_same(self, a, e, "transcendental")
                report = opt.report()
                body = [c for c in report.fused_clusters if "body" in c.name]
                cell = [c for c in body if "Sigmoid" in {op for _, op in c.tf_ops}]
                self.assertLen(cell, 1, str(report))
                selects = [op for _, op in cell[0].tf_ops if op in ("Select", "SelectV2")]
                self.assertLen(selects, 1, str(report))


class StatefulTest(tf.test.TestCase):

    def test_assignments_and_random_keep_their_order(self):
        tf.random.set_seed(1)
        ref_step, ref_v, ref_count = make_stateful_step(9700, noise=True)
        tf.random.set_seed(1)
        step, v, count = make_stateful_step(9700, noise=True)
        opt = fs.optimize(step, fusion="explore", explore_guard=False)
        gen = rng(9701)
        for i in range(3):
            x = random(gen, (4, 8), "float32")
            v_before = v.numpy()
            expected = ref_step(x)
            actual = quiet_call(opt, x)
            for a, e in zip(actual, expected):
                assert_same(self, a, e, "transcendental", msg=f"call {i}")
            np.testing.assert_array_equal(v.numpy(), v_before + to_numpy(x) * np.float32(0.5))
            np.testing.assert_array_equal(v.numpy(), ref_v.numpy())
            self.assertEqual(int(count.numpy()), i + 1)
            self.assertEqual(int(actual[-1]), i + 1)
        self.assertNotEmpty(fusion_stitch_nodes(opt.graph_def), str(opt.report()))
        self.assertEmpty(opt.report().fallbacks, str(opt.report()))


class OptionsTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        self.f = tf.function(lambda x: tf.nn.relu(x * 2.0) + 1.0)

    def test_bad_k_and_beam_fail_with_the_range(self):
        for key, value in (("explore_k", 0), ("explore_k", 9), ("explore_beam", 0),
                           ("explore_beam", 17)):
            with self.subTest(f"{key}={value}"):
                with self.assertRaisesRegex(ValueError, f"{key}={value} is out of range"):
                    fs.optimize(self.f, fusion="explore", **{key: value})

    def test_k_and_beam_are_ints(self):
        for value in ("3", 2.0, True):
            with self.assertRaisesRegex(TypeError, "explore_beam"):
                fs.optimize(self.f, fusion="explore", explore_beam=value)

    def test_k_and_beam_need_fusion_explore(self):
        with self.assertRaisesRegex(ValueError, "explore_k applies only to fusion='explore'"):
            fs.optimize(self.f, explore_k=2)
        with self.assertRaisesRegex(ValueError, "explore_beam applies only"):
            fs.optimize(self.f, fusion="xla_like", explore_beam=2)

    def test_narrow_search_still_matches_tf(self):
        f = tf.function(lambda x, g, b: _layernorm(x, g, b))
        gen = rng(9800)
        args = (random(gen, (6, HIDDEN), "float32"), random(gen, (HIDDEN,), "float32"),
                random(gen, (HIDDEN,), "float32"))
        opt = fs.optimize(f, fusion="explore", explore_guard=False, explore_k=1, explore_beam=1)
        assert_same(self, quiet_call(opt, *args), f(*args), rtol=_NORM_TOL, atol=_NORM_TOL)
        self.assertIn("explore k=1 beam=1", str(opt.report()))
        self.assertEqual(opt.report().kernels_after, 1, str(opt.report()))


class PlanGuardTest(tf.test.TestCase):
    """The plan guard (rewriters/plan_guard.py) keeps the explored plan or a
    rule plan (stitch's, optimize's default, or XLA's), says which and why,
    and every choice gives TF's results."""

    def test_the_report_names_the_plan_kept_and_both_give_tfs_results(self):
        gen = rng(9900)
        x = random(gen, (4, 16, HIDDEN), "float32")
        weights = [random(gen, s, "float32") for s in ((HIDDEN,), (HIDDEN,))]
        f = tf.function(lambda x, g, b: tf.nn.softmax(_layernorm(x, g, b) * 2.0))
        expected = f(x, *weights)
        default = fs.optimize(f, rewrite_cache=False)
        quiet_call(default, x, *weights)
        reports = {}
        for error in (0.0, 0.99):
            costs = dict(cpu_cost_model.BUILTIN, plan_error=error)
            with mock.patch.object(cpu_costs, "for_this_machine",
                                   return_value=(costs, "calibrated")):
                opt = fs.optimize(f, fusion="explore", rewrite_cache=False)
                assert_same(self, quiet_call(opt, x, *weights), expected, "transcendental")
            reports[error] = opt.report()
        for error, report in reports.items():
            predicted = {name: float(ms) for name, ms in re.findall(
                r"([\w-]+) plan ([\d.]+) ms", report.exploration)}
            self.assertEqual(set(predicted), {"explored", "stitch", "XLA-rule"},
                             report.exploration)
            kept = re.search(r"kept the ([\w-]+) plan", report.exploration).group(1)
            # with no error, the kept plan is never predicted slower than another
            if error == 0.0:
                self.assertEqual(predicted[kept], min(predicted.values()), report.exploration)
        # beyond a 99% error nothing is certain: the plan the default rules give
        self.assertIn("kept the stitch plan", reports[0.99].exploration)
        self.assertEqual(reports[0.99].kernels_after, default.report().kernels_after)

    def test_no_guard_no_verdict(self):
        f = tf.function(lambda x: tf.nn.relu(x * 2.0) + 1.0)
        opt = fs.optimize(f, fusion="explore", explore_guard=False)
        quiet_call(opt, tf.ones([4, 8]))
        self.assertNotIn("plan guard", opt.report().exploration)
        with self.assertRaisesRegex(ValueError, "explore_guard applies only"):
            fs.optimize(f, explore_guard=False)


class CycleCheckTest(tf.test.TestCase):

    def test_closure_through_clusters_agrees_with_the_walk(self):
        """Reachability.closes_cycle (the plan search's check: bit sets, and
        only the clusters placed before the point past which paths move
        forward) gives creates_cycle's verdict on random DAGs with random
        clusters formed so far, some of them spanning far apart nodes."""
        gen = np.random.default_rng(9900)
        disagreements, cycles = 0, 0
        for _ in range(40):
            gd = graph_pb2.GraphDef()
            n = 30
            for i in range(n):
                node = gd.node.add(name=f"n{i}", op="NoOp")
                for j in gen.choice(i, size=min(i, int(gen.integers(0, 3))), replace=False):
                    node.input.append(f"^n{j}" if gen.random() < 0.3 else f"n{j}")
            view = GraphView(gd, {})
            reach = Reachability(view)
            order = list(view.order)
            owner, members = {}, {}
            for u in range(4):  # disjoint clusters already formed (each acyclic or not)
                picked = [m for m in gen.choice(order, size=int(gen.integers(1, 5)),
                                                replace=False) if m not in owner]
                members[f"u{u}"] = picked
                owner.update((m, f"u{u}") for m in picked)
            spans = cluster_spans(members, view.position)
            bits = {u: reach.cluster_bits(ms) for u, ms in members.items()}
            free = [m for m in order if m not in owner]
            for _ in range(10):
                nodes = set(gen.choice(free, size=int(gen.integers(1, 4)), replace=False))
                walk = creates_cycle(view, nodes, owner, members)
                cycles += walk
                disagreements += walk != reach.closes_cycle(nodes, spans, bits)
        self.assertEqual(disagreements, 0)
        self.assertGreater(cycles, 20)  # the cases exercise both verdicts

    def test_bit_set_closure_agrees_with_the_walk(self):
        """Reachability (the transitive closure the search checks patterns
        with) gives creates_cycle's verdict with no clusters formed."""
        gen = np.random.default_rng(9901)
        disagreements, cycles = 0, 0
        for _ in range(40):
            gd = graph_pb2.GraphDef()
            for i in range(30):
                node = gd.node.add(name=f"n{i}", op="NoOp")
                for j in gen.choice(i, size=min(i, int(gen.integers(0, 3))), replace=False):
                    node.input.append(f"^n{j}" if gen.random() < 0.3 else f"n{j}")
            view = GraphView(gd, {})
            reach = Reachability(view)
            for _ in range(10):
                nodes = set(gen.choice(view.order, size=int(gen.integers(1, 5)), replace=False))
                walk = creates_cycle(view, nodes, {}, {})
                cycles += walk
                disagreements += walk != reach.creates_cycle(nodes)
        self.assertEqual(disagreements, 0)
        self.assertGreater(cycles, 20)


class ReferenceModelTest(tf.test.TestCase):

    def test_bert_train_step(self):
        """The 2-layer tiny BERT train step explores and its three optimized
        Adam steps match TF (tolerances of test_reference_models.py)."""
        reference = models.build("bert", "tiny", seed=11)
        fused = models.build("bert", "tiny", seed=11)
        opt = fs.optimize(fused.train_step, fusion="explore", explore_guard=False)
        assert_train_steps_match(self, reference, fused, opt, np.random.default_rng(12))
        report = opt.report()
        self.assertEmpty(report.fallbacks, str(report))
        self.assertIn("explore k=3 beam=3", str(report))
        # Adam's per-variable updates have static shapes: remote fusion packs
        # some of them; the plan is far below TF's kernel count.
        self.assertNotIn(" 0 kernel(s) packed", str(report))
        self.assertLess(report.kernels_after, report.kernels_before / 3, str(report))

    def test_dien_at_benchmark_size_needs_at_most_40_percent_of_xla_likes_kernels(self):
        """The issue's kernel bar on the real-size DIEN train step (batch 128,
        as benchmarks/models.py runs it), with the builtin costs so that the
        plan does not depend on this machine: explore's plan has at most 40%
        of xla_like's memory-intensive kernels. Its Adam updates of weights
        of different shapes share launches as packs of separate spaces;
        without them the plan was at 60%. Only the plans are built here; the
        tiny models' tests check the results."""
        counts = {}
        for fusion, options in (("xla_like", {}),
                                ("explore", {"costs": "builtin", "explore_guard": False})):
            model = models.build("dien", "real", seed=13)
            batch = model.make_batch(np.random.default_rng(14), 128)
            opt = fs.optimize(model.train_step, fusion=fusion, **options)
            report = opt.prepare(*batch.inputs, batch.labels)
            self.assertEmpty(report.fallbacks, str(report))
            counts[fusion] = report.kernels_after
        self.assertLessEqual(counts["explore"], 0.4 * counts["xla_like"], counts)
