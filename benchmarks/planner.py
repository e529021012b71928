"""Planner searches compared at equal budgets of cost-model calls (issue 7).

  python benchmarks/planner.py                          # every case, writes RESULTS.md
  python benchmarks/planner.py --cases=mlp-4xV100 --seeds=3 --out=

For each case (a reference model, a cluster preset, a strategy and a budget B of distinct
plans priced): exhaustive search where the space has at most --exhaustive_limit plans, DP,
greedy (deterministic, one run each, capped at B), and random, simulated annealing and the DQN
over --seeds seeds at budget B. Reported per method: best predicted step time (mean and
spread over seeds), its gap to the optimum (exhaustive) or else to the best plan any method
found, how many seeds reached that plan, distinct plans priced until the best was first
priced, plans priced in all, and search wall time.

Within a case every run has its own plan cache and counts its own distinct plans; the
estimates themselves are shared between runs (the cost model is deterministic), so the wall
times in the main table exclude re-pricing a plan another run already priced. The DQN on
BERT-large is also timed cold (own cost model, nothing shared), see --cold_case.
"""

import collections
import dataclasses
import math
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from tf_fusionstitch import planner  # noqa: E402
from tf_fusionstitch.planner import dqn, reference_models, search_common, searches  # noqa: E402

import results_md  # noqa: E402  (benchmarks/ is this script's directory, on sys.path)

_HERE = os.path.dirname(os.path.abspath(__file__))
BEGIN, END = "<!-- planner:begin -->", "<!-- planner:end -->"


@dataclasses.dataclass
class Case:
    name: str
    model: str
    cluster: str
    strategy: str = "auto"
    budget: int = 300
    sizes: dict = dataclasses.field(default_factory=dict)
    expect: str = ""        # "megatron" or "data": what the DQN's plan should be


MLP = dict(batch=64, sizes=(256, 512, 512, 256))
TOY_TRANSFORMER = dict(batch=8, seq=128, hidden=512, heads=8, ffn=2048, layers=2)
CASES = [
    Case("mlp-4xV100", "mlp", "4xV100", sizes=MLP),
    Case("mlp-8xV100", "mlp", "8xV100", sizes=MLP),
    Case("transformer-op-4xA100", "transformer_block", "4xA100", "operator", 20,
         TOY_TRANSFORMER, "megatron"),
    Case("transformer-op-8xH200", "transformer_block", "8xH200", "operator", 20,
         TOY_TRANSFORMER, "megatron"),
    Case("transformer-4xA100", "transformer_block", "4xA100", sizes=TOY_TRANSFORMER,
         expect="megatron"),
    Case("transformer-8xH200", "transformer_block", "8xH200", sizes=TOY_TRANSFORMER,
         expect="megatron"),
    Case("bert_large-8xV100", "bert_large", "8xV100", budget=200, expect="megatron"),
    Case("bert_large-8xH200", "bert_large", "8xH200", budget=200, expect="megatron"),
    # GPT-2 XL prices a plan in ~0.3 s here: a smaller budget keeps the run under an hour.
    Case("gpt2_xl-8xV100", "gpt2_xl", "8xV100", budget=100),
    Case("gpt2_xl-8xH200", "gpt2_xl", "8xH200", budget=100),
    Case("resnet50-8xV100", "resnet50", "8xV100", budget=150, expect="data"),
    Case("gpt_6b7-8xV100", "gpt_6b7", "8xV100", budget=100),
]
SMALL = {"mlp": MLP, "transformer_block": dict(batch=4, seq=16, hidden=32, heads=4, ffn=64,
                                                layers=1),
         "bert_large": dict(batch=8, seq=16, hidden=32, heads=4, ffn=64, layers=2, vocab=64,
                            predictions=2),
         "gpt2_xl": dict(batch=8, seq=16, hidden=32, heads=4, ffn=64, layers=2, vocab=64),
         "gpt_6b7": dict(batch=8, seq=16, hidden=32, heads=4, ffn=64, layers=2, vocab=64),
         "resnet50": dict(batch=8, image=16, blocks=(1, 1), widths=(4, 8), classes=10)}

FLAGS = flags.FLAGS
flags.DEFINE_list("cases", [c.name for c in CASES], "Cases to run.")
flags.DEFINE_integer("seeds", 5, "Seeds per seeded method (random, annealing, dqn).")
flags.DEFINE_integer("budget", None, "Distinct plans priced per run; default per case.")
flags.DEFINE_integer("exhaustive_limit", 20000, "Largest space searched exhaustively.")
flags.DEFINE_string("cold_case", "bert_large-8xV100",
                    "Case whose DQN runs are also timed cold (own cost model); '' for none.")
