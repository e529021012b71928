"""The CPU cost model: the costs' vocabulary (BUILTIN) and FusionStitching's
delta evaluator (docs/PAPERS.md, "Cost models") that prices
fusion="explore"'s patterns with them. No TensorFlow import here:
cpu_costs.py measures the costs on the machine (TensorFlow's own kernels).

Delta evaluator f(P) = T_unfused - T_fused - T_penalty, in seconds:
- T_unfused: each memory-intensive op of P run alone by TF: a launch, plus
  the larger of its memory time (the bytes it reads and writes, at the
  costs' bandwidth) and its compute time (elements x seconds per element of
  the primitives that are compute-bound here);
- T_fused: one launch, plus the larger of the fused kernel's memory time (its
  inputs and outputs) and the compute of all its primitives. Extents unknown
  at trace time count as DYNAMIC_EXTENT. With no compute costs this is the
  paper's memory traffic saved plus launches saved;
- penalty (the paper's "simplified latency evaluator"): per-row buffered
  values beyond what stays in cache spill to DRAM and back; each column loop
  after the first re-reads the row's inputs from cache.

CpuEvaluator implements kernel_cost.KernelCostModel: `estimate` gives the
fused kernel's CpuEstimate (T_fused and the penalty, its latency their sum),
`delta` sets it against T_unfused.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable, Dict, FrozenSet, List, Optional, Set

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters import op_table
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor
from tf_fusionstitch.schedule import Schedule

def usable_cores() -> int:
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


# Extent assumed for a dimension unknown at trace time (the batch): only
# scales all terms alike, so the ranking of patterns hardly depends on it.
# A modelling choice, not a machine cost: never calibrated.
DYNAMIC_EXTENT = 32

# Costs used without calibration (costs="builtin", or when calibrating fails).
# Elements per tensor of the op chain the calibration (cpu_costs.py) times
# "launch" on: its operands' cache traffic (12 bytes per element) is inside
# the launch it measures.
LAUNCH_OP_ELEMENTS = 1 << 12

BUILTIN = {
    # Bytes/s. Measured once on this project's 2-core CPU machine: a fused
    # x * 2 + 1 over 4M float32 (16 MB read + 16 MB written) took 1.16 ms.
    "bandwidth": 29e9,
    # Seconds per memory-intensive kernel launch: one more TF Tanh op inside a
    # tf.function cost 0.8-2.6 us on that machine.
    "launch": 2e-6,
    # Cache re-reads (a loop after the first reads the row's inputs again) are
    # priced at bandwidth x this factor: two cores' caches against DRAM,
    # 5.9-12.7x as calibrated on this project's 2-core Intel Xeon machine.
    "cache_speedup": 8.0,
    # Per-row bytes that stay in cache between a row's loops: half of a 1 MiB
    # per-core L2.
    "row_cache_bytes": 512 * 1024,
    # Buffered (per-row) values live at once before they compete for cache;
    # each beyond this spills its row once. An assumption (the paper fixes 16
    # registers in its penalty), never calibrated.
    "max_live_buffers": 4,
    # Seconds per element of compute-bound primitives; empty: every op is
    # priced by its memory traffic alone.
    "compute": {},
    # The plan model's (plan_time.py). Cores the process may use: read from
    # the OS, not measured.
    "cores": usable_cores(),
    # Bytes/s of an elementwise op within a chain of them, whose output
    # takes the buffer of the input before it (TF forwards a buffer no one
    # else reads): no fresh pages to fault in, unlike "bandwidth"'s single
    # op, so about twice as fast (65-87 GB/s against 20-30 GB/s on this
    # project's machine). The plan model's (plan_time.py) memory rate.
    "stream_bandwidth": 58e9,
    # Flop/s of a float32 matmul on all cores: a 512 x 512 x 512 MatMul took
    # 2.7 ms on this project's 2-core machine.
    "matmul_flops": 1e11,
    # Seconds of one core's work below which TF's thread pool keeps a kernel
    # on one core: Shard cuts work into shards of at least 10,000 cost units
    # (about cycles), Eigen's elementwise ops take a second thread only past
    # about 200,000 cycles; 20 us at 2-3 GHz lies between. An assumption,
    # never calibrated: the plan model's measured error includes it.
    "parallel_grain": 20e-6,
    # Seconds below which TF's executor runs an op inline, in the thread
    # that made it ready, rather than as a task of its pool: 8,000 cycles
    # (kOpIsExpensiveThresholdCycles) at about 2.7 GHz. An assumption, as
    # parallel_grain.
    "inline_op": 3e-6,
    # The plan model's relative error predicting TF's own step time on the
    # calibration's graphs (cpu_costs.py); explore keeps its plan over the
    # rule plans only when it predicts a larger gain. An assumption here.
    "plan_error": 0.1,
}


class CalibrationError(RuntimeError):
    """A measurement came out outside what any machine could do."""


def validate(costs: Dict) -> Dict:
    """The costs, checked: every entry of BUILTIN present, finite and positive."""
    for name in BUILTIN:
        if name not in costs:
            raise CalibrationError(f"costs lack {name!r}")
    for name in ("bandwidth", "launch", "cache_speedup", "row_cache_bytes", "max_live_buffers",
                 "cores", "stream_bandwidth", "matmul_flops", "parallel_grain",
                 "inline_op"):
        value = costs[name]
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise CalibrationError(f"cost {name}={value!r} is not a positive number")
    error = costs["plan_error"]
    if not isinstance(error, (int, float)) or not 0 <= error < 1:
        raise CalibrationError(f"cost plan_error={costs['plan_error']!r} is not in [0, 1)")
    for prim, value in costs["compute"].items():
        if prim not in ir.EXPENSIVE or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            raise CalibrationError(f"compute cost {prim}={value!r} is not valid")
    return costs


@dataclasses.dataclass(frozen=True)
class LoweredPattern:
    """What the evaluator prices: a pattern's nodes as one kernel, lowered
    (lowering.lower_nodes) and scheduled for the CPU."""
    nodes: FrozenSet[str]
    cluster: ir.Cluster
    input_tensors: List[Tensor]    # the TF tensors the kernel reads
    output_tensors: List[Tensor]   # the TF tensors it writes
    schedule: Schedule


@dataclasses.dataclass(frozen=True)
class CpuEstimate:
    """A fused kernel's time on the CPU (kernel_cost.KernelEstimate)."""
    launch_s: float    # one launch, or none for a kernel of shape-only ops
    memory_s: float    # its inputs and outputs at the bandwidth
    compute_s: float   # its compute-bound primitives
    penalty_s: float   # spills and cache re-reads of its schedule

    @property
    def kernel_s(self) -> float:
        """T_fused: the launch and the larger of memory and compute."""
        return self.launch_s + max(self.memory_s, self.compute_s)

    @property
    def latency_s(self) -> float:
        return self.kernel_s + self.penalty_s


