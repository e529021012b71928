"""Simulated annealing over complete plans (FlexFlow's MCMC-style search), TF-free.

Starts from the pure data-parallel plan (as the DQN's reference), proposes a random neighbour
(the greedy search's moves: split or unsplit one unit, move one cut, adjacent micro-batch
count) or, with probability `jump` (or when there is no neighbour), a random legal plan, and
accepts a worse plan with probability exp(-(log t' - log t) / T). T cools geometrically from
`t_start` to `t_end` as the budget of distinct priced plans is spent, or as the walk's steps
(at most `max_steps_per_call` per call of budget) run out, whichever is further: revisits of
priced plans are free and would otherwise hold the temperature.
"""

import math
import random as random_lib

from tf_fusionstitch.planner.search_common import (Budget, make_plan, neighbours, random_plan,
                                                   reference_config)

DEFAULT_BUDGET = 300


def _log_objective(env, config):
    return math.log(env.objective(env.evaluate(config)))


def annealing(env, budget=None, seed=0, t_start=1.0, t_end=3e-3, jump=0.1,
              max_steps_per_call=20):
    """(Plan of the best plan priced, cost-model calls used)."""
    budget = budget or DEFAULT_BUDGET
    rng = random_lib.Random(seed)
    track = Budget(env, budget)
    current = reference_config(env)
    track.consider(current)
    current_obj = _log_objective(env, current)
    max_steps = max_steps_per_call * budget
    for step in range(max_steps):
        if track.exhausted():
            break
        # Cool with the budget spent, or with steps when proposals keep being known plans.
        progress = min(1.0, max(track.used / budget, step / max_steps))
        temperature = t_start * (t_end / t_start) ** progress
        moves = list(neighbours(env, current))
        if rng.random() < jump or not moves:
            proposal = random_plan(env, rng)
        else:
            proposal = rng.choice(moves)
        if not env.is_priced(proposal) and track.exhausted():
            break
        track.consider(proposal)
        obj = _log_objective(env, proposal)
        if obj <= current_obj or rng.random() < math.exp(-(obj - current_obj) / temperature):
            current, current_obj = proposal, obj
    return make_plan(env, track.best, "annealing"), track.used