flags.DEFINE_string("out", os.path.join(_HERE, "RESULTS.md"), "Markdown to update; '' for none.")
flags.DEFINE_bool("small", False, "Tiny model sizes, for a smoke test of the script.")

SEEDED = ("random", "annealing", "dqn")
ONCE = ("exhaustive", "dp", "greedy")


class SharedEnv(planner.PlanEnv):
    """A PlanEnv view with its own plan cache and call count over shared estimates."""

    def __init__(self, base, shared):   # noqa: super().__init__ would rebuild the cost model
        self.__dict__.update(base.__dict__)
        self._cache, self._shared, self.order = {}, shared, []

    @property
    def calls(self):
        return len(self._cache)

    def evaluate(self, config):
        if config not in self._cache:
            if config not in self._shared:
                self._shared[config] = self.cost.evaluate(config)
            self._cache[config] = self._shared[config]
            self.order.append(config)
        return self._cache[config]


@dataclasses.dataclass
class Run:
    method: str
    seed: int
    time: float            # predicted step time of the best plan (s)
    feasible: bool
    calls: int
    calls_to_best: int
    wall: float
    mesh: str
    config: object
    policy_time: float = math.nan   # DQN only: the final greedy policy's plan


def _mesh(c):
    return f"{c.replicas}x{c.tensor_parallel}x{c.stages} m{c.micro_batches}"


def run_one(base, shared, method, budget, seed):
    env = SharedEnv(base, shared)
    t0 = time.perf_counter()
    policy_time = math.nan
    if method == "dqn":
        result = dqn.DQNSearch(env, budget, seed).run()
        config = result.best
        if result.policy is not None:
            est = env.evaluate(result.policy)
            policy_time = est.step_time if est.feasible else math.inf
    else:
        plan, _ = searches.run(env, method, budget, seed)
        config = _config_of(env, plan)
    wall = time.perf_counter() - t0
    est = env.evaluate(config)
    return Run(method, seed, est.step_time, est.feasible, env.calls,
               env.order.index(config) + 1, wall, _mesh(config), config, policy_time)


def _config_of(env, plan):
    """The config of `plan`: every search returns the first-priced plan of least objective."""
    config = min(env.order, key=lambda c: env.objective(env._cache[c]))
    assert env._cache[config].step_time == plan.predicted_step_time, plan.method
    return config


def megatron_config(env):
    """Megatron's plan on all devices (heads and FFN units split), if the graph has it."""
    n = env.cluster.num_devices
    units = frozenset(u.index for u in env.link.units if any(
        (v.endswith("wq:0") or v.endswith("w1:0")) and a == 1 for v, a in u.variables))
    if len(units) != 2 or (1, n, 1) not in env.meshes or \
            set(units) - set(env.link.legal_units(set(), n)):
        return None
    return planner.Config(tensor_parallel=n, split_units=units, schedule=env.schedule)


def run_case(case, seeds, budget, exhaustive_limit, small):
    sizes = SMALL.get(case.model, case.sizes) if small else case.sizes
    t0 = time.perf_counter()
    graph = reference_models.build_graph_ir(case.model, **sizes)
    base = planner.PlanEnv(graph, planner.get_cluster(case.cluster), case.strategy)
    setup = time.perf_counter() - t0
    shared, runs = {}, []
    budget = budget or case.budget
    print(f"\n{case.name}: {graph.summary()}; {len(base.meshes)} meshes, {base.num_units} "
          f"linkage units, {base.cost.num_units} pipeline units; setup {setup:.1f} s",
          flush=True)
    for method in ONCE:
        try:
            limit = exhaustive_limit if method == "exhaustive" else budget
            runs.append(run_one(base, shared, method, limit, 0))
        except ValueError as e:
            print(f"  {method}: skipped ({e})")
            continue
        _print_run(runs[-1])
    for method in SEEDED:
        for seed in range(seeds):
            runs.append(run_one(base, shared, method, budget, seed))
            _print_run(runs[-1])
    mega = megatron_config(base)
    mega_time = SharedEnv(base, shared).evaluate(mega).step_time if mega else None
    dp_est = SharedEnv(base, shared).evaluate(search_common.reference_config(base))
    return dict(case=case, graph=graph.summary(), runs=runs, budget=budget,
                megatron=mega_time, data_parallel=(dp_est.step_time, dp_est.feasible),
                setup=setup, meshes=len(base.meshes))


def _print_run(r):
    extra = f" policy {r.policy_time * 1e3:.4g} ms" if r.method == "dqn" else ""
    print(f"  {r.method:10s} seed {r.seed}: {r.time * 1e3:.4g} ms "
          f"{'' if r.feasible else '(INFEASIBLE) '}{r.mesh}, {r.calls} calls, best at "
          f"{r.calls_to_best}, {r.wall:.1f} s{extra}", flush=True)


