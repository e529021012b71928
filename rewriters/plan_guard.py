"""explore's plan guard: the explored plan against the XLA-rule plan of the
same graph, both priced by the plan model (plan_time.py). The delta
evaluator scores patterns by the bytes and launches they save; it cannot
see what a kernel delays (a pack that holds back the critical path, a big
kernel that takes the cores from a matmul). Where the plan model's
predicted gain of the explored plan is within its own error on this
machine (costs["plan_error"], measured by plan_checks.py), the simpler
plan, XLA's rules, is kept; the report says which and why.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Set

from tf_fusionstitch.rewriters import plan_time
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor


@dataclasses.dataclass(frozen=True)
class Choice:
    groups: List[List[str]]        # the plan kept
    explored: plan_time.PlanTime
    rules: plan_time.PlanTime
    error: float                   # the model's relative error on this machine
    kept_explored: bool

    @property
    def gain(self) -> float:
        """The explored plan's predicted gain, relative to the XLA-rule plan's step."""
        rules = self.rules.step_s
        return (rules - self.explored.step_s) / rules if rules > 0 else 0.0

    def __str__(self) -> str:
        verdict = ("above" if self.kept_explored else "within")
        kept = "explored" if self.kept_explored else "XLA-rule"
        return (f"plan guard: explored plan {self.explored}, XLA-rule plan {self.rules}; "
                f"predicted gain {100 * self.gain:+.1f}% is {verdict} the plan model's "
                f"error ({100 * self.error:.1f}%): kept the {kept} plan")


def choose(view: GraphView, fetches: Set[Tensor], explored: Sequence[Sequence[str]],
           rules: Sequence[Sequence[str]], costs: Dict,
           compute_of: Callable[[str], float],
           extents: Optional[Callable[[Tensor], Optional[list]]] = None) -> Choice:
    """The plan to keep of `explored` and `rules` (each a list of groups):
    explored only when the plan model predicts it faster by more than its
    error. `compute_of(op)`: an op's arithmetic in seconds (the delta
    evaluator's compute-bound primitives); `extents(t)`: a tensor's sizes
    in the traced call (plan_time.Sizes), the sizes both plans are priced at."""
    machine = plan_time.Machine.from_costs(costs)
    sizes = plan_time.Sizes(view, extents)
    seconds = plan_time.fused_seconds(sizes, fetches, machine, compute_of)
    explored_time = plan_time.predict(sizes, explored, machine, seconds)
    rules_time = plan_time.predict(sizes, rules, machine, seconds)
    choice = Choice([list(g) for g in explored], explored_time, rules_time,
                    costs["plan_error"], True)
    if choice.gain <= choice.error:
        choice = dataclasses.replace(choice, groups=[list(g) for g in rules],
                                     kept_explored=False)
    return choice
