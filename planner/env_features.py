"""Observation features for learned searches: the graph, the partial plan, memory so far. TF-free.

`Features(env, pruner).observe(state)` returns one fixed-length float32 vector per state:

  graph (constant within a search, so one network can in principle serve several graphs):
    op-type histogram (matmul, conv, elementwise, reduction, gather, update, other), log10 of
    FLOPs, parameters and batch, linkage and pipeline unit counts, training-state bytes over
    device memory;
  partial plan: `PlanEnv.observation` (next decision kind and index, mesh, micro-batches, one
    slot per unit, one per cut);
  context of the next decision: the next unit's share of parameter bytes, the forward compute
    share before the last cut and the share an even split would put there;
  memory so far: the pruner's per-device lower bound over device memory, and whether it
    already overflows.
"""

import math

import numpy as np

from tf_fusionstitch.planner import cost_model as cm
from tf_fusionstitch.planner import op_rules

_CATEGORIES = ("matmul", "conv", "elementwise", "reduction", "gather", "update", "other")


def _category(op_type):
    if op_rules.is_matmul(op_type) or op_type == "Einsum":
        return "matmul"
    if op_type.startswith(("Conv", "DepthwiseConv")):
        return "conv"
    if op_rules.is_elementwise(op_type) or op_type.startswith("Bias"):
        return "elementwise"
    if op_rules.is_reduction(op_type) or op_type.startswith("Softmax") or \
            op_type.endswith("SoftmaxCrossEntropyWithLogits"):
        return "reduction"
    if "Gather" in op_type or "Segment" in op_type:
        return "gather"
    if op_rules.writes_variable(op_type):
        return "update"
    return "other"


def graph_features(env):
    graph, cost = env.graph, env.cost
    counted = [op for op in graph.ops.values() if not op_rules.is_free(op.type)]
    hist = [0.0] * len(_CATEGORIES)
    for op in counted:
        hist[_CATEGORIES.index(_category(op.type))] += 1
    hist = [h / max(1, len(counted)) for h in hist]
    flops = sum(op.flops for op in graph.ops.values())
    params = sum(math.prod(v.shape) for v in graph.trainable_variables())
    state_bytes = sum(v.nbytes * (2 if v.trainable and cost.training else 1)
                      for v in graph.variables.values())
    return hist + [math.log10(1 + flops) / 20, math.log10(1 + params) / 12,
                   math.log10(1 + graph.batch_size) / 4, env.num_units / 16,
                   cost.num_units / cm.CostModel.MAX_PIPELINE_UNITS,
                   min(8.0, state_bytes / env.cluster.memory) / 8]


class Features:
    """Fixed-length observations of states of one `PlanEnv` (see the module docstring)."""

    def __init__(self, env, pruner):
        self.env, self.pruner = env, pruner
        self._graph = graph_features(env)
        cost = env.cost
        total = sum(v.nbytes for v in env.graph.variables.values()) or 1.0
        self._unit_share = [sum(env.graph.variables[n].nbytes for n, _ in u.variables) / total
                            for u in env.link.units]
        forward = [0.0] * cost.num_units
        c = env.cluster
        for op in cost.forward:
            forward[cost.unit_of[op.name]] += cm.roofline_time(op.flops, op.bytes, c.flops,
                                                               c.memory_bandwidth)
        acc = np.cumsum([0.0] + forward)
        self._compute_before = acc / (acc[-1] or 1.0)   # share before pipeline unit i
        self._memo = {}    # searches revisit prefixes thousands of times
        self.size = len(self.observe(env.reset()))

    def observe(self, state):
        if state not in self._memo:
            self._memo[state] = self._observe(state)
        return self._memo[state]

    def _observe(self, state):
        env = self.env
        dec = env.decision(state)
        mesh, _, _, cuts = env.parse(state)
        is_unit = dec is not None and dec.kind == "unit"
        context = [self._unit_share[dec.index] if is_unit else 0.0]
        if mesh is not None and mesh[2] > 1:
            positions = list(range(1, env.cost.num_units))
            last = positions[cuts[-1]] if cuts else 0
            context += [float(self._compute_before[last]), (len(cuts) + 1) / mesh[2]]
        else:
            context += [0.0, 0.0]
        lb = self.pruner.memory_lower_bound(state) / self.pruner.memory
        memory = [min(lb, 4.0) / 4, float(lb > 1.0)]
        return np.asarray(self._graph + env.observation(state) + context + memory,
                          dtype=np.float32)
