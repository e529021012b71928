"""`planner.parallelize` runs data, operator and auto plans on 4 logical CPU devices (DTensor)
with the single-device losses and variables, for two transformer blocks of different styles.

Logical devices must be configured before TensorFlow initialises its devices, so this is
done when the module is imported (pytest imports every test module before running any, in
each xdist worker too). If something initialised TF's devices earlier with fewer CPUs, the
tests are skipped with the error `use_cpu_devices` gives.
"""

import dataclasses
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tf_fusionstitch import planner  # noqa: E402

_DEVICES = 4
try:
    planner.use_cpu_devices(_DEVICES)
    _SETUP_ERROR = None
except ValueError as e:
    _SETUP_ERROR = str(e)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.experimental import dtensor  # noqa: E402

from tf_fusionstitch.planner import reference_models  # noqa: E402

_STEPS = 3
_RTOL = 1e-4
_REFERENCE_SIZES = dict(batch=4, seq=8, hidden=16, heads=2, ffn=32, layers=1)


def _einsum_block(seed, batch=4, seq=8, hidden=16, heads=2, ffn=32, lr=0.05):
    """A pre-LN attention + FFN block written another way: rank-3 activations, einsum with
    per-head rank-3 weights, `x @ w` on rank 3, plain SGD by `assign_sub`. Returns (train
    step, example inputs, {name: variable})."""
    rng = np.random.default_rng(seed)
    dh = hidden // heads

    def var(name, shape):
        return tf.Variable((rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32),
                           name=name)

    params = [var("q_proj", (hidden, heads, dh)), var("k_proj", (hidden, heads, dh)),
              var("v_proj", (hidden, heads, dh)), var("out_proj", (heads, dh, hidden)),
              var("up", (hidden, ffn)), var("down", (ffn, hidden)),
              tf.Variable(np.ones(hidden, np.float32), name="norm_scale")]
    q, k, v, o, up, down, scale = params

    def norm(x):
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + 1e-6) * scale

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            h = norm(x)
            qh = tf.einsum("bsd,dhk->bhsk", h, q)
            kh = tf.einsum("bsd,dhk->bhsk", h, k)
            vh = tf.einsum("bsd,dhk->bhsk", h, v)
            attn = tf.nn.softmax(tf.einsum("bhsk,bhtk->bhst", qh, kh) / math.sqrt(dh))
            x = x + tf.einsum("bhsk,hkd->bsd", tf.einsum("bhst,bhtk->bhsk", attn, vh), o)
            x = x + tf.nn.relu(norm(x) @ up) @ down
            loss = tf.reduce_mean(tf.square(x - y))
        for p, g in zip(params, tape.gradient(loss, params)):
            p.assign_sub(lr * g)
        return loss

    inputs = [tf.constant(rng.standard_normal((batch, seq, hidden)).astype(np.float32))
              for _ in range(2)]
    return step, inputs, {p.name: p for p in params}


def _reference_block(seed):
    return reference_models.build_eager("transformer_block", seed=seed, **_REFERENCE_SIZES)


_MODELS = {"reference": _reference_block, "einsum": _einsum_block}


# The reference block's attention key bias adds q . bk to every score of a query's row, which
# softmax ignores: its gradient is zero in exact arithmetic, and Adam turns the rounding noise
# into steps (about lr * noise / epsilon) that differ between any two layouts. It and its
# slots are compared against the largest value of their kind instead of against themselves.
_ZERO_GRADIENT = ("bk:0", "bk/m:0", "bk/v:0")


def _kind(name):
    """Weights, or Adam's first or second moments (many orders of magnitude smaller)."""
    base = name.split(":")[0]
    return base[-1] if base.endswith(("/m", "/v")) else "weights"


