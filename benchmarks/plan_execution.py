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


def main(argv):
    del argv
    from tf_fusionstitch import planner
    from tf_fusionstitch.planner import parallel
    spec = planner.get_cluster(FLAGS.cluster)
    parallel.run_cluster(spec)
    planner.use_cpu_devices(spec.num_devices)   # before anything starts TensorFlow

    import run_context  # imports TensorFlow
    from tf_fusionstitch.planner import graph_import, reference_models, search_common

    load = os.getloadavg()[0]
    sizes = SMALL_SIZES if FLAGS.small else SIZES
    step, inputs, variables = reference_models.einsum_block(seed=0, lr=LEARNING_RATE, **sizes)
    graph, _, _ = graph_import.from_function(step, inputs, variables=variables.values())
    picked = planner.search_graph(graph, spec, "auto", FLAGS.search)
    print(picked, flush=True)

    plans, labels = [], []
    for choice in CHOICES:
        env = planner.PlanEnv(graph, spec, "auto", schedule=choice.schedule)
        plans.append(search_common.make_plan(env, config_of(env, choice), "fixed"))
        labels.append(plan_label(plans[-1]))
    pick = next((i for i, p in enumerate(plans) if same_plan(p, picked)), None)
    pick_note = ""
    if pick is None:
        if picked.num_stages > 1 and picked.tensor_parallel > 1:
            pick_note = ("the search's pick pipelines tensor-parallel stages, which "
                         "parallelize does not run: not measured")
        else:
            plans.append(picked)
            labels.append(plan_label(picked))
            pick = len(plans) - 1

    assert len(set(labels)) == len(labels), labels
    steps = {}
    for label, plan in zip(labels, plans):
        # Every plan starts from the same weights: it copies them when built.
        parallel_step = planner.parallelize(step, inputs, cluster=spec, plan=plan,
                                            variables=variables.values())
        float(parallel_step(*inputs))   # traces, partitions and compiles
        steps[label] = parallel_step
        print(f"built {label}: predicted {plan.predicted_step_time * 1e3:.3f} ms", flush=True)

    def timed(parallel_step):
        return lambda *args: float(parallel_step(*args))

    with run_context.LoadSampler() as sampler:
        wall, _ = rounds_lib.time_rounds({k: timed(s) for k, s in steps.items()}, inputs,
                                         FLAGS.rounds, FLAGS.warmup)
    measured = [statistics.median(wall[label]) for label in labels]
    predicted = [p.predicted_step_time for p in plans]
    rho = spearman(predicted, measured)
    by_measured = sorted(range(len(plans)), key=lambda i: measured[i])
    rank_of = {i: r + 1 for r, i in enumerate(by_measured)}
    fastest = measured[by_measured[0]]

    rows = []
    for i, (label, plan) in enumerate(zip(labels, plans)):
        interval = median_interval.median_interval(wall[label])
        spread = (f"{interval[0] * 1e3:.2f}-{interval[1] * 1e3:.2f}" if interval else "n/a")
        rows.append([label + (" (search pick)" if i == pick else ""),
                     f"{predicted[i] * 1e3:.3f}", f"{measured[i] * 1e3:.2f}", spread,
                     str(sorted(range(len(plans)), key=lambda j: predicted[j]).index(i) + 1),
                     str(rank_of[i]), f"{measured[i] / fastest:.2f}x"])
    if pick is not None:
        pick_line = (f"the search's pick ({FLAGS.search}, auto) is {labels[pick]}: measured "
                     f"rank {rank_of[pick]} of {len(plans)}, "
                     f"{(measured[pick] / fastest - 1) * 100:.1f}% slower than the fastest "
                     f"measured ({labels[by_measured[0]]})")
    else:
        pick_line = pick_note
    notes = [f"Spearman's rho (predicted vs measured median) = {rho:.3f} over {len(plans)} "
             "plans.", pick_line,
             f"model: einsum_block {sizes}, SGD lr {LEARNING_RATE}; cluster {spec.name} "
             f"(flops {spec.flops:.3g}/s, memory bandwidth {spec.memory_bandwidth:.3g} B/s, "
             f"link {spec.intra_bandwidth:.3g} B/s + {spec.intra_latency * 1e6:.1f} us, op "
             f"overhead {spec.op_overhead * 1e6:.1f} us).",
             f"{FLAGS.rounds} interleaved rounds after {FLAGS.warmup} warm-up rounds; "
             "interval: 95% order-statistic interval of the median.",
             f"{run_context.machine_line(load)}; {sampler.text()}; "
             f"{run_context.source_state()}."]
    header = ["plan (d x t x p)", "predicted (ms)", "measured median (ms)", "95% interval",
              "predicted rank", "measured rank", "vs fastest"]
    text = "\n".join([BEGIN, "## Plans run: predicted against measured step time", "",
                      *results_md.table_and_notes(header, rows, notes), "", END]) + "\n"
    print("\n" + text)
    if FLAGS.out:
        results_md.write_section(FLAGS.out, BEGIN, END, text)
        print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
    app.run(main)
