"""Searches over the shared environment, the public `search` entry, and `Plan`."""

import os
import random

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from tf_fusionstitch import planner
from tf_fusionstitch.planner import reference_models, searches


class EnvironmentAndSearchTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # Four identical layers, built in graph mode (no weights allocated).
        cls.graph = reference_models.build_graph_ir(
            "transformer_block", batch=16, seq=128, hidden=256, heads=8, ffn=1024, layers=4)

    def test_repeated_layers_share_one_decision(self):
        units = self.graph.linkage.units
        self.assertLen(units, 3)   # hidden, heads, FFN: not 1 + 2 x 4
        heads = [u for u in units if ("layer0/wq:0", 1) in u.variables][0]
        for i in range(4):
            self.assertIn((f"layer{i}/wq:0", 1), heads.variables)
            self.assertIn((f"layer{i}/wo:0", 0), heads.variables)

    def test_episode_masks(self):
        env = planner.PlanEnv(self.graph, planner.get_cluster("8xA100"), "operator")
        dec = env.decision(env.reset())
        self.assertEqual((dec.kind, dec.actions), ("mesh", ((1, 8, 1),)))
        state = env.step((), 0)
        self.assertEqual(env.decision(state).index, 0)   # unit 0: the hidden axis
        state = env.step(state, 1)                   # split the hidden unit
        dec = env.decision(state)
        self.assertEqual(dec.kind, "unit")
        self.assertEqual(dec.legal, (True, False))   # heads conflicts with hidden (wq)
        with self.assertRaisesRegex(ValueError, "illegal action"):
            env.step(state, 1)
        state = env.step(env.step(state, 0), 0)
        self.assertTrue(env.complete(state))
        config = env.config(state)
        self.assertEqual(config.split_units, frozenset({0}))
        self.assertEqual(env.state_of(config), state)
        self.assertLess(env.reward(state), 0)
        # Heads split 8 ways is illegal when there are only 4 heads.
        small = reference_models.build_graph_ir("transformer_block", batch=2, seq=8, hidden=32,
                                                heads=4, ffn=64)
        env = planner.PlanEnv(small, planner.get_cluster("8xA100"), "operator")
        self.assertEqual(env.link.legal_units(set(), 8), [0, 2])
        # A tensor-parallel mesh splits at least one unit: replicating the last splittable
        # unit after replicating all others is illegal.
        state = env.step(env.step(env.step((), 0), 0), 0)
        self.assertEqual(env.decision(state).legal, (False, True))
        with self.assertRaisesRegex(ValueError, "linkage group whose extents divide by 8"):
            planner.PlanEnv(reference_models.build_graph_ir(
                "mlp", batch=8, sizes=(6, 6)), planner.get_cluster("8xA100"), "operator")

    def test_episodes_for_learned_searches(self):
        # What a DQN needs: fixed-size masks and observations along any legal episode.
        env = planner.PlanEnv(self.graph, planner.get_cluster("8xA100"), "auto")
        size, obs_len = env.action_space_size, len(env.observation(()))
        rng = random.Random(0)
        for _ in range(20):
            state = env.reset()
            while not env.complete(state):
                mask = env.legal_mask(state)
                self.assertLen(mask, size)
                self.assertLen(env.observation(state), obs_len)
                legal = [a for a, ok in enumerate(mask) if ok]
                self.assertNotEmpty(legal)
                illegal = [a for a, ok in enumerate(mask) if not ok]
                if illegal:
                    with self.assertRaises(ValueError):
                        env.step(state, illegal[0])
                state = env.step(state, rng.choice(legal))
            self.assertLen(env.observation(state), obs_len)
            self.assertEqual(env.state_of(env.config(state)), state)
            self.assertLess(env.reward(state), 0)

    def test_pipeline_dp_matches_exhaustive_with_fewer_calls(self):
        best = planner.search_graph(self.graph, "2xA100", "pipeline", "exhaustive")
        dp = planner.search_graph(self.graph, "2xA100", "pipeline", "dp")
        greedy = planner.search_graph(self.graph, "2xA100", "pipeline", "greedy")
        self.assertAllClose(dp.predicted_step_time, best.predicted_step_time, rtol=1e-12)
        self.assertLess(dp.cost_model_calls, best.cost_model_calls / 10)
        self.assertGreaterEqual(greedy.predicted_step_time, best.predicted_step_time)
        self.assertEqual(best.num_stages, 2)
        self.assertLen(best.cuts, 1)
        self.assertEqual(sum(len(s) for s in best.stages), len(self.graph.ops))

    def test_random_is_reproducible_and_within_budget(self):
        a = planner.search_graph(self.graph, "4xA100", "auto", "random", budget=30, seed=7)
        b = planner.search_graph(self.graph, "4xA100", "auto", "random", budget=30, seed=7)
        self.assertEqual(a.to_json(), b.to_json())
        self.assertLessEqual(a.cost_model_calls, 30)
        dp = planner.search_graph(self.graph, "4xA100", "auto", "dp")
        self.assertLessEqual(dp.predicted_step_time, a.predicted_step_time)

    def test_small_budgets_still_compare_every_mesh(self):
        env = planner.PlanEnv(self.graph, planner.get_cluster("8xA100"), "auto")
        data = env.evaluate(planner.Config(replicas=8)).step_time
        for method in ("dp", "greedy"):
            plan = planner.search_graph(self.graph, "8xA100", "auto", method,
                                        budget=len(env.meshes))
            self.assertEqual(plan.cost_model_calls, len(env.meshes))
            self.assertLessEqual(plan.predicted_step_time, data)

    def test_exhaustive_refuses_a_space_beyond_its_budget(self):
        with self.assertRaisesRegex(ValueError, "more than 10 plans"):
            planner.search_graph(self.graph, "4xA100", "pipeline", "exhaustive", budget=10)

    def test_unknown_strategy_method_and_bad_budget(self):
        with self.assertRaisesRegex(ValueError, "unknown strategy 'tensor'.*auto, data"):
            planner.search_graph(self.graph, "2xA100", "tensor")
        with self.assertRaisesRegex(ValueError, "unknown search method 'anneal'.*exhaustive"):
            planner.search_graph(self.graph, "2xA100", "auto", "anneal")
        with self.assertRaisesRegex(ValueError, "budget"):
            planner.search_graph(self.graph, "2xA100", "auto", "greedy", budget=0)
        with self.assertRaisesRegex(ValueError, "divisible by 3"):
            planner.search_graph(self.graph, "3xA100", "data")
        with self.assertRaisesRegex(ValueError, "cannot parse cluster"):
            planner.search(lambda x: x, [tf.zeros([2])], cluster="lots")


