"""What a plan asks of a device mesh, TF-free: mesh axes and one sharding spec per tensor.

A plan of d replicas x t-way tensor parallelism (one pipeline stage) runs on a 2-D mesh
("batch" of d, "model" of t) over its first d * t devices, batch-major. A variable the plan
splits along axis a is sharded on "model" along a; every other variable is replicated. A
step input is sharded on "batch" along its first axis when that axis divides by d (the
batch, as the cost model splits it); otherwise it is replicated. A spec is a list with one
entry per axis: a mesh axis name or None (not sharded).
"""

BATCH, MODEL = "batch", "model"


class MeshLayouts:
    """Mesh shape and per-tensor sharding specs of a one-stage `Plan`."""

    def __init__(self, plan):
        if plan.num_stages > 1:
            raise ValueError(
                f"a plan of {plan.num_stages} pipeline stages has no single device mesh: "
                "mesh layouts cover data and tensor parallelism only")
        self.plan = plan
        self.mesh_axes = [(BATCH, plan.replicas), (MODEL, plan.tensor_parallel)]

    @property
    def num_devices(self):
        return self.plan.replicas * self.plan.tensor_parallel

    def variable_spec(self, name, rank):
        """The spec of variable `name` (as the plan names it, e.g. `wq:0`) of rank `rank`."""
        if name not in self.plan.variable_splits:
            raise ValueError(f"the plan has no variable {name!r} (it knows "
                             f"{sorted(self.plan.variable_splits)[:5]}...): was it made "
                             "for another function?")
        spec = [None] * rank
        axis = self.plan.variable_splits[name]
        if axis is not None and self.plan.tensor_parallel > 1:
            if not 0 <= axis < rank:
                raise ValueError(f"the plan splits {name!r} along axis {axis}, but it has "
                                 f"rank {rank}")
            spec[axis] = MODEL
        return spec

    def input_spec(self, shape):
        """The spec of a step input of static shape `shape` (a tuple of ints)."""
        spec = [None] * len(shape)
        if shape and self.plan.replicas > 1 and shape[0] % self.plan.replicas == 0:
            spec[0] = BATCH
        return spec
