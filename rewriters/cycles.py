"""Whether fusing a set of nodes would close a cycle, three ways for three uses.

A set of nodes can be one kernel only if no path leaves the set and comes
back into it (data or control edges), with every cluster formed so far
counted as one node: two clusters that are each fine can still feed each
other (A -> B and B -> A).

- creates_cycle: the reference walk through whole clusters;
- Reachability: the transitive closure as bit sets, for a search that checks
  tens of thousands of candidate sets (explore.py);
- ClusterGraph: the graph of the clusters formed so far, kept merge by merge,
  for the greedy merging (clustering.py): a check walks from the producer's
  cluster only through clusters ranked below the consumer's, one exit set
  each. On EfficientNetV2B0's train step (17848 nodes, 13490 checks;
  benchmarks/clustering_cycles.py) the walk took 9.4 s and the incremental
  check 0.7 s, its updates included.
"""

from __future__ import annotations

import heapq
import math
from typing import Dict, List, Optional, Sequence, Set, Tuple

from tf_fusionstitch.rewriters.graph_view import GraphView


def creates_cycle(view: GraphView, nodes: Set[str], owner: Dict[str, str],
                  members: Dict[str, List[str]], *, after: Optional[int] = None) -> bool:
    """Whether a path leaves `nodes` and comes back into them in the graph
    where every other cluster already formed is one node: two clusters that
    are each fine can still feed each other (A -> B and B -> A).

    With `after` (a view.position) the caller vouches that every node placed
    after it is outside `nodes` and in no cluster (grow_clusters' merges, see
    there): from such a node paths only move forward, so the walk stops at
    them without looking at the clusters at all. A search that checks
    thousands of sets against one plan uses Reachability.closes_cycle, and
    the greedy merging ClusterGraph (this walk is its reference)."""
    bound = after if after is not None else len(view.order)   # no bound: every node
    return _reaches_back(view, nodes, owner, members, bound)


class Reachability:
    """The graph's transitive closure (data and control edges) as bit sets
    over view.position: whether a set of nodes would close a cycle, in time
    proportional to the set (creates_cycle with no clusters formed yet, for
    a search that checks tens of thousands of candidate sets), or through
    the clusters of a plan (closes_cycle: a handful of bit operations per
    cluster, where creates_cycle's walk may visit every node between)."""

    def __init__(self, view: GraphView):
        self._position = position = view.position
        self._below = [0] * len(view.order)   # descendants
        self._above = [0] * len(view.order)   # ancestors
        for name in reversed(view.order):
            bits = 0
            for c in view.consumers[name]:
                bits |= self._below[position[c]] | (1 << position[c])
            self._below[position[name]] = bits
        for name in view.order:
            bits = 0
            for src in {s for s, _ in view.data_inputs[name]} | set(view.control_inputs[name]):
                bits |= self._above[position[src]] | (1 << position[src])
            self._above[position[name]] = bits

    def creates_cycle(self, nodes) -> bool:
        """Whether a path leaves `nodes` and comes back: some node outside
        them is both reached from them and reaches them."""
        inside = below = above = 0
        for n in nodes:
            i = self._position[n]
            inside |= 1 << i
            below |= self._below[i]
            above |= self._above[i]
        return bool(below & above & ~inside)

    def cluster_bits(self, nodes) -> Tuple[int, int]:
        """A cluster's (members, members and their descendants) as bit sets,
        for closes_cycle."""
        mask = down = 0
        for n in nodes:
            i = self._position[n]
            mask |= 1 << i
            down |= self._below[i]
        return mask, mask | down

    def closes_cycle(self, nodes, spans: Sequence[Tuple[int, int, str]],
                     bits: Dict[str, Tuple[int, int]]) -> bool:
        """creates_cycle's verdict, over bit sets: whether a path leaves
        `nodes` and comes back in the graph where each cluster formed so far
        is one node. `spans`: the clusters of more than one node, none sharing
        a node with `nodes`, as cluster_spans gives them (view.position);
        `bits`: each one's cluster_bits.

        Descendants grow by every cluster they reach (a path may enter it at
        one member and leave at another) until one of them is an ancestor of
        `nodes` or nothing grows. Only clusters that end after the first of
        `nodes` can be reached (a path only moves forward from there). A
        path past the last of `nodes` and past every cluster spanning that
        point only moves forward too, so clusters placed after those take
        no part."""
        inside = below = above = 0
        first, bound = len(self._position), -1
        for n in nodes:
            i = self._position[n]
            first, bound = min(first, i), max(bound, i)
            inside |= 1 << i
            below |= self._below[i]
            above |= self._above[i]
        above &= ~inside
        pending = []   # (first, last position, bits), in span order
        for lo, hi, unit in spans:
            if lo > bound:
                break
            bound = max(bound, hi)
            if hi > first:
                pending.append((lo, hi, bits[unit]))
        if below & above:
            return True
        while pending:
            # One pass in span order: a cluster reached adds descendants that
            # lie after its first member, so a cluster passed over earlier
            # needs another look only if a later one reached starts before
            # it ends.
            reached = []
            for c in pending:
                hit = bool(c[2][0] & below)
                if hit:
                    below |= c[2][1]
                reached.append(hit)
            if not any(reached):
                return False
            if below & above:
                return True
            again, next_lo = [], None   # the first start of a later reached cluster
            for c, hit in zip(reversed(pending), reversed(reached)):
                if hit:
                    next_lo = c[0]
                elif next_lo is not None and next_lo < c[1]:
                    again.append(c)
            pending = again[::-1]
        return False


