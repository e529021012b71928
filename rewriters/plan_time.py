"""A step's time under a fusion plan on a CPU of few cores: the plan-level
terms of the CPU cost model. cpu_cost_model.py prices one kernel alone (its
launch, bytes and arithmetic); this prices how the plan's kernels and TF's
other ops share the machine, which a sum of kernel times cannot see:

- occupancy: a kernel that TF's thread pool splits into shards keeps several
  cores busy, so a matmul beside it slows down; a small kernel (one shard)
  leaves the other cores to whatever else is ready;
- the critical path: a step cannot end before its longest chain of
  dependent ops, however idle the cores are;
- packs that hold back work: a pack starts when its last member's inputs
  exist and its outputs exist only when all its members are done, so a
  member on the critical path waits for the others.

The model is a small simulation of TF's executor (docs/DESIGN.md, "The
plan model"; `simulate` says how it hands units to threads): every unit (a
kernel of the plan, or an op TF runs alone) runs when all its inputs exist,
on one of the executor's threads, inline after the unit that made it ready
when it is cheap; running units share the cores in proportion to the cores
each can use (processor sharing: the OS time-slices oversubscribed pool
threads). The predicted step time is when the last unit ends.

No TensorFlow import here: the same model runs on a GraphView (a plan) and,
in cpu_costs.py, on TF's own graphs to measure its error on this machine.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
from typing import Callable, Dict, List, Optional, Sequence, Set

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters import op_table
from tf_fusionstitch.rewriters.cpu_cost_model import DYNAMIC_EXTENT, LAUNCH_OP_ELEMENTS
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor
from tf_fusionstitch.rewriters.packing import boundary_tensors


@dataclasses.dataclass(frozen=True)
class Unit:
    """What the executor runs as one: a plan's kernel, or an op alone."""
    name: str
    launch_s: float        # the executor's own time for it, on one core
    work_s: float          # core-seconds of its kernel's work
    width: int             # cores its work can use at once (its shards)
    inputs: tuple = ()     # indices of the units it waits for

    @property
    def alone_s(self) -> float:
        """Its time with the machine to itself."""
        return self.launch_s + self.work_s / self.width


