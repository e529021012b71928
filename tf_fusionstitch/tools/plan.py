"""Search a distributed execution plan for a reference model or a SavedModel.

  python -m tf_fusionstitch.tools.plan --model=bert_large --cluster=8xV100 --strategy=data
  python -m tf_fusionstitch.tools.plan --model=transformer_block --cluster=8xH200 \\
      --strategy=operator --search=exhaustive --out=plan.json
  python -m tf_fusionstitch.tools.plan --model=/path/to/saved_model --function=train_step \\
      --batch=64 --cluster=4xA100 --strategy=pipeline --search=dp

Reference models (--model=mlp, transformer_block, bert, bert_base, bert_large) are training
steps (forward, backward, Adam) built from sizes in graph mode, so no weights are allocated.
Prints the plan and writes its JSON to --out. --coverage also lists the op types the planner
has no axis rule for (it treats each of their inputs as needed whole), with counts.

  python -m tf_fusionstitch.tools.plan --model=transformer_block --batch=8 --seq=32 \
      --hidden=64 --heads=4 --ffn=256 --cluster=4xCPU --strategy=auto --execute --steps=10

--execute builds the reference model with weights, plans its traced step and runs it under
the plan with `planner.parallelize` on the cluster (`NxCPU`: logical CPU devices of this
process; with --workers=W, `planner.local_cluster`'s W worker processes on 127.0.0.1 of N/W
devices each, over gRPC), and prints the predicted and the measured step time (mean of
--steps steps after one that traces and compiles).

  python -m tf_fusionstitch.tools.plan --model=transformer_block --batch=8 --seq=32 \
      --hidden=64 --heads=4 --ffn=256 --cluster=2xCPU --workers=2 --strategy=operator \
      --execute --steps=10
 --measured_spec prices an NxCPU cluster with this machine's
measured figures (planner/cpu_calibration.py) instead of assumed ones.
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app
from absl import flags

FLAGS = flags.FLAGS
_SIZES = ("batch", "seq", "hidden", "heads", "ffn", "layers")


def _define_flags():
    # names of the search methods and reference models
    from tf_fusionstitch.planner import reference_models
    from tf_fusionstitch.planner.searches import METHODS
    # Only when run as a program: other tools define flags of the same names (--batch,
    # --seed) in absl's global registry, and tests import this module next to them.
    flags.DEFINE_string("model", "transformer_block",
                        "A reference model (" + ", ".join(reference_models.MODELS)
                        + ") or the path of a SavedModel.")
    flags.DEFINE_string("cluster", "8xH200", "A preset (8xV100, 8xA100, 8xH200, 4x8xH200, "
                        "cpu-localhost), 'NxDEVICE', 'MxNxDEVICE' or a JSON object.")
    flags.DEFINE_enum("strategy", "auto", ["auto", "data", "operator", "pipeline"],
                      "Which parallelism to search: one kind over all devices, or every "
                      "product.")
    flags.DEFINE_enum("search", "greedy", list(METHODS), "Search method.")
    flags.DEFINE_integer("budget", None, "Cost-model calls the search may use (default per "
                         "method).")
    flags.DEFINE_integer("seed", 0, "Seed of the random, annealing and DQN searches.")
    flags.DEFINE_enum("schedule", "1f1b", ["1f1b", "gpipe"], "Pipeline schedule.")
    flags.DEFINE_enum("fusion", "none", ["none", "stitch", "xla"],
                      "How memory-intensive ops are priced: one kernel each (TF's executor), "
                      "or fused into clusters as tf_fusionstitch ('stitch') or XLA fuses "
                      "them.")
    flags.DEFINE_string("out", None, "Write the plan's JSON here.")
    flags.DEFINE_integer("batch", None, "Global batch size (reference models; for a "
                         "SavedModel, the extent given to unknown dimensions).")
    flags.DEFINE_integer("seq", None, "Sequence length (transformer and BERT models).")
    flags.DEFINE_integer("hidden", None, "Hidden size (transformer and BERT models).")
    flags.DEFINE_integer("heads", None, "Attention heads (transformer and BERT models).")
    flags.DEFINE_integer("ffn", None, "Feed-forward size (transformer and BERT models).")
    flags.DEFINE_integer("layers", None, "Layers (transformer and BERT models).")
    flags.DEFINE_string("function", None, "SavedModel: the tf.function attribute to plan "
                        "(default __call__).")
    flags.DEFINE_bool("coverage", False, "Also report the op types that fell to the "
                      "conservative axis rule, with counts.")
    flags.DEFINE_bool("execute", False, "Run the reference model's step under the plan on "
                      "the cluster (NxCPU) and print the measured step time.")
    flags.DEFINE_integer("steps", 5, "--execute: steps timed after the first.")
    flags.DEFINE_integer("workers", 0, "--execute: run on planner.local_cluster's W worker "
                         "processes (the NxCPU cluster's devices split evenly over them) "
                         "instead of this process's logical CPUs; 0: this process.")
    flags.DEFINE_bool("measured_spec", False, "With an NxCPU cluster: plan with this "
                      "machine's measured figures (planner/cpu_calibration.py: measured once, "
                      "then cached) instead of the assumed ones.")


def _load_graph(model, sizes, function=None):
    from tf_fusionstitch.planner import reference_models
    if model in reference_models.MODELS:
        known = reference_models.DEFAULT_SIZES[model]
        unused = [k for k, v in sizes.items() if v is not None and k not in known]
        if unused:
            raise ValueError(f"--model={model} takes no {', '.join(unused)}")
        return reference_models.build_graph_ir(
            model, **{k: v for k, v in sizes.items() if k in known})
    if not os.path.isdir(model):
        raise ValueError(f"--model={model!r} is neither a reference model "
                         f"({', '.join(reference_models.MODELS)}) nor a SavedModel directory")
    from tf_fusionstitch.planner import graph_import
    return graph_import.from_saved_model(model, function, sizes.get("batch"))


def coverage_report(graph):
    """Lines naming the op types of `graph` that fell to the conservative axis rule."""
    from tf_fusionstitch.planner import op_rules
    fallen = op_rules.conservative_ops(graph)
    if not fallen:
        return "import coverage: every op that binds an axis has an axis rule"
    listed = ", ".join(f"{op_type} x{count}" for op_type, count in fallen.items())
    return (f"import coverage: {sum(fallen.values())} ops on the conservative rule (inputs "
            f"needed whole): {listed}")


def execute(model, spec, strategy, search, budget, seed, schedule, fusion, steps, sizes,
            workers=0):
    """Plans the reference `model`'s traced step and runs it under the plan on `spec`, or
    with `workers`, on a `planner.local_cluster` of that many processes sharing `spec`'s
    devices. Returns (the IR graph, the plan, measured seconds per step, the cluster's name)."""
    from tf_fusionstitch import planner
    from tf_fusionstitch.planner import parallel, reference_models
    parallel.run_cluster(spec)
    if model not in reference_models.MODELS:
        raise ValueError(f"--execute runs reference models only "
                         f"({', '.join(reference_models.MODELS)})")
    if steps < 1:
        raise ValueError(f"--steps must be at least 1, got {steps}")
    if not workers:
        planner.use_cpu_devices(spec.num_devices)   # before anything starts TensorFlow
        return (*_run_planned(model, spec, strategy, search, budget, seed, schedule, fusion,
                              steps, sizes), spec.name)
    if workers < 2 or spec.num_devices % workers:
        raise ValueError(f"--workers={workers}: give 2 or more workers that divide the "
                         f"cluster's {spec.num_devices} devices evenly")
    with planner.local_cluster(workers=workers,
                               devices_per_worker=spec.num_devices // workers) as cluster:
        return (*_run_planned(model, cluster, strategy, search, budget, seed, schedule,
                              fusion, steps, sizes), cluster.spec.name)


def _run_planned(model, cluster, strategy, search, budget, seed, schedule, fusion, steps,
                 sizes):
    from tf_fusionstitch import planner
    from tf_fusionstitch.planner import graph_import, reference_models
    known = reference_models.DEFAULT_SIZES[model]
    step, inputs, variables = reference_models.build_eager(
        model, seed=seed, **{k: v for k, v in sizes.items() if k in known and v is not None})
    parallel_step = planner.parallelize(step, inputs, cluster=cluster, strategy=strategy,
                                        method=search, budget=budget, seed=seed,
                                        schedule=schedule, fusion=fusion,
                                        variables=variables.values())
    graph, _, _ = graph_import.from_function(step, inputs, variables=variables.values())
    float(parallel_step(*inputs))   # traces, partitions and compiles
    start = time.perf_counter()
    for _ in range(steps):
        loss = parallel_step(*inputs)
    float(loss)
    return graph, parallel_step.plan, (time.perf_counter() - start) / steps


def run(model, cluster="8xH200", strategy="auto", search="greedy", budget=None, seed=0,
        schedule="1f1b", out=None, function=None, coverage=False, fusion="none",
        run_steps=None, measured_spec=False, workers=0, **sizes):
    """Plans `model` and returns (the printed report, the Plan); writes JSON to `out`.
    With `coverage`, the report also lists the ops on the conservative axis rule. With
    `run_steps`, the reference model runs under the plan (`execute`; on a local cluster of
    `workers` processes when given) and the report gives
    the measured step time; TensorFlow must not have started yet (it needs the cluster's
    logical CPU devices). With `measured_spec`, an NxCPU cluster has this machine's
    measured figures (`cpu_calibration.measured_cluster`).

    Raises ValueError with the reason for bad arguments.
    """
    from tf_fusionstitch import planner
    unknown = set(sizes) - set(_SIZES)
    if unknown:
        raise ValueError(f"unknown size(s) {sorted(unknown)}; sizes are {', '.join(_SIZES)}")
    spec = planner.get_cluster(cluster)
    if workers and run_steps is None:
        raise ValueError("--workers says where --execute runs the plan: give --execute too")
    if workers and measured_spec:
        raise ValueError("--measured_spec measures this process's logical CPUs; a local "
                         "cluster (--workers) measures its own link: give one of the two")
    if measured_spec:
        if spec.device_type != "CPU" or spec.nodes != 1:
            raise ValueError(f"--measured_spec measures this machine's logical CPUs: give an "
                             f"NxCPU cluster, not {spec.name!r}")
        from tf_fusionstitch.planner import cpu_calibration
        spec = cpu_calibration.measured_cluster(spec.num_devices)
    if run_steps is not None:
        graph, plan, measured, ran_on = execute(model, spec, strategy, search, budget, seed,
                                                schedule, fusion, run_steps, sizes, workers)
    else:
        graph = _load_graph(model, sizes, function)
        plan = planner.search_graph(graph, spec, strategy, search, budget, seed, schedule,
                                    fusion)
    lines = [graph.summary(), str(plan)]
    if run_steps is not None:
        lines.append(f"predicted step time {plan.predicted_step_time * 1e3:.3f} ms, measured "
                     f"{measured * 1e3:.3f} ms (mean of {run_steps} steps on {ran_on})")
    if coverage:
        lines.insert(1, coverage_report(graph))
    if out:
        with open(out, "w") as f:
            f.write(plan.to_json())
        lines.append(f"wrote {out}")
    return "\n".join(lines), plan


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        text, _ = run(FLAGS.model, FLAGS.cluster, FLAGS.strategy, FLAGS.search, FLAGS.budget,
                      FLAGS.seed, FLAGS.schedule, FLAGS.out, FLAGS.function,
                      FLAGS.coverage, FLAGS.fusion, FLAGS.steps if FLAGS.execute else None,
                      FLAGS.measured_spec, FLAGS.workers,
                      **{k: getattr(FLAGS, k) for k in _SIZES})
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    print(text)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
