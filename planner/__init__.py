"""Auto-MAP-style parallel planner: search data-parallel, operator-partitioning and pipeline
plans for a TensorFlow training step over a cost model, write the plan into a GraphDef, or
run it.

    import tf_fusionstitch.planner as planner
    plan = planner.search(train_step, example_inputs, cluster="8xH200", strategy="auto",
                          method="dp")
    print(plan)                       # mesh, split variables, stages, predicted step time
    placed = plan.apply(graph_def)    # NodeDef.device strings per stage
    step = planner.parallelize(train_step, example_inputs, cluster="4xCPU")
    loss = step(*example_inputs)      # one step under the plan, on 4 logical CPUs

Only `graph_import`, `parallel` (runs plans), `local_workers` and `dtensor_client_main`
(worker processes), the model
builders (`reference_models`, `more_models`, `model_blocks`) and the DQN's networks import
TensorFlow (lazily, from `search`, `parallelize`, `local_cluster` and `method="dqn"`); the
IR, cost model, layouts, micro-batch cuts, strategies and searches are TF-free
(tests/test_imports.py checks it).
"""

from tf_fusionstitch.planner.cluster import PRESETS, ClusterSpec, get_cluster
from tf_fusionstitch.planner.cost_model import Config, CostModel, Estimate
from tf_fusionstitch.planner.plan import Plan
from tf_fusionstitch.planner.searches import METHODS
from tf_fusionstitch.planner.strategies import STRATEGIES, PlanEnv

__all__ = ["search", "search_graph", "parallelize", "use_cpu_devices", "local_cluster", "Plan",
           "ClusterSpec", "get_cluster", "PRESETS", "STRATEGIES", "METHODS", "PlanEnv",
           "CostModel", "Config", "Estimate"]


def _check(strategy, method):
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    if method not in METHODS:
        raise ValueError(f"unknown search method {method!r}; use one of {', '.join(METHODS)}")


def search_graph(graph, cluster="8xH200", strategy="auto", method="greedy", budget=None,
                 seed=0, schedule="1f1b", fusion="none"):
    """Searches a plan for an already imported `ir.Graph`. Returns a `Plan`."""
    from tf_fusionstitch.planner import searches
    _check(strategy, method)
    env = PlanEnv(graph, get_cluster(cluster), strategy, schedule=schedule, fusion=fusion)
    plan, calls = searches.run(env, method, budget, seed)
    plan.cost_model_calls = calls
    return plan


def search(fn, example_inputs, cluster="8xH200", strategy="auto", method="greedy",
           budget=None, seed=0, variables=(), schedule="1f1b", fusion="none"):
    """Traces `fn` (a training step or inference tf.function) and searches a plan.

    cluster: a preset (`8xV100`, `8xA100`, `8xH200`, `4x8xH200`, `cpu-localhost`), an
      `NxDEVICE` / `MxNxDEVICE` string (`NxCPU`: N logical CPUs of this process), a dict or
      JSON, or a ClusterSpec.
    strategy: "data" (replicas only), "operator" (operator partitioning over all devices),
      "pipeline" (stages over all devices), or "auto" (every product d x t x p = devices).
    method: "exhaustive" (small spaces), "dp" (dynamic programming over pipeline cuts),
      "greedy", "random", "annealing" (simulated annealing) or "dqn" (double DQN with
      task-specific pruning; imports TensorFlow); budget caps cost-model calls (distinct
      plans priced); seed drives "random", "annealing" and "dqn" (same seed, same plan).
    variables: extra tf.Variables the function uses only through raw handles.
    fusion: how memory-intensive ops are priced: "none" (one kernel each, TF's executor),
      "stitch" (clusters as tf_fusionstitch fuses them) or "xla" (as XLA fuses them).
    Returns a `Plan` (its `cost_model_calls` says what the search used).
    """
    _check(strategy, method)
    cluster = get_cluster(cluster)   # fail on a bad spec before tracing
    from tf_fusionstitch.planner import graph_import
    graph, _, _ = graph_import.from_function(fn, example_inputs, variables=variables)
    return search_graph(graph, cluster, strategy, method, budget, seed, schedule, fusion)


def parallelize(fn, example_inputs, cluster="4xCPU", strategy="auto", method="greedy",
                plan=None, variables=(), **search_options):
    """A callable that runs one training step of `fn` under a plan, on TensorFlow's engine.

    The plan is `plan`, or the one `search` finds for `fn` with `strategy`, `method` and
    `search_options` (budget, seed, schedule, fusion; fusion defaults to "stitch" for a
    step that holds FusionStitch ops, else "none"). cluster: `NxCPU`, N logical CPU
    devices of this process (set up here if TensorFlow has not initialised its devices; else
    see `use_cpu_devices`), or a `local_cluster(...)`. Data x tensor parallel plans run
    under DTensor (on a local cluster: multi-client, on its DTensor clients); pipeline and
    data plans without tensor parallelism run placed, in replicas and micro-batches (on a
    local cluster, data plans always so); pipelines with tensor parallelism raise
    ValueError. The callable takes `fn`'s arguments and returns its
    outputs; its `.plan` is the plan and `.sync_variables()` writes the distributed
    variables' values back into `fn`'s variables. Imports TensorFlow.
    """
    _check(strategy, method)
    from tf_fusionstitch.planner import parallel

    def search_plan(graph, cluster_spec):
        options = dict(search_options)
        if any(op.type == "FusionStitch" for op in graph.ops.values()):
            # A step tf_fusionstitch.optimize fused runs stitched kernels: price it so.
            options.setdefault("fusion", "stitch")
        return search_graph(graph, cluster_spec, strategy, method, **options)

    return parallel.build(fn, example_inputs, cluster, plan=plan, search=search_plan,
                          variables=variables)


def use_cpu_devices(count):
    """Makes this process's CPU `count` logical devices, as `cluster="NxCPU"` needs; call it
    before TensorFlow runs anything. Imports TensorFlow."""
    from tf_fusionstitch.planner import parallel
    return parallel.use_cpu_devices(count)


def local_cluster(workers=2, devices_per_worker=1):
    """Starts `workers` TensorFlow worker processes on 127.0.0.1 (`devices_per_worker` CPU
    devices each) and joins them; the result is a `cluster=` for `parallelize` (data and
    pipeline plans run placed on the workers, tensor parallel plans on DTensor client
    processes it starts beside them) and a context manager that stops them all. Create
    the model after it. Imports TensorFlow."""
    from tf_fusionstitch.planner import local_workers
    return local_workers.LocalCluster(workers, devices_per_worker)
