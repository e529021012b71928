"""The CPU cost calibration (rewriters/cpu_costs.py) and how fusion="explore"'s
delta evaluator (rewriters/cpu_cost_model.py) prices plans with it."""

import os
import tempfile
import warnings

import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs
from optimize_testlib import quiet_call, random, rng, traced_types
from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import kernel_cost
from tf_fusionstitch.rewriters import cpu_cost_model, cpu_costs, explore
from tf_fusionstitch.rewriters.graph_view import GraphView
from tf_fusionstitch.rewriters.legality import cpu_schedule
from tf_fusionstitch.rewriters.lowering import lower_nodes
from tf_fusionstitch.runtime import cache
from tf_fusionstitch.tools import calibrate as calibrate_tool


class _PrivateCache:
    """A cache directory of the test's own: calibration state starts empty."""

    def __enter__(self):
        self.previous = os.environ.get(cache.ENV_CACHE_DIR)
        self.directory = tempfile.mkdtemp(prefix="tf_fusionstitch-costs-")
        os.chmod(self.directory, 0o700)
        os.environ[cache.ENV_CACHE_DIR] = self.directory
        return self

    def __exit__(self, *exc):
        if self.previous is None:
            os.environ.pop(cache.ENV_CACHE_DIR, None)
        else:
            os.environ[cache.ENV_CACHE_DIR] = self.previous


