"""What the plan searches share, TF-free: the budget of cost-model calls, the plain start plan
of each mesh and the single changes around a plan, the data-parallel reference plan, random
legal plans, and the `Plan` of a config.

`searches`, `annealing` and `dqn` import this module and none of each other (the registry in
`searches` loads the other two).
"""

import dataclasses
import math

from tf_fusionstitch.planner import cost_model as cm
from tf_fusionstitch.planner import plan as plan_lib


def make_plan(env, config, method):
    """The `Plan` of `config` (evaluated through the environment's cache)."""
    est = env.evaluate(config)
    graph, link = env.graph, env.link
    split = {}
    if config.tensor_parallel > 1:
        for u in config.split_units:
            for var, axis in link.units[u].variables:
                split[var] = axis
    unit_stage = env.cost.stage_of_unit(config.cuts)
    stages = [[] for _ in range(config.stages)]
    for op in graph.ops:
        stages[unit_stage[env.cost.anchor[op]]].append(op)
    counts = {}
    for c in est.collectives:
        key = f"{c.kind}/{c.phase}"
        counts[key] = counts.get(key, 0) + 1
    return plan_lib.Plan(
        variable_splits={v: split.get(v) for v in graph.variables},
        stages=stages, replicas=config.replicas, tensor_parallel=config.tensor_parallel,
        micro_batches=config.micro_batches, predicted_step_time=est.step_time,
        peak_memory_per_device=est.peak_memory, feasible=est.feasible,
        cluster=env.cluster.to_dict(), strategy=env.strategy, method=method,
        schedule=config.schedule,
        split_units=[link.units[u].label for u in sorted(config.split_units)],
        cuts=list(config.cuts), infeasible_reason=est.reason, tp_collectives=counts,
        fusion=env.cost.fusion)


class Budget:
    """Cost-model calls a search has used since it began, against its budget, and the best
    plan it has priced (least objective; the first priced wins a tie)."""

    def __init__(self, env, budget):
        self.env, self.start, self.budget = env, env.calls, budget
        self.best, self.best_obj = None, math.inf

    @property
    def used(self):
        return self.env.calls - self.start

    def exhausted(self):
        return self.used >= self.budget

    def consider(self, config):
        obj = self.env.objective(self.env.evaluate(config))
        if obj < self.best_obj:
            self.best, self.best_obj = config, obj
        return obj


def start_configs(env):
    """Each mesh's plain plan: the fewest micro-batches that fill its pipeline, the first
    legal unit split (when t > 1), even cuts."""
    for d, t, p in env.meshes:
        ms = env.micro_batch_choices(d, p)
        m = min((x for x in ms if x >= p), default=ms[-1])
        split = frozenset(env.link.legal_units(set(), t)[:1]) if t > 1 else frozenset()
        yield cm.Config(d, t, p, m, split, env.even_cuts(p), env.schedule)


def neighbours(env, config):
    """The plans one change away: split or unsplit one unit, adjacent micro-batch count,
    move one cut by one."""
    link, t = env.link, config.tensor_parallel
    if t > 1:
        for u in range(env.num_units):
            if u in config.split_units:
                if len(config.split_units) > 1:   # a t > 1 mesh splits something
                    yield dataclasses.replace(config, split_units=config.split_units - {u})
            elif u in link.legal_units(set(config.split_units), t):
                yield dataclasses.replace(config, split_units=config.split_units | {u})
    ms = env.micro_batch_choices(config.replicas, config.stages)
    i = ms.index(config.micro_batches)
    for j in (i - 1, i + 1):
        if 0 <= j < len(ms):
            yield dataclasses.replace(config, micro_batches=ms[j])
    cuts = list(config.cuts)
    for k in range(len(cuts)):
        lo = cuts[k - 1] + 1 if k else 1
        hi = cuts[k + 1] - 1 if k + 1 < len(cuts) else env.cost.num_units - 1
        for c in (cuts[k] - 1, cuts[k] + 1):
            if lo <= c <= hi:
                yield dataclasses.replace(config, cuts=tuple(cuts[:k] + [c] + cuts[k + 1:]))


def reference_config(env):
    """Pure data parallelism if the environment offers it, else the first mesh's plain plan."""
    n = env.cluster.num_devices
    if (n, 1, 1) in env.meshes:
        return cm.Config(replicas=n, schedule=env.schedule)
    return next(start_configs(env))


def random_plan(env, rng):
    """A uniformly random legal episode (a random mesh, then random legal decisions)."""
    state = env.reset()
    while (dec := env.decision(state)) is not None:
        state = env.step(state, rng.choice(dec.legal_actions()))
    return env.config(state)
