"""A step fused by `tf_fusionstitch.optimize` runs under a pipeline plan and under a data
plan (placed: a piece of the batch per replica) on 4 logical CPUs with the unfused
single-device results; under DTensor (tensor plans) it is refused (DTensor has no layout
propagation for FusionStitch ops), and in pieces where a fused kernel makes the pieces'
mean differ from the whole batch's step. Its own file: compiling the kernels takes a while.
"""

import parallelize_testlib as lib  # configures the logical devices first
from parallelize_testlib import MODELS, einsum_block

import tensorflow as tf

import tf_fusionstitch as fs
from tf_fusionstitch import planner


class FusedParallelizeTest(lib.ParallelStepCase):

    def test_fused_pipeline_step(self):
        parallel = self.check_strategy("einsum", "pipeline", fuse=True)
        ops = self.ops_run(parallel, "einsum")
        fused = [op.device for op in ops if op.type == "FusionStitch"]
        self.assertNotEmpty(fused)
        self.assertTrue(all(fused), "a FusionStitch op without a stage device")

    def test_fused_data_step_runs_placed(self):
        # DTensor cannot partition FusionStitch ops: the data plan runs a piece of the batch
        # per replica, each on its device, and one update on the gradients' mean.
        parallel = self.check_strategy("einsum", "data", fuse=True)
        fused = {op.device for op in self.ops_run(parallel, "einsum")
                 if op.type == "FusionStitch"}
        self.assertLen(fused, 4, "FusionStitch ops on fewer replicas' devices")

    def test_fused_data_step_calling_a_function_that_captures_a_variable(self):
        # Each trace names the nested function's capture by TF's counter; the pieces'
        # trace must still run placed, not fall to DTensor's refusal.
        parallel = self.check_strategy("nested", "data", fuse=True)
        fused = {op.device for op in self.ops_run(parallel, "nested")
                 if op.type == "FusionStitch"}
        self.assertLen(fused, 4, "FusionStitch ops on fewer replicas' devices")

    def test_fused_step_squaring_a_sum_over_the_batch_does_not_run_in_pieces(self):
        # The rank-3 `h @ up`'s weight gradient is a sum over the batch that the fused plan
        # computes in one kernel with Adam's square of it: the pieces' mean of the square
        # is not the square of the whole batch's gradient, so the step is refused.
        step, inputs, variables = MODELS["nested_adam"](seed=1)
        with self.assertRaisesRegex(ValueError, "computes .*, which the variable writes read, "
                                                "from a sum over the batch through a "
                                                "nonlinear op"):
            planner.parallelize(fs.optimize(step), inputs, cluster="4xCPU", strategy="data",
                                variables=variables.values())

    def test_fused_data_step_that_does_not_take_a_piece_says_why(self):
        # The reference block reshapes to its batch size, so it cannot run placed in
        # pieces; the refusal says so rather than only asking for any batch size.
        step, inputs, variables = lib.reference_block(seed=2)
        with self.assertRaisesRegex(ValueError, "FusionStitch ops.*this one does not: the "
                                                "step does not trace on a micro-batch of 1"):
            planner.parallelize(fs.optimize(step), inputs, cluster="4xCPU", strategy="data",
                                variables=variables.values())

    def test_fused_step_under_dtensor_is_refused(self):
        step, inputs, variables = einsum_block(seed=2)
        with self.assertRaisesRegex(ValueError, "FusionStitch ops.*strategy='pipeline'"):
            planner.parallelize(fs.optimize(step), inputs, cluster="4xCPU",
                                strategy="operator", variables=variables.values())


if __name__ == "__main__":
    tf.test.main()
