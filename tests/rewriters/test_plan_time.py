"""The plan model (rewriters/plan_time.py), its calibration checks
(plan_checks.py) and explore's plan guard (plan_guard.py): the new terms
against values computed by hand, in milliseconds."""

import tensorflow as tf

from optimize_testlib import traced_types
from tf_fusionstitch.rewriters import cpu_cost_model, plan_checks, plan_guard, plan_time
from tf_fusionstitch.rewriters.graph_view import GraphView
from tf_fusionstitch.tools import calibrate as calibrate_tool

MS = 1e-3


def unit(name, alone_ms, width=1, inputs=()):
    """A unit that takes `alone_ms` with the machine to itself (no launch)."""
    return plan_time.Unit(name, 0.0, alone_ms * width * MS, width, tuple(inputs))


def view_of(fn, *specs):
    graph = fn.get_concrete_function(*specs).graph
    graph_def = graph.as_graph_def()
    return GraphView(graph_def, traced_types(graph_def, graph))


class SimulationTest(tf.test.TestCase):
    """Two cores throughout."""

    def assertMs(self, seconds, ms):
        self.assertAllClose(seconds / MS, ms, rtol=1e-9)

    def test_a_one_core_kernel_beside_a_matmul_takes_a_core_for_its_time(self):
        # 0-1.5 ms: demand 3 cores of 2, both at 2/3 speed; the kernel's 1 ms
        # ends at 1.5 and the matmul has done 1 of its 10; 9 more at full speed.
        t = plan_time.simulate([unit("matmul", 10, width=2), unit("small", 1)], cores=2)
        self.assertMs(t.step_s, 10.5)
        self.assertMs(t.critical_path_s, 10)
        self.assertAllClose(t.busy, 1.0)

    def test_two_one_core_kernels_run_side_by_side(self):
        both = [unit("a", 1), unit("b", 1)]
        self.assertMs(plan_time.simulate(both, cores=2).step_s, 1)
        # one executor thread: one after the other
        self.assertMs(plan_time.simulate(both, cores=2, threads=1).step_s, 2)

    def test_cheap_units_run_inline_in_the_thread_that_made_them_ready(self):
        # a (1 ms) makes b and c ready. Below the inline threshold, a's
        # thread runs both, one after the other: 1 + 2 x 0.5 ms.
        units = [unit("a", 1), unit("b", 0.5, inputs=[0]), unit("c", 0.5, inputs=[0])]
        self.assertMs(plan_time.simulate(units, cores=2, inline_s=1e-3).step_s, 2)
        # above it, a's thread keeps one and the pool's other thread runs the other
        self.assertMs(plan_time.simulate(units, cores=2, inline_s=0.1e-3).step_s, 1.5)

    def test_kernels_that_use_every_core_add_up(self):
        # demand 4 of 2 cores: both at half speed; the small one's 2 ms end
        # at 4, when the big one has done 2 of its 6; 4 more at full speed.
        t = plan_time.simulate([unit("big", 6, width=2), unit("small", 2, width=2)], cores=2)
        self.assertMs(t.step_s, 8)

    def test_the_critical_path_bounds_the_step(self):
        chain = [unit("a", 1), unit("b", 2, inputs=[0]), unit("c", 3, inputs=[1])]
        t = plan_time.simulate(chain, cores=2)
        self.assertMs(t.step_s, 6)
        self.assertMs(t.critical_path_s, 6)
        self.assertAllClose(t.busy, 0.5)   # one core of two

    def test_a_pack_that_waits_for_a_producer_holds_back_the_critical_path(self):
        # p (4 ms, 2 cores) feeds u2; u1 (1 ms, 1 core) feeds the matmul m
        # (10 ms, 2 cores), the critical path.
        p, u1 = unit("p", 4, width=2), unit("u1", 1)
        apart = [p, u1, unit("u2", 1, inputs=[0]), unit("m", 10, width=2, inputs=[1])]
        # 0-1.5: p and u1 at 2/3 (p has 3 ms left); 1.5-7.5: p and m at 1/2
        # (m has 7 left); 7.5-9: u2 and m at 2/3 (m has 6 left); m ends at 15.
        self.assertMs(plan_time.simulate(apart, cores=2).step_s, 15)
        # u1 and u2 packed: the pack waits for p (0-4), runs 2 ms on one
        # core (4-6), and only then can m start: 6 + 10.
        packed = [p, unit("u1+u2", 2, inputs=[0]), unit("m", 10, width=2, inputs=[1])]
        self.assertMs(plan_time.simulate(packed, cores=2).step_s, 16)

    def test_aliases_take_no_time_and_no_thread(self):
        units = [unit("a", 1), unit("alias", 0, inputs=[0]), unit("b", 1, inputs=[1]),
                 unit("c", 1)]
        t = plan_time.simulate(units, cores=2, threads=1)
        self.assertMs(t.step_s, 3)

    def test_width_follows_the_thread_pools_shards(self):
        self.assertEqual(plan_time.width(10e-6, cores=2, grain_s=20e-6), 1)
        self.assertEqual(plan_time.width(50e-6, cores=2, grain_s=20e-6), 2)
        self.assertEqual(plan_time.width(70e-6, cores=8, grain_s=20e-6), 3)
        self.assertEqual(plan_time.width(1.0, cores=8, grain_s=20e-6), 8)

    def test_a_cycle_is_refused(self):
        with self.assertRaisesRegex(ValueError, "cycle"):
            plan_time.simulate([unit("a", 1, inputs=[1]), unit("b", 1, inputs=[0])], cores=2)


