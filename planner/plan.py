"""`Plan`: a chosen distributed execution plan, readable, serialisable, applicable. TF-free.

`apply(graph_def)` works on any GraphDef protobuf (it only sets `NodeDef.device`), so this
module needs no TensorFlow import.
"""

import dataclasses
import json

from tf_fusionstitch.planner import cluster as cluster_lib, plan_html


@dataclasses.dataclass
class Plan:
    """A plan and what the cost model predicts for it.

    variable_splits: variable name -> split axis (tensor parallel) or None (replicated).
    stages: op names per pipeline stage (every op of the step, forward, backward, update).
    replicas, tensor_parallel, micro_batches: data-parallel degree, tensor-parallel degree,
    micro-batches per step. predicted_step_time in seconds, peak_memory_per_device in bytes.
    """
    variable_splits: dict
    stages: list
    replicas: int
    tensor_parallel: int
    micro_batches: int
    predicted_step_time: float
    peak_memory_per_device: float
    feasible: bool
    cluster: dict
    strategy: str = "auto"
    method: str = ""
    schedule: str = "1f1b"
    cost_model_calls: int = 0
    split_units: list = dataclasses.field(default_factory=list)   # labels, for reading
    cuts: list = dataclasses.field(default_factory=list)
    infeasible_reason: str = ""
    tp_collectives: dict = dataclasses.field(default_factory=dict)
    fusion: str = "none"     # how the cost model priced memory-intensive ops

    @property
    def num_stages(self):
        return len(self.stages)

    @property
    def cluster_spec(self):
        return cluster_lib.get_cluster(self.cluster)

    def stage_devices(self, stage):
        """Global device indices of `stage`: d replicas x t shards, stage-major."""
        group = self.replicas * self.tensor_parallel
        return list(range(stage * group, (stage + 1) * group))

    def device_of_stage(self, stage, replica=0):
        """The device string ops of `stage` are placed on for `replica` (its first shard)."""
        if not 0 <= replica < self.replicas:
            raise ValueError(f"replica {replica} out of range for {self.replicas} replicas")
        return self.cluster_spec.device_name(
            self.stage_devices(stage)[replica * self.tensor_parallel])

    def apply(self, graph_def, replica=0):
        """A copy of `graph_def` with `NodeDef.device` set for every op the plan places.

        Pipeline stages map to device groups; within a group, ops are placed on the device
        of `replica`'s first shard. The rewriting of split ops into shards plus collectives
        is not done here (`planner.parallelize` runs such plans under DTensor).
        """
        placed = type(graph_def)()
        placed.CopyFrom(graph_def)
        device = {}
        for s, ops in enumerate(self.stages):
            name = self.device_of_stage(s, replica)
            for op in ops:
                device[op] = name
        for node in placed.node:
            if node.name in device:
                node.device = device[node.name]
        return placed

    def save_html(self, path):
        """Writes one self-contained page: the device mesh, how each variable
        is split, and the pipeline schedule as a timeline (plan_html.py)."""
        plan_html.save(self, path)

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text):
        data = json.loads(text)
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields
        if unknown:
            raise ValueError(f"not a plan: unknown field(s) {sorted(unknown)}")
        return cls(**data)

    def __str__(self):
        spec = self.cluster_spec
        lines = [
            f"Plan for {spec.name} ({spec.num_devices} devices), strategy={self.strategy}, "
            f"search={self.method}, {self.cost_model_calls} cost-model calls",
            f"  mesh: {self.replicas} replicas x {self.tensor_parallel}-way tensor parallel x "
            f"{self.num_stages} pipeline stages, {self.micro_batches} micro-batches "
            f"({self.schedule})",
            f"  predicted step time: {self.predicted_step_time * 1e3:.3f} ms"
            + ("" if self.fusion == "none" else f" (memory-intensive ops fused: {self.fusion})")
            + f"; peak memory per "
            f"device: {self.peak_memory_per_device / 1e9:.2f} GB of {spec.memory / 1e9:.0f} GB"
            + ("" if self.feasible else f"  INFEASIBLE: {self.infeasible_reason}"),
        ]
        if self.tensor_parallel > 1:
            split = {v: a for v, a in self.variable_splits.items() if a is not None}
            lines.append(f"  split variables: {len(split)} of {len(self.variable_splits)}")
            for label in self.split_units:
                lines.append(f"    split: {label}")
            if self.tp_collectives:
                counts = ", ".join(f"{k}: {v}" for k, v in sorted(self.tp_collectives.items()))
                lines.append(f"  tensor-parallel collectives per micro-batch: {counts}")
        if self.num_stages > 1:
            for s, ops in enumerate(self.stages):
                lines.append(f"  stage {s}: {len(ops)} ops on {self.device_of_stage(s)}")
        return "\n".join(lines)
