"""Strategy spaces as one decision environment shared by every search. TF-free.

An episode is a sequence of decisions, each with a mask of legal actions:

  1. mesh: (replicas d, tensor-parallel t, stages p) with d * t * p = devices, among those
     the strategy allows ("data": d only; "operator": t only; "pipeline": p only; "auto": all
     products);
  2. micro-batches m (only when p > 1);
  3. one decision per linkage unit (only when t > 1): 0 = replicate, 1 = split it t ways
     along its own axis (illegal when an extent is not divisible by t, or when a tensor
     would be split twice together with an already split unit); at least one unit is
     split, and meshes whose t splits nothing are not offered;
  4. p - 1 pipeline cuts, increasing, at pipeline-unit boundaries.

A finished episode is a `cost_model.Config`; its reward is minus the predicted step time
(a large penalty when it does not fit in memory). Searches (and the later DQN) drive the
environment through `decision`, `step` and `evaluate`, so all are compared at equal budgets
of cost-model calls.
"""

import dataclasses

from tf_fusionstitch.planner import cost_model

STRATEGIES = ("auto", "data", "operator", "pipeline")
INFEASIBLE_PENALTY = 1e6   # seconds: worse than any plan that fits


def _divisors(n):
    return [i for i in range(1, n + 1) if n % i == 0]


@dataclasses.dataclass(frozen=True)
class Decision:
    kind: str            # "mesh", "micro_batches", "unit", "cut"
    index: int           # which unit or cut
    actions: tuple       # the action values (legal or not), indexed by action id
    legal: tuple         # bool mask over `actions`

    def legal_actions(self):
        return [a for a, ok in enumerate(self.legal) if ok]


