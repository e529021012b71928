"""explore's plan guard: the explored plan against the rule plans of the
same graph (optimize's default rules, "stitch", and XLA's), all priced by
the plan model (plan_time.py). The delta evaluator scores patterns by the
bytes and launches they save; it cannot see what a kernel delays (a pack
that holds back the critical path, a big kernel that takes the cores from a
matmul). The explored plan is kept only where the plan model predicts it
faster than every rule plan by more than its own error on this machine
(costs["plan_error"], measured by plan_checks.py). Otherwise a rule plan is
kept: the first one given (the default rules' plan), unless the model
predicts another faster than it by more than its error. The report says
which and why.

Why the default rules' plan and not XLA's where the model cannot tell:
it is the plan the same call gets without explore, so asking for explore
never changes the plan on a guess. Against XLA's rules it measured from 4%
slower (EfficientNetB0's train step, in median) to 4% faster on the
reference and zoo train steps (benchmarks/RESULTS.md, "Explore's plan guard
against both rule plans"): a difference the model, whose error is 12-27%,
cannot see either way. The first calls then can: optimize times the kept
plan against XLA's rule plan there (options.measured_plans,
tf_fusionstitch/measured_choice.py).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Set

from tf_fusionstitch.rewriters import plan_time
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor

EXPLORED = "explored"


@dataclasses.dataclass(frozen=True)
class Choice:
    kept: str                                 # EXPLORED or a rule plan's name
    groups: List[List[str]]                   # the plan kept
    times: Dict[str, plan_time.PlanTime]      # every plan's prediction, explored first
    error: float                              # the model's relative error on this machine

    @property
    def kept_explored(self) -> bool:
        return self.kept == EXPLORED

    def gain_over(self, name: str) -> float:
        """The explored plan's predicted gain, relative to plan `name`'s step."""
        return _gain(self.times[EXPLORED], self.times[name])

    @property
    def gain(self) -> float:
        """The explored plan's smallest predicted gain over a rule plan."""
        return min(self.gain_over(n) for n in self.times if n != EXPLORED)

    def __str__(self) -> str:
        plans = ", ".join(f"{name} plan {t}" for name, t in self.times.items())
        verdict = "above" if self.kept_explored else "within"
        return (f"plan guard: {plans}; the explored plan's predicted gain over the rule "
                f"plans ({100 * self.gain:+.1f}%) is {verdict} the plan model's error "
                f"({100 * self.error:.1f}%): kept the {self.kept} plan")


def _gain(plan: plan_time.PlanTime, base: plan_time.PlanTime) -> float:
    return (base.step_s - plan.step_s) / base.step_s if base.step_s > 0 else 0.0


def choose(view: GraphView, fetches: Set[Tensor], explored: Sequence[Sequence[str]],
           rules: Dict[str, Sequence[Sequence[str]]], costs: Dict,
           compute_of: Callable[[str], float],
           extents: Optional[Callable[[Tensor], Optional[list]]] = None) -> Choice:
    """The plan to keep of `explored` and the rule plans `rules` (name ->
    list of groups, the default first): explored only when the plan model
    predicts it faster than each rule plan by more than its error.
    `compute_of(op)`: an op's arithmetic in seconds (the delta evaluator's
    compute-bound primitives); `extents(t)`: a tensor's sizes in the traced
    call (plan_time.Sizes), the sizes every plan is priced at."""
    if not rules:
        raise ValueError("the plan guard needs at least one rule plan")
    machine = plan_time.Machine.from_costs(costs)
    sizes = plan_time.Sizes(view, extents)
    seconds = plan_time.fused_seconds(sizes, fetches, machine, compute_of)
    plans = {EXPLORED: explored, **rules}
    times = {name: plan_time.predict(sizes, groups, machine, seconds)
             for name, groups in plans.items()}
    error = costs["plan_error"]
    default = next(iter(rules))
    rule = min(rules, key=lambda n: times[n].step_s)
    if _gain(times[rule], times[default]) <= error:
        rule = default          # the model cannot tell the rule plans apart
    kept = EXPLORED if all(_gain(times[EXPLORED], times[n]) > error for n in rules) else rule
    return Choice(kept, [list(g) for g in plans[kept]], times, error)
