"""Random-graph differential testing of `tf_fusionstitch.optimize`
(tf_fusionstitch/tools/fuzzing/).

- FuzzTest runs a fixed-seed sample of random graphs (CI_GRAPHS, batches of 8
  per tf.function) through optimize(min_cluster_ops=1) and checks every output
  against TensorFlow with the oracle's derived bounds. No shrinking here: a
  failure prints each failing case as JSON and as a standalone script; shrink
  it with `python -m tf_fusionstitch.tools.fuzz --graphs=... --seed=...`.
  Sized for a few minutes on the 2-core development machine, including the
  first build of the FusionStitch op library (CI_GRAPHS below).
- FuzzRegressionTest replays every minimal case in tests/fuzz_regressions/
  (written by the fuzzer). A case whose "status" is "open" (a known, unfixed
  bug) is an expected failure, so a fix shows up as an unexpected success:
  then set its status to "fixed".
- OracleSelfTest checks the oracle's rules on small hand-made values.
"""

import json
import unittest

import numpy as np
import tensorflow as tf

from tf_fusionstitch.tools.fuzzing.case_types import infer_types
from tf_fusionstitch.tools.fuzzing.checking import check_value
from tf_fusionstitch.tools.fuzzing.generator import case_seed, generate_case, validate_case
from tf_fusionstitch.tools.fuzzing.inputs import make_inputs
from tf_fusionstitch.tools.fuzzing.intervals import input_iv
from tf_fusionstitch.tools.fuzzing.np_dtypes import np_dtype
from tf_fusionstitch.tools.fuzzing.oracle import evaluate
from tf_fusionstitch.tools.fuzzing.regressions import REGRESSIONS_DIR, load_regressions, replay
from tf_fusionstitch.tools.fuzzing.reproducer import to_python
from tf_fusionstitch.tools.fuzzing.session import fuzz

CI_SEED = 20250101
# Issue 5 asks for 500+ graphs in CI: 512 (64 batches of 8, ~1,500 kernels,
# ~0.12 s of g++ each). Measured 250 s for this test on the 2-core machine
# while a soak and other work kept it at load average 5; ~4 graphs/s idle.
CI_GRAPHS = 512


class FuzzTest(tf.test.TestCase):

    def test_random_graphs(self):
        log = []
        stats, findings, oracle = fuzz(CI_GRAPHS, CI_SEED, batch=8, draws=2,
                                       shrink_budget_s=0, save=False, log=log.append)
        self.assertEqual(stats.graphs, CI_GRAPHS, "\n".join(log))
        self.assertGreaterEqual(stats.kernels, CI_GRAPHS, "most graphs fuse something")
        self.assertGreater(stats.checked, 0.8 * stats.total,
                           "the oracle determines most output elements")
        self.assertEqual(stats.invalid, 0, "\n".join(log))
        self.assertEqual(len(oracle), 0, "TF outside the oracle's bounds (an oracle rule is wrong):\n"
                         + "\n".join(log))
        self.assertEqual(len(findings), 0, "optimize() differs from TF:\n" + "\n".join(log))


class FuzzRegressionTest(tf.test.TestCase):
    """One test per file in tests/fuzz_regressions/ (added below)."""

    def test_regression_files_exist_or_skip(self):
        if not load_regressions():
            self.skipTest(f"no regression files in {REGRESSIONS_DIR}")
        for path, record in load_regressions():
            self.assertIn(record.get("status"), ("open", "fixed"), path.name)
            infer_types(record["case"])      # each file still describes a valid graph


def _add_replays():
    for path, record in load_regressions():
        def test(self, record=record, path=path):
            result = replay(record)
            self.assertNotEqual(result.status, "invalid", f"{path.name}: {result.problems}")
            self.assertFalse(result.failed, f"{path.name} still fails:\n"
                             + "\n".join(result.problems) + "\n"
                             + to_python(record["case"], result.draw))
        if record.get("status") == "open":
            test = unittest.expectedFailure(test)
        name = "test_replay_" + "".join(ch if ch.isalnum() else "_" for ch in path.stem)
        setattr(FuzzRegressionTest, name, test)


_add_replays()


def _iv(dtype, values):
    return input_iv(dtype, np.asarray(values, dtype=np_dtype(dtype)))


