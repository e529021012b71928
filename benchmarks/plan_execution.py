"""Predicted against measured step times of plans run on this machine (issue 24).

  python benchmarks/plan_execution.py                 # writes RESULTS.md's section
  python benchmarks/plan_execution.py --small --rounds=3 --out=

One small transformer train step (`reference_models.einsum_block`: attention + FFN, einsum
weights, SGD; it takes any batch size, so it also runs in micro-batches) is planned on
`--cluster` (NxCPU: N logical CPU devices of this process) in a fixed set of plans that
differ in mesh (replicas d x tensor parallel t x stages p), split linkage units,
micro-batches and pipeline schedule. Each is built by the planner (`PlanEnv`,
`search_common.make_plan`), priced by its cost model and run with `planner.parallelize`.
Step times are measured in interleaved rounds (every plan once per round, in a new random
order, after warm-up rounds), so a busy machine's drift hits all plans alike; the table gives
each plan's median with its 95% interval. Then: Spearman's rank correlation of predicted
and measured, and where the plan `planner.search` picks (method --search, strategy auto)
ranks among the measured.

Plans that `parallelize` cannot run (pipelines with tensor parallelism) are not in the set;
if the search picks one, the report says so.
"""

import dataclasses
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

import numpy as np  # noqa: E402

import median_interval  # noqa: E402  (benchmarks/, this script's directory)
import results_md  # noqa: E402
import rounds as rounds_lib  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
BEGIN, END = "<!-- plan_execution:begin -->", "<!-- plan_execution:end -->"

FLAGS = flags.FLAGS
flags.DEFINE_string("cluster", "4xCPU", "Cluster the plans are priced for and run on (NxCPU, "
                    "or a JSON spec whose base is one).")
flags.DEFINE_integer("rounds", 15, "Timed rounds (one step of every plan per round).")
flags.DEFINE_integer("warmup", 2, "Untimed rounds first (the first step of each plan also "
                     "traces and partitions it, before any round).")
flags.DEFINE_enum("search", "dp", ["dp", "exhaustive", "greedy"],
                  "Search whose pick is ranked among the measured plans.")
flags.DEFINE_string("out", os.path.join(_HERE, "RESULTS.md"), "Markdown to update; '' for none.")
flags.DEFINE_bool("measured_spec", True, "Also price every plan with this machine's measured "
                  "figures (planner/cpu_calibration.py; measured once, then cached).")
flags.DEFINE_bool("small", False, "Tiny model, for a smoke test of the script.")

SIZES = dict(batch=16, seq=64, hidden=128, heads=4, ffn=512)
SMALL_SIZES = dict(batch=8, seq=8, hidden=16, heads=4, ffn=32)
LEARNING_RATE = 1e-3   # small: hundreds of steps must not blow the weights up


@dataclasses.dataclass(frozen=True)
class PlanChoice:
    """One plan of the set: a mesh, the units split (each by a variable axis it holds),
    micro-batches and schedule."""
    replicas: int
    tensor_parallel: int
    stages: int
    micro_batches: int = 1
    split: tuple = ()          # (variable prefix, axis) of each unit split
    schedule: str = "1f1b"


HEADS, FFN, HIDDEN = ("q_proj", 1), ("up", 1), ("q_proj", 0)
UNIT_NAMES = {HEADS: "heads", FFN: "ffn", HIDDEN: "hidden"}
MEGATRON = (HEADS, FFN)


def plan_label(plan):
    """d x t x p, the units split (by name) and, for pipelines, micro-batches, schedule and
    cuts (pipeline-unit boundaries): unique within the set, as the timings are keyed by it."""
    text = f"{plan.replicas}x{plan.tensor_parallel}x{plan.num_stages}"
    split = [name for (prefix, axis), name in UNIT_NAMES.items()
             if any(v.startswith(prefix) and a == axis for v, a in plan.variable_splits.items())]
    if split:
        text += " split " + "+".join(split)
    if plan.num_stages > 1:
        text += f" m={plan.micro_batches} {plan.schedule} cuts {','.join(map(str, plan.cuts))}"
    return text

CHOICES = [
    PlanChoice(4, 1, 1),
    PlanChoice(1, 4, 1, split=MEGATRON),
    PlanChoice(1, 4, 1, split=(FFN,)),
    PlanChoice(1, 4, 1, split=(HIDDEN,)),
    PlanChoice(2, 2, 1, split=MEGATRON),
    PlanChoice(2, 2, 1, split=(HIDDEN,)),
    PlanChoice(1, 1, 4, 1),
    PlanChoice(1, 1, 4, 4, schedule="gpipe"),
    PlanChoice(1, 1, 4, 4),
    PlanChoice(1, 1, 4, 8),
    PlanChoice(2, 1, 2, 1),
    PlanChoice(2, 1, 2, 2),
    PlanChoice(2, 1, 2, 4, schedule="gpipe"),
]


