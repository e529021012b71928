"""Kernel packing (remote fusion): kernels that no path connects share one
launch (docs/PAPERS.md, "Kernel packing").

Input: the clusters a strategy formed. Every cluster with a memory-intensive
op is a *unit*; one packed cluster (a FusionStitch node of several
unconnected parts, codegen/pack.py) replaces a *pack* of units. Units are
visited in topological order, and each joins the open pack it can join that
grew last (kernels close in the order, so a pack holds back little work),
else opens one. A unit joins a pack when
- no path leads from one to the other (a path through other kernels too:
  packing both would make the pack wait for itself), and
- the pack starts no later than any member may start without lengthening
  the longest path through the graph (in ops): a pack runs when the last of
  its members could, so a kernel on the critical path never waits for one
  computed off it (a recurrent cell's gate beside its state update), while
  an optimizer's updates, which nothing waits for, still share a launch;
- a kernel on or near a longest path (one that cannot start more than
  NEAR_LONGEST_OPS later without lengthening it) shares a launch with
  kernels that could wait only while those move at most DELAY_BYTES in
  all: a pack also ends when its last
  part does, so a backward pass's kernel packed with weight updates that
  could wait made every later layer wait for them (CRNN's train step ran
  3% slower than with no packs), while a bias's update delays it by
  microseconds;
- in a loop's body, a kernel that computes a value the next iteration
  reads (a loop variable: `carried`) is packed with nothing: a pack ends
  when its slowest member does, TensorFlow starts an iteration's
  independent work as soon as its inputs exist, and a loop counter packed
  with the iteration's cell would make the next iteration wait for the
  whole cell (DIEN's train step ran 15% slower so);
- the pack stays within PACK_MAX_BYTES of inputs and outputs: a pack's
  outputs are allocated together and its inputs live until the whole pack
  runs, so packing big kernels (an optimizer's update of every weight)
  would hold much more memory at once for no gain (launches matter for
  small kernels);
- the pack stays within the inputs and ops a kernel may have
  (pack_limits.py): a unit that would pass them opens a new pack instead,
  so an optimizer's updates of hundreds of small weights make a few packs
  rather than one that cannot be built.

Reachability is kept as bit sets over units: `desc[p]`, the units reachable
from pack p (through any nodes, every cluster counted as one node). Joining
p and u makes everything that reached either reach what both reach; the
closure is updated in place, so each check is two mask tests instead of a
graph walk.

A lone op that stays with TensorFlow when alone (one primitive: no fusion
to gain) is a unit too, but only joins a pack that holds a fused kernel (a
pack of lone ops only costs more per call than TF's own small ops) or lone
elementwise ops that read the same tensors (siblings: one loop reads them
once, codegen/pack.py), and not when it reads a matmul's or convolution's
result (TF fuses it into that).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Set

from tf_fusionstitch.rewriters import op_table
from tf_fusionstitch.rewriters.cpu_cost_model import BUILTIN, DYNAMIC_EXTENT
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor
from tf_fusionstitch.rewriters.pack_limits import KernelSize, kernel_size

# Inputs plus outputs of one pack, bytes, at most (dimensions unknown at
# trace time counted as cpu_cost_model.DYNAMIC_EXTENT).
PACK_MAX_BYTES = 64 << 20
# Open packs a unit tries, the most recently grown first.
PACK_CANDIDATES = 8
# Bytes that kernels which could wait may move in a pack with one on a
# longest path: half of a core's L2 (cpu_cost_model.BUILTIN's row_cache_bytes),
# a wait of microseconds (18 us at BUILTIN's bandwidth, nine launches'
# worth). The packs that made CRNN's step slower held 2-25 MB of weight
# updates; DIEN's Adam updates of biases and small weights, 0.3-0.5 MB.
DELAY_BYTES = BUILTIN["row_cache_bytes"]
# Ops a kernel may start later than it can and still count as on the
# longest path: it runs beside it anyway (BERT's key and value kernels, 2
# ops off the query's path, share a launch with it). The weight updates
# that could wait in CRNN's slow packs had 7 ops and more to spare.
NEAR_LONGEST_OPS = 2


def pack_clusters(view: GraphView, groups: List[List[str]], fetches: Set[Tensor],
                  carried: Set[Tensor] = frozenset()) -> List[List[str]]:
    """`groups` (every candidate node in one, as the strategies return them)
    with packs merged; each group's nodes in topological order. `carried`:
    a loop body's values that the next iteration reads."""
    position = view.position
    launches = {id(g): _launches(view, g) for g in groups}
    units = [g for g in groups if (launches[id(g)] > 1
             or launches[id(g)] == 1 and not _after_contraction(view, g))
             and not any(view.nodes[n].op in OWN_KERNELS for n in g)]
    units.sort(key=lambda g: max(position[n] for n in g))
    single = [launches[id(g)] == 1 for g in units]
    size = [boundary_bytes(view, g, fetches) for g in units]
    graph = _unit_graph(view, groups, units, size)
    if graph is None:
        return groups
    desc, windows = graph
    kernel = [kernel_size(view, g, fetches, b) for g, b in zip(units, size)]
    # A unit that does not lower, or is too big to pack, joins no pack
    # and no unit joins it.
    alone = _carrying(view, units, carried) | {
        u for u, k in enumerate(kernel) if k is None or not k.within(PACK_MAX_BYTES)}

    members: Dict[int, List[int]] = {}   # pack id (its first unit) -> units
    mask: Dict[int, int] = {}            # pack id -> bit set of its units
    window: Dict[int, StartWindow] = {}  # pack id -> when it may start
    load: Dict[int, KernelSize] = {}     # pack id -> its kernel's size
    recent: List[int] = []               # open pack ids, most recently grown last
    absorbed: Set[int] = set()           # units inside a pack of another id
    for u in range(len(units)):
        joined = None
        if u not in alone:
            for p in reversed(recent[-PACK_CANDIDATES:]):
                if load[p].plus(kernel[u]).within(PACK_MAX_BYTES) \
                        and window[p].admits(windows[u]) and not desc[p] & (1 << u) \
                        and not desc[u] & mask[p]:
                    joined = p
                    break
        if joined is None:
            members[u], mask[u] = [u], 1 << u
            window[u], load[u] = windows[u], kernel[u]
            if u not in alone:   # no other unit joins it either
                recent.append(u)
            continue
        members[joined].append(u)
        load[joined] = load[joined].plus(kernel[u])
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
        window[joined] = window[joined].joined(windows[u])
        recent.remove(joined)
        recent.append(joined)

    # A pack of lone ops only would replace cheap TF ops by a launch of ours,
    # which costs more per call on small tensors: those stay apart, unless
    # they are siblings (codegen/pack.py runs them as one loop over inputs
    # read once: traffic saved, as fusion saves it).
    packs = [us for us in members.values() if len(us) > 1 and
             (not all(single[u] for u in us) or _siblings(view, [units[u] for u in us]))]
    packed = {n for us in packs for u in us for n in units[u]}
    out = [g for g in groups if not set(g) & packed]
    for us in packs:
        out.append(sorted((n for u in us for n in units[u]), key=position.get))
    out.sort(key=lambda g: position[g[0]])
    return out


