"""Seconds the greedy clustering spends on its cycle checks: ClusterGraph's
incremental check against creates_cycle's walk (form_clusters(cycle_walk=True)).

  python benchmarks/clustering_cycles.py                          # EfficientNetV2B0's train step
  python benchmarks/clustering_cycles.py --model=bert --size=real --repeats=3

The zoo model's train step goes through tf_fusionstitch.optimize with the
greedy clustering replaced by a recorder that forms no cluster (nothing is
compiled); the largest graph it was handed is then clustered by each check
in turn, from a fresh copy each time (a view remembers lowering verdicts),
--repeats times, and the fastest run of each is reported: form_clusters'
seconds, the cycle checks' seconds (for ClusterGraph its merges' updates
too), the checks made, and whether both formed the same clusters.
"""

import os
import pathlib
import pickle
import sys
import time
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import tensorflow as tf  # noqa: E402

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(1, str(_HERE.parent))
from benchmarks import zoo  # noqa: E402

import tf_fusionstitch as fs  # noqa: E402
from tf_fusionstitch.rewriters import clustering, cycles  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "efficientnet_v2_b0", "A zoo model (benchmarks/zoo/).")
flags.DEFINE_enum("size", "tiny", list(zoo.SIZES),
                  "The zoo's size set (the graph is the same at both; tiny traces faster).")
flags.DEFINE_integer("repeats", 1, "Runs of each check; the fastest is reported.")

# The cycle checks of each mode, timed: (owner, attribute) pairs.
CHECKS = {"walk": [(cycles, "creates_cycle")],
          "incremental": [(cycles.ClusterGraph, "creates_cycle"),
                          (cycles.ClusterGraph, "join")]}


def largest_clustered_graph(name: str, size: str):
    """(view, candidates, fetches, recurrence) of the largest graph that the
    pass hands the greedy clustering in `name`'s train step, pickled."""
    handed = []

    def record(view, candidates, fetches, recurrence=None, **_):
        handed.append((view, candidates, fetches, recurrence))
        return []
    model = zoo.build(name, size, seed=0)
    batch = model.make_batch(0, 2, 16)
    step = tf.function(model.train_step.python_function,
                       input_signature=model.train_step.input_signature)
    with mock.patch.object(clustering, "form_clusters", record):
        fs.optimize(step, rewrite_cache=False)(*batch.inputs, batch.labels)
    return pickle.dumps(max(handed, key=lambda args: len(args[0].order)))


def timed_run(graph: bytes, mode: str):
    """(form_clusters seconds, cycle check seconds, checks, clusters) of one run."""
    view, candidates, fetches, recurrence = pickle.loads(graph)
    spent, checks = [0.0], [0]
    patches = []
    for owner, attribute in CHECKS[mode]:
        real = getattr(owner, attribute)

        def timed(*args, real=real, attribute=attribute, **kwargs):
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start
                checks[0] += attribute == "creates_cycle"
        patches.append(mock.patch.object(owner, attribute, timed))
    for patch in patches:
        patch.start()
    try:
        start = time.perf_counter()
        groups = clustering.form_clusters(view, candidates, fetches, recurrence,
                                          cycle_walk=mode == "walk")
        total = time.perf_counter() - start
    finally:
        for patch in patches:
            patch.stop()
    return total, spent[0], checks[0], sorted(sorted(g) for g in groups)


def main(_):
    graph = largest_clustered_graph(FLAGS.model, FLAGS.size)
    view, candidates = pickle.loads(graph)[:2]
    print(f"{FLAGS.model} {FLAGS.size} train step: {len(view.order)} nodes, "
          f"{len(candidates)} candidates")
    clusters = {}
    for mode in CHECKS:
        runs = [timed_run(graph, mode) for _ in range(FLAGS.repeats)]
        total, cycles, checks, clusters[mode] = min(runs, key=lambda run: run[1])
        print(f"{mode:12} form_clusters {total:6.2f} s   cycle checks {cycles:6.2f} s "
              f"({checks} checks, {len(clusters[mode])} clusters)")
    print("same clusters:", clusters["walk"] == clusters["incremental"])


if __name__ == "__main__":
    app.run(main)
