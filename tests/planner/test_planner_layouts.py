"""`layouts.MeshLayouts`: a plan's mesh axes and sharding specs (TF-free)."""

import dataclasses

from absl.testing import absltest

from tf_fusionstitch.planner import layouts
from tf_fusionstitch.planner.plan import Plan


def _plan(replicas, tensor_parallel, stages=1, splits=None):
    return Plan(variable_splits=splits or {"w:0": 1, "b:0": None}, stages=[[]] * stages,
                replicas=replicas, tensor_parallel=tensor_parallel, micro_batches=1,
                predicted_step_time=0.0, peak_memory_per_device=0.0, feasible=True,
                cluster="4xCPU")


class MeshLayoutsTest(absltest.TestCase):

    def test_mesh_and_specs(self):
        mesh = layouts.MeshLayouts(_plan(2, 2))
        self.assertEqual(mesh.mesh_axes, [("batch", 2), ("model", 2)])
        self.assertEqual(mesh.num_devices, 4)
        self.assertEqual(mesh.variable_spec("w:0", 2), [None, "model"])
        self.assertEqual(mesh.variable_spec("b:0", 1), [None])
        self.assertEqual(mesh.input_spec((8, 16)), ["batch", None])
        self.assertEqual(mesh.input_spec((3, 16)), [None, None])   # 3 rows: not split 2 ways
        self.assertEqual(mesh.input_spec(()), [])

    def test_one_way_splits_and_replicas_shard_nothing(self):
        mesh = layouts.MeshLayouts(_plan(1, 1))
        self.assertEqual(mesh.variable_spec("w:0", 2), [None, None])
        self.assertEqual(mesh.input_spec((8, 16)), [None, None])

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, "3 pipeline stages has no single device mesh"):
            layouts.MeshLayouts(_plan(1, 1, stages=3))
        mesh = layouts.MeshLayouts(_plan(1, 2))
        with self.assertRaisesRegex(ValueError, "no variable 'x:0'"):
            mesh.variable_spec("x:0", 2)
        with self.assertRaisesRegex(ValueError, "along axis 1, but it has rank 1"):
            layouts.MeshLayouts(dataclasses.replace(_plan(1, 2), variable_splits={"w:0": 1})
                                ).variable_spec("w:0", 1)


if __name__ == "__main__":
    absltest.main()