def pack_parts(view: GraphView, nodes: List[str]) -> List[List[str]]:
    """The clusters a pack of `nodes` joined: their connected components
    through the data edges between them (a pack joins only clusters that
    no path connects, and the strategies grow a cluster along its edges),
    each in topological order, in the order of their first node. A cluster
    that is no pack is one part."""
    position = view.position
    inside = set(nodes)
    part_of: Dict[str, int] = {}
    parts: List[List[str]] = []
    for start in sorted(nodes, key=position.get):
        if start in part_of:
            continue
        part_of[start] = len(parts)
        part, stack = [], [start]
        while stack:
            n = stack.pop()
            part.append(n)
            near = [src for src, _ in view.data_inputs[n]] + [
                c for port in range(view.num_outputs[n])
                for c in view.data_consumers.get((n, port), ())]
            for m in near:
                if m in inside and m not in part_of:
                    part_of[m] = len(parts)
                    stack.append(m)
        parts.append(sorted(part, key=position.get))
    return parts


_CONTRACTIONS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3",
                           "Conv2D", "Conv3D", "DepthwiseConv2dNative", "Einsum"})
# Ops whose kernels are of a kind of their own (codegen/scatter.py), never a part.
OWN_KERNELS = frozenset({"UnsortedSegmentSum"})
# Ops that take no time worth counting on a path (aliases, constants, arguments).
_FREE_OPS = frozenset({"Identity", "IdentityN", "NoOp", "Const", "Placeholder", "_Arg",
                       "_Retval", "ReadVariableOp", "Reshape", "StopGradient", "Snapshot"})


@dataclasses.dataclass(frozen=True)
class StartWindow:
    """When a kernel (or a pack) may start, in ops along the graph's paths:
    no earlier than its inputs exist, no later than the longest path
    through the graph allows; and what in it could wait."""
    earliest: int
    latest: int
    critical: bool     # holds a kernel on or near a longest path
    waiting_bytes: int  # bytes moved by its kernels that could start later

    def admits(self, other: "StartWindow") -> bool:
        """Whether one launch may run both (the rules above): it starts when
        the later could and before either must, and a kernel on or near a
        longest path waits for at most DELAY_BYTES of others' work."""
        if max(self.earliest, other.earliest) > min(self.latest, other.latest):
            return False
        return not (self.critical or other.critical) or \
            self.waiting_bytes + other.waiting_bytes <= DELAY_BYTES

    def joined(self, other: "StartWindow") -> "StartWindow":
        return StartWindow(max(self.earliest, other.earliest),
                           min(self.latest, other.latest), self.critical or other.critical,
                           self.waiting_bytes + other.waiting_bytes)


def start_windows(view: GraphView, groups: List[List[str]],
                  fetches: Set[Tensor]) -> Optional[List[StartWindow]]:
    """Each group's StartWindow, every group one node of the graph; None
    if the groups feed each other in a cycle."""
    sizes = [boundary_bytes(view, g, fetches) for g in groups]
    graph = _unit_graph(view, groups, groups, sizes)
    return None if graph is None else graph[1]


