"""Legality of one kernel: small named predicates that say why not.

Every fusion strategy asks the same questions of a set of nodes it would
fuse, and each answer is a Decision: OK, or the reason they cannot be one
kernel (XLA's FusionDecision). A strategy chains the predicates its rules
need with `first_refusal`, cheapest first:

- one_recurrence: in a loop's body a kernel holds the ops of at most one
  recurrence and nothing else (recurrences.py; explore.py says why);
- acyclic: no path leaves the nodes and comes back (cycles.py decides it);
- single_root, no_reduction_read: XLA's rules (fusion="xla_like");
- one_kernel: the nodes lower to one valid cluster (lowering.py) that the
  CPU schedule accepts (cpu_schedule: one iteration space, one set of
  reduced axes, outputs written once, and a kernel that pays on a CPU).

The fusion pass reports, for each op no kernel took, the first reason a
merge with it was refused (Refusals), so a report names the rule.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, Iterable, List, Set

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.codegen import kernel_ir, scatter
from tf_fusionstitch.rewriters import op_table, recurrences
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor
from tf_fusionstitch.rewriters.lowering import lower_nodes
from tf_fusionstitch.rewriters.pattern_key import pattern_key
from tf_fusionstitch.schedule import Schedule, UnsupportedCluster, build_schedule

# What lowering and scheduling raise for nodes that are not one kernel.
LOWERING_ERRORS = (op_table.NotFusible, ir.SpecError, UnsupportedCluster)


@dataclasses.dataclass(frozen=True)
class Decision:
    """OK (reason "") or a refusal with its reason; true when OK."""
    reason: str = ""

    def __bool__(self) -> bool:
        return not self.reason

    def __str__(self) -> str:
        return self.reason or "ok"


OK = Decision()


def refuse(reason: str) -> Decision:
    if not reason:
        raise ValueError("a refusal needs a reason")
    return Decision(reason)


def first_refusal(*checks: Callable[[], Decision]) -> Decision:
    """The first check that refuses, else OK; later checks do not run."""
    for check in checks:
        decision = check()
        if not decision:
            return decision
    return OK


class Refusals:
    """Per node, the first reason a kernel with it was refused."""

    def __init__(self):
        self.first: Dict[str, str] = {}

    def note(self, nodes: Iterable[str], decision: Decision) -> None:
        if not decision:
            for n in nodes:
                self.first.setdefault(n, decision.reason)


# -- predicates ----------------------------------------------------------------

def one_recurrence(recurrence: Dict[str, int], nodes: Iterable[str]) -> Decision:
    """`recurrence`: recurrences.recurrence_ids' map (empty outside loops)."""
    if recurrences.joins_apart(recurrence, nodes):
        return refuse("a loop recurrence's ops stay in a kernel of their own (the next "
                      "iteration would wait for the rest)")
    return OK


def acyclic(closes_cycle: bool) -> Decision:
    """`closes_cycle`: the verdict of one of cycles.py's checks."""
    return refuse("the kernel would create a cycle through ops outside it") \
        if closes_cycle else OK


def single_root(view: GraphView, nodes: List[str]) -> Decision:
    """XLA's fusion grows by fusing a producer into its consumer: one root
    (a member no other member reads); independent ops are never fused."""
    members = set(nodes)
    roots = [n for n in nodes if not any(c in members for c in view.consumers[n])]
    if len(roots) != 1:
        return refuse(f"{len(roots)} roots ({', '.join(roots[:3])}): sibling fusion")
    return OK


def no_reduction_read(cluster: ir.Cluster) -> Decision:
    """XLA's input fusion: nothing in a fusion reads a reduced value."""
    reduced = {op.name for op in cluster.ops if op.prim in ir.REDUCE}
    for op in cluster.ops:
        read = reduced.intersection(op.inputs)
        if read:
            return refuse(f"{op.prim} reads the reduction {sorted(read)[0]} in the same fusion")
    return OK