def unit_of(env, variable, axis):
    """The linkage unit that splits `variable` (by name prefix) along `axis`."""
    for u, unit in enumerate(env.link.units):
        if any(v.startswith(variable) and a == axis for v, a in unit.variables):
            return u
    raise ValueError(f"no linkage unit splits {variable} along axis {axis}")


def config_of(env, choice):
    from tf_fusionstitch.planner import cost_model
    return cost_model.Config(
        replicas=choice.replicas, tensor_parallel=choice.tensor_parallel,
        stages=choice.stages, micro_batches=choice.micro_batches,
        split_units=frozenset(unit_of(env, v, a) for v, a in choice.split),
        cuts=env.even_cuts(choice.stages), schedule=choice.schedule)


def same_plan(a, b):
    return (a.replicas, a.tensor_parallel, a.num_stages, a.micro_batches, a.cuts,
            sorted(a.split_units), a.schedule if a.num_stages > 1 else "") == \
        (b.replicas, b.tensor_parallel, b.num_stages, b.micro_batches, b.cuts,
         sorted(b.split_units), b.schedule if b.num_stages > 1 else "")


def spearman(x, y):
    """Spearman's rank correlation: Pearson's of the ranks (ties share their mean rank)."""
    def ranks(values):
        values = np.asarray(values, dtype=float)
        order = np.argsort(values, kind="stable")
        r = np.empty(len(values))
        r[order] = np.arange(1, len(values) + 1)
        for v in np.unique(values):
            tie = values == v
            r[tie] = r[tie].mean()
        return r
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def config_of_plan(env, plan):
    """The cost-model config of a `Plan` (its split units found again by label)."""
    from tf_fusionstitch.planner import cost_model
    labels = [unit.label for unit in env.link.units]
    return cost_model.Config(
        replicas=plan.replicas, tensor_parallel=plan.tensor_parallel, stages=plan.num_stages,
        micro_batches=plan.micro_batches,
        split_units=frozenset(labels.index(u) for u in plan.split_units),
        cuts=tuple(plan.cuts), schedule=plan.schedule)


def spec_line(spec):
    return (f"{spec.name}: flops {spec.flops:.3g}/s, memory bandwidth "
            f"{spec.memory_bandwidth:.3g} B/s, link {spec.intra_bandwidth:.3g} B/s + "
            f"{spec.intra_latency * 1e6:.1f} us, "
            + (f"send {spec.send_bandwidth:.3g} B/s + {spec.send_latency * 1e6:.1f} us, "
               if spec.send_bandwidth else "")
            + f"op overhead {spec.op_overhead * 1e6:.2f} us")


def plan_set(graph, specs):
    """The fixed plans (built for the first spec) and each spec's search pick, added when
    not among them. Returns (plans, {spec name: index of its pick}, notes on picks that
    cannot run)."""
    from tf_fusionstitch import planner
    from tf_fusionstitch.planner import search_common
    first = next(iter(specs.values()))
    plans = []
    for choice in CHOICES:
        env = planner.PlanEnv(graph, first, "auto", schedule=choice.schedule)
        plans.append(search_common.make_plan(env, config_of(env, choice), "fixed"))
    picks, notes = {}, []
    for name, spec in specs.items():
        picked = planner.search_graph(graph, spec, "auto", FLAGS.search)
        print(f"{name} spec's pick:", picked, flush=True)
        pick = next((i for i, p in enumerate(plans) if same_plan(p, picked)), None)
        if pick is None and picked.num_stages > 1 and picked.tensor_parallel > 1:
            notes.append(f"the {name} spec's pick ({plan_label(picked)}) pipelines "
                         "tensor-parallel stages, which parallelize does not run: not "
                         "measured.")
            continue
        if pick is None:
            plans.append(picked)
            pick = len(plans) - 1
        picks[name] = pick
    return plans, picks, notes


def time_plans(step, inputs, variables, cluster, labels, plans):
    """Each plan's step built with `parallelize` and run once, then timed in interleaved
    rounds. Returns ({label: wall seconds per round}, the load during the rounds)."""
    from tf_fusionstitch import planner
    import run_context
    steps = {}
    for label, plan in zip(labels, plans):
        # Every plan starts from the same weights: it copies them when built.
        parallel_step = planner.parallelize(step, inputs, cluster=cluster, plan=plan,
                                            variables=variables.values())
        float(parallel_step(*inputs))   # traces, partitions and compiles
        steps[label] = parallel_step
        print(f"built {label}", flush=True)

    def timed(parallel_step):
        return lambda *args: float(parallel_step(*args))

    with run_context.LoadSampler() as sampler:
        wall, _ = rounds_lib.time_rounds({k: timed(s) for k, s in steps.items()}, inputs,
                                         FLAGS.rounds, FLAGS.warmup)
    return wall, sampler.text()


