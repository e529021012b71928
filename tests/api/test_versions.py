"""Versions of an optimized function that assume input sizes equal
(tf_fusionstitch/versions.py, rewriters/decided_shapes.py InputEqualities):
which version a call runs, that every version matches TF on the calls it
gets, and that the assumptions survive the rewrite cache."""

import os
import tempfile
from unittest import mock

import tensorflow as tf

import tf_fusionstitch as fs
from optimize_testlib import quiet_call, random, rng
from tf_fusionstitch.runtime import cache
from tf_fusionstitch.versions import MAX_VERSIONS, Versions, call_sizes, holds

X0_Y0 = ((0, 0), (1, 0))      # leaf 0 axis 0 == leaf 1 axis 0


def _bga_sums(graph_def):
    producers = {n.name: n.op for n in graph_def.node}
    return [n.name for n in graph_def.node
            if n.op == "Sum" and producers[n.input[1].split(":")[0]] == "BroadcastGradientArgs"]


def _make_grads():
    """Gradients of a product of two independently batched inputs: TF lets
    either batch be 1 against the other, so the Sums stay TF's unless the
    call's batches are known equal."""
    @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None, 4])])
    def grads(x, y):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            loss = tf.reduce_sum(tf.tanh(x * y + x) * 2.0)
        gx, gy = tape.gradient(loss, [x, y])
        return gx * 3.0 + 1.0, tf.exp(gy) - 1.0
    return grads


def _inputs(seed, rows_x, rows_y):
    return (random(rng(seed), (rows_x, 4), "float32"),
            random(rng(seed + 1), (rows_y, 4), "float32"))


class VersionsTest(tf.test.TestCase):
    """versions.py alone: the dispatch, with a stand-in for the traces."""

    def _versions(self):
        made = []

        def make(version):
            made.append(version)
            return lambda: None
        return Versions(make), made

    def test_sizes_and_pairs(self):
        sizes = call_sizes([tf.zeros([3, 4]), 2.0, tf.zeros([3, 1]), tf.TensorSpec([None, 4])])
        self.assertEqual(sizes, [(3, 4), None, (3, 1), (None, 4)])
        self.assertTrue(holds(sizes, ((0, 0), (2, 0))))
        self.assertFalse(holds(sizes, ((0, 1), (2, 1))))
        self.assertFalse(holds(sizes, ((0, 0), (3, 0))))     # unknown: not known to hold
        self.assertFalse(holds(sizes, ((0, 0), (1, 0))))     # not a tensor

    def test_first_version_narrows_to_what_its_trace_assumed(self):
        versions, made = self._versions()
        sizes = [(3, 4), (3, 4)]
        first = versions.pick(sizes)
        self.assertIsNone(first.guard)
        # Before its trace it may take every equal pair of the call's sizes.
        self.assertEqual(first.equal_classes([(0, 0), (1, 0), (0, 1), (1, 1)]),
                         [[(0, 0), (1, 0)], [(0, 1), (1, 1)]])
        versions.traced(first, {X0_Y0}, {X0_Y0})
        versions.settle(first, sizes)
        self.assertEqual(first.guard, frozenset({X0_Y0}))
        self.assertIs(versions.pick([(7, 4), (7, 4)]), first)
        # A call where the pair fails gets a new version that assumes nothing.
        other = versions.pick([(1, 4), (7, 4)])
        self.assertIsNot(other, first)
        self.assertEqual(other.guard, frozenset())
        self.assertEqual(other.equal_classes([(0, 0), (1, 0)]), [])
        self.assertLen(made, 2)

    def test_no_wanted_pair_means_one_version_for_every_call(self):
        versions, _ = self._versions()
        first = versions.pick([(3, 4), (3, 4)])
        versions.traced(first, set(), set())
        versions.settle(first, [(3, 4), (3, 4)])
        self.assertIs(versions.ready(), first)
        self.assertIs(versions.pick([(1, 4), (9, 4)]), first)

    def test_a_trace_may_assume_what_its_guard_implies_and_no_more(self):
        versions, _ = self._versions()
        with self.assertRaisesRegex(AssertionError, "beyond its version's guard"):
            versions.traced(versions.generic, {X0_Y0}, {X0_Y0})
        chained = versions.pick([(3,), (3,), (3,)])
        versions.traced(chained, {X0_Y0, ((1, 0), (2, 0))}, set())
        self.assertEqual(chained.equal_classes([(0, 0), (2, 0)]), [[(0, 0), (2, 0)]])
        versions.traced(chained, {((0, 0), (2, 0))}, set())     # x == y == z

    def test_past_the_cap_a_call_runs_a_version_whose_guard_it_meets(self):
        versions, made = self._versions()
        pairs = [((0, 0), (1, a)) for a in range(12)]

        def sizes_with(a):          # only pair a holds
            return [(100,), tuple(100 if b == a else b + 1 for b in range(12))]
        first = versions.pick([(100,), tuple(range(1, 13))])
        versions.traced(first, set(), set(pairs))
        versions.settle(first, [(100,), tuple(range(1, 13))])   # the empty key
        for a in range(MAX_VERSIONS - 1):
            version = versions.pick(sizes_with(a))
            self.assertEqual(version.guard, frozenset({pairs[a]}))
            versions.traced(version, {pairs[a]}, set())
            versions.settle(version, sizes_with(a))
        self.assertLen(made, MAX_VERSIONS)
        # Full: the next new combination runs the version that assumes nothing.
        self.assertIs(versions.pick(sizes_with(MAX_VERSIONS)), first)
        self.assertEqual(versions.pick(sizes_with(2)).guard, frozenset({pairs[2]}))
        self.assertLen(made, MAX_VERSIONS)


