"""fusion="explore": FusionStitching's fusion-plan exploration (docs/PAPERS.md,
"Plan exploration"; its delta evaluator: docs/PAPERS.md, "Cost models").

Five steps over the fusible nodes (clustering.fusible_nodes):

1. PatternReduction, an approximate dynamic program. Vertices are visited in
   post-order (every consumer before its producers). A vertex v keeps its top-k
   candidate patterns: v alone, or v joined with one candidate pattern of each
   of some of its consumers. Consumers are combined in groups of two (each
   side: nothing, or one of its k patterns: (k+1)^2 - 1 unions), the top k of
   a group go on as one "consumer" to the next round of pairing, until one
   list is left (wide fan-out costs O(consumers * k^2) checks, not k^consumers).
   A pattern is legal when it creates no cycle (cycles.Reachability),
   lowers to a cluster within a kernel's size (fusion_ir.MAX_INPUTS and
   MAX_OPS: lowering checks it even where it skips the other checks) that
   schedule.build_schedule accepts and, in a loop
   body, holds the ops of at most one recurrence (recurrences.py) and no
   other ops beside them: one iteration lasts as long as its recurrences,
   and whatever else a recurrence's kernel computed would make every
   iteration wait for it, where TF runs it on another core (a masked GRU's
   output select in its cell's kernel made DIEN's inference 10% slower than
   xla_like's plan, which leaves that select alone); the verdict and
   the pattern's score are cached per frozenset of nodes, and lowering and
   scheduling run once per structure (pattern_key.py: the layers of a deep
   model repeat the same patterns).
2. Beam search (width `beam`) over plans, from producers to consumers: at each
   vertex not yet covered, every state either leaves it alone or appends one
   of its candidate patterns that overlaps no pattern of the state and makes
   no cycle with them (patterns each acyclic can still feed each other).
   States are ranked by the sum of their patterns' scores.
3. Neighbour merges: patterns grow only from a producer towards its
   consumers, so the two producers of one op (x + y, both computed) end up
   apart. A greedy pass over the best plan's edges merges two kernels when
   the union is legal, makes no cycle with the rest of the plan, and scores
   more than the two apart.
4. Remote fusion (kernel packing): kernels that are not connected are merged
   into one packed kernel under the same three conditions, when packing.py's
   start windows admit them together (a kernel on a longest path waits for
   little work that could wait) and the pack moves at most REMOTE_MAX_BYTES
   (a pack starts when its last member can: a big one held the updates of
   one layer's weights back until another's gradients existed); one that a
   pack cannot take (its size above all: the updates of hundreds of
   same-shaped weights) starts a new pack. Steps 3 and 4 are
   this pass's stand-in for the paper's second PatternReduction round from a
   virtual producer of every vertex; packing is tried only between kernels
   whose iteration spaces have the same static extents (build_schedule can
   only place two unconnected parts in one iteration space when it can
   identify their axes by static extent), or between segment sums of one
   ids tensor (one scatter kernel, codegen/scatter.py, walks the ids once).
5. Packs of separate iteration spaces (packing.py, as fusion="stitch" packs;
   off with pack=False): kernels that no path connects, each keeping its own
   loops, share one launch, under packing.py's rules (a pack never delays a
   kernel on the longest path, nor a loop's next iteration, and holds a
   bounded number of bytes, inputs and ops). Its traffic is its members', so the evaluator
   gains one launch per kernel that joins a pack.

Patterns are scored by FusionStitching's delta evaluator f(P) = T_unfused -
T_fused - T_penalty, in seconds (cpu_cost_model.CpuEvaluator, the package's
kernel_cost interface), with the costs of cpu_costs.py (measured on this
machine) or cpu_cost_model.BUILTIN.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters import (cpu_cost_model, legality, packing, plan_guard,
                                       recurrences)
from tf_fusionstitch.rewriters.cpu_cost_model import CpuEvaluator, LoweredPattern
from tf_fusionstitch.rewriters.cycles import Reachability
from tf_fusionstitch.rewriters.legality import LOWERING_ERRORS, cpu_schedule
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor
from tf_fusionstitch.rewriters.lowering import lower_nodes
from tf_fusionstitch.rewriters.pattern_key import pattern_key

# Bytes one remote-fusion pack (step 4) may move in all. A pack starts when
# its last member's inputs exist, so its earlier members no longer run beside
# the work between them: the Adam updates of BERT's same-shaped weights,
# packed across all twelve layers, waited for the last layer's gradients and
# made the step 2.5% slower than xla_like's plan, which packs nothing.
REMOTE_MAX_BYTES = packing.PACK_MAX_BYTES


@dataclasses.dataclass
class ExploreStats:
    """What the exploration did, for the report."""
    k: int
    beam: int
    vertices: int = 0
    patterns_checked: int = 0       # distinct node sets checked for legality
    legal_patterns: int = 0
    structures: int = 0             # distinct pattern keys among them, lowered once each
    across_recurrences: int = 0     # patterns refused: a loop recurrence's ops with others
    merged: int = 0                 # kernels removed by merging neighbours
    packed: int = 0                 # kernels removed by remote fusion (one space)
    packed_apart: int = 0           # kernels removed by packs of separate spaces
    plan_score: float = 0.0         # final plan, delta evaluator: seconds saved per call
    seconds: float = 0.0
    costs: str = "builtin"          # where the evaluator's costs came from
    guard: str = ""                 # the plan guard's verdict (plan_guard.py)

    def __str__(self) -> str:
        return (f"explore k={self.k} beam={self.beam}: {self.vertices} vertices, "
                f"{self.patterns_checked} patterns checked ({self.legal_patterns} legal, "
                f"{self.structures} distinct structures lowered, "
                f"{self.across_recurrences} refused for joining a loop's recurrence "
                f"with other ops), "
                f"{self.merged} neighbour merge(s), "
                f"{self.packed} kernel(s) packed by remote fusion into a shared "
                f"iteration space and {self.packed_apart} into packs of separate "
                f"spaces, plan saves "
                f"{self.plan_score * 1e6:.1f} us/call by the delta evaluator "
                f"(costs: {self.costs}), {self.seconds:.2f} s"
                + (f"; {self.guard}" if self.guard else ""))


Pattern = FrozenSet[str]


class _Explorer:
    def __init__(self, view: GraphView, candidates: Set[str], fetches: Set[Tensor],
                 k: int, beam: int, costs: Dict,
                 recurrence: Optional[Dict[str, int]] = None,
                 refusals: Optional[legality.Refusals] = None):
        self.view, self.candidates, self.fetches = view, candidates, fetches
        self.refusals = refusals   # hears why a producer-consumer pair was refused
        # node -> its loop recurrence (recurrences.py); none outside loops
        self.recurrence = recurrence or {}
        self.k, self.beam = k, beam
        self.stats = ExploreStats(k, beam)
        self._cache: Dict[Pattern, Optional[float]] = {}
        # pattern_key -> (score, _space entry, compute, decision), None score if illegal
        self._by_structure: Dict[tuple, tuple] = {}
        self._space: Dict[Pattern, Optional[tuple]] = {}  # see _space_key
        self.evaluator = CpuEvaluator(view, candidates, costs, self._lowered_alone)
        self._reach = Reachability(view)   # a pattern's own cycle check
        self._unit_bits: Dict[str, Tuple[int, int]] = {}  # plan unit -> cluster_bits
        self._serial = iter(range(1 << 62))                # plan units' names

    def _lowered_alone(self, name: str) -> Optional[ir.Cluster]:
        """The node's cluster lowered by itself (for the evaluator), or None."""
        try:
            return lower_nodes(self.view, [name], self.fetches, validate=False).cluster
        except LOWERING_ERRORS:
            return None

    # -- legality --------------------------------------------------------------

    def evaluate(self, nodes: Pattern) -> Optional[float]:
        """f(nodes), or None when the nodes cannot form one kernel by
        themselves (a cycle through the rest of the graph, or lowering or
        the schedule refuses them). Cached per node set."""
        if nodes not in self._cache:
            self.stats.patterns_checked += 1
            verdict = None
            decision = legality.one_recurrence(self.recurrence, nodes)
            if not decision:
                self.stats.across_recurrences += 1
            else:
                decision = legality.acyclic(len(nodes) > 1 and self._reach.creates_cycle(nodes))
            if decision:
                verdict, decision = self._structure(nodes)
            if verdict is not None:
                self.stats.legal_patterns += 1
            elif self.refusals is not None and len(nodes) == 2:
                self.refusals.note(nodes, decision)
            self._cache[nodes] = verdict
        return self._cache[nodes]

    def _structure(self, nodes: Pattern) -> Tuple[Optional[float], legality.Decision]:
        """The score of the nodes' structure (None if it does not lower and
        schedule, with the reason), from the first node set of that
        structure checked: sets with equal pattern keys lower to the same
        cluster."""
        key = pattern_key(self.view, nodes, self.fetches)
        known = self._by_structure.get(key)
        if known is None:
            self.stats.structures += 1
            try:
                # Priced only: fusion_pass lowers the chosen kernels again, validated.
                lowered = lower_nodes(self.view, sorted(nodes, key=self.view.position.get),
                                      self.fetches, validate=False)
                schedule = cpu_schedule(lowered.cluster)
                space = None if None in schedule.static_extent else (
                    schedule.tiled, tuple(sorted(schedule.static_extent)))
                delta = self.evaluator.delta(LoweredPattern(
                    nodes, lowered.cluster, lowered.input_tensors, lowered.output_tensors,
                    schedule))
                known = (delta.saved_s, space, delta.fused.compute_s, legality.OK)
            except LOWERING_ERRORS as e:
                known = (None, None, None, legality.refuse(str(e)))
            self._by_structure[key] = known
        score, space, compute, decision = known
        if score is not None:
            self._space[nodes] = space
            if len(nodes) == 1:  # the op alone: its compute, lowered once per structure
                self.evaluator.note_compute_alone(next(iter(nodes)), compute)
        return score, decision

    # -- 1. PatternReduction ----------------------------------------------------

    def _top(self, options: List[Tuple[float, Pattern]]) -> List[Tuple[float, Pattern]]:
        seen, best = set(), []
        for s, p in sorted(options, key=lambda o: (-o[0], len(o[1]), sorted(o[1]))):
            if p not in seen:
                seen.add(p)
                best.append((s, p))
            if len(best) == self.k:
                break
        return best

    def _combine(self, seed: Pattern, a: List[Tuple[float, Pattern]],
                 b: List[Tuple[float, Pattern]]) -> List[Tuple[float, Pattern]]:
        """Top k of seed joined with nothing or one pattern of each side."""
        options = []
        for _, pa in [(0.0, frozenset())] + a:
            for _, pb in [(0.0, frozenset())] + b:
                p = seed | pa | pb
                s = self.evaluate(p)
                if s is not None:
                    options.append((s, p))
        return self._top(options)

    def candidate_patterns(self) -> Dict[str, List[Tuple[float, Pattern]]]:
        view = self.view
        order = [n for n in view.order if n in self.candidates]
        self.stats.vertices = len(order)
        cands: Dict[str, List[Tuple[float, Pattern]]] = {}
        for v in reversed(order):  # post-order: consumers first
            seed = frozenset([v])
            consumers = {c for port in range(view.num_outputs[v])
                         for c in view.data_consumers.get((v, port), ())
                         if c in self.candidates}
            groups = [cands[c] for c in sorted(consumers, key=view.position.get)]
            if not groups:
                cands[v] = [(0.0, seed)]
                continue
            if len(groups) == 1:
                groups = [self._combine(seed, groups[0], [])]
            while len(groups) > 1:  # pairs of consumers, then pairs of pairs
                groups = [self._combine(seed, groups[i], groups[i + 1] if i + 1 < len(groups)
                                        else []) for i in range(0, len(groups), 2)]
            best = self._top(groups[0] + [(0.0, seed)])
            cands[v] = best
        return cands

    # -- 2. beam search ---------------------------------------------------------

    def best_plan(self, cands) -> List[Pattern]:
        view = self.view
        # state: (score, patterns, owner, the patterns' spans sorted)
        states = [(0.0, (), {}, [])]
        for v in (n for n in view.order if n in self.candidates):
            options = [(s, p) for s, p in cands.get(v, []) if len(p) > 1 and s > 0]
            if not options:
                continue
            # Every state alone and grown by each option that fits, best first;
            # the cycle check (the costly part) runs only until the beam is full.
            grown = []
            for state in states:
                grown.append((state[0], state, None))
                if v not in state[2]:
                    grown += [(state[0] + s, state, p) for s, p in options
                              if not any(n in state[2] for n in p)]
            unique, seen = [], set()
            for total, state, p in sorted(grown, key=lambda g: -g[0]):
                if len(unique) == self.beam:
                    break
                _, patterns, _, spans = state
                key = frozenset(patterns + ((p,) if p is not None else ()))
                if key in seen or p is not None and self._closes_cycle(p, spans):
                    continue
                seen.add(key)
                unique.append(state if p is None else self._grown(state, p, total))
            states = unique
        return list(states[0][1])

    def _new_unit(self, p: Pattern) -> str:
        """A fresh name for a plan's kernel of nodes `p` (a state's pattern,
        or a unit of refine), its bits kept for _closes_cycle."""
        unit = f"unit{next(self._serial)}"
        if len(p) > 1:  # an op alone is never contracted
            self._unit_bits[unit] = self._reach.cluster_bits(p)
        return unit

    def _closes_cycle(self, nodes: Pattern, spans) -> bool:
        """Whether `nodes` as one kernel close a cycle through the plan's
        kernels (`spans`, sorted, none sharing a node with them)."""
        return self._reach.closes_cycle(nodes, spans, self._unit_bits)

    def _grown(self, state, p: Pattern, score: float):
        """`state` with pattern `p` added (its own copies of the plan)."""
        _, patterns, owner, spans = state
        unit = self._new_unit(p)
        new_owner = dict(owner)
        new_owner.update((n, unit) for n in p)
        new_spans = list(spans)
        bisect.insort(new_spans, _span(unit, p, self.view.position))
        return score, patterns + (p,), new_owner, new_spans

    # -- 3. remote fusion -------------------------------------------------------

    def refine(self, plan: List[Pattern]) -> List[Pattern]:
        """Steps 3 and 4 on the beam's best plan: every candidate is a unit
        (a pattern, or an op alone); merge neighbours, then pack the rest."""
        view = self.view
        covered = set().union(*plan) if plan else set()
        units = list(plan) + [frozenset([n]) for n in view.order
                              if n in self.candidates and n not in covered]
        owner: Dict[str, str] = {}
        members: Dict[str, List[str]] = {}
        # _closes_cycle's spans, sorted: of the units of more than one node
        # (the graph's own edges already connect an op alone).
        spans: List[Tuple[int, int, str]] = []

        def register(p: Pattern) -> str:
            unit = self._new_unit(p)
            for n in p:
                owner[n] = unit
            members[unit] = sorted(p, key=view.position.get)
            if len(p) > 1:
                bisect.insort(spans, _span(unit, p, view.position))
            return unit

        def unregister(unit: str) -> List[str]:
            nodes = members.pop(unit)
            if len(nodes) > 1:
                del spans[bisect.bisect_left(spans, _span(unit, nodes, view.position))]
            return nodes

        def restore(unit: str, nodes: List[str]) -> None:
            members[unit] = nodes
            owner.update((n, unit) for n in nodes)
            if len(nodes) > 1:
                bisect.insort(spans, _span(unit, nodes, view.position))

        def merge(a: str, b: str) -> Optional[str]:
            """The unit of a and b merged, when legal, profitable and acyclic
            in the plan (every other kernel one node); else None."""
            pa, pb = frozenset(members[a]), frozenset(members[b])
            merged = pa | pb
            s = self.evaluate(merged)
            if s is None or s <= self.evaluate(pa) + self.evaluate(pb):
                return None
            saved = unregister(a), unregister(b)  # the merged set is the one checked
            if self._closes_cycle(merged, spans):
                restore(a, saved[0])
                restore(b, saved[1])
                return None
            return register(merged)

        # Every kernel is a unit before any merge, so the cycle check sees
        # the whole plan (a later pattern can close a cycle too).
        for p in units:
            register(p)

        # 3. Neighbours: the DP grows a pattern only from a producer towards
        # its consumers, so two producers of one op (x + y, both computed)
        # end up apart; the paper's second PatternReduction round from a
        # virtual producer of every vertex joins them. Here: a greedy pass
        # over the plan's edges, merging when the evaluator gains.
        for consumer in view.order:
            if consumer not in self.candidates:
                continue
            for src, _ in view.data_inputs[consumer]:
                if src in self.candidates and owner[src] != owner[consumer]:
                    if merge(owner[src], owner[consumer]) is not None:
                        self.stats.merged += 1

        # 4. Remote fusion: kernels with the same static iteration space,
        # visited in topological order, join the first open pack they can.
        kernels = sorted(members, key=lambda u: view.position[members[u][0]])
        windows = packing.start_windows(view, [members[u] for u in kernels], self.fetches)
        if windows is None:  # the plan's kernels feed each other: pack nothing
            return [frozenset(m) for m in members.values()]
        window = dict(zip(kernels, windows))
        moved = {u: packing.boundary_bytes(view, members[u], self.fetches) for u in kernels}
        open_packs: Dict[tuple, List[str]] = {}  # iteration-space key -> pack units
        for unit in kernels:
            p = frozenset(members[unit])
            key = self._space_key(p)
            if key is None or not any(self.evaluator.launches.get(n) for n in p):
                continue
            for i, pack_unit in enumerate(open_packs.get(key, [])):
                if not window[pack_unit].admits(window[unit]) or \
                        moved[pack_unit] + moved[unit] > REMOTE_MAX_BYTES:
                    continue
                packed = merge(pack_unit, unit)
                if packed is not None:
                    open_packs[key][i] = packed
                    window[packed] = window[pack_unit].joined(window[unit])
                    moved[packed] = moved[pack_unit] + moved[unit]
                    self.stats.packed += 1
                    break
            else:
                open_packs.setdefault(key, []).append(unit)
        return [frozenset(m) for m in members.values()]

    def _space_key(self, p: Pattern) -> Optional[tuple]:
        """The static extents of the pattern's iteration space (and whether
        it has no reduction), or None when it has a dimension unknown at
        trace time or is not legal alone: only kernels with equal keys are
        tried for packing. Segment sums have a key of their own, their ids
        and segment count: sums of one ids tensor share a scatter kernel
        (codegen/scatter.py) whatever their rows' extents (Adam's two
        moments of one embedding's gradient, DIEN's g and g * g)."""
        if self.evaluate(p) is None:
            return None
        segments = {tuple(self.view.data_inputs[n][1:3]) for n in p
                    if self.view.nodes[n].op in packing.OWN_KERNELS}
        if segments:
            return ("segments", *segments) if len(segments) == 1 else None
        return self._space.get(p)