def rank_by(values, i):
    """Rank (1 = least) of values[i]; ties in the order given."""
    return sorted(range(len(values)), key=lambda j: values[j]).index(i) + 1


def table_rows(labels, picks, predicted, wall):
    """One row per plan: its label (and which spec picked it), per spec the predicted time
    and rank, the measured median, its interval, rank and ratio to the fastest."""
    measured = [statistics.median(wall[label]) for label in labels]
    rows = []
    for i, label in enumerate(labels):
        interval = median_interval.median_interval(wall[label])
        spread = (f"{interval[0] * 1e3:.2f}-{interval[1] * 1e3:.2f}" if interval else "n/a")
        picked_by = [name for name, pick in picks.items() if pick == i]
        row = [label + (f" (pick: {', '.join(picked_by)})" if picked_by else "")]
        for times in predicted.values():
            row += [f"{times[i] * 1e3:.3f}", str(rank_by(times, i))]
        rows.append(row + [f"{measured[i] * 1e3:.2f}", spread, str(rank_by(measured, i)),
                           f"{measured[i] / min(measured):.2f}x"])
    return rows


def correlation_notes(labels, picks, specs, predicted, measured):
    """Per spec: its figures and Spearman's rho, the range of predicted over measured, and
    where its pick ranks among the measured."""
    fastest = min(range(len(labels)), key=lambda i: measured[i])
    notes = []
    for name, spec in specs.items():
        notes.append(f"{name} spec ({spec_line(spec)}): Spearman's rho (predicted vs measured "
                     f"median) = {spearman(predicted[name], measured):.3f} over {len(labels)} "
                     "plans.")
        ratios = [pr / me for pr, me in zip(predicted[name], measured)]
        notes.append(f"{name} spec: predicted / measured from {min(ratios):.2f}x to "
                     f"{max(ratios):.2f}x.")
        if name in picks:
            pick = picks[name]
            notes.append(f"the {name} spec's pick ({FLAGS.search}, auto) is {labels[pick]}: "
                         f"measured rank {rank_by(measured, pick)} of {len(labels)}, "
                         f"{(measured[pick] / measured[fastest] - 1) * 100:.1f}% slower than "
                         f"the fastest measured ({labels[fastest]}).")
    return notes


def main(argv):
    del argv
    from tf_fusionstitch import planner
    from tf_fusionstitch.planner import parallel
    assumed = planner.get_cluster(FLAGS.cluster)
    parallel.run_cluster(assumed)
    planner.use_cpu_devices(assumed.num_devices)   # before anything starts TensorFlow

    import run_context  # imports TensorFlow
    from tf_fusionstitch.planner import (cost_model, cpu_calibration, graph_import,
                                         reference_models)

    load = os.getloadavg()[0]
    specs = {"assumed": assumed}
    if FLAGS.measured_spec:
        specs["measured"] = cpu_calibration.measured_cluster(assumed.num_devices)
    sizes = SMALL_SIZES if FLAGS.small else SIZES
    step, inputs, variables = reference_models.einsum_block(seed=0, lr=LEARNING_RATE, **sizes)
    graph, _, _ = graph_import.from_function(step, inputs, variables=variables.values())

    plans, picks, pick_notes = plan_set(graph, specs)
    labels = [plan_label(p) for p in plans]
    assert len(set(labels)) == len(labels), labels
    env = planner.PlanEnv(graph, assumed, "auto")
    configs = [config_of_plan(env, p) for p in plans]
    predicted = {name: [cost_model.CostModel(graph, spec).evaluate(c).step_time
                        for c in configs] for name, spec in specs.items()}
    wall, load_text = time_plans(step, inputs, variables, assumed, labels, plans)
    measured = [statistics.median(wall[label]) for label in labels]

    rows = table_rows(labels, picks, predicted, wall)
    notes = correlation_notes(labels, picks, specs, predicted, measured) + pick_notes
    notes.append("Plans whose 95% intervals overlap are not told apart by this run: their "
                 "measured ranks may swap from run to run.")
    notes += [f"model: einsum_block {sizes}, SGD lr {LEARNING_RATE}; every plan runs under "
              f"planner.parallelize on {assumed.num_devices} logical CPUs of one process.",
              f"{FLAGS.rounds} interleaved rounds after {FLAGS.warmup} warm-up rounds; "
              "interval: 95% order-statistic interval of the median.",
              f"{run_context.machine_line(load)}; {load_text}; "
              f"{run_context.source_state()}."]
    header = ["plan (d x t x p)"]
    for name in specs:
        header += [f"predicted, {name} spec (ms)", "rank"]
    header += ["measured median (ms)", "95% interval", "measured rank", "vs fastest"]
    text = "\n".join([BEGIN, "## Plans run: predicted against measured step time", "",
                      *results_md.table_and_notes(header, rows, notes), "", END]) + "\n"
    results_md.publish(FLAGS.out, BEGIN, END, text)


if __name__ == "__main__":
    app.run(main)