class CalibrationTest(tf.test.TestCase):

    def test_the_measured_costs_are_physical(self):
        costs = cpu_costs.measure_costs()
        self.assertBetween(costs["launch"], 1e-8, 1e-3)
        self.assertBetween(costs["bandwidth"], 1e8, 1e13)
        self.assertBetween(costs["cache_speedup"], 1.0, cpu_costs.MAX_CACHE_SPEEDUP)
        self.assertGreater(costs["row_cache_bytes"], 0)
        self.assertTrue(set(costs["compute"]) <= ir.EXPENSIVE)
        # pow costs ~20x its memory time on any x86 CPU: priced by its arithmetic
        self.assertIn("pow", costs["compute"])
        self.assertBetween(costs["compute"]["pow"], 1e-11, 1e-6)

    def test_costs_are_measured_once_per_machine_and_then_read_back(self):
        calls = []

        def fake_calibrate():
            calls.append(1)
            return dict(cpu_cost_model.BUILTIN, launch=3e-6 + len(calls) * 1e-6)

        real, cpu_costs.calibrate = cpu_costs.calibrate, fake_calibrate
        try:
            with _PrivateCache():
                first, source = cpu_costs.for_this_machine()
                again, _ = cpu_costs.for_this_machine()
                self.assertEqual((len(calls), source), (1, "calibrated"))
                self.assertEqual(first, again)
                self.assertEqual(cpu_costs.cached_record()["costs"], first)
                # an altered entry fails its hash and is measured again
                entry = next(p for p in os.scandir(os.environ[cache.ENV_CACHE_DIR])
                             if p.name.endswith(".cpu-costs.json"))
                with open(entry.path, "a") as f:
                    f.write(" ")
                changed, _ = cpu_costs.for_this_machine()
                self.assertLen(calls, 2)
                self.assertNotEqual(changed["launch"], first["launch"])
                self.assertEqual(cpu_costs.recalibrate()["costs"]["launch"], 6e-6)
        finally:
            cpu_costs.calibrate = real

    def test_a_failed_calibration_warns_and_prices_with_the_builtin_costs(self):
        def broken():
            raise cpu_cost_model.CalibrationError("measured bandwidth=-1")

        calls = []

        def counted():
            calls.append(1)
            broken()

        real, cpu_costs.calibrate = cpu_costs.calibrate, counted
        try:
            with _PrivateCache(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                costs, source = cpu_costs.for_this_machine()
                again = cpu_costs.for_this_machine()
        finally:
            cpu_costs.calibrate, cpu_costs._failure = real, None
        self.assertEqual(costs, cpu_cost_model.BUILTIN)
        self.assertEqual(source, "builtin, calibration failed")
        self.assertIn("bandwidth=-1", str(caught[0].message))
        self.assertEqual(again, (costs, source))
        # measured CALIBRATION_ATTEMPTS times, then never again in this process
        self.assertLen(calls, cpu_costs.CALIBRATION_ATTEMPTS)
        self.assertLen(caught, 2)                # but says so on every use

    def test_a_measurement_a_busy_moment_spoiled_is_taken_again(self):
        calls = []

        def busy_once():
            calls.append(1)
            if len(calls) == 1:
                raise cpu_cost_model.CalibrationError("measured launch=-5.25e-07")
            return dict(cpu_cost_model.BUILTIN, launch=4e-6)

        real, cpu_costs.calibrate = cpu_costs.calibrate, busy_once
        try:
            with _PrivateCache(), warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)
                costs, source = cpu_costs.for_this_machine()
        finally:
            cpu_costs.calibrate, cpu_costs._failure = real, None
        self.assertEqual((source, costs["launch"], len(calls)), ("calibrated", 4e-6, 2))

    def test_calibrating_while_a_function_traces_measures_eagerly(self):
        found = []

        @tf.function
        def f(x):
            found.append(cpu_costs.for_this_machine())   # runs at trace time
            return x + 1.0

        with _PrivateCache():
            f(tf.constant(1.0))
        (costs, source), = found
        self.assertEqual(source, "calibrated")
        self.assertBetween(costs["bandwidth"], 1e8, 1e13)

    def test_bad_costs_are_refused_with_the_name(self):
        with self.assertRaisesRegex(cpu_cost_model.CalibrationError, "bandwidth"):
            cpu_cost_model.validate(dict(cpu_cost_model.BUILTIN, bandwidth=float("nan")))
        with self.assertRaisesRegex(cpu_cost_model.CalibrationError, "relu"):
            cpu_cost_model.validate(dict(cpu_cost_model.BUILTIN, compute={"relu": 1e-9}))
        with self.assertRaisesRegex(cpu_cost_model.CalibrationError, "launch"):
            cpu_cost_model.validate({k: v for k, v in cpu_cost_model.BUILTIN.items() if k != "launch"})

    def test_the_tool_prints_each_cost_against_the_builtin_one(self):
        record = {"machine": "test CPU", "seconds": 1.0,
                  "costs": dict(cpu_cost_model.BUILTIN, launch=5e-7, compute={"pow": 6e-9})}
        text = calibrate_tool.format_record(record, cpu_cost_model.BUILTIN)
        self.assertIn("test CPU", text)
        self.assertRegex(text, r"launch \(us\)\s+0\.5\s+2")
        self.assertRegex(text, r"pow\s+6")