def _span(unit: str, nodes, position: Dict[str, int]) -> Tuple[int, int, str]:
    """A unit's entry in _closes_cycle's `spans`: its first and last position."""
    first = min(position[n] for n in nodes)
    return first, max(position[n] for n in nodes), unit


def form_clusters(view: GraphView, candidates: Set[str], fetches: Set[Tensor],
                  k: int = 3, beam: int = 3, costs: Optional[Dict] = None,
                  costs_source: str = "builtin", pack: bool = True,
                  loop_vars: Sequence[recurrences.LoopVar] = (),
                  refusals: Optional[legality.Refusals] = None,
                  rule_plans: Optional[Callable[[], Dict[str, List[List[str]]]]] = None,
                  extents: Optional[Callable] = None
                  ) -> Tuple[List[List[str]], ExploreStats]:
    """The explored plan: clusters (every candidate in exactly one, in
    topological order) and what the exploration did. `costs`: the delta
    evaluator's (cpu_cost_model.py), cpu_cost_model.BUILTIN if None. `pack`: step 5,
    packing.py's packs; `loop_vars`: a loop body's variables, (argument
    node, value returned for it) in order, () outside loops; `refusals`
    hears why a producer-consumer pair could not be one kernel;
    `rule_plans()`: the rule plans of the same graph by name, the default
    rules' first, for the plan guard (plan_guard.py; no guard if None, nor in
    a loop body), which prices plans at `extents(t)`
    (a tensor's sizes in the traced call, None where unknown)."""
    start = time.perf_counter()
    costs = cpu_cost_model.validate(dict(costs or cpu_cost_model.BUILTIN))
    recurrence = recurrences.recurrence_ids(view, loop_vars, candidates)
    explorer = _Explorer(view, candidates, fetches, k, beam, costs, recurrence, refusals)
    explorer.stats.costs = costs_source
    plan = explorer.best_plan(explorer.candidate_patterns())
    kernels = explorer.refine(plan)
    explorer.stats.plan_score = math.fsum(explorer.evaluate(p) for p in kernels if len(p) > 1)
    covered = set().union(*kernels) if kernels else set()
    groups = [sorted(p, key=view.position.get) for p in kernels]
    groups += [[n] for n in candidates if n not in covered]
    groups.sort(key=lambda g: view.position[g[0]])
    if pack:
        # 5. Packs of kernels in iteration spaces of their own: each unit
        # that joins a pack saves one launch (packing.py packs only units
        # that launch).
        unpacked = len(groups)
        groups = packing.pack_clusters(view, groups, fetches,
                                       recurrences.waited_for(view, loop_vars, recurrence))
        explorer.stats.packed_apart = unpacked - len(groups)
        explorer.stats.plan_score += explorer.stats.packed_apart * costs["launch"]
    if rule_plans is not None and loop_vars:
        explorer.stats.guard = ("plan guard: not applied in a loop body, as XLA's rules "
                                "do not keep a recurrence's ops apart: kept the explored plan")
    elif rule_plans is not None:
        groups, explorer.stats.guard = _guarded(view, fetches, groups, rule_plans, costs,
                                                explorer.evaluator.compute_alone, extents)
    explorer.stats.seconds = time.perf_counter() - start
    return groups, explorer.stats


def _guarded(view, fetches, groups, rule_plans, costs, compute_of, extents):
    """The plan guard's choice between `groups` and the rule plans, and its
    verdict; the explored plan when the guard fails."""
    start = time.perf_counter()
    try:
        choice = plan_guard.choose(view, fetches, groups, rule_plans(), costs, compute_of,
                                   extents)
    except Exception as e:  # noqa: BLE001  (a guard that fails leaves the plan as explored)
        return groups, f"plan guard failed ({type(e).__name__}: {e}): kept the explored plan"
    return choice.groups, f"{choice} ({time.perf_counter() - start:.2f} s)"