@dataclasses.dataclass(frozen=True)
class Delta:
    """f(P): what fusing a pattern saves against TF running its ops alone."""
    unfused_s: float
    fused: CpuEstimate

    @property
    def saved_s(self) -> float:
        return self.unfused_s - self.fused.kernel_s - self.fused.penalty_s


class CpuEvaluator:
    """The delta evaluator for one graph and one set of costs (BUILTIN's
    keys, validated). `lower_alone(name)` is the node's cluster lowered by
    itself (None when it does not lower): an op's compute alone, where no
    pattern of it alone was priced yet. Each op's time alone is computed
    once."""

    def __init__(self, view: GraphView, candidates: Set[str], costs: Dict,
                 lower_alone: Callable[[str], Optional[ir.Cluster]]):
        self.view, self.costs = view, costs
        self._lower_alone = lower_alone
        # node -> 1 when TF runs it as a kernel of its own (shape-only ops alias)
        self.launches = {n: int(op_table.is_memory_intensive(view.nodes[n].op))
                         for n in candidates}
        self._alone: Dict[str, float] = {}            # see seconds_alone
        self._compute_alone: Dict[str, float] = {}    # an op's compute, from its own lowering

    def note_compute_alone(self, name: str, compute_s: float) -> None:
        """Records an op's compute, priced from a pattern of it alone, so
        that seconds_alone does not lower it again."""
        self._compute_alone[name] = compute_s

    def _bytes(self, t: Tensor) -> int:
        return self.view.tensor_bytes(t, DYNAMIC_EXTENT)

    def compute_s(self, cluster: ir.Cluster) -> float:
        """Seconds of arithmetic of the cluster's compute-bound primitives."""
        per_element = self.costs["compute"]
        return sum(per_element[op.prim] * math.prod(
            DYNAMIC_EXTENT if d is None else d for d in op.type.shape)
            for op in cluster.ops if op.prim in per_element)

    def seconds_alone(self, name: str) -> float:
        """What one op costs run by TF alone: a launch plus the larger of its
        memory time (inputs and outputs) and its compute; 0 for ops that
        launch nothing (shape-only ops alias their input)."""
        if not self.launches.get(name):
            return 0.0
        if name not in self._alone:
            view = self.view
            traffic = sum(self._bytes(t) for t in view.data_inputs[name]) + \
                sum(self._bytes((name, p)) for p in range(view.num_outputs[name]))
            self._alone[name] = self.costs["launch"] + max(
                traffic / self.costs["bandwidth"], self.compute_alone(name))
        return self._alone[name]

    def compute_alone(self, name: str) -> float:
        """Seconds of one op's compute-bound primitives (0 when none, or
        when the op does not lower alone)."""
        if name not in self._compute_alone:
            # an op whose pattern alone was not priced yet
            cluster = self._lower_alone(name) if self.costs["compute"] else None
            self._compute_alone[name] = 0.0 if cluster is None else self.compute_s(cluster)
        return self._compute_alone[name]

    def estimate(self, kernel: LoweredPattern) -> CpuEstimate:
        """T_fused and the penalty of the kernel."""
        costs = self.costs
        compute = self.compute_s(kernel.cluster)
        if len(kernel.nodes) == 1:  # before seconds_alone would lower it again
            self.note_compute_alone(next(iter(kernel.nodes)), compute)
        traffic = sum(self._bytes(t) for t in kernel.input_tensors) + \
            sum(self._bytes(t) for t in kernel.output_tensors)
        launches = min(sum(self.launches.get(n, 0) for n in kernel.nodes), 1)
        return CpuEstimate(launches * costs["launch"], traffic / costs["bandwidth"], compute,
                           self._penalty(kernel))

    def delta(self, kernel: LoweredPattern) -> Delta:
        """f(kernel's nodes): its estimate against its ops run alone."""
        fused = self.estimate(kernel)
        # fsum: the same total in any order (a set's order follows string hashes)
        return Delta(math.fsum(self.seconds_alone(n) for n in kernel.nodes), fused)

    def _penalty(self, kernel: LoweredPattern) -> float:
        costs, schedule = self.costs, kernel.schedule
        types = kernel.cluster.types()
        ext = [DYNAMIC_EXTENT if e is None else e for e in schedule.static_extent]
        col = math.prod(ext[a] for a in schedule.col_axes) if schedule.col_axes else 1
        rows = math.prod(ext[a] for a in range(schedule.num_axes)
                         if a not in schedule.col_axes)
        bw = costs["bandwidth"]
        row_buffers = [col * ir.DTYPE_BYTES.get(types[v].dtype, 4) for v in schedule.buffered]
        spill = 0
        if sum(row_buffers) > costs["row_cache_bytes"]:
            spill += sum(row_buffers) - costs["row_cache_bytes"]
        extra = len(row_buffers) - costs["max_live_buffers"]
        if extra > 0:
            spill += sum(sorted(row_buffers)[:extra])
        penalty = 2 * spill * rows / bw  # written out and read back
        if schedule.num_loops > 1 and not schedule.tiled:
            row_inputs = sum(col * ir.DTYPE_BYTES.get(t.dtype, 4)
                             for name, t in kernel.cluster.inputs
                             if schedule.axes_of(name) & schedule.col_axes)
            penalty += (schedule.num_loops - 1) * row_inputs * rows / (
                bw * costs["cache_speedup"])
        return penalty
