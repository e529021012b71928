"""Planner searches compared at equal budgets of cost-model calls (issue 7).

  python benchmarks/planner.py                          # every case, writes RESULTS.md
  python benchmarks/planner.py --cases=mlp-4xV100 --seeds=3 --out=
  python benchmarks/planner.py --models=real            # only the keras / keras_hub models

Cases are the planner's reference models (`reference_models`, `more_models`) and real models:
keras_hub BERT-large, GPT-2 XL and Llama-2 7B-shaped backbones and keras.applications ResNet50,
built from constructors in graph mode at full size (nothing allocated; see planner_models.py).

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

import planner_models  # noqa: E402  (benchmarks/, this script's directory)

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
    real: bool = False      # model is a keras_hub / keras.applications entry of planner_models.REAL_MODELS


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
REAL_CLUSTERS = ("8xV100", "8xH200", "4x8xH200")
# A plan of these prices in about 0.1 s here (8-21k ops): budget 100 keeps a case to ~1 min.
REAL_CASES = [Case(f"{model}-{cluster}", model, cluster, budget=100, real=True,
                   expect="data" if model == "keras_resnet50" else "megatron")
              for model in ("hub_bert_large", "hub_gpt2_xl", "hub_llama2_7b", "keras_resnet50")
              for cluster in REAL_CLUSTERS]
SMALL = {"mlp": MLP, "transformer_block": dict(batch=4, seq=16, hidden=32, heads=4, ffn=64,
                                                layers=1),
         "bert_large": dict(batch=8, seq=16, hidden=32, heads=4, ffn=64, layers=2, vocab=64,
                            predictions=2),
         "gpt2_xl": dict(batch=8, seq=16, hidden=32, heads=4, ffn=64, layers=2, vocab=64),
         "gpt_6b7": dict(batch=8, seq=16, hidden=32, heads=4, ffn=64, layers=2, vocab=64),
         "resnet50": dict(batch=8, image=16, blocks=(1, 1), widths=(4, 8), classes=10)}

# Megatron's column-parallel kernels (split on axis 1), by name suffix, per naming scheme.
MEGATRON_COLUMNS = (("wq:0", "w1:0"),
                    ("query/kernel:0", "feedforward_gate_dense/kernel:0",
                     "feedforward_intermediate_dense/kernel:0"),
                    ("query/kernel:0", "feedforward_intermediate_dense/kernel:0"))


def build_ir(case, small):
    if case.real:
        return planner_models.real_model_ir(case.model, small)
    sizes = SMALL.get(case.model, case.sizes) if small else case.sizes
    return reference_models.build_graph_ir(case.model, **sizes)


FLAGS = flags.FLAGS
flags.DEFINE_list("cases", [], "Cases to run; default every case --models selects.")
flags.DEFINE_enum("models", "all", ["all", "reference", "real"],
                  "Default case set: the planner's reference models, the real models "
                  "(keras_hub BERT-large, GPT-2 XL and Llama-2 7B-shaped backbones and "
                  "keras.applications ResNet50, each on 8xV100, 8xH200 and 4x8xH200), or both. "
                  "The real models are in the default run: built in graph mode (nothing "
                  "allocated), each imports in under 15 s and prices a plan in about 0.1 s, "
                  "so their 12 cases take ~12 of the whole run's ~23 minutes at 5 seeds on "
                  "a loaded 2-core machine.")
flags.DEFINE_integer("seeds", 5, "Seeds per seeded method (random, annealing, dqn).")
flags.DEFINE_integer("budget", None, "Distinct plans priced per run; default per case.")
flags.DEFINE_integer("exhaustive_limit", 20000, "Largest space searched exhaustively.")
flags.DEFINE_string("cold_case", "bert_large-8xV100",
                    "Case whose DQN runs are also timed cold (own cost model); '' for none.")
flags.DEFINE_string("out", os.path.join(_HERE, "RESULTS.md"), "Markdown to update; '' for none.")
flags.DEFINE_bool("small", False, "Tiny model sizes, for a smoke test of the script.")
flags.DEFINE_bool("published", True, "Also price keras_hub BERT-large's pre-training step "
                  "data parallel on 8xV100 under each fusion rule against NVIDIA's published "
                  "throughput (~30 s; skipped with --small).")

# NVIDIA DeepLearningExamples, TensorFlow BERT, DGX-1 32GB (8x V100), sequence 128, FP32,
# XLA on: 357.00 sentences/s at 32 per GPU (tests/planner/test_planner_cost_model.py).
PUBLISHED_BERT_STEP = 256 / 357.00

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
    for columns in MEGATRON_COLUMNS:
        found = {s: {u.index for u in env.link.units for v, a in u.variables
                     if v.endswith(s) and a == 1} for s in columns}
        if all(found.values()):
            units = frozenset().union(*found.values())
            break
    else:
        return None
    if (1, n, 1) not in env.meshes or set(units) - set(env.link.legal_units(set(), n)):
        return None
    return planner.Config(tensor_parallel=n, split_units=units, schedule=env.schedule)


def run_case(case, seeds, budget, exhaustive_limit, small):
    t0 = time.perf_counter()
    graph = build_ir(case, small)
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
    mega_est = SharedEnv(base, shared).evaluate(mega) if mega else None
    dp_est = SharedEnv(base, shared).evaluate(search_common.reference_config(base))
    return dict(case=case, graph=graph.summary(), runs=runs, budget=budget,
                megatron=mega_est.step_time if mega_est else None,
                megatron_fits=bool(mega_est and mega_est.feasible),
                data_parallel=(dp_est.step_time, dp_est.feasible),
                setup=setup, meshes=len(base.meshes))


def _print_run(r):
    extra = f" policy {r.policy_time * 1e3:.4g} ms" if r.method == "dqn" else ""
    print(f"  {r.method:10s} seed {r.seed}: {r.time * 1e3:.4g} ms "
          f"{'' if r.feasible else '(INFEASIBLE) '}{r.mesh}, {r.calls} calls, best at "
          f"{r.calls_to_best}, {r.wall:.1f} s{extra}", flush=True)


def cold_dqn(case, seeds, budget, small):
    """DQN wall time with its own cost model and nothing shared (what a user waits)."""
    graph = build_ir(case, small)
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


def markdown(results, cold, seeds, load, published=()):
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
                     + ("" if res["megatron_fits"] else " (does not fit in memory)")
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
    lines += list(published)
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
        # Lost by at least the table's resolution (0.01%), not by rounding noise.
        if m != "dqn" and r["gap"] < d["gap"] - 5e-5:
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


def published_comparison():
    """Markdown lines: BERT-large pre-training, data parallel on 8xV100, per fusion rule."""
    graph = planner_models.bert_pretraining_ir()
    cluster = planner.get_cluster("8xV100")
    lines = ["### keras_hub BERT-large pre-training against its published throughput", "",
             f"{graph.summary()}. Data parallel on 8xV100 (FP32 peak 15.7 TFLOP/s, products "
             "in waves of 128 x 128 tiles on 80 SMs). Published: NVIDIA DeepLearningExamples "
             f"TensorFlow BERT, DGX-1 32GB, sequence 128, FP32, XLA on: "
             f"{PUBLISHED_BERT_STEP:.3f} s per step of 256 sequences.", "",
             "| fusion | predicted (s) | vs published | compute | update | all-reduce |",
             "|---|---|---|---|---|---|"]
    for fusion in ("none", "xla", "stitch"):
        est = planner.CostModel(graph, cluster, fusion).evaluate(planner.Config(replicas=8))
        lines.append(f"| {fusion} | {est.step_time:.3f} | "
                     f"{(est.step_time / PUBLISHED_BERT_STEP - 1) * 100:+.1f}% | "
                     f"{est.stage_times[0]:.3f} | {est.update_times[0]:.3f} | "
                     f"{est.dp_times[0]:.3f} |")
        print(lines[-1], flush=True)
    return lines + [""]


def main(argv):
    del argv
    known = {c.name: c for c in CASES + REAL_CASES}
    unknown = set(FLAGS.cases) - set(known)
    if unknown:
        raise app.UsageError(f"unknown --cases {sorted(unknown)}; choose from {list(known)}")
    names = FLAGS.cases or [c.name for c in {"all": CASES + REAL_CASES, "reference": CASES,
                                             "real": REAL_CASES}[FLAGS.models]]
    load = os.getloadavg()[0]
    results = [run_case(known[n], FLAGS.seeds, FLAGS.budget, FLAGS.exhaustive_limit,
                        FLAGS.small) for n in names]
    cold = None
    if FLAGS.cold_case and FLAGS.cold_case in names:
        print(f"\ncold DQN timing on {FLAGS.cold_case}", flush=True)
        cold = (FLAGS.cold_case, cold_dqn(known[FLAGS.cold_case], FLAGS.seeds, FLAGS.budget,
                                          FLAGS.small))
    published = published_comparison() if FLAGS.published and not FLAGS.small else []
    text = markdown(results, cold, FLAGS.seeds, load, published)
    results_md.publish(FLAGS.out, BEGIN, END, text)


if __name__ == "__main__":
    app.run(main)