class OptimizedVersionsTest(tf.test.TestCase):

    def _matches(self, reference, optimized, *args):
        """The optimized call's results have TF's shapes and values."""
        for r, o in zip(reference(*args), quiet_call(optimized, *args)):
            self.assertEqual(r.shape, o.shape)
            self.assertAllClose(r, o, rtol=1e-5, atol=1e-5)

    def test_equal_batches_fuse_the_gradient_sums_and_other_calls_stay_right(self):
        grads = _make_grads()
        opt = fs.optimize(grads, rewrite_cache=False)
        x, y = _inputs(1, 3, 3)
        self._matches(grads, opt, x, y)
        specialized = opt.report()
        self.assertEqual(specialized.assumed_equal, [("x", 0, "y", 0)])
        self.assertIn("assumes equal sizes", str(specialized))
        self.assertIn("x[0] == y[0]", str(specialized))
        self.assertEmpty(_bga_sums(opt.graph_def))
        # Batches TF lets broadcast: a version that assumes nothing.
        for seed, rows_x, rows_y in ((2, 1, 3), (3, 3, 1)):
            self._matches(grads, opt, *_inputs(seed, rows_x, rows_y))
        generic = opt.report()
        self.assertEqual(generic.assumed_equal, [])
        self.assertNotEmpty(_bga_sums(opt.graph_def))
        self.assertLess(specialized.kernels_after, generic.kernels_after)
        # Equal batches again, of another size: the first version, no new trace.
        traces = len(opt.reports())
        x, y = _inputs(4, 5, 5)
        self._matches(grads, opt, x, y)
        self.assertLen(opt.reports(), traces)

    def test_a_first_call_with_unequal_batches_still_specializes_later(self):
        grads = _make_grads()
        opt = fs.optimize(grads, rewrite_cache=False)
        x, y = _inputs(5, 1, 4)
        self._matches(grads, opt, x, y)
        self.assertEqual(opt.report().equal_sizes_wanted, [("x", 0, "y", 0)])
        x, y = _inputs(6, 4, 4)
        self._matches(grads, opt, x, y)
        self.assertEqual(opt.report().assumed_equal, [("x", 0, "y", 0)])

    def test_concrete_functions_and_calls_from_graphs_assume_nothing(self):
        grads = _make_grads()
        opt = fs.optimize(grads, rewrite_cache=False)
        x, y = _inputs(7, 3, 3)
        quiet_call(opt, x, y)
        concrete = opt.get_concrete_function(x, y)
        self.assertNotEmpty(_bga_sums(opt.graph_def))
        x1, y1 = _inputs(8, 1, 3)
        self._matches(grads, concrete, x1, y1)

        @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None, 4])])
        def outer(a, b):
            return opt(a, b)   # sizes unknown at trace time: nothing to check them by

        self._matches(grads, outer, x1, y1)
        self.assertEqual(opt.report().assumed_equal, [])

    def test_numpy_and_nested_list_arguments_are_checked_as_tf_converts_them(self):
        grads = _make_grads()
        opt = fs.optimize(grads, rewrite_cache=False)
        x, y = _inputs(13, 3, 3)
        quiet_call(opt, x.numpy(), y.numpy())
        self.assertEqual(opt.report().assumed_equal, [("x", 0, "y", 0)])
        for rows_x, rows_y in ((1, 3), (3, 1)):
            x, y = _inputs(14, rows_x, rows_y)
            for args in ((x.numpy(), y.numpy()), (x.numpy().tolist(), y)):
                for r, o in zip(grads(x, y), quiet_call(opt, *args)):
                    self.assertEqual(r.shape, o.shape)
                    self.assertAllClose(r, o, rtol=1e-5, atol=1e-5)

    def test_a_function_of_star_args_with_a_signature_specializes(self):
        @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None, 4])])
        def grads(*xy):
            with tf.GradientTape() as tape:
                tape.watch(list(xy))
                loss = tf.reduce_sum(tf.exp(xy[0] * 0.5) * xy[1])
            return tape.gradient(loss, list(xy))

        opt = fs.optimize(grads, rewrite_cache=False)
        for seed, rows_x, rows_y in ((15, 3, 3), (16, 1, 3)):
            x, y = _inputs(seed, rows_x, rows_y)
            self._matches(grads, opt, x, y)
        first, second = opt.reports()
        self.assertLen(first.assumed_equal, 1)
        self.assertEqual(second.assumed_equal, [])

    def test_specialize_false_assumes_nothing(self):
        grads = _make_grads()
        opt = fs.optimize(grads, specialize=False, rewrite_cache=False)
        x, y = _inputs(9, 3, 3)
        self._matches(grads, opt, x, y)
        self.assertEqual(opt.report().assumed_equal, [])
        self.assertEqual(opt.report().equal_sizes_wanted, [("x", 0, "y", 0)])

    def test_prepare_traces_the_version_a_call_would_run(self):
        grads = _make_grads()
        opt = fs.optimize(grads, rewrite_cache=False)
        x, y = _inputs(10, 2, 2)
        report = opt.prepare(x, y)
        self.assertEqual(report.assumed_equal, [("x", 0, "y", 0)])
        traces = len(opt.reports())
        quiet_call(opt, x, y)
        self.assertLen(opt.reports(), traces)
        # Another version traced since: prepare still answers with this one's.
        opt.get_concrete_function(x, y)
        self.assertEqual(opt.report().assumed_equal, [])
        self.assertIs(opt.prepare(x, y), report)

    def test_the_assumptions_come_back_from_the_rewrite_cache(self):
        directory = tempfile.mkdtemp(prefix="tf_fusionstitch-versions-")
        os.chmod(directory, 0o700)   # the cache refuses a directory others can write
        with mock.patch.dict(os.environ, {cache.ENV_CACHE_DIR: directory}):
            x, y = _inputs(11, 3, 3)
            cold = fs.optimize(_make_grads())
            quiet_call(cold, x, y)
            warm = fs.optimize(_make_grads())
            quiet_call(warm, x, y)
            self.assertTrue(warm.report().cache_hit)
            self.assertEqual(warm.report().assumed_equal, [("x", 0, "y", 0)])
            # The version the cache restored is guarded: unequal batches do not run it.
            grads = _make_grads()
            x1, y1 = _inputs(12, 1, 3)
            self._matches(grads, warm, x1, y1)


if __name__ == "__main__":
    tf.test.main()
