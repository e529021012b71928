"""Searches over one `strategies.PlanEnv`: exhaustive, dynamic programming, greedy, random,
and (in their own modules) simulated annealing and the DQN; what they share is in
`search_common`.

TF-free. Each returns (Plan, cost-model calls used). `budget` caps cost-model calls (cache
misses); exhaustive refuses a space larger than its budget rather than silently truncate.
"""

import dataclasses
import itertools
import math
import random as random_lib

from tf_fusionstitch.planner import cost_model as cm
from tf_fusionstitch.planner.search_common import (Budget, make_plan, neighbours, random_plan,
                                                   start_configs)

METHODS = ("exhaustive", "dp", "greedy", "random", "annealing", "dqn")
DEFAULT_BUDGET = {"exhaustive": 5000, "dp": 2000, "greedy": 2000, "random": 200,
                  "annealing": 300, "dqn": 300}


def _complete_states(env, state=()):
    dec = env.decision(state)
    if dec is None:
        yield state
        return
    for a in dec.legal_actions():
        yield from _complete_states(env, state + (a,))


def exhaustive(env, budget=None):
    """Evaluates every legal plan. Raises ValueError if there are more than `budget`."""
    budget = budget or DEFAULT_BUDGET["exhaustive"]
    states = list(itertools.islice(_complete_states(env), budget + 1))
    if len(states) > budget:
        raise ValueError(f"the {env.strategy!r} space has more than {budget} plans: use "
                         "method='dp', 'greedy' or 'random', or raise budget")
    track = Budget(env, math.inf)
    for s in states:
        track.consider(env.config(s))
    return make_plan(env, track.best, "exhaustive"), track.used


def random(env, budget=None, seed=0):
    """Uniformly random legal episodes until `budget` distinct plans were evaluated."""
    budget = budget or DEFAULT_BUDGET["random"]
    rng = random_lib.Random(seed)
    track = Budget(env, budget)
    for _ in range(budget * 20):
        if track.exhausted():
            break
        track.consider(random_plan(env, rng))
    return make_plan(env, track.best, "random"), track.used


def _ranked_starts(env, track):
    """Every mesh's plain start, evaluated, best first: a budget that runs out during
    refinement has still compared every mesh."""
    starts = [(track.consider(c), i, c) for i, c in enumerate(start_configs(env))]
    return [c for _, _, c in sorted(starts)]


def greedy(env, budget=None):
    """Hill climbing from every mesh's plain start (best start first): take the best single
    change until none improves (split or unsplit one unit, move one cut, adjacent
    micro-batch count)."""
    budget = budget or DEFAULT_BUDGET["greedy"]
    track = Budget(env, budget)
    for start in _ranked_starts(env, track):
        if track.exhausted():
            break
        current, obj = start, env.objective(env.evaluate(start))
        while not track.exhausted():
            best_n, best_obj = None, obj
            for n in neighbours(env, current):
                if track.exhausted():
                    break
                o = track.consider(n)
                if o < best_obj:
                    best_n, best_obj = n, o
            if best_n is None:
                break
            current, obj = best_n, best_obj
    return make_plan(env, track.best, "greedy"), track.used


