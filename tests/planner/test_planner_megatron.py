"""Exhaustive operator partitioning of a traced transformer block finds Megatron's plan."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from tf_fusionstitch import planner
from tf_fusionstitch.planner import cost_model as cm
from tf_fusionstitch.planner import graph_import, reference_models

B, S, H, HEADS, FFN = 8, 256, 1024, 16, 4096


class MegatronTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # A real traced training step: forward, GradientTape backward, Adam updates.
        step, inputs, variables = reference_models.build_eager(
            "transformer_block", batch=B, seq=S, hidden=H, heads=HEADS, ffn=FFN)
        cls.graph = graph_import.from_function(step, inputs, variables=variables.values())[0]

    def test_linkage_groups_are_megatrons(self):
        units = {frozenset(v for v, _ in u.variables if "/" not in v): u
                 for u in self.graph.linkage.units}
        heads = {"wq:0", "bq:0", "wk:0", "bk:0", "wv:0", "bv:0", "wo:0"}
        ffn = {"w1:0", "b1:0", "w2:0"}
        self.assertIn(frozenset(heads), units)
        self.assertIn(frozenset(ffn), units)
        # Each weight's slots (Adam m, v) are tied to it by the update.
        self.assertIn(("wq/m:0", 1), units[frozenset(heads)].variables)

    def _check(self, t, cluster):
        plan = planner.search_graph(self.graph, cluster, strategy="operator",
                                    method="exhaustive")
        splits = plan.variable_splits
        self.assertEqual(plan.tensor_parallel, t)
        # Column-parallel: query/key/value and FFN-in split on their output axis.
        for name in ("wq:0", "wk:0", "wv:0", "w1:0"):
            self.assertEqual(splits[name], 1, f"{name} with t={t}")
        # Row-parallel: attention-out and FFN-out split on their input axis.
        for name in ("wo:0", "w2:0"):
            self.assertEqual(splits[name], 0, f"{name} with t={t}")
        for name in ("bo:0", "b2:0", "ln1_gamma:0", "input_ln_gamma:0"):
            self.assertIsNone(splits[name], f"{name} with t={t}")
        # Every legal combination of the three units was evaluated, and this one won:
        # hidden, heads, FFN, heads + FFN.
        self.assertEqual(plan.cost_model_calls, 4)

        est = cm.CostModel(self.graph, planner.get_cluster(cluster)).evaluate(cm.Config(
            tensor_parallel=t, split_units=frozenset(
                u.index for u in self.graph.linkage.units
                if any(v == "wq:0" and a == 1 or v == "w1:0" and a == 1
                       for v, a in u.variables))))
        self.assertAllClose(est.step_time, plan.predicted_step_time, rtol=1e-12)
        # And it beats doing one device's work on each of the t devices.
        one_device = cm.CostModel(self.graph, planner.get_cluster(cluster)).evaluate(
            cm.Config(tensor_parallel=t))
        self.assertLess(est.step_time, one_device.step_time)
        self.assertEqual(est.count("all_reduce", "forward"), 2)
        self.assertEqual(est.count("all_reduce", "backward"), 2)
        self.assertLen(est.collectives, 4)
        for c in est.collectives:
            self.assertEqual(c.nbytes, B * S * H * 4)
        self.assertAllClose(est.tp_traffic(elements=True), 8 * B * S * H * (t - 1) / t,
                            rtol=1e-12)

    def test_megatron_plan_t2(self):
        self._check(2, "2xH200")

    def test_megatron_plan_t4(self):
        self._check(4, "4xA100")

    def test_megatron_plan_t8(self):
        self._check(8, "8xH200")
        self._check(8, "8xV100")


if __name__ == "__main__":
    tf.test.main()
