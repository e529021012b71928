"""Differential fuzzing of tf_fusionstitch.optimize against TensorFlow.

Generates random graphs of op-table ops (see fuzz_graphs.py for what is drawn
and how results are judged), optimizes them with min_cluster_ops=1 in batches
of several graphs per tf.function, compares every output with TensorFlow's on
fresh random inputs, shrinks every mismatch to a minimal case and writes it to
tests/fuzz_regressions/ (replayed by tests/test_fuzz.py).

  python -m tf_fusionstitch.tools.fuzz --graphs=200 --seed=1

The last line is `fuzz: N graphs, M kernels, F mismatches`; the exit status is
1 when F > 0. Oracle problems (TensorFlow itself outside the computed bounds:
a rule of the oracle is wrong, not the compiler) are printed and counted
separately; they do not fail the run unless --strict_oracle.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tempfile
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("graphs", 100, "Number of random graphs to generate and check.")
flags.DEFINE_integer("seed", 0, "Seed of the run; graph i uses a seed derived from (seed, i).")
flags.DEFINE_integer("batch", 8, "Graphs per optimized tf.function (one trace, one Grappler "
                     "run, kernels compiled in parallel).")
flags.DEFINE_integer("draws", 2, "Fresh input draws per graph.")
flags.DEFINE_float("shrink_seconds", 90.0, "Time allowed to shrink one mismatch; 0 disables "
                   "shrinking.")
flags.DEFINE_float("time_limit", 0.0, "Stop generating new graphs after this many seconds "
                   "(0: no limit).")
flags.DEFINE_string("regressions_dir", None, "Where minimal failing cases are written "
                    "(default: tests/fuzz_regressions of the source tree).")
flags.DEFINE_bool("save", True, "Write minimal failing cases as JSON files.")
flags.DEFINE_string("cache_dir", None, "Kernel cache directory (default: "
                    "$TF_FUSIONSTITCH_CACHE_DIR, else a fresh temporary directory: random "
                    "graphs would otherwise fill the user's cache).")
flags.DEFINE_bool("strict_oracle", False, "Count oracle problems as mismatches.")


def main(argv):
    del argv
    if FLAGS.graphs < 0 or FLAGS.batch < 1 or FLAGS.draws < 1:
        raise app.UsageError("--graphs must be >= 0, --batch and --draws >= 1")
    temp = None
    if FLAGS.cache_dir:
        os.environ["TF_FUSIONSTITCH_CACHE_DIR"] = FLAGS.cache_dir
    elif not os.environ.get("TF_FUSIONSTITCH_CACHE_DIR"):
        temp = tempfile.TemporaryDirectory(prefix="tf_fusionstitch-fuzz-cache-")
        os.chmod(temp.name, 0o700)
        os.environ["TF_FUSIONSTITCH_CACHE_DIR"] = temp.name
    from tf_fusionstitch.tools import fuzz_graphs  # after the cache is chosen

    start = time.monotonic()
    stats, findings, oracle = fuzz_graphs.fuzz(
        FLAGS.graphs, FLAGS.seed, batch=FLAGS.batch, draws=FLAGS.draws,
        shrink_budget_s=FLAGS.shrink_seconds, regressions_dir=FLAGS.regressions_dir,
        save=FLAGS.save, time_limit_s=FLAGS.time_limit,
        log=lambda s: print(s, flush=True))
    wall = time.monotonic() - start
    checked = 100.0 * stats.checked / max(stats.total, 1)
    print(f"{stats.graphs} graphs in {wall:.0f} s ({stats.graphs / max(wall, 1e-9):.2f} graphs/s, "
          f"{stats.seconds:.0f} s checking, the rest shrinking); {stats.fallbacks} fallback "
          f"cluster(s); {checked:.1f}% of output elements determined by the oracle; "
          f"{len(oracle)} oracle problem(s); {stats.invalid} invalid graph(s)")
    failures = len(findings) + (len(oracle) if FLAGS.strict_oracle else 0)
    print(f"fuzz: {stats.graphs} graphs, {stats.kernels} kernels, {failures} mismatches",
          flush=True)
    if temp is not None:
        temp.cleanup()
    return 1 if failures else 0


if __name__ == "__main__":
    app.run(main)
