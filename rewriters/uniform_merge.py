"""Deciding a merge of two uniform clusters from their summaries, without
lowering the merged nodes (clustering.py's greedy merging, fast path).

The greedy loop checks every merge by lowering and scheduling the whole
merged set, so a cluster that grows by thousands of merges (an optimizer's
per-variable scalar arithmetic, a long elementwise chain) is lowered
thousands of times. For one kind of cluster the verdict follows from a few
facts kept per cluster:

A node is *uniform of shape S* (S fully static) when its lowering alone
- emits, by its op-table rule, only elementwise primitives (unary, binary,
  select, scalar constants), each of shape S but for scalar constants;
- reads kernel inputs of shape S or scalars only;
- maps every output that is used or fetched to an op its rule emitted (not
  an input passed through, not an inlined constant), typed as TF types it.

A cluster is uniform of shape S when all its nodes are. Lowering a node
reads of its inputs only their types, Const values and inlinable scalars,
never whether they come from inside the set, and an output's value has the
type its readers would see as an input, so a node lowers inside a uniform
cluster to the ops it lowers to alone. The merged lowering then has no
reduction, no reshape, no dynamic extent and no output of another shape:
every check of lowering (a value used but not lowered, one value leaving
twice), of Cluster.validate (each op is one that validated alone) and of
the schedule and cpu_schedule passes, except two:
- the size limits (fusion_ir.MAX_INPUTS, MAX_OPS), counted exactly from
  each cluster's kernel inputs, inlined constants and rule ops;
- at least one output: the last node of the merged set has one when it has
  a reader (every reader comes later, outside the set) or is fetched.
When both hold the merge is legal; when any of this is not known, the
caller runs the full check. A summary never decides a refusal.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Set

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor
from tf_fusionstitch.rewriters.lowering import inlinable_scalar, lower_nodes
from tf_fusionstitch.rewriters.op_table import OP_TABLE, NotFusible

ELEMENTWISE_PRIMS = frozenset(ir.UNARY + ir.BINARY + ir.TERNARY + ir.CONSTANT)


@dataclasses.dataclass
class Summary:
    """What the merged lowering of a uniform cluster's nodes counts."""
    shape: tuple        # S
    feeds: Set[Tensor]  # tensors read from outside as kernel inputs
    inlined: Set[Tensor]  # scalar Const tensors read from outside, inlined
    rule_ops: int       # ops its nodes' rules emit (inlined constants apart)


def _reads(view: GraphView, name: str):
    """(kernel inputs, inlined scalars) that `name` reads when lowered alone."""
    rule = OP_TABLE[view.nodes[name].op]
    feeds, inlined = set(), set()
    for i, t in enumerate(view.data_inputs[name]):
        if i not in rule.static_inputs:
            (inlined if inlinable_scalar(view, t) is not None else feeds).add(t)
    return feeds, inlined


def node_summary(view: GraphView, name: str, fetches: Set[Tensor]) -> Optional[Summary]:
    """The summary of `name` alone, or None when it is not uniform (or does
    not lower alone)."""
    feeds, inlined = _reads(view, name)
    try:
        lowered = lower_nodes(view, [name], fetches)
    except (NotFusible, ir.SpecError):
        return None
    cluster = lowered.cluster
    if len(cluster.inputs) != len(feeds):
        return None
    # lower_nodes inlines a node's scalar inputs before its rule emits anything
    consts, ops = cluster.ops[:len(inlined)], cluster.ops[len(inlined):]
    if any(op.prim != "const" for op in consts) or not lowered.output_tensors:
        return None
    shape = view.type_of(lowered.output_tensors[0]).shape
    if not all(type(d) is int for d in shape):
        return None
    if any(op.prim not in ELEMENTWISE_PRIMS or
           not (op.type.shape == shape or op.prim == "const" and op.type.shape == ())
           for op in ops):
        return None
    if any(t.shape not in (shape, ()) for _, t in cluster.inputs):
        return None
    by_name = {op.name: op for op in ops}
    for value, t in zip(cluster.outputs, lowered.output_tensors):
        op = by_name.get(value)
        if op is None or op.type != view.type_of(t) or op.type.shape != shape:
            return None
    return Summary(shape, feeds, inlined, len(ops))