def _best_cuts(env, profile, p, m):
    """Exact DP over contiguous unit ranges minimising the slowest stage, within memory."""
    comp, weights, acts, boundary = profile
    n = len(comp)
    c = env.cluster
    bw, lat = c.send_link(1)
    pre = list(itertools.accumulate([0.0] + comp))
    prew = list(itertools.accumulate([0.0] + weights))
    prea = list(itertools.accumulate([0.0] + acts))

    def stage_cost(i, j, s, check_memory):
        if check_memory:
            flight = cm.in_flight_micro_batches(s, p, m, env.schedule)
            if prew[j] - prew[i] + (prea[j] - prea[i]) * flight > c.memory:
                return math.inf
        sends = (cm.p2p_time(boundary[j], bw, lat) if j < n else 0.0) + \
                (cm.p2p_time(boundary[i], bw, lat) if i > 0 else 0.0)
        return pre[j] - pre[i] + sends

    for check_memory in (True, False):
        f = [[math.inf] * (n + 1) for _ in range(p)]
        arg = [[0] * (n + 1) for _ in range(p)]
        for j in range(1, n + 1):
            f[0][j] = stage_cost(0, j, 0, check_memory)
        for s in range(1, p):
            for j in range(s + 1, n + 1):
                for i in range(s, j):
                    v = max(f[s - 1][i], stage_cost(i, j, s, check_memory))
                    if v < f[s][j]:
                        f[s][j], arg[s][j] = v, i
        if f[p - 1][n] < math.inf:
            cuts, j = [], n
            for s in range(p - 1, 0, -1):
                j = arg[s][j]
                cuts.append(j)
            return tuple(reversed(cuts))
    return env.even_cuts(p)


def dp(env, budget=None):
    """Per mesh (best plain start first): the split units by exhaustive choice when few
    (else a greedy-grown list), then per micro-batch count the pipeline cuts by exact dynamic
    programming over pipeline units."""
    budget = budget or DEFAULT_BUDGET["dp"]
    track = Budget(env, budget)
    for start in _ranked_starts(env, track):
        d, t, p = start.replicas, start.tensor_parallel, start.stages
        best_split, best_obj = frozenset(), math.inf
        for s in (_split_sets(env, t) if t > 1 else [frozenset()]):
            if track.exhausted():
                break
            o = track.consider(dataclasses.replace(start, split_units=s))
            if o < best_obj:
                best_split, best_obj = s, o
        if p == 1:
            continue
        for m in env.micro_batch_choices(d, p):
            if track.exhausted():
                break
            profile = env.cost.unit_profile(best_split, t, d * m)
            cuts = _best_cuts(env, profile, p, m)
            track.consider(cm.Config(d, t, p, m, best_split, cuts, env.schedule))
    return make_plan(env, track.best, "dp"), track.used


def _split_sets(env, t, limit=64):
    """All non-empty legal sets of split units if there are at most `limit`, else the single
    units and their greedy-grown union."""
    link = env.link
    sets, frontier = [frozenset()], [frozenset()]
    while frontier and len(sets) <= limit:
        nxt = []
        for s in frontier:
            for u in link.legal_units(set(s), t):
                if u > max(s, default=-1):
                    nxt.append(s | {u})
        sets += nxt
        frontier = nxt
    if len(sets) <= limit:
        return sets[1:]
    # Too many: every single unit, and the union of compatible ones grown in order.
    singles = link.legal_units(set(), t)
    grown = set()
    for u in singles:
        if u in link.legal_units(grown, t):
            grown.add(u)
    return [frozenset({u}) for u in singles] + ([frozenset(grown)] if len(grown) > 1 else [])


def _annealing(env, budget=None, seed=0):
    from tf_fusionstitch.planner import annealing
    return annealing.annealing(env, budget or DEFAULT_BUDGET["annealing"], seed)


def _dqn(env, budget=None, seed=0):
    from tf_fusionstitch.planner import dqn   # imports TensorFlow: only when asked for
    return dqn.dqn(env, budget or DEFAULT_BUDGET["dqn"], seed)


SEARCHES = {"exhaustive": exhaustive, "dp": dp, "greedy": greedy, "random": random,
            "annealing": _annealing, "dqn": _dqn}
SEEDED = ("random", "annealing", "dqn")


def run(env, method, budget=None, seed=0):
    """Runs search `method` on `env`; returns (Plan, cost-model calls used)."""
    if method not in SEARCHES:
        raise ValueError(f"unknown search method {method!r}; use one of {', '.join(METHODS)}")
    if budget is not None and (not isinstance(budget, int) or budget < 1):
        raise ValueError(f"budget must be a positive integer (cost-model calls), got {budget!r}")
    if method in SEEDED:
        return SEARCHES[method](env, budget, seed)
    return SEARCHES[method](env, budget)