class EvaluatorTest(tf.test.TestCase):
    """Fusion saves memory traffic and launches, not arithmetic: with compute
    costs, two compute-bound ops fused save less than the memory model says."""

    N = 256 * 256
    BANDWIDTH, LAUNCH = 1e9, 1e-6

    FETCHES = {("Identity", 0)}

    def _graph(self, compute):
        """(view, the Tanh and Exp nodes, costs) of exp(tanh(x))."""
        @tf.function(input_signature=[tf.TensorSpec([256, 256])])
        def f(x):
            return tf.exp(tf.tanh(x))

        graph = f.get_concrete_function().graph
        graph_def = graph.as_graph_def()
        view = GraphView(graph_def, traced_types(graph_def, graph))
        names = [n.name for n in graph_def.node if n.op in ("Tanh", "Exp")]
        costs = dict(cpu_cost_model.BUILTIN, bandwidth=self.BANDWIDTH, launch=self.LAUNCH,
                     compute=compute)
        return view, names, costs

    def _score(self, compute):
        view, names, costs = self._graph(compute)
        explorer = explore._Explorer(view, set(names), self.FETCHES, 3, 3, costs)
        return explorer.evaluate(frozenset(names))

    def test_the_evaluator_prices_through_the_kernel_cost_interface(self):
        """CpuEvaluator is a kernel_cost.KernelCostModel: the fused kernel
        reads x and writes its result once, launches once and, one loop
        with no buffers, pays no penalty; its delta against the two ops
        alone is the score explore gives the pattern."""
        tensor = 4 * self.N / self.BANDWIDTH
        per_element = 3 * tensor / self.N
        view, names, costs = self._graph({"tanh": per_element})
        lowered = lower_nodes(view, sorted(names, key=view.position.get), self.FETCHES,
                              validate=False)
        kernel = cpu_cost_model.LoweredPattern(
            frozenset(names), lowered.cluster, lowered.input_tensors, lowered.output_tensors,
            cpu_schedule(lowered.cluster))
        evaluator = cpu_cost_model.CpuEvaluator(
            view, set(names), costs, lambda name: lower_nodes(view, [name], self.FETCHES,
                                                              validate=False).cluster)
        self.assertIsInstance(evaluator, kernel_cost.KernelCostModel)
        fused = evaluator.estimate(kernel)
        self.assertIsInstance(fused, kernel_cost.KernelEstimate)
        self.assertAllClose((fused.launch_s, fused.memory_s, fused.compute_s, fused.penalty_s),
                            (self.LAUNCH, 2 * tensor, 3 * tensor, 0.0))
        self.assertAllClose(fused.latency_s, self.LAUNCH + 3 * tensor)
        delta = evaluator.delta(kernel)
        # alone: tanh, launch + 3 tensors of arithmetic; exp, launch + 2 of traffic
        self.assertAllClose(delta.unfused_s, 2 * self.LAUNCH + 5 * tensor)
        self.assertEqual(delta.saved_s, self._score({"tanh": per_element}))

    def test_fusing_two_memory_bound_ops_saves_a_tensor_round_trip_and_a_launch(self):
        tensor = 4 * self.N / self.BANDWIDTH
        self.assertAllClose(self._score({}), 2 * tensor + self.LAUNCH)

    def test_fusing_two_compute_bound_ops_saves_only_a_launch(self):
        tensor = 4 * self.N / self.BANDWIDTH
        per_element = 3 * tensor / self.N   # each op: 3 tensors' time of arithmetic
        score = self._score({"tanh": per_element, "exp": per_element})
        # alone: 2 x (launch + max(2 tensors of traffic, 3 of arithmetic));
        # fused: launch + max(2 tensors of traffic, 6 of arithmetic)
        self.assertAllClose(score, self.LAUNCH)


class ExploreCostsOptionTest(tf.test.TestCase):

    def test_both_cost_sources_give_tfs_results_and_say_which(self):
        @tf.function
        def f(x, b):
            y = tf.exp(x + b)
            return y / tf.reduce_sum(y, axis=-1, keepdims=True)

        x, b = random(rng(3), (8, 64), "float32"), random(rng(4), (64,), "float32")
        for costs in ("calibrated", "builtin"):
            opt = fs.optimize(f, fusion="explore", costs=costs, rewrite_cache=False)
            np.testing.assert_allclose(quiet_call(opt, x, b), f(x, b), rtol=1e-5, atol=1e-6)
            self.assertIn(f"(costs: {costs})", str(opt.report()))

    def test_costs_is_an_explore_option_with_two_values(self):
        f = tf.function(lambda x: x * 2.0)
        with self.assertRaisesRegex(ValueError, "costs applies only to fusion='explore'"):
            fs.optimize(f, costs="builtin")
        with self.assertRaisesRegex(ValueError, "'calibrated', 'builtin'"):
            fs.optimize(f, fusion="explore", costs="measured")


if __name__ == "__main__":
    tf.test.main()