def cluster_spans(members: Dict[str, List[str]],
                  position: Dict[str, int]) -> List[Tuple[int, int, str]]:
    """Reachability.closes_cycle's `spans`: each cluster of more than one
    node as (first, last position, name), sorted."""
    return sorted((min(position[m] for m in ms), max(position[m] for m in ms), unit)
                  for unit, ms in members.items() if len(ms) > 1)


def _reaches_back(view: GraphView, nodes: Set[str], owner: Dict[str, str],
                  members: Dict[str, List[str]], bound: int) -> bool:
    """creates_cycle's walk over the nodes placed at or before `bound`."""
    position, consumers = view.position, view.consumers
    stack = [c for m in nodes for c in consumers[m]
             if c not in nodes and position[c] <= bound]
    seen = set()
    while stack:
        n = stack.pop()
        unit = owner.get(n, n)
        if unit in seen:
            continue
        seen.add(unit)
        for m in members.get(unit, (n,)):
            for c in consumers[m]:
                if c in nodes:
                    return True
                if position[c] <= bound:
                    stack.append(c)
    return False


# Clusters moved in front of a rank get ranks three entries longer than it:
# past this length all ranks are renumbered (the same order, one entry each).
LONGEST_RANK = 16


class ClusterGraph:
    """The graph where every cluster formed so far is one node, kept up to
    date merge by merge (grow_clusters' `joined`): each cluster's exits (the
    consumers of its members outside it) and a topological order of the
    clusters (ranks: tuples, compared as tuples). creates_cycle then gives
    the walk's verdict (creates_cycle above) on merging a producer's cluster
    into the cluster it feeds while visiting only clusters ranked between
    the two, one exit set each, never a whole cluster's members.

    Why only those: the cluster graph is acyclic (every merge was checked),
    and the producer feeds the consumer's cluster, so a cycle through the
    merged pair can only be a path from the producer through other clusters
    into the consumer's (a path the other way would close a cycle with that
    edge already). Every cluster on such a path ranks between the two.

    After a merge the order is repaired much as Pearce and Kelly repair one
    after inserting an edge: the merged cluster takes the consumer's rank,
    and the clusters the check reached (the producer's descendants ranked
    before the consumer, none of them an ancestor of it) move, in their old
    order, to just before the first cluster they feed that ranks after the
    consumer (or to the end). Later checks then pass over them until a
    consumer ranked after that one: a cluster of scalar optimizer arithmetic
    feeds every variable's update, and without the move each merge along
    one update would visit all the updates placed before it again."""

    def __init__(self, view: GraphView):
        self._consumers, self._position = view.consumers, view.position
        self._rank: Dict[str, tuple] = {n: (i,) for i, n in enumerate(view.order)}
        # A rank after every unit's, even after those moved in front of it
        # (an infinite one would not be): the clusters a check reached move
        # there when they feed nothing ranked after the consumer.
        self._end = (len(view.order) + 1,)
        self._exits: Dict[str, Set[str]] = {}    # clusters of more than one node
        self._moves: Dict[tuple, int] = {}      # rank -> groups moved in front of it
        self._checked = None   # (fusion, producer, reached, fed_after) of a check, no cycle

    def exits(self, unit: str) -> Set[str]:
        """The consumers of `unit`'s members outside it (the caller must not
        change the set)."""
        return self._exits[unit] if unit in self._exits else self._consumers[unit]

    def rank(self, unit: str) -> tuple:
        """`unit`'s place in the topological order (less is earlier)."""
        return self._rank[unit]

    def creates_cycle(self, fusion: str, producer: str, owner: Dict[str, str]) -> bool:
        """Whether merging cluster `producer` into `fusion`, which one of its
        members feeds, closes a cycle: creates_cycle's verdict on the union
        of their members."""
        rank, limit, position = self._rank, self._rank[fusion], self._position
        seen, reached = {producer}, []
        # Latest entered first: a path back climbs to the consumer's rank, and
        # the walk ends at the first cluster found on one.
        entered = [(0, producer)]
        fed_after = self._end   # the lowest rank after `limit` a reached cluster feeds
        while entered:
            _, unit = heapq.heappop(entered)
            for c in self.exits(unit):
                other = owner.get(c, c)
                if other == fusion:
                    if unit != producer:   # back in through another cluster
                        return True
                elif rank[other] < limit:
                    if other not in seen:
                        seen.add(other)
                        reached.append(other)
                        heapq.heappush(entered, (-position[c], other))
                elif unit != producer and rank[other] < fed_after:
                    # only what the reached feed bounds their move: what the
                    # producer feeds stays after the merged cluster anyway
                    fed_after = rank[other]
        self._checked = (fusion, producer, reached, fed_after)
        return False

    def join(self, fusion: str, producer: str, owner: Dict[str, str],
             members: Dict[str, List[str]]) -> None:
        """grow_clusters' `joined`: record that `producer` merged into
        `fusion` (before owner and members change)."""
        if self._checked is None or self._checked[:2] != (fusion, producer):
            # not the merge just checked: check it here (the order needs its reach)
            if self.creates_cycle(fusion, producer, owner):
                raise ValueError(f"merging {producer} into {fusion} closes a cycle")
        _, _, reached, fed_after = self._checked
        self._checked = None
        self._exits[fusion] = self._merged_exits(fusion, producer, owner)
        self._exits.pop(producer, None)
        del self._rank[producer]
        self._move_before(fed_after, reached)

    def _merged_exits(self, fusion: str, producer: str, owner: Dict[str, str]) -> Set[str]:
        merged = {c for c in self.exits(fusion) if owner.get(c) != producer}
        merged.update(c for c in self.exits(producer) if owner.get(c) != fusion)
        return merged

    def _move_before(self, ahead: tuple, units: List[str]) -> None:
        """Gives `units` ranks, in their present order, between `ahead` and
        every rank below it: `ahead` with its last entry one less, then inf
        (above every rank that begins the same way), then a group number that
        grows with each group moved in front of `ahead` (the latest group goes
        closest to it), then the unit's place in the group."""
        if not units:
            return
        group = self._moves.get(ahead, 0) + 1
        self._moves[ahead] = group
        prefix = ahead[:-1] + (ahead[-1] - 1, math.inf, group)
        for i, unit in enumerate(sorted(units, key=self._rank.__getitem__)):
            self._rank[unit] = prefix + (i,)
        if len(prefix) >= LONGEST_RANK:
            self.renumber()

    def renumber(self) -> None:
        """The same order as ranks of one entry each."""
        ordered = sorted(self._rank, key=self._rank.__getitem__)
        self._rank = {unit: (i,) for i, unit in enumerate(ordered)}
        self._moves.clear()