def lowered(view: GraphView, nodes: List[str], fetches: Set[Tensor],
            *checks: Callable[[ir.Cluster], Decision]) -> Decision:
    """`nodes` lowered to one cluster that passes `checks` and cpu_schedule."""
    try:
        cluster = lower_nodes(view, nodes, fetches).cluster
        for check in checks:
            decision = check(cluster)
            if not decision:
                return decision
        cpu_schedule(cluster)
    except LOWERING_ERRORS as e:
        return refuse(str(e))
    return OK


def one_kernel(view: GraphView, nodes: List[str], fetches: Set[Tensor],
               exact: bool = False) -> Decision:
    """`nodes` lower to one cluster that cpu_schedule accepts. Verdicts are
    remembered per structure (pattern_key.py) in the view's memo, so the
    layers of a deep model are lowered once. A refusal remembered from other
    nodes says so; with `exact` those nodes are lowered again, so the reason
    names their own ops."""
    key = ("legality.one_kernel", pattern_key(view, nodes, fetches))
    known = view.memo.get(key)
    if known is not None:
        decision, first = known
        if decision or list(nodes) == first:
            return decision
        if not exact:
            return refuse(f"{decision.reason} (as for the same structure at {first[0]})")
    decision = lowered(view, nodes, fetches)
    if known is None:
        view.memo[key] = (decision, list(nodes))
    return decision


# A reduction that keeps the innermost axis runs as blocks of CPU_LANES kept
# elements (kernel_ir.cpu_lanes), one work item each: it needs at least this
# many items, counted from the kept extents known at trace time, to spread
# over threads, unless it is short (at most STRIDED_REDUCTION_MAX reduced
# elements per kept element).
MIN_COLUMN_ITEMS = 2
STRIDED_REDUCTION_MAX = 4096


def cpu_schedule(cluster: ir.Cluster) -> Schedule:
    """The cluster's schedule where a CPU kernel of it pays: UnsupportedCluster
    for a reduction whose input is the same for every row, and for a long
    reduction that keeps the innermost axis over too few kept elements to
    use more than one thread (TF's kernel splits the reduced rows instead).
    A bias gradient's sum over the batch or NHWC batchnorm's statistics run
    as blocks of adjacent kept elements, the lanes innermost: a sum over
    16384 rows of 768 took 6.3 ms there against 6.4 ms for TF's Sum (49 ms
    as a thread per kept element walking its column a row apart)."""
    if scatter.is_scatter(cluster):   # legal as segment sums; priced by the rows they read
        return build_schedule(scatter.scatter_form(cluster).rows)
    schedule = build_schedule(cluster)
    ops = cluster.op_by_name()
    row_axes = set(range(schedule.num_axes)) - schedule.col_axes
    if row_axes and any(not schedule.axes_of(ops[r].inputs[0]) & row_axes
                        for r in schedule.reductions):
        # A reduction whose input is the same for every row (a Prod of shape
        # sizes, a gradient's element count) would be recomputed per row, and
        # the rows become single elements: 2.6x slower than TF on CRNN's
        # batchnorm gradient. It stays apart, where it runs once.
        raise UnsupportedCluster("a reduction that is the same for every row stays out of "
                                 "a kernel over rows")
    lanes = kernel_ir.cpu_lanes(schedule)
    if lanes:
        reduced = [schedule.static_extent[a] for a in schedule.col_axes]
        short = None not in reduced and math.prod(reduced) < STRIDED_REDUCTION_MAX
        kept = [schedule.static_extent[a] or 1 for a in sorted(row_axes)]
        items = math.prod(kept[:-1]) * -(-kept[-1] // lanes)
        if not short and items < MIN_COLUMN_ITEMS:
            raise UnsupportedCluster(
                f"a reduction that keeps the innermost axis over {kept[-1]} kept elements "
                "would run on one thread; it stays with TensorFlow, which splits the rows")
    return schedule