class PricingTest(tf.test.TestCase):

    def test_contraction_flops(self):
        @tf.function
        def f(a, b, x, w, p, q, dy):
            conv = tf.nn.conv2d(x, w, 1, "SAME")
            return (tf.matmul(a, b), tf.matmul(b, a, transpose_a=True, transpose_b=True),
                    conv, tf.einsum("bij,bjk->bik", p, q),
                    tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=[3, 3, 3, 4],
                                                    out_backprop=dy, strides=[1, 1, 1, 1],
                                                    padding="SAME"))
        view = view_of(f, tf.TensorSpec([8, 16]), tf.TensorSpec([16, 32]),
                       tf.TensorSpec([1, 8, 8, 3]), tf.TensorSpec([3, 3, 3, 4]),
                       tf.TensorSpec([2, 3, 4]), tf.TensorSpec([2, 4, 5]),
                       tf.TensorSpec([1, 8, 8, 4]))
        sizes = plan_time.Sizes(view)
        flops = {view.nodes[n].op + ("_t" if view.nodes[n].attr["transpose_a"].b else ""):
                 plan_time.contraction_flops(sizes, n) for n in view.nodes
                 if plan_time.contraction_flops(sizes, n) is not None}
        self.assertEqual(flops, {
            "MatMul": 2 * 8 * 32 * 16,           # [8,16] @ [16,32]
            "MatMul_t": 2 * 32 * 8 * 16,         # [16,32]^T @ [8,16]^T: [32, 8], 16 summed
            "Conv2D": 2 * (8 * 8 * 4) * (3 * 3 * 3),
            "Einsum": 2 * (2 * 3 * 5) * 4,
            "Conv2DBackpropFilter": 2 * (8 * 8 * 4) * (3 * 3 * 3)})

    def test_unknown_sizes_are_priced_at_the_traced_calls(self):
        @tf.function
        def f(x):
            return tf.matmul(x, tf.ones([16, 8]))

        view = view_of(f, tf.TensorSpec([None, 16]))
        matmul = next(n for n in view.nodes if view.nodes[n].op == "MatMul")
        at_call = plan_time.Sizes(view, lambda t: [3, 8] if t == (matmul, 0) else None)
        self.assertEqual(at_call.extents((matmul, 0)), [3, 8])
        self.assertEqual(at_call.bytes((matmul, 0)), 3 * 8 * 4)
        self.assertEqual(plan_time.contraction_flops(at_call, matmul), 2 * 3 * 8 * 16)
        unknown = plan_time.Sizes(view)   # no call: DYNAMIC_EXTENT
        self.assertEqual(unknown.extents((matmul, 0)),
                         [cpu_cost_model.DYNAMIC_EXTENT, 8])

    def test_unknown_axes_beyond_two_are_priced_at_one(self):
        @tf.function
        def f(x, shape):
            return tf.reshape(x, shape) * 2.0

        view = view_of(f, tf.TensorSpec([None]), tf.TensorSpec([6], tf.int32))
        mul = next(n for n in view.nodes if view.nodes[n].op == "Mul")
        sizes = plan_time.Sizes(view)
        self.assertEqual(list(sizes.view.type_of((mul, 0)).shape), [None] * 6)
        # 32 x 32, not 32^6: no more than a batch and a sequence axis unknown
        self.assertEqual(sizes.extents((mul, 0)), [32, 32, 1, 1, 1, 1])
        self.assertEqual(sizes.elements((mul, 0)), 32 * 32)

    def test_a_group_is_one_unit_reading_what_its_members_read(self):
        @tf.function
        def f(x):
            a = x * 2.0
            b = tf.matmul(a, a)
            return a + 1.0, b

        view = view_of(f, tf.TensorSpec([64, 64]))
        mul = next(n for n in view.nodes if view.nodes[n].op == "Mul")
        add = next(n for n in view.nodes if view.nodes[n].op == "AddV2")
        machine = plan_time.Machine(cores=2, launch_s=1e-6, bandwidth=1e9,
                                    matmul_flops=1e9, grain_s=20e-6)
        units = plan_time.plan_units(plan_time.Sizes(view), [[mul, add]], machine,
                                     lambda nodes: 5e-6)
        by_name = {u.name: u for u in units}
        kernel = by_name[mul]
        self.assertEqual((kernel.launch_s, kernel.work_s, kernel.width), (1e-6, 10e-6, 1))
        matmul = next(u for u in units if view.nodes[u.name].op == "MatMul")
        self.assertAllClose(matmul.work_s, 2 * 2 * 64 ** 3 / 1e9)   # two cores' seconds
        self.assertEqual(matmul.width, 2)
        self.assertIn(units.index(kernel), matmul.inputs)

    def test_memory_comes_from_the_cache_when_it_fits_and_past_the_launchs_share(self):
        costs = dict(cpu_cost_model.BUILTIN, cores=2, bandwidth=30e9, stream_bandwidth=80e9,
                     cache_speedup=8.0, row_cache_bytes=1 << 20)
        machine = plan_time.Machine.from_costs(costs)
        self.assertEqual((machine.bandwidth, machine.cache_bytes, machine.cache_bandwidth),
                         (80e9, 2 << 20, 240e9))
        launch_bytes = 12 * 4096   # x * y over 4K float32: inside the measured launch
        self.assertEqual(machine.memory_seconds(launch_bytes), 0.0)
        # 1 MiB: from the cache, less the launch's 48 KiB, at 240 GB/s
        self.assertAllClose(machine.memory_seconds(1 << 20), ((1 << 20) - launch_bytes) / 240e9)
        # 48 MiB: beyond the cache, streamed at 80 GB/s
        self.assertAllClose(machine.memory_seconds(48 << 20), (48 << 20) / 80e9)

    def test_a_group_can_start_before_a_node_it_waits_for(self):
        # {a, c} reads b: a comes before b in the graph, but the group's unit
        # waits for b's.
        @tf.function
        def f(x, y):
            a = x * 2.0
            b = y * 3.0
            return a + b

        view = view_of(f, tf.TensorSpec([4]), tf.TensorSpec([4]))
        muls = [n for n in view.order if view.nodes[n].op == "Mul"]
        a, b = sorted(muls, key=view.position.get)
        c = next(n for n in view.order if view.nodes[n].op == "AddV2")
        machine = plan_time.Machine(2, 1e-6, 1e9, 1e9, 20e-6)
        units = plan_time.plan_units(plan_time.Sizes(view), [[a, c]], machine,
                                     lambda nodes: 1e-6)
        order = [u.name for u in units]
        self.assertLess(order.index(b), order.index(a))
        group = units[order.index(a)]
        self.assertIn(order.index(b), group.inputs)


