"""Differential fuzzing of tf_fusionstitch.optimize against TensorFlow.

Generates random graphs of op-table ops (see the fuzzing package for what is
drawn and how results are judged), optimizes them with min_cluster_ops=1 in batches
of several graphs per tf.function, compares every output with TensorFlow's on
fresh random inputs, shrinks every mismatch to a minimal case and writes it to
tests/fuzz_regressions/ (replayed by tests/tools/test_fuzz.py).

  python -m tf_fusionstitch.tools.fuzz --graphs=200 --seed=1

The last line is `fuzz: N graphs, M kernels, F mismatches`; the exit status is
1 when F > 0. Long runs go in fresh processes of --graphs_per_process graphs
each: every kernel stays loaded for the life of the process, and Linux's
default limit of 65,530 memory mappings ends a process after ~13,000 kernels. Oracle problems (TensorFlow itself outside the computed bounds:
a rule of the oracle is wrong, not the compiler) are printed and counted
separately; they do not fail the run unless --strict_oracle.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import re
import subprocess
import sys
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
                    "(default: tests/fuzz_regressions of the source tree; fuzz_regressions/ "
                    "of the working directory where the package is installed).")
flags.DEFINE_bool("save", True, "Write minimal failing cases as JSON files.")
flags.DEFINE_string("cache_dir", None, "Kernel cache directory (default: "
                    "$TF_FUSIONSTITCH_CACHE_DIR, else a fresh temporary directory: random "
                    "graphs would otherwise fill the user's cache).")
flags.DEFINE_bool("strict_oracle", False, "Count oracle problems as mismatches.")
flags.DEFINE_integer("first", 0, "Index of the first graph (graphs first .. first+graphs-1 "
                     "of --seed).")
flags.DEFINE_integer("graphs_per_process", 2000, "Runs longer than this go in a sequence "
                     "of child processes of this many graphs each (0: all in this one).")

_SUMMARY = re.compile(r"^fuzz: (\d+) graphs, (\d+) kernels, (\d+) mismatches$")


def _run_in_children() -> int:
    """Runs the graphs in chunks, each in a fresh process; sums their summaries."""
    start, totals, status = time.monotonic(), [0, 0, 0], 0
    for first in range(FLAGS.first, FLAGS.first + FLAGS.graphs, FLAGS.graphs_per_process):
        left = FLAGS.time_limit - (time.monotonic() - start) if FLAGS.time_limit else 0.0
        if FLAGS.time_limit and left <= 0:
            print(f"time limit reached before graph {first}", flush=True)
            break
        n = min(FLAGS.graphs_per_process, FLAGS.first + FLAGS.graphs - first)
        argv = [sys.executable, "-m", "tf_fusionstitch.tools.fuzz", f"--graphs={n}",
                f"--first={first}", "--graphs_per_process=0", f"--time_limit={left}"]
        argv += [FLAGS[name].serialize() for name in ("seed", "batch", "draws",
                                                      "shrink_seconds", "save", "strict_oracle")]
        argv += [FLAGS[name].serialize() for name in ("regressions_dir", "cache_dir")
                 if FLAGS[name].value]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        summary = None
        for line in proc.stdout:
            print(line, end="", flush=True)
            summary = _SUMMARY.match(line.strip()) or summary
        if proc.wait() not in (0, 1) or summary is None:
            print(f"fuzz: the child process for graphs {first}..{first + n - 1} failed "
                  f"(exit status {proc.returncode})", flush=True)
            return 2
        status = max(status, proc.returncode)
        totals = [t + int(v) for t, v in zip(totals, summary.groups())]
    wall = time.monotonic() - start
    print(f"all processes: {totals[0]} graphs in {wall:.0f} s", flush=True)
    print(f"fuzz: {totals[0]} graphs, {totals[1]} kernels, {totals[2]} mismatches", flush=True)
    return status


def main(argv):
    del argv
    if FLAGS.graphs < 0 or FLAGS.batch < 1 or FLAGS.draws < 1 or FLAGS.first < 0 \
            or FLAGS.graphs_per_process < 0:
        raise app.UsageError("--graphs, --first and --graphs_per_process must be >= 0, "
                             "--batch and --draws >= 1")
    if FLAGS.graphs_per_process and FLAGS.graphs > FLAGS.graphs_per_process:
        return _run_in_children()
    temp = None
    if FLAGS.cache_dir:
        os.environ["TF_FUSIONSTITCH_CACHE_DIR"] = FLAGS.cache_dir
    elif not os.environ.get("TF_FUSIONSTITCH_CACHE_DIR"):
        temp = tempfile.TemporaryDirectory(prefix="tf_fusionstitch-fuzz-cache-")
        os.chmod(temp.name, 0o700)
        os.environ["TF_FUSIONSTITCH_CACHE_DIR"] = temp.name
    from tf_fusionstitch.tools.fuzzing import session  # after the cache is chosen

    start = time.monotonic()
    stats, findings, oracle = session.fuzz(
        FLAGS.graphs, FLAGS.seed, batch=FLAGS.batch, draws=FLAGS.draws,
        shrink_budget_s=FLAGS.shrink_seconds, regressions_dir=FLAGS.regressions_dir,
        save=FLAGS.save, time_limit_s=FLAGS.time_limit,
        log=lambda s: print(s, flush=True), first=FLAGS.first)
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