class PublicSearchAndPlanTest(tf.test.TestCase):

    def test_search_a_tf_function_and_use_the_plan(self):
        step, inputs, variables = reference_models.build_eager("mlp", batch=32,
                                                               sizes=(16, 32, 32, 8))
        plan = planner.search(step, inputs, cluster="4xA100", strategy="pipeline",
                              method="dp", variables=variables.values())
        self.assertEqual(plan.num_stages, 4)
        self.assertGreater(plan.predicted_step_time, 0)
        self.assertGreater(plan.cost_model_calls, 0)
        self.assertEqual(set(plan.variable_splits), set(variables))
        text = str(plan)
        self.assertIn("4 pipeline stages", text)
        self.assertIn("predicted step time", text)
        again = planner.Plan.from_json(plan.to_json())
        self.assertEqual(again, plan)
        graph_def = step.get_concrete_function(*inputs).graph.as_graph_def()
        placed = again.apply(graph_def)
        devices = {n.name: n.device for n in placed.node}
        for s, ops in enumerate(plan.stages):
            for op in ops:
                if op in devices:
                    self.assertEqual(devices[op], f"/job:worker/replica:0/task:0/device:GPU:{s}")
        self.assertEqual({n.device for n in graph_def.node}, {""})   # input left untouched
        with self.assertRaisesRegex(ValueError, "unknown field"):
            planner.Plan.from_json('{"replica": 2}')

    def test_data_parallel_over_two_replicas(self):
        step, inputs, variables = reference_models.build_eager("mlp", batch=32,
                                                               sizes=(16, 32, 8))
        plan = planner.search(step, inputs, cluster="2xV100", strategy="data",
                              method="exhaustive", variables=variables.values())
        self.assertEqual((plan.replicas, plan.tensor_parallel, plan.num_stages), (2, 1, 1))
        self.assertTrue(all(a is None for a in plan.variable_splits.values()))

    def test_search_methods_table(self):
        self.assertEqual(set(searches.SEARCHES), set(planner.METHODS))


if __name__ == "__main__":
    tf.test.main()
