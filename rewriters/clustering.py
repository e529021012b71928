"""Form clusters of fusible nodes: greedy producer-consumer merging (fusion="stitch";
xla_like.py holds XLA's rules, fusion="xla_like").

Every merge is checked by legality.py's predicates, cheapest first: a loop
recurrence's ops stay apart; no cycle (cycles.ClusterGraph, with every
cluster formed so far counted as one node, so the fused nodes can be
scheduled); the merged nodes lower to one valid cluster and the schedule
accepts it (one iteration space, one set of reduced axes, outputs that are
written once). A reduction therefore joins its broadcast consumers: a
layernorm or a softmax becomes one cluster. Stateful ops are never
fusible, so their order is never changed.

The last rule is decided without lowering when both clusters are
uniform elementwise clusters of one shape (uniform_merge.py: the verdict
then follows exactly from their summaries); otherwise, and whenever the
summaries cannot tell, by lowering and scheduling the merged nodes, each
structure's verdict remembered (pattern_key.py).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set

from tf_fusionstitch.rewriters import cycles, legality, op_table
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor
from tf_fusionstitch.rewriters.uniform_merge import UniformMerges


def fusible_nodes(view: GraphView, fetches: Set[Tensor]) -> Dict[str, str]:
    """Node -> '' if fusible alone, else the reason it stays a TF op (only for
    ops in the op table; other ops are simply not candidates)."""
    verdict: Dict[str, str] = {}
    for name in view.order:
        node = view.nodes[name]
        rule = op_table.OP_TABLE.get(node.op)
        if rule is None:
            continue
        if node.device and "CPU" not in node.device.upper():
            verdict[name] = f"placed on {node.device}"
            continue
        extra_ports = [p for (n, p) in view.data_consumers if n == name and p > 0] \
            if view.num_outputs[name] > 1 else []
        if extra_ports or any(t[0] == name and t[1] > 0 for t in fetches):
            verdict[name] = "an auxiliary output is used"
            continue
        verdict[name] = legality.one_kernel(view, [name], fetches, exact=True).reason
    return verdict


def grow_clusters(view: GraphView, candidates: Set[str], decide, joined=None,
                  refusals: Optional[legality.Refusals] = None) -> List[List[str]]:
    """Visits edges in topological order of the consumer and merges the
    producer's cluster into the consumer's where `decide(merged, owner,
    members, fusion, producer)` gives an OK legality.Decision; a refusal
    goes to `refusals` (if given) for the edge's two nodes. `owner` maps a node to
    its cluster's key, `members` a key to its nodes, both as formed so far;
    `fusion` and `producer` are the two clusters' keys, and `merged` the
    consumer's cluster's nodes, then the producer's. `joined(fusion,
    producer, owner, members)`, if given, hears of each merge before owner
    and members change.

    A node joins a cluster only as a visited consumer or as the producer of
    one, and producers come first: while a consumer is visited, every node
    placed after it in view.order is still alone, so `decide` may pass the
    consumer's position (the last of `merged`) as creates_cycle's `after`."""
    owner = {n: n for n in candidates}
    members: Dict[str, List[str]] = {n: [n] for n in candidates}
    for consumer in view.order:
        if consumer not in candidates:
            continue
        for src, _ in view.data_inputs[consumer]:
            if src not in candidates:
                continue
            producer, fusion = owner[src], owner[consumer]
            if producer == fusion:
                continue
            merged = members[fusion] + members[producer]
            decision = decide(merged, owner, members, fusion, producer)
            if not decision:
                if refusals is not None:
                    refusals.note((consumer, src), decision)
                continue
            if joined is not None:
                joined(fusion, producer, owner, members)
            for n in members[producer]:
                owner[n] = fusion
            members[fusion] = merged
            del members[producer]
    return [sorted(m, key=view.position.get) for m in members.values()]


def form_clusters(view: GraphView, candidates: Set[str], fetches: Set[Tensor],
                  recurrence: Optional[Dict[str, int]] = None,
                  summaries: bool = True, cycle_walk: bool = False,
                  refusals: Optional[legality.Refusals] = None) -> List[List[str]]:
    """Greedy: merge along every edge whenever the result is legal.
    `recurrence`: in a loop's body, node -> its recurrence
    (recurrences.recurrence_ids). `summaries=False` decides every merge by
    the full check (lowering and scheduling the merged nodes): the reference
    that uniform_merge.py's shortcut must agree with. `cycle_walk=True`
    checks cycles by creates_cycle's walk through whole clusters, the
    reference for ClusterGraph's incremental check. `refusals` hears why
    each refused merge was refused."""

    position = view.position
    recurrence = recurrence or {}
    uniform = UniformMerges(view, candidates, fetches) if summaries else None
    graph = None if cycle_walk else cycles.ClusterGraph(view)

    def closes_cycle(nodes: List[str], owner, members, fusion, producer, last) -> bool:
        if graph is not None:
            return graph.creates_cycle(fusion, producer, owner)
        return cycles.creates_cycle(view, set(nodes), owner, members, after=position[last])

    def decide(nodes: List[str], owner, members, fusion, producer) -> legality.Decision:
        # the consumer being visited is the last of `nodes` (grow_clusters)
        last = max(nodes, key=position.__getitem__)
        return legality.first_refusal(
            lambda: legality.one_recurrence(recurrence, nodes),
            lambda: legality.acyclic(closes_cycle(nodes, owner, members, fusion, producer,
                                                  last)),
            lambda: legality.OK if uniform is not None and uniform.legal(
                fusion, producer, last, owner, members)
            else legality.one_kernel(view, nodes, fetches))

    hooks = [kept.join for kept in (uniform, graph) if kept is not None]

    def joined(*merge) -> None:
        for hook in hooks:
            hook(*merge)

    return grow_clusters(view, candidates, decide, joined=joined, refusals=refusals)