def cold_dqn(case, seeds, budget, small):
    """DQN wall time with its own cost model and nothing shared (what a user waits)."""
    sizes = SMALL.get(case.model, case.sizes) if small else case.sizes
    graph = reference_models.build_graph_ir(case.model, **sizes)
    out = []
    for seed in range(seeds):
        t0 = time.perf_counter()
        plan = planner.search_graph(graph, case.cluster, case.strategy, "dqn",
                                    budget or case.budget, seed)
        out.append((time.perf_counter() - t0, plan.predicted_step_time, plan.cost_model_calls))
        print(f"  cold dqn seed {seed}: {out[-1][0]:.1f} s, {plan.predicted_step_time * 1e3:.4g}"
              f" ms, {plan.cost_model_calls} calls", flush=True)
    return out


# -- summary ----------------------------------------------------------------------------------

def summarize(result):
    runs = result["runs"]
    exhaustive = [r for r in runs if r.method == "exhaustive"]
    feasible = [r for r in runs if r.feasible] or runs
    best = exhaustive[0].time if exhaustive else min(r.time for r in feasible)
    rows = []
    for method in ONCE + SEEDED:
        rs = [r for r in runs if r.method == method]
        if not rs:
            continue
        times = [r.time for r in rs]
        hits = sum(1 for r in rs if r.feasible and r.time <= best * (1 + 1e-9))
        gaps = [r.time / best - 1 if r.feasible else math.inf for r in rs]
        meshes = collections.Counter(r.mesh for r in rs).most_common(1)[0][0]
        rows.append(dict(
            method=method, n=len(rs), mean=statistics.mean(times),
            spread=(max(times) - min(times)) if len(rs) > 1 else 0.0,
            gap=statistics.mean(gaps), worst_gap=max(gaps), hits=hits,
            infeasible=sum(1 for r in rs if not r.feasible),
            to_best=statistics.mean(r.calls_to_best for r in rs),
            calls=statistics.mean(r.calls for r in rs),
            wall=statistics.mean(r.wall for r in rs), mesh=meshes,
            policy=[r.policy_time for r in rs] if method == "dqn" else None))
    return best, bool(exhaustive), rows


def _fmt_gap(g):
    return "inf" if math.isinf(g) else f"{100 * g:.2f}%"