def _unit_graph(view: GraphView, groups: List[List[str]], units: List[List[str]],
                sizes: List[int]):
    """In the graph where every group is one node (a path may enter a
    cluster at one node and leave it at another), per unit: the bit set of
    units a path from it reaches (data or control) and its StartWindow
    (earliest start: the longest path to it, in ops; latest: the latest
    start that does not lengthen the longest path through the graph;
    `sizes`: the units' boundary bytes). None if the groups feed each other
    in a cycle (the strategies never leave one; nothing is packed then)."""
    node_of: Dict[str, object] = {n: ("group", i) for i, g in enumerate(groups) for n in g}
    unit_bit = {node_of[g[0]]: 1 << u for u, g in enumerate(units)}
    succ: Dict[object, Set[object]] = {}
    indegree: Dict[object, int] = {}
    weight: Dict[object, int] = {}
    for name in view.order:
        a = node_of.get(name, name)
        succ.setdefault(a, set())
        indegree.setdefault(a, 0)
        weight[a] = 1 if a != name else int(view.nodes[name].op not in _FREE_OPS)
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
    if len(order) != len(indegree):
        return None
    earliest = {a: 0 for a in order}
    for a in order:
        for b in succ[a]:
            earliest[b] = max(earliest[b], earliest[a] + weight[a])
    below: Dict[object, int] = {}
    height: Dict[object, int] = {}  # longest path from a's start to the end, a included
    for a in reversed(order):
        bits, tail = 0, 0
        for b in succ[a]:
            bits |= below[b] | unit_bit.get(b, 0)
            tail = max(tail, height[b])
        below[a], height[a] = bits, weight[a] + tail
    longest = max(earliest[a] + height[a] for a in order)
    keys = [node_of[g[0]] for g in units]
    windows = []
    for a, size in zip(keys, sizes):
        latest = longest - height[a]
        critical = latest - earliest[a] <= NEAR_LONGEST_OPS
        windows.append(StartWindow(earliest[a], latest, critical, 0 if critical else size))
    return [below[a] for a in keys], windows


def _carrying(view: GraphView, units: List[List[str]], carried: Set[Tensor]) -> Set[int]:
    """The units that compute a carried value (through aliases)."""
    unit_of = {n: u for u, g in enumerate(units) for n in g}
    found: Set[int] = set()
    stack = list(carried)
    seen: Set[Tensor] = set()
    while stack:
        t = stack.pop()
        if t in seen or t[0] not in view.nodes:
            continue
        seen.add(t)
        if t[0] in unit_of:
            found.add(unit_of[t[0]])
        elif view.nodes[t[0]].op in _FREE_OPS:
            stack.extend(view.data_inputs[t[0]])
    return found


def _siblings(view: GraphView, groups: List[List[str]]) -> bool:
    """Whether lone elementwise ops all read the same tensors (scalar
    constants aside: lowering inlines them, so they are no kernel input)."""
    reads = []
    for group in groups:
        ops = [n for n in group if op_table.is_memory_intensive(view.nodes[n].op)]
        rule = op_table.OP_TABLE.get(view.nodes[ops[0]].op) if len(ops) == 1 else None
        if rule is None or rule.kind != op_table.ELEMENTWISE:
            return False
        reads.append({t for t in view.data_inputs[ops[0]]
                      if not (view.nodes[t[0]].op == "Const" and _is_scalar(view, t))})
    return bool(reads[0]) and all(r == reads[0] for r in reads[1:])


def _is_scalar(view: GraphView, t: Tensor) -> bool:
    tt = view.type_of(t)
    return tt is not None and tt.rank == 0


def _launches(view: GraphView, nodes: List[str]) -> int:
    """Memory-intensive ops in the group: what TF would launch for it."""
    return sum(op_table.is_memory_intensive(view.nodes[n].op) for n in nodes)


def _after_contraction(view: GraphView, nodes: List[str]) -> bool:
    """Whether a lone op reads a matmul's or convolution's result: TF's own
    graph optimizer (remapper) fuses a bias add or an activation there into
    the contraction's kernel, which is better than any launch of ours."""
    return any(view.nodes[src].op in _CONTRACTIONS for n in nodes
               for src, _ in view.data_inputs[n])


def boundary_tensors(view: GraphView, nodes: Sequence[str], fetches: Set[Tensor]) -> Set[Tensor]:
    """The tensors that enter and leave the group."""
    inside = set(nodes)
    tensors = set()
    for n in nodes:
        tensors.update(t for t in view.data_inputs[n] if t[0] not in inside)
        for port in range(view.num_outputs[n]):
            t = (n, port)
            if t in fetches or any(c not in inside for c in view.data_consumers.get(t, ())):
                tensors.add(t)
    return tensors


def boundary_bytes(view: GraphView, nodes: Sequence[str], fetches: Set[Tensor]) -> int:
    """Bytes of the tensors that enter and leave the group."""
    return sum(view.tensor_bytes(t, DYNAMIC_EXTENT) for t in boundary_tensors(view, nodes, fetches))
