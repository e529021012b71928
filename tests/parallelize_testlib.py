"""What the tests of `planner.parallelize` share: 4 logical CPU devices, two transformer
blocks of different styles, and the check of a parallel step against one device.

Logical devices must be configured before TensorFlow initialises its devices, so this is
done when a test module imports this one (pytest imports every test module before running
any, in each xdist worker too). If something initialised TF's devices earlier with fewer
CPUs, the tests are skipped with the error `use_cpu_devices` gives.
"""

import functools
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tf_fusionstitch import planner  # noqa: E402

DEVICES = 4
try:
    planner.use_cpu_devices(DEVICES)
    SETUP_ERROR = None
except ValueError as e:
    SETUP_ERROR = str(e)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_fusionstitch as fs  # noqa: E402
from tf_fusionstitch.planner import reference_models  # noqa: E402
from tf_fusionstitch.planner.reference_models import einsum_block  # noqa: E402,F401

STEPS = 3
RTOL = 1e-4
REFERENCE_SIZES = dict(batch=4, seq=8, hidden=16, heads=2, ffn=32, layers=1)


def reference_block(seed):
    return reference_models.build_eager("transformer_block", seed=seed, **REFERENCE_SIZES)


def nested_call_block(seed, batch=8, seq=8, hidden=16, ffn=32, lr=0.05, adam=False):
    """A step whose feed-forward layer is a tf.function of its own that captures its
    weight, as Keras' grouped convolution is: each trace of the step captures that weight
    again, as a placeholder named by TensorFlow's process-wide counter. Keras' SGD with
    momentum updates it (a slot read after its write), or Adam (the square of the
    gradient), and counts its steps in an int64 variable."""
    rng = np.random.default_rng(seed)
    up = tf.Variable(rng.standard_normal((hidden, ffn)).astype(np.float32) / 4, name="up")
    down = tf.Variable(rng.standard_normal((ffn, hidden)).astype(np.float32) / 6,
                       name="down")
    params = [up, down]

    @tf.function
    def feed_forward(h):
        return tf.nn.relu(h @ up)

    optimizer = keras.optimizers.Adam(lr / 10) if adam else \
        keras.optimizers.SGD(lr, momentum=0.9)
    optimizer.build(params)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
            h = (x - mean) * tf.math.rsqrt(variance + 1e-6)
            loss = tf.reduce_mean(tf.square(x + feed_forward(h) @ down - y))
        optimizer.apply_gradients(zip(tape.gradient(loss, params), params))
        return loss

    inputs = [tf.constant(rng.standard_normal((batch, seq, hidden)).astype(np.float32))
              for _ in range(2)]
    return step, inputs, {p.name: p for p in params}


MODELS = {"reference": reference_block, "einsum": einsum_block, "nested": nested_call_block,
          "nested_adam": functools.partial(nested_call_block, adam=True)}


# The reference block's attention key bias adds q . bk to every score of a query's row, which
# softmax ignores: its gradient is zero in exact arithmetic, and Adam turns the rounding noise
# into steps (about lr * noise / epsilon) that differ between any two layouts. It and its
# slots are compared against the largest value of their kind instead of against themselves.
ZERO_GRADIENT = ("bk:0", "bk/m:0", "bk/v:0")


def kind(name):
    """Weights, or Adam's first or second moments (many orders of magnitude smaller)."""
    base = name.split(":")[0]
    return base[-1] if base.endswith(("/m", "/v")) else "weights"


def relative_differences(got, want):
    """{variable: max |got - want| / max |want|}; for `ZERO_GRADIENT`'s variables the
    denominator is the largest |want| of their kind."""
    scale = {}
    for name, value in want.items():
        scale[kind(name)] = max(scale.get(kind(name), 0.0), float(np.max(np.abs(value))))
    return {name: float(np.max(np.abs(got[name] - value))) / (
        scale[kind(name)] if name in ZERO_GRADIENT else float(np.max(np.abs(value))))
        for name, value in want.items()}