def width(work_s: float, cores: int, grain_s: float) -> int:
    """Cores a kernel's work keeps busy: TF's thread pool (Shard) cuts work
    into shards of at least `grain_s` of one core's time."""
    return max(1, min(cores, int(work_s // grain_s)))


@dataclasses.dataclass(frozen=True)
class PlanTime:
    """The simulated step."""
    step_s: float            # when the last unit ends
    critical_path_s: float   # the longest chain of units, each alone
    work_s: float            # core-seconds of all units (launches included)
    cores: int

    @property
    def busy(self) -> float:
        """Fraction of the cores' time the step keeps busy."""
        return self.work_s / (self.cores * self.step_s) if self.step_s > 0 else 0.0

    def __str__(self) -> str:
        return (f"{self.step_s * 1e3:.3f} ms (critical path {self.critical_path_s * 1e3:.3f} ms, "
                f"cores {100 * self.busy:.0f}% busy)")


def simulate(units: Sequence[Unit], cores: int, threads: Optional[int] = None,
             inline_s: float = 0.0) -> PlanTime:
    """TF's executor running `units` (each unit's inputs come before it) on
    `cores` cores with `threads` executor threads (TF's inter-op pool: one
    per core by default):

    - the units that read nothing start as tasks of the pool;
    - a thread that ends a unit runs the readers it made ready that take at
      most `inline_s` itself, one after the other (TF runs ops it measured
      below 8,000 cycles inline); of the others, it keeps the last for
      itself when it has nothing inline, and hands the rest to the pool;
    - an idle thread runs its own next unit, else the pool's oldest;
    - running units share the cores: each progresses at min(1, cores /
      the cores all of them can use).

    A unit with no time at all (an alias) ends when it is run."""
    threads = threads or cores
    n = len(units)
    waiting = [len(set(u.inputs)) for u in units]
    readers: List[List[int]] = [[] for _ in range(n)]
    for i, u in enumerate(units):
        for j in sorted(set(u.inputs)):
            readers[j].append(i)
    pool = collections.deque(i for i in range(n) if waiting[i] == 0)
    own: List[collections.deque] = [collections.deque() for _ in range(threads)]
    current: List[Optional[int]] = [None] * threads
    remaining: Dict[int, float] = {}   # running unit -> its time alone still to go
    now, done = 0.0, 0
    finish = [0.0] * n

    def complete(i: int, thread: int) -> None:
        nonlocal done
        finish[i], done = now, done + 1
        expensive = []
        for r in readers[i]:
            waiting[r] -= 1
            if waiting[r] == 0:
                if units[r].alone_s <= inline_s:
                    own[thread].append(r)
                else:
                    expensive.append(r)
        if expensive:
            pool.extend(expensive[:-1])
            (own[thread] if not own[thread] else pool).append(expensive[-1])

    def start_idle_threads() -> None:
        for t in range(threads):
            while current[t] is None and (own[t] or pool):
                i = own[t].popleft() if own[t] else pool.popleft()
                if units[i].alone_s == 0:
                    complete(i, t)
                else:
                    current[t], remaining[i] = i, units[i].alone_s

    while done < n:
        start_idle_threads()
        running = [i for i in current if i is not None]
        if done == n:
            break
        if not running:
            raise ValueError("the units' inputs form a cycle")
        rate = min(1.0, cores / sum(units[i].width for i in running))
        now += min(remaining[i] for i in running) / rate
        step = min(remaining[i] for i in running)
        for t, i in enumerate(current):
            if i is None:
                continue
            remaining[i] -= step
            if remaining[i] <= 1e-12 * units[i].alone_s:
                del remaining[i]
                current[t] = None
                complete(i, t)
    return PlanTime(max(finish, default=0.0), critical_path(units),
                    math.fsum(u.launch_s + u.work_s for u in units), cores)


def critical_path(units: Sequence[Unit]) -> float:
    """The longest chain of units, each with the machine to itself."""
    end = []
    for u in units:
        end.append(u.alone_s + max((end[j] for j in u.inputs), default=0.0))
    return max(end, default=0.0)


# -- pricing the ops of a GraphView -------------------------------------------

# Ops that alias or name a value: no kernel, no time.
FREE_OPS = frozenset({"Identity", "IdentityN", "NoOp", "Const", "Placeholder", "_Arg",
                      "_Retval", "Reshape", "StopGradient", "Snapshot", "Squeeze",
                      "ExpandDims", "Shape", "ShapeN", "Size", "Rank", "PreventGradient"})


# Unknown axes of one tensor priced at DYNAMIC_EXTENT; any further ones at 1.
# A graph's inputs have a batch and maybe a sequence axis of unknown size; a
# tensor with more unknown axes is a reshape of those (a grouped-query
# attention's gradient reshapes to ten unknown axes): DYNAMIC_EXTENT on every
# axis would price it at 32^10 elements.
PRICED_UNKNOWN_AXES = 2


class Sizes:
    """A graph's tensor sizes as the plan model prices them: static ones,
    the traced call's where `typical(t)` knows them (a list per axis, None
    where it does not), DYNAMIC_EXTENT for the rest (for at most
    PRICED_UNKNOWN_AXES of a tensor's axes, 1 beyond)."""

    def __init__(self, view: GraphView,
                 typical: Optional[Callable[[Tensor], Optional[list]]] = None):
        self.view, self._typical = view, typical

    def extents(self, t: Tensor, typical: bool = True) -> Optional[List[int]]:
        """Per axis, its size; None for a tensor of unknown type. With
        typical=False, every unknown size is DYNAMIC_EXTENT."""
        tt = self.view.type_of(t)
        if tt is None:
            return None
        known = self._typical(t) if typical and self._typical and None in tt.shape else None
        if known is None or len(known) != len(tt.shape):
            known = [None] * len(tt.shape)
        extents, unknown = [], 0
        for d, k in zip(tt.shape, known):
            if d is None and k is None:
                unknown += 1
                d = DYNAMIC_EXTENT if unknown <= PRICED_UNKNOWN_AXES else 1
            extents.append(d if d is not None else k)
        return extents

    def elements(self, t: Tensor, typical: bool = True) -> int:
        ext = self.extents(t, typical)
        return 0 if ext is None else math.prod(ext)

    def bytes(self, t: Tensor) -> int:
        tt = self.view.type_of(t)
        return 0 if tt is None else self.elements(t) * ir.DTYPE_BYTES.get(tt.dtype, 4)


def _attr_bool(node, name: str) -> bool:
    return name in node.attr and node.attr[name].b


def _contracted(sizes: Sizes, name: str) -> Optional[int]:
    """Per output element, the products a contraction sums (its contracted
    extent), or None for an op that is not a contraction (or whose input
    types are unknown). The flops are 2 x output elements x this."""
    view = sizes.view
    node, inputs = view.nodes[name], view.data_inputs[name]
    op = node.op
    if op in ("MatMul", "_FusedMatMul"):
        a = sizes.extents(inputs[0])
        return a and a[0 if _attr_bool(node, "transpose_a") else 1]
    if op.startswith("BatchMatMul"):
        a = sizes.extents(inputs[0])
        return a and a[-2 if _attr_bool(node, "adj_x") else -1]
    if op in ("Conv2D", "_FusedConv2D", "Conv3D"):
        f = sizes.extents(inputs[1])
        return f and math.prod(f[:-1])        # window x input channels
    if op == "DepthwiseConv2dNative":
        f = sizes.extents(inputs[1])
        return f and f[0] * f[1]
    if op in ("Conv2DBackpropInput", "Conv3DBackpropInputV2"):
        f = sizes.extents(inputs[1])
        return f and math.prod(f[:-2]) * f[-1]  # window x output channels
    if op == "DepthwiseConv2dNativeBackpropInput":
        f = sizes.extents(inputs[1])
        return f and f[0] * f[1] * f[3]
    if op == "Einsum":
        return _einsum_contracted(sizes, name)
    return None


def _backprop_filter_flops(sizes: Sizes, name: str) -> Optional[int]:
    """A filter gradient does the forward convolution's products: the
    output gradient's elements x window x input channels (per group)."""
    view = sizes.view
    node, inputs = view.nodes[name], view.data_inputs[name]
    if node.op not in ("Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropFilter",
                       "Conv3DBackpropFilterV2"):
        return None
    f, dy = sizes.extents((name, 0)), sizes.elements(inputs[2])
    if f is None:
        return None
    per = math.prod(f[:-2]) if node.op.startswith("Depthwise") else math.prod(f[:-1])
    return 2 * dy * per


def _einsum_contracted(sizes: Sizes, name: str) -> Optional[int]:
    view = sizes.view
    equation = view.nodes[name].attr["equation"].s.decode()
    lhs, _, out = equation.replace(" ", "").partition("->")
    label_sizes: Dict[str, int] = {}
    for labels, t in zip(lhs.split(","), view.data_inputs[name]):
        ext = sizes.extents(t)
        if ext is None or "." in labels or len(labels) != len(ext):
            return None
        label_sizes.update(zip(labels, ext))
    return math.prod(size for label, size in label_sizes.items() if label not in out)


def contraction_flops(sizes: Sizes, name: str) -> Optional[int]:
    """Multiply-adds x 2 of a matmul or convolution, or None for another op."""
    flops = _backprop_filter_flops(sizes, name)
    if flops is not None:
        return flops
    k = _contracted(sizes, name)
    if k is None:
        return None
    return 2 * k * sum(sizes.elements((name, p)) for p in range(sizes.view.num_outputs[name]))


def op_bytes(sizes: Sizes, name: str) -> int:
    """Bytes an op alone reads and writes."""
    view = sizes.view
    return sum(sizes.bytes(t) for t in view.data_inputs[name]) + \
        sum(sizes.bytes((name, p)) for p in range(view.num_outputs[name]))


# The cache traffic of the op the calibration times "launch" on: x * y, float32.
LAUNCH_BYTES = 12 * LAUNCH_OP_ELEMENTS


@dataclasses.dataclass(frozen=True)
class Machine:
    """The costs the plan model reads (cpu_cost_model.BUILTIN's names)."""
    cores: int
    launch_s: float
    bandwidth: float         # bytes/s of all cores together, streaming from memory
    matmul_flops: float      # flop/s of all cores together
    grain_s: float
    inline_s: float = 0.0    # ops up to this long run inline (simulate)
    cache_bytes: int = 0     # traffic up to this stays in a core's cache...
    cache_bandwidth: float = 0.0  # ...and moves at this (all cores together)

    @classmethod
    def from_costs(cls, costs: Dict) -> "Machine":
        return cls(int(costs["cores"]), costs["launch"], costs["stream_bandwidth"],
                   costs["matmul_flops"], costs["parallel_grain"], costs["inline_op"],
                   2 * costs["row_cache_bytes"], costs["bandwidth"] * costs["cache_speedup"])

    def memory_seconds(self, traffic: float) -> float:
        """Seconds on all cores to move `traffic` bytes: from a core's cache
        when they fit in it (a small op's operands, just written by the op
        before), else from memory. The calibration's launch is the time of
        an op whose cache traffic is LAUNCH_BYTES: only the excess counts."""
        if 0 < traffic <= self.cache_bytes and self.cache_bandwidth > 0:
            return max(traffic - LAUNCH_BYTES, 0) / self.cache_bandwidth
        return traffic / self.bandwidth

    def unit(self, name: str, machine_seconds: float, launches: bool,
             inputs: tuple = ()) -> Unit:
        """A unit whose work takes `machine_seconds` on all cores."""
        work = machine_seconds * self.cores
        return Unit(name, self.launch_s if launches else 0.0, work,
                    width(work, self.cores, self.grain_s), inputs)

    def op_seconds(self, sizes: Sizes, name: str) -> float:
        """An op's work alone on all cores: its flops (matmuls, convolutions)
        or its bytes (everything else); 0 for ops that alias."""
        if sizes.view.nodes[name].op in FREE_OPS:
            return 0.0
        flops = contraction_flops(sizes, name)
        if flops is not None:
            return flops / self.matmul_flops
        return self.memory_seconds(op_bytes(sizes, name))


def plan_units(sizes: Sizes, groups: Sequence[Sequence[str]], machine: Machine,
               kernel_seconds: Callable[[Sequence[str]], float]) -> List[Unit]:
    """The units of the graph under a plan: each group of `groups` (a
    kernel of the plan, or a candidate op it leaves alone) is one unit,
    whose work on all cores `kernel_seconds(nodes)` prices; every other
    node is a unit alone (machine.op_seconds). In a topological order of
    the units (the plan's groups must not feed each other in a cycle),
    earliest first node first."""
    view = sizes.view
    owner: Dict[str, int] = {}
    members: List[List[str]] = []
    for g in groups:
        for n in g:
            owner[n] = len(members)
        members.append(list(g))
    for n in view.order:
        if n not in owner:
            owner[n] = len(members)
            members.append([n])
    reads = [{owner[src] for n in nodes
              for src in [s for s, _ in view.data_inputs[n]] + view.control_inputs[n]} - {g}
             for g, nodes in enumerate(members)]
    order = _topological(reads, [min(view.position[n] for n in m) for m in members])
    index = {g: i for i, g in enumerate(order)}
    units = []
    for g in order:
        nodes = members[g]
        if g < len(groups):
            seconds = kernel_seconds(nodes)
            launches = any(op_table.is_memory_intensive(view.nodes[n].op) for n in nodes)
        else:
            seconds = machine.op_seconds(sizes, nodes[0])
            launches = view.nodes[nodes[0]].op not in FREE_OPS
        units.append(machine.unit(nodes[0], seconds, launches,
                                  tuple(sorted(index[r] for r in reads[g]))))
    return units


def _topological(reads: List[Set[int]], first: List[int]) -> List[int]:
    """Kahn's order of the groups, the earliest first node first among
    those ready (a group's first node can come after a node of a group
    that reads it: {a, c} reads b, b reads a)."""
    waiting = [len(r) for r in reads]
    readers: List[List[int]] = [[] for _ in reads]
    for g, r in enumerate(reads):
        for src in r:
            readers[src].append(g)
    ready = [(first[g], g) for g in range(len(reads)) if not waiting[g]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, g = heapq.heappop(ready)
        order.append(g)
        for r in readers[g]:
            waiting[r] -= 1
            if not waiting[r]:
                heapq.heappush(ready, (first[r], r))
    if len(order) != len(reads):
        raise ValueError("the plan's groups feed each other in a cycle")
    return order


def predict(sizes: Sizes, groups: Sequence[Sequence[str]], machine: Machine,
            kernel_seconds: Callable[[Sequence[str]], float],
            threads: Optional[int] = None) -> PlanTime:
    """The simulated step of the graph under the plan `groups`."""
    return simulate(plan_units(sizes, groups, machine, kernel_seconds), machine.cores, threads,
                    machine.inline_s)


def fused_seconds(sizes: Sizes, fetches: Set[Tensor], machine: Machine,
                  compute_of: Callable[[str], float]) -> Callable[[Sequence[str]], float]:
    """A kernel's work on all cores: the larger of the bytes that enter and
    leave it and its ops' arithmetic. `compute_of(op)`: the delta
    evaluator's seconds of the op's compute-bound primitives, priced with
    DYNAMIC_EXTENT for unknown sizes; scaled here to `sizes` by the op's
    output elements."""
    view = sizes.view

    def compute(name: str) -> float:
        seconds = compute_of(name)
        if seconds:
            seconds *= sizes.elements((name, 0)) / max(sizes.elements((name, 0), False), 1)
        return seconds

    def seconds(nodes: Sequence[str]) -> float:
        memory = sum(sizes.bytes(t) for t in boundary_tensors(view, nodes, fetches))
        return max(machine.memory_seconds(memory), math.fsum(compute(n) for n in nodes))
    return seconds