def _relative_differences(got, want):
    """{variable: max |got - want| / max |want|}; for `_ZERO_GRADIENT`'s variables the
    denominator is the largest |want| of their kind."""
    scale = {}
    for name, value in want.items():
        scale[_kind(name)] = max(scale.get(_kind(name), 0.0), float(np.max(np.abs(value))))
    return {name: float(np.max(np.abs(got[name] - value))) / (
        scale[_kind(name)] if name in _ZERO_GRADIENT else float(np.max(np.abs(value))))
        for name, value in want.items()}


class ParallelizeTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        if _SETUP_ERROR is not None:
            self.skipTest(_SETUP_ERROR)

    def _check_strategy(self, model, strategy, plan=None):
        build = _MODELS[model]
        step, inputs, variables = build(seed=1)
        # The parallel step copies the initial weights, so it is built before the reference
        # steps change them.
        parallel = planner.parallelize(step, inputs, cluster="4xCPU", strategy=strategy,
                                       plan=plan, variables=variables.values())
        plan = parallel.plan
        if strategy == "pipeline":
            self.assertEqual(plan.num_stages, _DEVICES, str(plan))
        else:
            self.assertEqual(plan.num_stages, 1, str(plan))
        if strategy == "data":
            self.assertEqual((plan.replicas, plan.tensor_parallel), (_DEVICES, 1))
        if strategy == "operator":
            self.assertEqual((plan.replicas, plan.tensor_parallel), (1, _DEVICES))
        if plan.tensor_parallel > 1:
            self._check_shards(parallel, variables)
        initial = {n: v.numpy() for n, v in variables.items()}
        want_losses = [float(step(*inputs)) for _ in range(_STEPS)]
        want = {n: v.numpy() for n, v in variables.items()}
        got_losses = [float(parallel(*inputs)) for _ in range(_STEPS)]
        np.testing.assert_allclose(got_losses, want_losses, rtol=_RTOL)
        # The originals still hold the reference's values until synced.
        for name, var in variables.items():
            var.assign(initial[name])
        parallel.sync_variables()
        got = {n: v.numpy() for n, v in variables.items()}
        differences = _relative_differences(got, want)
        worst = max(differences, key=differences.get)
        print(f"{model} {strategy} (d={plan.replicas}, t={plan.tensor_parallel}, "
              f"p={plan.num_stages}, m={plan.micro_batches}): losses {got_losses}, largest "
              f"relative difference {differences[worst]:.2e} ({worst})")
        for name, difference in differences.items():
            self.assertLess(difference, _RTOL, f"{name} of {model} under {plan}")
        moved = max(float(np.max(np.abs(want[n] - initial[n]))) for n in want)
        self.assertGreater(moved, 100 * _RTOL, "the steps changed no variable")
        return parallel

    def _check_shards(self, parallel, variables):
        """Each device holds 1/t of every variable the plan splits, along the plan's axis."""
        plan = parallel.plan
        split = {n: a for n, a in plan.variable_splits.items() if a is not None}
        self.assertNotEmpty(split)
        for name, axis in split.items():
            var = variables[name]
            shards = dtensor.unpack(parallel.copies[id(var)].read_value())
            self.assertLen(shards, _DEVICES)
            want = var.shape.as_list()
            want[axis] //= plan.tensor_parallel
            for shard in shards:
                self.assertEqual(shard.shape.as_list(), want, name)

    def test_reference_block_data(self):
        self._check_strategy("reference", "data")

    def test_reference_block_operator(self):
        self._check_strategy("reference", "operator")

    def test_reference_block_auto(self):
        self._check_strategy("reference", "auto")

    def test_einsum_block_data(self):
        self._check_strategy("einsum", "data")

    def test_einsum_block_operator(self):
        self._check_strategy("einsum", "operator")

    def test_einsum_block_auto(self):
        self._check_strategy("einsum", "auto")

    def _hybrid_plan(self, model):
        """A 2 x 2 (replicas x tensor parallel) plan: the planner's 2-way operator plan of
        the model, replicated twice (the searches seldom pick a hybrid on 4 CPUs)."""
        step, inputs, variables = _MODELS[model](seed=1)
        plan = planner.search(step, inputs, cluster="2xCPU", strategy="operator",
                              variables=variables.values())
        self.assertEqual(plan.tensor_parallel, 2)
        return dataclasses.replace(plan, replicas=2,
                                   cluster=planner.get_cluster("4xCPU").to_dict())

    def test_reference_block_data_times_operator(self):
        self._check_strategy("reference", "auto", self._hybrid_plan("reference"))

    def test_einsum_block_data_times_operator(self):
        self._check_strategy("einsum", "auto", self._hybrid_plan("einsum"))

    def _ops_run(self, parallel, model):
        """The ops of the pipeline step's tf.function, after checking they use every device."""
        _, inputs, _ = _MODELS[model](seed=1)
        ops = parallel.run.get_concrete_function(*inputs).graph.get_operations()
        devices = {op.device.rpartition(":")[2] for op in ops if op.device}
        self.assertLen(devices, _DEVICES, sorted(devices))
        return ops

    def test_reference_block_pipeline(self):
        parallel = self._check_strategy("reference", "pipeline")
        self._ops_run(parallel, "reference")

    def test_pipeline_in_micro_batches(self):
        step, inputs, variables = _einsum_block(seed=1)
        plan = planner.search(step, inputs, cluster="4xCPU", strategy="pipeline",
                              variables=variables.values())
        parallel = self._check_strategy("einsum", "pipeline",
                                        dataclasses.replace(plan, micro_batches=_DEVICES))
        ops = self._ops_run(parallel, "einsum")
        # Each micro-batch computes its gradients; the variables are written once.
        for i in range(_DEVICES):
            self.assertTrue(any(op.name.startswith(f"micro_batch_{i}/") for op in ops))
        writes = [op for op in ops if op.type == "AssignSubVariableOp"]
        self.assertLen(writes, len(variables))
        self.assertTrue(all(op.name.startswith("update/") for op in writes))

    def test_micro_batches_need_a_step_of_any_batch_size(self):
        # The reference block reshapes to its batch size: it does not trace on less.
        step, inputs, variables = _reference_block(seed=2)
        plan = planner.search(step, inputs, cluster="4xCPU", strategy="pipeline",
                              variables=variables.values())
        with self.assertRaisesRegex(ValueError, "does not trace on a micro-batch of 1"):
            planner.parallelize(step, inputs, cluster="4xCPU", variables=variables.values(),
                                plan=dataclasses.replace(plan, micro_batches=_DEVICES))

    def test_pipeline_mixed_with_replicas_is_refused(self):
        step, inputs, variables = _reference_block(seed=2)
        plan = planner.search(step, inputs, cluster="2xCPU", strategy="pipeline",
                              variables=variables.values())
        mixed = dataclasses.replace(plan, replicas=2,
                                    cluster=planner.get_cluster("4xCPU").to_dict())
        with self.assertRaisesRegex(ValueError, "pipeline stages run only alone"):
            planner.parallelize(step, inputs, cluster="4xCPU", plan=mixed,
                                variables=variables.values())

    def test_cluster_that_does_not_match_the_devices(self):
        step, inputs, variables = _einsum_block(seed=2)
        with self.assertRaisesRegex(ValueError, r"needs 8 logical CPU devices.*"
                                    r"use_cpu_devices\(8\)"):
            planner.parallelize(step, inputs, cluster="8xCPU", strategy="data")
        with self.assertRaisesRegex(ValueError, "cannot run on cluster '8xH200'.*NxCPU"):
            planner.parallelize(step, inputs, cluster="8xH200", strategy="data")
        plan = planner.search(step, inputs, cluster="2xCPU", strategy="data")
        with self.assertRaisesRegex(ValueError, "the plan uses 2 devices.*'4xCPU' has 4"):
            planner.parallelize(step, inputs, cluster="4xCPU", plan=plan)


if __name__ == "__main__":
    tf.test.main()