def markdown(results, cold, seeds, load):
    lines = [BEGIN, "## Planner searches (`benchmarks/planner.py`)", "",
             f"{time.strftime('%Y-%m-%d')}; {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores; Python {platform.python_version()}; load average "
             f"{load:.1f} before the run. Predicted step times from the planner's cost "
             f"model (not measured on GPUs). {seeds} seeds for random, annealing and DQN; "
             "exhaustive, DP and greedy are deterministic (one run). Budget: distinct plans "
             "priced per run (the same B for every method; DP and greedy may stop earlier). "
             "Gap: to the exhaustive optimum where the space was enumerated, else to the "
             "best plan any method found (marked *). hits: runs that reached that plan. "
             "to best: plans priced until the run first priced its final best. Wall: search "
             "time with estimates shared between runs of a case (a plan another run priced "
             "is not re-priced), so it mostly measures search overhead; cold DQN timings "
             "are below.", ""]
    lines += ["| case | budget | optimum (ms) | " + " | ".join(
        f"{m}: gap mean, hits" for m in ONCE[1:] + SEEDED) + " | DQN wall (s) |",
        "|---" * (4 + len(ONCE[1:] + SEEDED)) + "|"]
    for res in results:
        best, exact, rows = summarize(res)
        by = {r["method"]: r for r in rows}
        cells = [f"{_fmt_gap(by[m]['gap'])}, {by[m]['hits']}/{by[m]['n']}" if m in by else "n/a"
                 for m in ONCE[1:] + SEEDED]
        wall = f"{by['dqn']['wall']:.1f}" if "dqn" in by else "n/a"
        lines.append(f"| {res['case'].name} | {res['budget']} | {best * 1e3:.4g}"
                     f"{'' if exact else '*'} | " + " | ".join(cells) + f" | {wall} |")
    lines.append("")
    for res in results:
        best, exact, rows = summarize(res)
        case = res["case"]
        dp_time, dp_ok = res["data_parallel"]
        lines += [f"### {case.name} ({case.strategy}, budget {res['budget']})", "",
                  f"{res['graph']}; {res['meshes']} meshes. Optimum{'' if exact else '*'}: "
                  f"{best * 1e3:.4g} ms; pure data parallel: {dp_time * 1e3:.4g} ms"
                  f"{'' if dp_ok else ' (does not fit in memory)'}"
                  + (f"; Megatron (t = all devices): {res['megatron'] * 1e3:.4g} ms"
                     if res["megatron"] else "") + ".", "",
                  "| method | runs | best step (ms), mean | spread | gap mean | gap worst | "
                  "hits | to best | priced | wall (s) | plan (d x t x p, m) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(
                f"| {r['method']} | {r['n']} | {r['mean'] * 1e3:.4g} | {r['spread'] * 1e3:.3g} | "
                f"{_fmt_gap(r['gap'])} | {_fmt_gap(r['worst_gap'])} | {r['hits']}/{r['n']} | "
                f"{r['to_best']:.0f} | {r['calls']:.0f} | {r['wall']:.2f} | {r['mesh']} |")
        for r in rows:
            if r["policy"]:
                priced = [p for p in r["policy"] if not math.isnan(p)]
                fits = [p for p in priced if not math.isinf(p)]
                text = (f"DQN's final greedy-policy plan (not its best priced): priced within "
                        f"budget in {len(priced)}/{len(r['policy'])} seeds, fits in memory in "
                        f"{len(fits)}")
                if fits:
                    text += (f", gap to the optimum{'' if exact else '*'} "
                             f"{', '.join(_fmt_gap(p / best - 1) for p in fits)}")
                lines += ["", text + "."]
        lines += [""] + verdict(res, best, rows) + [""]
    if cold:
        name, timings = cold
        walls = [t for t, _, _ in timings]
        lines += [f"### DQN wall time, cold ({name})", "",
                  f"Own cost model, nothing shared, on this machine: "
                  f"{', '.join(f'{w:.1f}' for w in walls)} s over {len(walls)} seeds (max "
                  f"{max(walls):.1f} s); plans priced: "
                  f"{', '.join(str(c) for _, _, c in timings)}.", ""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def verdict(res, best, rows):
    """Plain statements: where the DQN lost, and whether its plan is the expected one."""
    by = {r["method"]: r for r in rows}
    out = []
    d = by.get("dqn")
    if d is None:
        return out
    for m, r in by.items():
        if m != "dqn" and r["gap"] < d["gap"] - 1e-9:
            out.append(f"- DQN loses to {m} here: mean gap {_fmt_gap(d['gap'])} vs "
                       f"{_fmt_gap(r['gap'])}.")
    runs = [r for r in res["runs"] if r.method == "dqn"]
    expect = res["case"].expect
    if expect == "megatron" and res["megatron"]:
        ok = sum(1 for r in runs if r.time <= res["megatron"] * (1 + 1e-9))
        out.append(f"- DQN's plan is Megatron's or priced at least as fast in {ok}/{len(runs)} "
                   "seeds.")
    if expect == "data":
        n = planner.get_cluster(res["case"].cluster).num_devices
        ok = sum(1 for r in runs if r.config.replicas == n)
        out.append(f"- DQN's plan is pure data parallelism ({n} replicas) in {ok}/{len(runs)} "
                   "seeds.")
    if not res["data_parallel"][1]:
        ok = sum(1 for r in runs if r.feasible and r.config.tensor_parallel * r.config.stages > 1)
        out.append(f"- Data parallelism does not fit; DQN returned a feasible non-data-parallel "
                   f"plan in {ok}/{len(runs)} seeds.")
    if not out[:1] or not out[0].startswith("- DQN loses"):
        out.insert(0, f"- DQN is not beaten on mean gap ({_fmt_gap(d['gap'])}, {d['hits']}/"
                      f"{d['n']} seeds at the optimum).")
    return out


def main(argv):
    del argv
    known = {c.name: c for c in CASES}
    unknown = set(FLAGS.cases) - set(known)
    if unknown:
        raise app.UsageError(f"unknown --cases {sorted(unknown)}; choose from {list(known)}")
    load = os.getloadavg()[0]
    results = [run_case(known[n], FLAGS.seeds, FLAGS.budget, FLAGS.exhaustive_limit,
                        FLAGS.small) for n in FLAGS.cases]
    cold = None
    if FLAGS.cold_case and FLAGS.cold_case in FLAGS.cases:
        print(f"\ncold DQN timing on {FLAGS.cold_case}", flush=True)
        cold = (FLAGS.cold_case, cold_dqn(known[FLAGS.cold_case], FLAGS.seeds, FLAGS.budget,
                                          FLAGS.small))
    text = markdown(results, cold, FLAGS.seeds, load)
    print("\n" + text)
    if FLAGS.out:
        results_md.write_section(FLAGS.out, BEGIN, END, text)
        print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
    app.run(main)
