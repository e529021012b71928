"""The fusion strategies behind one interface (optimize's `fusion` option).

A strategy takes the view of a graph and its fusible candidates and forms
the clusters the fusion pass then lowers, builds and substitutes:

- "stitch" (clustering.py): greedy producer-consumer merging where a
  reduction shares a kernel with the ops that read it, then kernels that no
  path connects packed into one launch (packing.py);
- "xla_like" (xla_like.py): XLA's fusion rules, to compare plans; it first
  expands Softmax as tf2xla does;
- "explore" (explore.py): FusionStitching's plan exploration with its delta
  evaluator, remote fusion and packing.

Each says, for the candidates it leaves out, why (`rejected`), and for every
op, the first reason a kernel with it was refused (`refusals`), so the
report can name the rule that kept an op alone.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Callable, Dict, List, Optional, Set

from tf_fusionstitch.options import FusionOptions
from tf_fusionstitch.rewriters import (clustering, explore, legality, packing, recurrences,
                                       xla_like)
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor


@dataclasses.dataclass(frozen=True)
class Context:
    fetches: Set[Tensor]
    options: FusionOptions
    loop_vars: tuple = ()        # a loop body's (argument node, returned value) pairs
    costs: Optional[Dict] = None   # the delta evaluator's (cpu_cost_model.py); BUILTIN if None
    costs_source: str = "builtin"
    # (Placeholder, axis) -> size in the traced call, and per tensor its
    # extents at those sizes (fusion_pass.typical_extents): what explore's
    # plan guard prices plans at.
    call_sizes: Dict = dataclasses.field(default_factory=dict)
    extents: Optional[Callable] = None


@dataclasses.dataclass
class Formed:
    groups: List[List[str]]      # clusters, each in topological order
    rejected: Dict[str, str]     # candidates left as TF ops, and why
    refusals: Dict[str, str]     # per op, the first reason a kernel with it was refused
    exploration: str = ""        # what a search did, for the report


class Strategy(abc.ABC):
    name = ""

    def prepare(self, graph_def, types):
        """The graph the strategy fuses: as given, unless it rewrites some ops first."""
        return graph_def, types

    @abc.abstractmethod
    def form_clusters(self, view: GraphView, candidates: Set[str], context: Context) -> Formed:
        """The clusters of `candidates`, and why the ones left out stay TF ops."""


class Stitch(Strategy):
    name = "stitch"

    def form_clusters(self, view, candidates, context):
        refusals = legality.Refusals()
        recurrence = recurrences.recurrence_ids(view, context.loop_vars, candidates)
        groups = _stitch_plan(view, candidates, context.fetches, context.options.pack,
                              recurrence, recurrences.waited_for(view, context.loop_vars,
                                                                 recurrence), refusals)
        return Formed(groups, {}, refusals.first)


def _stitch_plan(view, candidates, fetches, pack: bool, recurrence=None,
                 carried=frozenset(), refusals=None) -> List[List[str]]:
    groups = clustering.form_clusters(view, candidates, fetches, recurrence,
                                      refusals=refusals)
    return packing.pack_clusters(view, groups, fetches, carried) if pack else groups


class XlaLike(Strategy):
    name = "xla_like"

    def prepare(self, graph_def, types):
        return xla_like.expand_softmax(graph_def, types)

    def form_clusters(self, view, candidates, context):
        rejected = xla_like.unfusible_alone(view, candidates, context.fetches)
        refusals = legality.Refusals()
        groups = xla_like.form_clusters(view, candidates - set(rejected), context.fetches,
                                        refusals=refusals)
        return Formed(groups, rejected, refusals.first)


class Explore(Strategy):
    name = "explore"

    def form_clusters(self, view, candidates, context):
        refusals = legality.Refusals()
        o = context.options
        groups, stats = explore.form_clusters(
            view, candidates, context.fetches, k=o.explore_k, beam=o.explore_beam,
            costs=context.costs, costs_source=context.costs_source, pack=o.pack,
            loop_vars=context.loop_vars, refusals=refusals,
            rule_plans=(lambda: _rule_plans(view, candidates, context.fetches, o.pack))
            if o.explore_guard else None,
            extents=context.extents)
        return Formed(groups, {}, refusals.first, str(stats))


def _rule_plans(view, candidates, fetches, pack: bool) -> Dict[str, List[List[str]]]:
    """The plans explore's guard weighs its own against, the default first:
    the default rules' (stitch, packed as `pack` says) and XLA's (Softmax not
    expanded), both of the graph as given. The guard runs outside loop
    bodies only, so no recurrence keeps ops apart here."""
    rejected = xla_like.unfusible_alone(view, candidates, fetches)
    return {"stitch": _stitch_plan(view, candidates, fetches, pack),
            "XLA-rule": xla_like.form_clusters(view, candidates - set(rejected), fetches)}


# In options.STRATEGIES' order (tests/rewriters/test_strategies.py checks the names agree).
STRATEGIES: Dict[str, Strategy] = {s.name: s for s in (Stitch(), XlaLike(), Explore())}