def _produced_by(tensors: Set[Tensor], key: str, members: List[str],
                 owner: Dict[str, str], view: GraphView) -> Set[Tensor]:
    """The tensors of `tensors` that cluster `key` (`members`) produces,
    walking the smaller of the two."""
    if len(tensors) <= len(members):
        return {t for t in tensors if owner.get(t[0]) == key}
    return {(m, k) for m in members for k in range(view.num_outputs[m]) if (m, k) in tensors}


def _union_size(a: Set[Tensor], drop_a: Set[Tensor], b: Set[Tensor], drop_b: Set[Tensor]) -> int:
    """|(a - drop_a) | (b - drop_b)|, drop_a within a and drop_b within b."""
    if len(a) > len(b):
        a, drop_a, b, drop_b = b, drop_b, a, drop_a
    both = sum(1 for t in a if t not in drop_a and t in b and t not in drop_b)
    return len(a) - len(drop_a) + len(b) - len(drop_b) - both


def _merge_into_larger(a: Set[Tensor], drop_a: Set[Tensor],
                       b: Set[Tensor], drop_b: Set[Tensor]) -> Set[Tensor]:
    """(a - drop_a) | (b - drop_b), reusing the larger set (the smaller one
    is copied, so merging stays near-linear over a whole clustering)."""
    if len(a) < len(b):
        a, drop_a, b, drop_b = b, drop_b, a, drop_a
    a -= drop_a
    a.update(t for t in b if t not in drop_b)
    return a


class UniformMerges:
    """Summaries of the clusters grow_clusters forms, keyed like its `members`."""

    def __init__(self, view: GraphView, candidates: Set[str], fetches: Set[Tensor]):
        self._view = view
        self._fetches = fetches
        self._summary: Dict[str, Optional[Summary]] = {
            n: node_summary(view, n, fetches) for n in candidates}

    def _parts(self, fusion: str, producer: str, owner, members):
        """Per kind of read (feeds, inlined): both clusters' sets and what
        each reads that the other produces."""
        f, p = self._summary[fusion], self._summary[producer]
        for kind in ("feeds", "inlined"):
            a, b = getattr(f, kind), getattr(p, kind)
            yield (kind, a, _produced_by(a, producer, members[producer], owner, self._view),
                   b, _produced_by(b, fusion, members[fusion], owner, self._view))

    def _both_uniform(self, fusion: str, producer: str) -> bool:
        f, p = self._summary[fusion], self._summary[producer]
        return f is not None and p is not None and f.shape == p.shape

    def legal(self, fusion: str, producer: str, last: str, owner, members) -> bool:
        """True when the summaries prove merging cluster `producer` into
        `fusion` lowers and schedules as one kernel (`last`: the merged
        set's last node in view.position); False when they cannot tell."""
        if not self._both_uniform(fusion, producer):
            return False
        view = self._view
        if not any(view.data_consumers.get((last, k)) or (last, k) in self._fetches
                   for k in range(view.num_outputs[last])):
            return False
        sizes = {kind: _union_size(a, da, b, db)
                 for kind, a, da, b, db in self._parts(fusion, producer, owner, members)}
        ops = self._summary[fusion].rule_ops + self._summary[producer].rule_ops + sizes["inlined"]
        return sizes["feeds"] <= ir.MAX_INPUTS and ops <= ir.MAX_OPS

    def join(self, fusion: str, producer: str, owner, members) -> None:
        """Record that `producer` merged into `fusion` (call before owner and
        members change)."""
        if not self._both_uniform(fusion, producer):
            self._summary[fusion] = None
        else:
            merged = {kind: _merge_into_larger(a, da, b, db)
                      for kind, a, da, b, db in self._parts(fusion, producer, owner, members)}
            f, p = self._summary[fusion], self._summary[producer]
            self._summary[fusion] = Summary(f.shape, merged["feeds"], merged["inlined"],
                                            f.rule_ops + p.rule_ops)
        del self._summary[producer]