class GuardTest(tf.test.TestCase):

    def _plans(self):
        @tf.function
        def f(x, y):
            return tf.nn.relu(x * y) + 1.0, tf.sqrt(y)

        view = view_of(f, tf.TensorSpec([1 << 16]), tf.TensorSpec([1 << 16]))
        ops = {view.nodes[n].op: n for n in view.nodes}
        fused = [[ops["Mul"], ops["Relu"], ops["AddV2"]], [ops["Sqrt"]]]
        partly = [[ops["Mul"], ops["Relu"]], [ops["AddV2"]], [ops["Sqrt"]]]
        apart = [[ops["Mul"]], [ops["Relu"]], [ops["AddV2"]], [ops["Sqrt"]]]
        return view, fused, partly, apart

    def _choose(self, explored, stitch, xla, error):
        view = self._plans()[0]
        costs = dict(cpu_cost_model.BUILTIN, cores=2, plan_error=error)
        return plan_guard.choose(view, set(), explored, {"stitch": stitch, "XLA-rule": xla},
                                 costs, lambda n: 0.0)

    def test_the_explored_plan_is_kept_only_above_the_models_error(self):
        _, fused, _, apart = self._plans()
        choice = self._choose(fused, apart, apart, 0.05)
        # fusing three ops over 256 KiB tensors saves two round trips: far above 5%
        self.assertTrue(choice.kept_explored)
        self.assertGreater(choice.gain, 0.05)
        self.assertEqual(choice.groups, fused)
        self.assertIn("kept the explored plan", str(choice))
        doubtful = self._choose(fused, apart, apart, 0.9)
        self.assertFalse(doubtful.kept_explored)
        self.assertEqual(doubtful.groups, apart)
        self.assertRegex(str(doubtful), r"within the plan model's error \(90\.0%\): "
                                        r"kept the stitch plan")

    def test_the_explored_plan_must_beat_every_rule_plan(self):
        _, fused, partly, apart = self._plans()
        # faster than stitch's plan by far, slower than XLA's
        choice = self._choose(partly, apart, fused, 0.05)
        self.assertGreater(choice.gain_over("stitch"), 0.05)
        self.assertLess(choice.gain_over("XLA-rule"), 0)
        self.assertEqual(choice.gain, choice.gain_over("XLA-rule"))
        self.assertEqual((choice.kept, choice.groups), ("XLA-rule", fused))

    def test_the_default_rule_plan_is_kept_where_the_model_cannot_tell_them_apart(self):
        _, fused, partly, apart = self._plans()
        xla = self._choose(apart, partly, fused, 0.05)
        self.assertEqual(xla.kept, "XLA-rule")   # one launch and round trip fewer: > 5%
        unsure = self._choose(apart, partly, fused, 0.9)
        self.assertEqual((unsure.kept, unsure.groups), ("stitch", partly))

    def test_a_slower_explored_plan_is_never_kept(self):
        _, fused, _, apart = self._plans()
        choice = self._choose(apart, fused, fused, 0.0)
        self.assertLess(choice.gain, 0)
        self.assertEqual((choice.kept, choice.groups), ("stitch", fused))

    def test_a_guard_needs_a_rule_plan(self):
        view, fused, _, _ = self._plans()
        with self.assertRaisesRegex(ValueError, "at least one rule plan"):
            plan_guard.choose(view, set(), fused, {}, dict(cpu_cost_model.BUILTIN), None)