class PlanEnv:
    """The environment: legal decisions, transitions and (cached, counted) evaluation."""

    def __init__(self, graph, cluster, strategy="auto", schedule="1f1b", max_micro_batches=32,
                 fusion="none"):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
        self.graph = graph
        self.cluster = cluster
        self.strategy = strategy
        self.schedule = schedule
        self.cost = cost_model.CostModel(graph, cluster, fusion)
        self.link = graph.linkage
        self.num_units = len(self.link.units)
        self.batch = graph.batch_size
        self.meshes = self._meshes()
        if not self.meshes:
            raise ValueError(self._no_mesh_reason())
        self.max_micro_batches = max_micro_batches
        self._cache = {}

    # -- the space ----------------------------------------------------------------------------

    def _meshes(self):
        n = self.cluster.num_devices
        out = []
        for d in _divisors(n):
            for t in _divisors(n // d):
                p = n // (d * t)
                allowed = {"data": t == 1 and p == 1, "operator": d == 1 and p == 1,
                           "pipeline": d == 1 and t == 1, "auto": True}[self.strategy]
                # t devices that split nothing would only repeat one device's work.
                splittable = t == 1 or self.link.legal_units(set(), t)
                if allowed and splittable and self.batch % d == 0 and \
                        p <= self.cost.num_units:
                    out.append((d, t, p))
        return out

    def _no_mesh_reason(self):
        n = self.cluster.num_devices
        if self.strategy == "data":
            return (f"data parallelism over {n} devices needs a batch divisible by {n}; the "
                    f"graph's batch is {self.batch}")
        if self.strategy == "operator":
            return (f"operator partitioning over {n} devices needs a linkage group whose "
                    f"extents divide by {n}; this graph has none")
        if self.strategy == "pipeline":
            return (f"a {n}-stage pipeline needs at least {n} pipeline units; the graph has "
                    f"{self.cost.num_units}")
        return f"no mesh of {n} devices fits strategy {self.strategy!r}"

    def micro_batch_choices(self, d, p):
        if p == 1:
            return [1]
        return [m for m in _divisors(self.batch // d) if m <= self.max_micro_batches]

    # -- episodes -----------------------------------------------------------------------------

    def reset(self):
        return ()

    def parse(self, state):
        """(mesh, m, unit decisions, cuts) of a partial state."""
        if not state:
            return None, None, [], []
        d, t, p = self.meshes[state[0]]
        i = 1
        m = 1
        if p > 1:
            if len(state) < 2:
                return (d, t, p), None, [], []
            m = self.micro_batch_choices(d, p)[state[1]]
            i = 2
        n_units = self.num_units if t > 1 else 0
        units = list(state[i:i + n_units])
        cuts = list(state[i + n_units:])
        return (d, t, p), m, units, cuts

    def decision(self, state):
        """The next `Decision`, or None when `state` is complete."""
        if not state:
            return Decision("mesh", 0, tuple(self.meshes), (True,) * len(self.meshes))
        mesh, m, units, cuts = self.parse(state)
        d, t, p = mesh
        if m is None:
            choices = self.micro_batch_choices(d, p)
            return Decision("micro_batches", 0, tuple(choices), (True,) * len(choices))
        if t > 1 and len(units) < self.num_units:
            here = len(units)
            chosen = {i for i, x in enumerate(units) if x}
            legal = self.link.legal_units(chosen, t)
            # At least one unit must be split: replicating is illegal for the last chance.
            last_chance = not chosen and [u for u in legal if u >= here] == [here]
            return Decision("unit", here, (0, 1), (not last_chance, here in legal))
        if len(cuts) < p - 1:
            lo = (cuts[-1] + 1 if cuts else 0) + 1   # cut actions are positions - 1
            hi = self.cost.num_units - (p - 1 - len(cuts))
            positions = tuple(range(1, self.cost.num_units))
            return Decision("cut", len(cuts), positions,
                            tuple(lo <= x <= hi for x in positions))
        return None

    @property
    def action_space_size(self):
        """Actions of the widest decision: a DQN's output layer size (masks pad to it)."""
        widest_m = max(len(self.micro_batch_choices(d, p)) for d, _, p in self.meshes)
        return max(len(self.meshes), widest_m, 2, self.cost.num_units - 1)

    def legal_mask(self, state):
        """The next decision's legal actions as a list of bools of `action_space_size`."""
        dec = self.decision(state)
        mask = [False] * self.action_space_size
        if dec is not None:
            mask[:len(dec.legal)] = dec.legal
        return mask

    _KINDS = ("mesh", "micro_batches", "unit", "cut")

    def observation(self, state):
        """A fixed-length numeric view of a (partial) state for learned searches.

        [one-hot of the next decision kind (4), its index / units, d/N, t/N, p/N, m/batch,
        one slot per unit (1 split, 0 replicated, -1 undecided), one per possible cut
        (position / units, -1 undecided)]; mesh values are 0 before the mesh is chosen.
        """
        n = self.cluster.num_devices
        dec = self.decision(state)
        kind = [float(dec is not None and dec.kind == k) for k in self._KINDS]
        index = [dec.index / max(1, self.num_units) if dec is not None else 0.0]
        mesh, m, units, cuts = self.parse(state)
        d, t, p = mesh if mesh else (0, 0, 0)
        mesh_feats = [d / n, t / n, p / n, (m or 0) / self.batch]
        unit_feats = [float(x) for x in units] + [-1.0] * (self.num_units - len(units))
        positions = list(range(1, self.cost.num_units))
        cut_feats = [positions[c] / self.cost.num_units for c in cuts]
        cut_feats += [-1.0] * (n - 1 - len(cut_feats))
        return kind + index + mesh_feats + unit_feats + cut_feats

    def step(self, state, action):
        dec = self.decision(state)
        if dec is None:
            raise ValueError("the episode is complete")
        if not 0 <= action < len(dec.actions) or not dec.legal[action]:
            raise ValueError(f"illegal action {action} for decision {dec.kind}")
        return state + (action,)

    def complete(self, state):
        return self.decision(state) is None

    def config(self, state):
        mesh, m, units, cuts = self.parse(state)
        d, t, p = mesh
        positions = list(range(1, self.cost.num_units))
        return cost_model.Config(
            replicas=d, tensor_parallel=t, stages=p, micro_batches=m,
            split_units=frozenset(i for i, x in enumerate(units) if x),
            cuts=tuple(positions[c] for c in cuts), schedule=self.schedule)

    def state_of(self, config):
        """The action sequence that produces `config` (inverse of `config`)."""
        mesh = (config.replicas, config.tensor_parallel, config.stages)
        state = (self.meshes.index(mesh),)
        if config.stages > 1:
            state += (self.micro_batch_choices(config.replicas, config.stages)
                      .index(config.micro_batches),)
        if config.tensor_parallel > 1:
            state += tuple(int(i in config.split_units) for i in range(self.num_units))
        return state + tuple(c - 1 for c in config.cuts)

    # -- evaluation ---------------------------------------------------------------------------

    @property
    def calls(self):
        return self.cost.calls

    def is_priced(self, config):
        """Whether `config` is in the cache: evaluating it again costs no cost-model call."""
        return config in self._cache

    def evaluate(self, config):
        """Cached `Estimate` of a config; only cache misses count as cost-model calls."""
        if config not in self._cache:
            self._cache[config] = self.cost.evaluate(config)
        return self._cache[config]

    def objective(self, estimate):
        return estimate.step_time if estimate.feasible else \
            INFEASIBLE_PENALTY + estimate.peak_memory / self.cluster.memory

    def reward(self, state):
        """Terminal reward of a complete state: minus the objective."""
        return -self.objective(self.evaluate(self.config(state)))

    def even_cuts(self, p):
        n = self.cost.num_units
        return tuple(round(n * s / p) for s in range(1, p))