class OracleSelfTest(tf.test.TestCase):
    """The enclosures hold what they must, and nothing looser than they must."""

    def _case(self, nodes, inputs, outputs):
        return {"version": 1, "seed": 0, "inputs": inputs, "nodes": nodes, "outputs": outputs}

    def test_correctly_rounded_ops_are_tight(self):
        x = np.array([1.0, 3.0, -2.5], np.float32)
        y = np.array([3.0, 7.0, 0.1], np.float32)
        s = np.array([3.0, 7.0, 0.5], np.float32)      # sums exactly representable
        case = self._case([{"name": "n0", "op": "RealDiv", "inputs": ["x", "y"], "attrs": {}},
                           {"name": "n1", "op": "AddV2", "inputs": ["x", "s"], "attrs": {}}],
                          [{"name": "x", "dtype": "float32", "shape": [3]},
                           {"name": "y", "dtype": "float32", "shape": [3]},
                           {"name": "s", "dtype": "float32", "shape": [3]}], ["n0", "n1"])
        env = evaluate(case, [x, y, s])
        exact_sum = (x + s).astype(np.float64)
        np.testing.assert_array_equal(env["n1"].lo, exact_sum)   # exactly representable
        np.testing.assert_array_equal(env["n1"].hi, exact_sum)
        q = (x / y).astype(np.float64)                              # float32 division
        self.assertTrue(np.all(env["n0"].lo <= q) and np.all(q <= env["n0"].hi))
        ulp = np.spacing(np.abs(x / y)).astype(np.float64)
        self.assertTrue(np.all(env["n0"].hi - env["n0"].lo <= 4 * ulp))

    def test_ill_conditioned_float16_cancellation_is_wide(self):
        # (a + b) - a in float16: b is lost when |a| >> |b|; the bound must allow it
        case = self._case([{"name": "n0", "op": "AddV2", "inputs": ["a", "b"], "attrs": {}},
                           {"name": "n1", "op": "Sub", "inputs": ["n0", "a"], "attrs": {}}],
                          [{"name": "a", "dtype": "float16", "shape": [1]},
                           {"name": "b", "dtype": "float16", "shape": [1]}], ["n1"])
        a, b = np.array([1000.0], np.float16), np.array([0.1], np.float16)
        iv = evaluate(case, [a, b])["n1"]
        tf_value = ((a + b) - a).astype(np.float64)   # numpy rounds per op like TF
        self.assertTrue(iv.lo[0] <= tf_value[0] <= iv.hi[0])
        self.assertLessEqual(iv.lo[0], 0.1)
        self.assertGreaterEqual(iv.hi[0], 0.1)

    def test_nan_certain_and_floor_straddle_undetermined(self):
        case = self._case([{"name": "n0", "op": "Log", "inputs": ["x"], "attrs": {}},
                           {"name": "n1", "op": "Mul", "inputs": ["x", {"const": 0.1}],
                            "attrs": {}},
                           {"name": "n2", "op": "Floor", "inputs": ["n1"], "attrs": {}}],
                          [{"name": "x", "dtype": "float32", "shape": [2]}], ["n0", "n2"])
        x = np.array([-1.0, 30.0], np.float32)
        env = evaluate(case, [x])
        self.assertTrue(np.isnan(env["n0"].lo[0]) and not env["n0"].unk[0])
        v = check_value(env["n0"], np.array([1.0, np.log(30.0)], np.float32))
        self.assertTrue(v.bad[0])                      # a number where NaN is certain
        # 30 * 0.1f = 3.0000000447 exactly: every rounding of it floors to 3
        self.assertEqual(env["n2"].lo[1], np.floor(np.float32(30.0) * np.float32(0.1)))

    def test_integers_exact_and_wrapping(self):
        case = self._case([{"name": "n0", "op": "AddV2", "inputs": ["x", "x"], "attrs": {}},
                           {"name": "n1", "op": "Mean", "inputs": ["x"],
                            "attrs": {"axis": [0], "keep_dims": False}}],
                          [{"name": "x", "dtype": "int32", "shape": [2]}], ["n0", "n1"])
        x = np.array([2 ** 31 - 1, 2 ** 31 - 1], np.int32)
        env = evaluate(case, [x])
        self.assertEqual(list(env["n0"].lo), [-2, -2])     # wraps, as TF's Eigen kernels do
        self.assertEqual(int(env["n1"].lo), 2 ** 31 - 1)   # TF's int32 mean does not wrap

    def test_int64_mean_of_int64_min_sum(self):
        # a sum of exactly INT64_MIN: truncating division without |INT64_MIN|
        # (--seed=20261129 graph 13737: TF -2^60, the oracle said +2^60)
        case = self._case([{"name": "n0", "op": "Mean", "inputs": ["x"],
                            "attrs": {"axis": [1], "keep_dims": False}}],
                          [{"name": "x", "dtype": "int64", "shape": [2, 8]}], ["n0"])
        x = np.zeros((2, 8), np.int64)
        x[0, :2] = -2 ** 62
        x[1, :3] = [-7, -2 ** 62, -2 ** 62 + 7]
        iv = evaluate(case, [x])["n0"]
        self.assertEqual(list(iv.lo), [-2 ** 60, -2 ** 60])
        self.assertEqual(list(iv.lo), list(tf.reduce_mean(tf.constant(x), axis=1).numpy()))

    def test_constant_push_down_reassociates(self):
        # Grappler's ConstantPushDown: (a + b) - 2 runs as a + (b - 2) or b + (a - 2),
        # x * 7 / c as x * (7 * (1/c)) (soak --seed=20261129 graph 505). Every
        # order TF may use is inside; a result off all of them is not.
        case = self._case([{"name": "n0", "op": "AddV2", "inputs": ["a", "b"], "attrs": {}},
                           {"name": "n1", "op": "Sub", "inputs": ["n0", {"const": 2.0}],
                            "attrs": {}},
                           {"name": "n2", "op": "Mul", "inputs": ["a", {"const": 7.0}],
                            "attrs": {}},
                           {"name": "n3", "op": "RealDiv", "inputs": ["n2", {"const": -1.7}],
                            "attrs": {}}],
                          [{"name": "a", "dtype": "float32", "shape": [4]},
                           {"name": "b", "dtype": "float32", "shape": [4]}], ["n1", "n3"])
        a = np.array([0.5599996447563171, 0.966751754283905, 1.1192902326583862,
                      1.19950270652771], np.float32)
        b = np.array([0.7377461791, 0.2, 0.931, 1.6], np.float32)
        env = evaluate(case, [a, b])
        two = np.float32(2)
        orders = [(a + b) - two, a + (b - two), b + (a - two)]
        self.assertTrue(np.all(orders[0] != orders[1]))      # the orders differ here
        iv = env["n1"]
        for r in orders:
            self.assertFalse(check_value(iv, r).bad.any(), r)
        # no wider than the orders, give or take an ulp of the partial sums (each
        # op's result is rounded outward)
        lo, hi = np.minimum.reduce(orders), np.maximum.reduce(orders)
        partial = np.maximum.reduce([np.abs(a + b), np.abs(a - two), np.abs(b - two)])
        ulp = np.spacing(partial).astype(np.float64)
        self.assertTrue(np.all(iv.lo >= lo - ulp) and np.all(iv.hi <= hi + ulp))
        self.assertTrue(check_value(iv, (hi + 2 * ulp).astype(np.float32)).bad.all())
        self.assertTrue(check_value(iv, (lo - 2 * ulp).astype(np.float32)).bad.all())
        r = np.float32(1) / np.float32(-1.7)
        pushed = a * (np.float32(7) * r)                     # TF's constant folding
        self.assertFalse(check_value(env["n3"], pushed).bad.any())

    def test_float16_sums_re_paired_by_shape(self):
        # The arithmetic optimizer re-pairs a tree of Adds by operand shape, in
        # float16 too: (x + y) + z with x, z of one shape runs as (x + z) + y
        # (soak --seed=20261130 graphs 2573, 2586). Both pairings are inside.
        case = self._case([{"name": "n0", "op": "AddV2", "inputs": ["x", "y"], "attrs": {}},
                           {"name": "n1", "op": "AddV2", "inputs": ["n0", "z"], "attrs": {}}],
                          [{"name": "x", "dtype": "float16", "shape": [8]},
                           {"name": "y", "dtype": "float16", "shape": [2, 8]},
                           {"name": "z", "dtype": "float16", "shape": [8]}], ["n1"])
        rng = np.random.default_rng(0)
        x = (rng.standard_normal(8) * 3).astype(np.float16)
        y = (rng.standard_normal((2, 8)) * 3).astype(np.float16)
        z = rng.standard_normal(8).astype(np.float16)
        iv = evaluate(case, [x, y, z])["n1"]
        graph_order, re_paired = (x + y) + z, (x + z) + y
        self.assertTrue(np.any(graph_order != re_paired))
        self.assertFalse(check_value(iv, graph_order).bad.any())
        self.assertFalse(check_value(iv, re_paired).bad.any())
        ulp = np.spacing(np.maximum(np.abs(x + y), np.abs(x + z))).astype(np.float64)
        self.assertTrue(np.all(iv.hi - iv.lo <= np.abs(graph_order - re_paired) + 4 * ulp))

    def test_maximum_of_scaled_self_is_leaky_relu(self):
        # The remapper fuses Maximum(x, x * a) into LeakyRelu(x, a) checking only
        # a >= 0: for a > 1 TF returns min(x, a x) (float32/bfloat16; soak
        # --seed=20261129 graph 19514, x / 0.5). float64 keeps the Maximum.
        x = np.array([1.5, -2.0, 3.0, 0.0], np.float32)
        for dtype, want in (("float32", [1.5, -4.0, 3.0, 0.0]), ("float64", [3.0, -2.0, 6.0, 0.0])):
            case = self._case([{"name": "n0", "op": "RealDiv", "inputs": ["x", {"const": 0.5}],
                                "attrs": {}},
                               {"name": "n1", "op": "Maximum", "inputs": ["x", "n0"], "attrs": {}}],
                              [{"name": "x", "dtype": dtype, "shape": [4]}], ["n1"])
            iv = evaluate(case, [x.astype(dtype)])["n1"]
            self.assertFalse(check_value(iv, np.array(want, dtype)).bad.any())
            other = np.maximum(x, 2 * x) if dtype == "float32" else np.minimum(x, 2 * x)
            self.assertEqual(list(check_value(iv, other.astype(dtype)).bad),
                             [True, True, True, False])

    def test_float64_sum_keeps_small_values(self):
        # A Sum over one element returns it as it is, a float64 denormal too
        # (--seed=20261129 graph 5276); the oracle's sum was formed scaled by
        # 2^-64 and flushed it. Scaling is kept for sums that overflow unscaled.
        case = self._case([{"name": "n0", "op": "Sum", "inputs": ["x"],
                            "attrs": {"axis": [1], "keep_dims": False}}],
                          [{"name": "x", "dtype": "float64", "shape": [3, 1]}], ["n0"])
        x = np.array([[-2.0 ** -1024], [3.0 * 2.0 ** -1000], [1e308]])
        iv = evaluate(case, [x])["n0"]
        self.assertFalse(check_value(iv, x[:, 0]).bad.any())
        self.assertTrue(check_value(iv, np.zeros(3)).bad[1:].all())   # not a denormal
        case["inputs"][0]["shape"] = [1, 3]
        case["nodes"][0]["attrs"]["axis"] = [1]
        big = np.array([[1.5e308, 1.5e308, -1.4e308]])    # 1.6e308, or inf in some order
        iv = evaluate(case, [big])["n0"]
        self.assertFalse(check_value(iv, np.array([1.6e308])).bad.any())
        self.assertFalse(check_value(iv, np.array([np.inf])).bad.any())

    def test_softmax_row_that_may_be_all_minus_inf(self):
        # x * 10 overflows to -inf or rounds to -FLT_MAX: a one-element row of
        # -inf gives NaN (exp(-inf - -inf)), so its softmax is undetermined
        # (--seed=20261129 graphs 4264, 4664, 19644). A finite row is checked.
        case = self._case([{"name": "n0", "op": "Mul", "inputs": ["x", {"const": 10.0}],
                            "attrs": {}},
                           {"name": "n1", "op": "Softmax", "inputs": ["n0"], "attrs": {}}],
                          [{"name": "x", "dtype": "float32", "shape": [2, 1]}], ["n1"])
        x = np.array([[-3.403e37], [1.0]], np.float32)
        env = evaluate(case, [x])
        self.assertTrue(np.isneginf(env["n0"].lo[0, 0]))
        iv = env["n1"]
        self.assertTrue(iv.unk[0, 0])
        self.assertFalse(check_value(iv, np.array([[np.nan], [1.0]], np.float32)).bad.any())
        self.assertFalse(iv.unk[1, 0])
        self.assertTrue(check_value(iv, np.array([[np.nan], [np.nan]], np.float32)).bad[1, 0])

    def test_float64_floor_mod_of_inexact_operand(self):
        # tanh(-253) = -1 (its enclosure is not a point); TF: fmod(-1, y) + y, one
        # rounding of -1 + 6y. The oracle's -1 - q*y in float64 rounds 6y too,
        # 4 ulps off this result (--seed=20261129 graph 10154).
        case = self._case([{"name": "n0", "op": "Tanh", "inputs": ["x"], "attrs": {}},
                           {"name": "n1", "op": "FloorMod", "inputs": ["n0", "y"], "attrs": {}}],
                          [{"name": "x", "dtype": "float64", "shape": [1]},
                           {"name": "y", "dtype": "float64", "shape": [1]}], ["n1"])
        x, y = np.array([-253.41407013877168]), np.array([0.19732494999908107])
        env = evaluate(case, [x, y])
        iv = env["n1"]
        tf_value = np.fmod(np.tanh(x), y) + y              # fmod is exact
        self.assertFalse(check_value(iv, tf_value).bad.any())
        tanh_width = env["n0"].hi[0] - env["n0"].lo[0]
        self.assertLess(iv.hi[0] - iv.lo[0], tanh_width + 24 * np.spacing(tf_value[0]))

    def test_duplicate_consumers_merged_before_rewrites(self):
        # Grappler merges the two equal LogicalNot(c) first, so c has one consumer
        # and not(x <= y) becomes x > y: False for NaN (--seed=20261130 graph 7922)
        case = self._case([{"name": "n1", "op": "LessEqual", "inputs": ["x", "y"], "attrs": {}},
                           {"name": "n3", "op": "LogicalNot", "inputs": ["n1"], "attrs": {}},
                           {"name": "n4", "op": "LogicalNot", "inputs": ["n1"], "attrs": {}}],
                          [{"name": "x", "dtype": "float32", "shape": [2]},
                           {"name": "y", "dtype": "float32", "shape": [2]}], ["n3", "n4"])
        x, y = np.array([np.nan, 2.0], np.float32), np.array([1.0, 1.0], np.float32)
        env = evaluate(case, [x, y])
        for name in ("n3", "n4"):
            self.assertEqual(list(env[name].lo), [0.0, 1.0])
            self.assertEqual(list(env[name].hi), [0.0, 1.0])

    def test_max_of_signed_zeros_may_be_either(self):
        # TF's max(-0, +0) is -0 here, and rsqrt of it -inf (--seed=20261130
        # graph 3435): both signs, so both infinities, are allowed
        case = self._case([{"name": "n0", "op": "Maximum", "inputs": ["x", "y"], "attrs": {}},
                           {"name": "n1", "op": "Rsqrt", "inputs": ["n0"], "attrs": {}}],
                          [{"name": "x", "dtype": "float32", "shape": [2]},
                           {"name": "y", "dtype": "float32", "shape": [2]}], ["n1"])
        x, y = np.array([-0.0, 0.0], np.float32), np.array([0.0, -0.0], np.float32)
        iv = evaluate(case, [x, y])["n1"]
        for v in (-np.inf, np.inf):
            self.assertFalse(check_value(iv, np.array([v, v], np.float32)).bad.any())

    def test_reciprocal_near_smallest_normal(self):
        # TF's vectorised float reciprocal (rcp estimate + one Newton step) loses
        # the Newton correction to FTZ once it is below FLT_MIN (soak
        # --seed=20261129 graph 2248): error up to FLT_MIN absolute, capped at the
        # estimate's 1.5 * 2^-12 relative. Elsewhere the bound stays a few ulps.
        case = self._case([{"name": "n0", "op": "Reciprocal", "inputs": ["x"], "attrs": {}}],
                          [{"name": "x", "dtype": "float32", "shape": [16]}], ["n0"])
        x = np.tile(np.array([4.1672e37, -4.4483e37, 8.4e37, 1e30, 3.0, -7.5, 2.0 ** 104,
                              0.1], np.float32), 2)
        iv = evaluate(case, [x])["n0"]
        exact = 1.0 / x.astype(np.float64)
        tf_value = tf.math.reciprocal(tf.constant(x)).numpy()    # a full AVX packet
        self.assertFalse(check_value(iv, tf_value).bad.any(), tf_value)
        small = np.abs(exact) < 2.0 ** -113          # Newton correction always flushed
        seen = exact * (1 + 3.1e-4)                  # (TF here: 3.14e-4 relative)
        self.assertFalse(check_value(iv, seen).bad[small].any())
        beyond = exact * (1 + 3.7e-4)                # more than rcp's own error
        self.assertTrue(check_value(iv, beyond).bad[small].all())
        normal = np.abs(exact) > 2.0 ** -90
        width = (iv.hi - iv.lo)[normal]
        self.assertTrue(np.all(width <= 8 * np.spacing(np.abs(exact[normal]).astype(np.float32))))

    def test_case_json_round_trip_and_replay_script(self):
        case = generate_case(case_seed(CI_SEED, 0))
        again = json.loads(json.dumps(case))
        self.assertEqual(again, case)
        self.assertIsNone(validate_case(again))
        for a, b in zip(make_inputs(case, 1), make_inputs(again, 1)):
            np.testing.assert_array_equal(a, b)
        compile(to_python(case), "<reproducer>", "exec")


if __name__ == "__main__":
    tf.test.main()
