"""`planner.parallelize` on 4 logical CPU devices: data, operator, auto and 2 x 2 plans under
DTensor, and pipeline plans (placed; in micro-batches; 2 stages x 2 replicas), each three
steps with the single-device losses and variables, for two transformer blocks of different
styles; the combinations that do not run are refused with what to do.
"""

import dataclasses

import parallelize_testlib as lib  # configures the logical devices first
from parallelize_testlib import DEVICES, MODELS, einsum_block, reference_block

import numpy as np
import tensorflow as tf

from tf_fusionstitch import planner


def _barrier(ops, replica, stage, j):
    """The pieces whose ops the j-th schedule barrier of a replica's stage waits for, and
    the pieces whose ops wait for it."""
    name = f"pipeline_schedule/replica_{replica}/stage_{stage}/{j}"
    barrier = next(op for op in ops if op.name == name)

    def pieces(names):
        return {int(n.split("/")[0].rpartition("_")[2]) for n in names}

    return (pieces(op.name for op in barrier.control_inputs),
            pieces(op.name for op in ops if barrier in op.control_inputs))


class ParallelizeTest(lib.ParallelStepCase):

    def test_reference_block_data(self):
        self.check_strategy("reference", "data")

    def test_reference_block_operator(self):
        self.check_strategy("reference", "operator")

    def test_reference_block_auto(self):
        self.check_strategy("reference", "auto")

    def test_einsum_block_data(self):
        self.check_strategy("einsum", "data")

    def test_einsum_block_operator(self):
        self.check_strategy("einsum", "operator")

    def test_einsum_block_auto(self):
        self.check_strategy("einsum", "auto")

    def hybrid_plan(self, model):
        """A 2 x 2 (replicas x tensor parallel) plan: the planner's 2-way operator plan of
        the model, replicated twice (the searches seldom pick a hybrid on 4 CPUs)."""
        step, inputs, variables = MODELS[model](seed=1)
        plan = planner.search(step, inputs, cluster="2xCPU", strategy="operator",
                              variables=variables.values())
        self.assertEqual(plan.tensor_parallel, 2)
        return dataclasses.replace(plan, replicas=2,
                                   cluster=planner.get_cluster("4xCPU").to_dict())

    def test_reference_block_data_times_operator(self):
        self.check_strategy("reference", "auto", self.hybrid_plan("reference"))

    def test_einsum_block_data_times_operator(self):
        self.check_strategy("einsum", "auto", self.hybrid_plan("einsum"))

    def test_reference_block_pipeline(self):
        parallel = self.check_strategy("reference", "pipeline")
        self.ops_run(parallel, "reference")

    def check_in_micro_batches(self, model):
        """The model's pipeline plan in DEVICES micro-batches against one device: the
        parallel step and the ops it runs, where each micro-batch computes its gradients."""
        step, inputs, variables = MODELS[model](seed=1)
        plan = planner.search(step, inputs, cluster="4xCPU", strategy="pipeline",
                              variables=variables.values())
        parallel = self.check_strategy(model, "pipeline",
                                        dataclasses.replace(plan, micro_batches=DEVICES))
        ops = self.ops_run(parallel, model)
        for i in range(DEVICES):
            self.assertTrue(any(op.name.startswith(f"micro_batch_{i}/") for op in ops))
        return parallel, ops

    def test_pipeline_in_micro_batches(self):
        parallel, ops = self.check_in_micro_batches("einsum")
        _, _, variables = einsum_block(seed=1)
        # The variables are written once.
        writes = [op for op in ops if op.type == "AssignSubVariableOp"]
        self.assertLen(writes, len(variables))
        self.assertTrue(all(op.name.startswith("update/") for op in writes))
        # 1F1B (the plan's schedule): the last stage alternates forward and backward; the
        # first fills the pipeline with every forward before its first backward.
        self.assertEqual(parallel.plan.schedule, "1f1b")
        self.assertEqual(_barrier(ops, 0, stage=3, j=0), ({0}, {0}))   # F0 -> B0
        self.assertEqual(_barrier(ops, 0, stage=3, j=1), ({0}, {1}))   # B0 -> F1
        self.assertEqual(_barrier(ops, 0, stage=0, j=3), ({3}, {0}))   # F3 -> B0

    def test_micro_batches_of_a_step_calling_a_function_that_captures_a_variable(self):
        # The trace on a micro-batch captures the weight under another counter-made name
        # than the whole batch's trace: a placeholder, fed, so the plan still places it.
        self.check_in_micro_batches("nested")

    def test_micro_batches_of_a_step_whose_optimizer_is_not_linear(self):
        # Adam squares the gradient: the pieces' gradients are averaged first, and the
        # update runs once on the mean, as on the whole batch.
        self.check_in_micro_batches("nested_adam")

    def test_micro_batches_of_a_step_with_an_integer_argument_the_writes_read(self):
        # The pieces share the argument (it is not split), so the update reads it as it
        # is; an integer has no mean (dividing a sum of them made a float64 of it).
        rng = np.random.default_rng(1)
        up = tf.Variable(rng.standard_normal((16, 32)).astype(np.float32) / 4)
        down = tf.Variable(rng.standard_normal((32, 16)).astype(np.float32) / 6)

        @tf.function
        def step(x, y, scale):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.nn.relu(x @ up) @ down - y))
            for p, g in zip([up, down], tape.gradient(loss, [up, down])):
                p.assign_sub(0.01 * tf.cast(scale, tf.float32) * g)
            return loss
        inputs = [tf.constant(rng.standard_normal((8, 8, 16)).astype(np.float32))
                  for _ in range(2)] + [tf.constant(3)]
        plan = planner.search(step, inputs, cluster="4xCPU", strategy="pipeline",
                              variables=[up, down])
        parallel = planner.parallelize(step, inputs, cluster="4xCPU", variables=[up, down],
                                       plan=dataclasses.replace(plan, micro_batches=DEVICES))
        want = [float(step(*inputs)) for _ in range(3)]
        got = [float(parallel(*inputs)) for _ in range(3)]
        np.testing.assert_allclose(got, want, rtol=lib.RTOL)

    def test_micro_batches_refuse_an_integer_the_pieces_compute_differently(self):
        # The writes read a count of the batch's rows: each piece counts its own rows, the
        # counts differ and have no mean, so the step refuses to run rather than update
        # with one piece's count.
        rng = np.random.default_rng(1)
        w = tf.Variable(rng.standard_normal((16, 16)).astype(np.float32) / 4)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(x @ w - y))
            positive = tf.reduce_sum(tf.cast(y[:, 0, 0] > 0, tf.int32))
            w.assign_sub(0.01 * tf.cast(positive, tf.float32) * tape.gradient(loss, w))
            return loss
        x = tf.constant(rng.standard_normal((8, 8, 16)).astype(np.float32))
        y = tf.constant(np.where(np.arange(8)[:, None, None] < 3, 1.0, -1.0)
                        * np.ones((8, 8, 16)), tf.float32)   # pieces: 2, 1, 0, 0 positive rows
        plan = planner.search(step, [x, y], cluster="4xCPU", strategy="pipeline",
                              variables=[w])
        parallel = planner.parallelize(step, [x, y], cluster="4xCPU", variables=[w],
                                       plan=dataclasses.replace(plan, micro_batches=DEVICES))
        before = w.numpy()
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "different values of .*cannot run in pieces"):
            parallel(x, y)
        self.assertAllEqual(w.numpy(), before)

    def test_micro_batches_need_a_step_of_any_batch_size(self):
        # The reference block reshapes to its batch size: it does not trace on less.
        step, inputs, variables = reference_block(seed=2)
        plan = planner.search(step, inputs, cluster="4xCPU", strategy="pipeline",
                              variables=variables.values())
        with self.assertRaisesRegex(ValueError, "does not trace on a micro-batch of 1"):
            planner.parallelize(step, inputs, cluster="4xCPU", variables=variables.values(),
                                plan=dataclasses.replace(plan, micro_batches=DEVICES))

    def two_stage_plan(self, model, **mesh):
        """The planner's 2-stage pipeline plan of the model on 2 CPUs, with `mesh` (replicas,
        tensor_parallel, micro_batches) changed to fill 4."""
        step, inputs, variables = MODELS[model](seed=1)
        plan = planner.search(step, inputs, cluster="2xCPU", strategy="pipeline",
                              variables=variables.values())
        self.assertEqual(plan.num_stages, 2)
        return dataclasses.replace(plan, cluster=planner.get_cluster("4xCPU").to_dict(),
                                   **mesh)

    def test_pipeline_times_data(self):
        parallel = self.check_strategy("einsum", "pipeline", self.two_stage_plan(
            "einsum", replicas=2, micro_batches=2, schedule="gpipe"))
        ops = self.ops_run(parallel, "einsum")
        # Replica r's stages run on devices 2s + r: all four devices compute. Replica 1
        # has pieces 2 and 3; GPipe runs both forwards before the backwards on every stage.
        for replica, first in ((0, 0), (1, 2)):
            for stage in (0, 1):
                self.assertEqual(_barrier(ops, replica, stage, 0), ({first}, {first + 1}))
                self.assertEqual(_barrier(ops, replica, stage, 1), ({first + 1}, {first}))

    def test_pipeline_times_tensor_parallel_is_refused(self):
        step, inputs, variables = einsum_block(seed=2)
        with self.assertRaisesRegex(ValueError, "do not run with tensor parallelism"):
            planner.parallelize(step, inputs, cluster="4xCPU",
                                plan=self.two_stage_plan("einsum", tensor_parallel=2),
                                variables=variables.values())

    def test_micro_batches_without_stages_are_refused(self):
        step, inputs, variables = einsum_block(seed=2)
        plan = planner.search(step, inputs, cluster="4xCPU", strategy="data")
        with self.assertRaisesRegex(ValueError, "micro-batches run in pipeline plans only"):
            planner.parallelize(step, inputs, cluster="4xCPU",
                                plan=dataclasses.replace(plan, micro_batches=2))

    def test_cluster_that_does_not_match_the_devices(self):
        step, inputs, variables = einsum_block(seed=2)
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