class ParallelStepCase(tf.test.TestCase):
    """Checks of a parallel step against one device (no tests of its own)."""

    def setUp(self):
        super().setUp()
        if SETUP_ERROR is not None:
            self.skipTest(SETUP_ERROR)

    def check_strategy(self, model, strategy, plan=None, fuse=False, cluster="4xCPU"):
        """Three steps of the model under the plan (or the strategy's) on `cluster` against
        one device; with `fuse`, the parallel step runs what tf_fusionstitch.optimize makes
        of it."""
        build = MODELS[model]
        step, inputs, variables = build(seed=1)
        # The parallel step copies the initial weights, so it is built before the reference
        # steps change them.
        parallel = planner.parallelize(fs.optimize(step) if fuse else step, inputs,
                                       cluster=cluster, strategy=strategy, plan=plan,
                                       variables=variables.values())
        searched, plan = plan is None, parallel.plan
        if searched:
            mesh = (plan.replicas, plan.tensor_parallel, plan.num_stages)
            n = plan.cluster_spec.num_devices
            want = {"data": (n, 1, 1), "operator": (1, n, 1),
                    "pipeline": (1, 1, n)}.get(strategy)
            if want is not None:
                self.assertEqual(mesh, want, str(plan))
            # A fused step is priced as it runs, with stitched kernels.
            self.assertEqual(plan.fusion, "stitch" if fuse else "none")
        if plan.tensor_parallel > 1:
            self.check_shards(parallel, variables)
        initial = {n: v.numpy() for n, v in variables.items()}
        want_losses = [float(step(*inputs)) for _ in range(STEPS)]
        want = {n: v.numpy() for n, v in variables.items()}
        got_losses = [float(parallel(*inputs)) for _ in range(STEPS)]
        np.testing.assert_allclose(got_losses, want_losses, rtol=RTOL)
        # The originals still hold the reference's values until synced.
        for name, var in variables.items():
            var.assign(initial[name])
        parallel.sync_variables()
        got = {n: v.numpy() for n, v in variables.items()}
        differences = relative_differences(got, want)
        worst = max(differences, key=differences.get)
        print(f"{model} {strategy} (d={plan.replicas}, t={plan.tensor_parallel}, "
              f"p={plan.num_stages}, m={plan.micro_batches}): losses {got_losses}, largest "
              f"relative difference {differences[worst]:.2e} ({worst})")
        for name, difference in differences.items():
            self.assertLess(difference, RTOL, f"{name} of {model} under {plan}")
        moved = max(float(np.max(np.abs(want[n] - initial[n]))) for n in want)
        self.assertGreater(moved, 100 * RTOL, "the steps changed no variable")
        return parallel

    def check_shards(self, parallel, variables):
        """Each device holds 1/t of every variable the plan splits, along the plan's axis."""
        plan = parallel.plan
        split = {n: a for n, a in plan.variable_splits.items() if a is not None}
        self.assertNotEmpty(split)
        shard_shapes = parallel.shard_shapes()
        for name, axis in split.items():
            shapes = shard_shapes[name]
            self.assertLen(shapes, plan.cluster_spec.num_devices)
            want = variables[name].shape.as_list()
            want[axis] //= plan.tensor_parallel
            for shape in shapes:
                self.assertEqual(shape, want, name)

    def ops_run(self, parallel, model):
        """The ops of the pipeline step's tf.function, after checking they use every device."""
        _, inputs, _ = MODELS[model](seed=1)
        ops = parallel.run.get_concrete_function(*inputs).graph.get_operations()
        devices = set()
        for op in ops:
            if op.device:
                spec = tf.DeviceSpec.from_string(op.device)
                devices.add((spec.job, spec.task, spec.device_index))
        self.assertLen(devices, parallel.plan.cluster_spec.num_devices, sorted(devices))
        return ops
