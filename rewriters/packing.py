"""Kernel packing (remote fusion): kernels that no path connects share one
launch (PAPERS.md, section 1: "independent ops share a launch").

Input: the clusters a strategy formed. Every cluster with a memory-intensive
op is a *unit*; one packed cluster (a FusionStitch node of several
unconnected parts, codegen/pack.py) replaces a *pack* of units. Units are
visited in topological order, and each joins the open pack it can join that
grew last (kernels close in the order, so a pack holds back little work),
else opens one. A unit joins a pack when
- no path leads from one to the other (a path through other kernels too:
  packing both would make the pack wait for itself), and
- the pack stays within PACK_MAX_BYTES of inputs and outputs: a pack's
  outputs are allocated together and its inputs live until the whole pack
  runs, so packing big kernels (an optimizer's update of every weight)
  would hold much more memory at once for no gain (launches matter for
  small kernels).

Reachability is kept as bit sets over units: `desc[p]`, the units reachable
from pack p (through any nodes, every cluster counted as one node). Joining p and u makes everything that
reached either reach what both reach; the closure is updated in place, so
each check is two mask tests instead of a graph walk.

A lone op that stays with TensorFlow when alone (one primitive: no fusion
to gain) is a unit too: packed, it shares a launch.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set

from tf_fusionstitch.rewriters import op_table
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor

# Inputs plus outputs of one pack, bytes, at most (dimensions unknown at
# trace time counted as DYNAMIC_EXTENT).
PACK_MAX_BYTES = 64 << 20
DYNAMIC_EXTENT = 32  # as explore.COSTS["dynamic_extent"]
# Open packs a unit tries, the most recently grown first.
PACK_CANDIDATES = 8

_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
                "int32": 4, "int64": 8, "bool": 1}


def pack_clusters(view: GraphView, groups: List[List[str]],
                  fetches: Set[Tensor]) -> List[List[str]]:
    """`groups` (every candidate node in one, as the strategies return them)
    with packs merged; each group's nodes in topological order."""
    position = view.position
    units = [g for g in groups if any(op_table.is_memory_intensive(view.nodes[n].op)
                                      for n in g)]
    units.sort(key=lambda g: max(position[n] for n in g))
    desc = _descendants(view, groups, units)
    if desc is None:
        return groups
    size = [_boundary_bytes(view, g, fetches) for g in units]

    members: Dict[int, List[int]] = {}   # pack id (its first unit) -> units
    mask: Dict[int, int] = {}            # pack id -> bit set of its units
    recent: List[int] = []               # open pack ids, most recently grown last
    absorbed: Set[int] = set()           # units inside a pack of another id
    for u, _ in enumerate(units):
        joined = None
        if size[u] <= PACK_MAX_BYTES:
            for p in reversed(recent[-PACK_CANDIDATES:]):
                fits = sum(size[m] for m in members[p]) + size[u] <= PACK_MAX_BYTES
                if fits and not desc[p] & (1 << u) and not desc[u] & mask[p]:
                    joined = p
                    break
        if joined is None:
            members[u], mask[u] = [u], 1 << u
            recent.append(u)
            continue
        members[joined].append(u)
        absorbed.add(u)
        grown = mask[joined] | (1 << u)
        both = desc[joined] | desc[u]
        # Whatever reached either now reaches both's descendants; that
        # includes units not visited yet (a unit may reach one ordered
        # before it by its last node).
        for q in range(len(units)):
            if q not in absorbed and desc[q] & grown:
                desc[q] |= both
        desc[joined] = both
        mask[joined] = grown
        recent.remove(joined)
        recent.append(joined)

    packed = {n for g in units for n in g}
    out = [g for g in groups if not set(g) & packed]
    for p, us in members.items():
        out.append(sorted((n for u in us for n in units[u]), key=position.get))
    out.sort(key=lambda g: position[g[0]])
    return out


def _descendants(view: GraphView, groups: List[List[str]],
                 units: List[List[str]]) -> Optional[List[int]]:
    """Per unit, the bit set of units a path from it reaches (data or
    control) in the graph where every group is one node: a path may enter a
    cluster at one node and leave it at another."""
    node_of: Dict[str, object] = {n: ("group", i) for i, g in enumerate(groups) for n in g}
    unit_bit = {node_of[g[0]]: 1 << u for u, g in enumerate(units)}
    succ: Dict[object, Set[object]] = {}
    indegree: Dict[object, int] = {}
    for name in view.order:
        a = node_of.get(name, name)
        succ.setdefault(a, set())
        indegree.setdefault(a, 0)
        for c in view.consumers[name]:
            b = node_of.get(c, c)
            if b != a and b not in succ[a]:
                succ[a].add(b)
                indegree[b] = indegree.get(b, 0) + 1
    ready = [a for a, d in indegree.items() if d == 0]
    order = []
    while ready:
        a = ready.pop()
        order.append(a)
        for b in succ[a]:
            indegree[b] -= 1
            if indegree[b] == 0:
                ready.append(b)
    if len(order) != len(indegree):  # the strategies never leave one; pack nothing then
        return None
    below: Dict[object, int] = {}
    for a in reversed(order):
        bits = 0
        for b in succ[a]:
            bits |= below[b] | unit_bit.get(b, 0)
        below[a] = bits
    return [below[node_of[g[0]]] for g in units]


def _boundary_bytes(view: GraphView, nodes: List[str], fetches: Set[Tensor]) -> int:
    """Bytes of the tensors that enter and leave the group."""
    inside = set(nodes)
    tensors = set()
    for n in nodes:
        tensors.update(t for t in view.data_inputs[n] if t[0] not in inside)
        for port in range(view.num_outputs[n]):
            t = (n, port)
            if t in fetches or any(c not in inside for c in view.data_consumers.get(t, ())):
                tensors.add(t)
    total = 0
    for t in tensors:
        tt = view.type_of(t)
        if tt is None:
            continue
        count = 1
        for d in tt.shape:
            count *= DYNAMIC_EXTENT if d is None else d
        total += count * _DTYPE_BYTES.get(tt.dtype, 4)
    return total
