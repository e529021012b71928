"""Task-specific pruning on top of `strategies.PlanEnv`, for searches that walk episodes. TF-free.

What PlanEnv already prunes (tested in tests/planner/test_planner_search.py): repeated layers share one
linkage unit (one decision for all layers); a unit whose extents do not divide by the
tensor-parallel degree, or that would split a tensor twice, is masked; a tensor-parallel mesh
must split something; cuts are increasing.

What this module adds:
  * forced decisions are not asked: a decision with one legal action (a unit that linkage
    forbids splitting or forces to be split, the single mesh of a strategy) is taken at once;
  * memory-infeasible prefixes end early: once the mesh is known, a lower bound on the
    fullest device's bytes (weights, optimizer slots and gradients, with every undecided
    unit assumed split; activations ignored) that exceeds device memory proves that no
    completion fits, so the episode stops without a cost-model call.
"""

import numpy as np


class Pruner:
    """Forced-decision skipping and a sound per-device memory lower bound for one env."""

    def __init__(self, env):
        self.env = env
        graph, cost, link = env.graph, env.cost, env.link
        variables = list(graph.variables.values())
        unit_of_var = {}
        for u in link.units:
            for name, _ in u.variables:
                unit_of_var.setdefault(name, set()).add(u.index)
        # Bytes each variable puts on its stage: the variable itself (weights and optimizer
        # slots are variables), plus a gradient when it is trained (as the cost model counts).
        self._bytes = np.array([v.nbytes * (2 if v.trainable and cost.training else 1)
                                for v in variables], dtype=np.float64)
        self._pipeline_unit = np.array([cost.var_unit.get(v.name, 0) for v in variables],
                                       dtype=np.int64)
        self._member = np.zeros((len(variables), max(1, env.num_units)), dtype=bool)
        for i, v in enumerate(variables):
            for u in unit_of_var.get(v.name, ()):
                self._member[i, u] = True
        self.memory = env.cluster.memory

    def advance(self, state):
        """`state` after taking every forced decision (one legal action) that comes next."""
        env = self.env
        while (dec := env.decision(state)) is not None:
            legal = dec.legal_actions()
            if len(legal) != 1:
                break
            state = env.step(state, legal[0])
        return state

    def memory_lower_bound(self, state):
        """Bytes that the fullest device needs at least, for every completion of `state`
        (0 before the mesh is chosen)."""
        env = self.env
        mesh, _, units, cuts = env.parse(state)
        if mesh is None:
            return 0.0
        _, t, p = mesh
        sizes = self._bytes
        if t > 1:
            # Undecided units may still be split: count them as split (a lower bound).
            maybe_split = np.ones(self._member.shape[1], dtype=bool)
            maybe_split[:len(units)] = np.array(units, dtype=bool)
            divided = (self._member & maybe_split).any(axis=1)
            sizes = np.where(divided, sizes / t, sizes)
        per_unit = np.bincount(self._pipeline_unit, weights=sizes,
                               minlength=env.cost.num_units)
        positions = list(range(1, env.cost.num_units))
        bounds = [0] + [positions[c] for c in cuts]
        fixed = [per_unit[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])]
        rest = per_unit[bounds[-1]:].sum()
        # Stages between decided cuts are known; the rest hold at least their mean.
        return float(max(fixed + [rest / (p - len(fixed))]))

    def dead(self, state):
        """True when no completion of `state` can fit in device memory."""
        return self.memory_lower_bound(state) > self.memory