class CalibrationChecksTest(tf.test.TestCase):

    def test_the_checks_measure_every_term_and_the_tool_prints_them(self):
        costs = dict(cpu_cost_model.BUILTIN, cores=2)
        checks = plan_checks.run(costs)
        self.assertEqual([c.graph for c in checks], list(plan_checks._graphs()))
        for c in checks:
            self.assertGreater(c.measured_s, 0)
            self.assertGreater(c.predicted_s, 0)
        by_graph = {c.graph: c.predicted_s for c in checks}
        # ops this cheap run inline in the thread that made them ready (as
        # TF's executor does): two chains one after the other; beside the
        # matmuls: longer than the matmuls alone, shorter than both in turn
        self.assertAllClose(by_graph["two small chains"], 2 * by_graph["small chain"])
        self.assertBetween(by_graph["matmuls beside a small chain"], by_graph["matmuls"],
                           by_graph["matmuls"] + by_graph["small chain"])
        record = {"machine": "test CPU", "seconds": 1.0,
                  "costs": dict(costs, plan_error=plan_checks.error(checks)),
                  "plan_checks": [c.__dict__ for c in checks]}
        text = calibrate_tool.format_record(record, cpu_cost_model.BUILTIN)
        self.assertIn("matmuls beside a large chain", text)
        self.assertRegex(text, r"plan_error \(%\)\s+\d")


if __name__ == "__main__":
    tf.test.main()
