"""Step time of fusion plans of one model, interleaved round by round.

  python benchmarks/compare_plans.py --model=dien --plans=xla_like,stitch,explore --rounds=40
  python benchmarks/compare_plans.py --model=bert --function=inference \
      --plans=xla_like,explore,explore:pack=False
  python benchmarks/compare_plans.py --model=zoo:mobilenet_v2 --plans=xla_like,explore

--model is a reference model (benchmarks/models/) or `zoo:` and a zoo model
(benchmarks/zoo/, at the batch and sequence length benchmarks/zoo.py times).

benchmarks/models.py times four contenders for a table; this script answers a narrower
question, whether one plan is slower than another, with as many rounds as that takes. A
plan is an optimize() fusion strategy with options after a colon, joined by '+'
(`explore:pack=False`, `explore:costs=builtin+explore_k=5`). Each plan trains its own copy
of the model, built from one seed. Every round calls each plan once, in a new random order
(rounds.py); per plan the script prints the median step time and process CPU time, and the
median over rounds of the first plan's time over this plan's (above 1x: this plan is
faster), with its middle half and its 95% interval (median_interval.py; from six rounds).
The rewrite cache is off, so each plan is rewritten by the code checked out. A plan
with a measured choice (explore's measured_plans, measured_choice) is called until it has
decided, and the decision is printed, before the rounds.
"""

import ast
import os
import pathlib
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402

import rounds  # noqa: E402  (benchmarks/ is sys.path[0])

# `models` on sys.path[0] is the package benchmarks/models/, whose modules import
# `benchmarks.models`: the repository root goes on the path too (as in models.py).
sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))
from benchmarks import models as reference_models  # noqa: E402
from benchmarks import zoo  # noqa: E402

import tf_fusionstitch as fs  # noqa: E402
from tf_fusionstitch.options import FusionOptions  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "bert", list(reference_models.MODELS) +
                  [f"zoo:{name}" for name in zoo.NAMES],
                  "The reference model, or zoo:<name> for a zoo model.")
flags.DEFINE_enum("function", "train_step", ["train_step", "inference"],
                  "Which of the model's functions to time.")
flags.DEFINE_enum("size", "real", list(reference_models.SIZES), "The model's size set.")
flags.DEFINE_integer("batch", None, "Batch size; default benchmarks/models/'s DEFAULT_BATCH "
                     "(a zoo model's: zoo.REAL_BATCH) at real sizes, 4 at "
                     "tiny ones.")
flags.DEFINE_list("plans", ["xla_like", "explore"], "Plans to compare, the first the "
                  "baseline: fusion strategies, each with optional `:option=value+option=value`.")
flags.DEFINE_integer("rounds", 30, "Timed rounds (one call of each plan per round).")
flags.DEFINE_integer("warmup", 2, "Untimed rounds after the first call.")
flags.DEFINE_integer("seed", 2, "Seed of the rounds' orders.")


def parse_plan(text):
    """'explore:pack=False+costs=builtin' -> ('explore', {'pack': False, 'costs': 'builtin'})
    (options joined by '+': --plans splits at commas)."""
    fusion, _, rest = text.partition(":")
    options = {}
    for item in filter(None, rest.split("+")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"plan {text!r}: option {item!r} is not key=value")
        try:
            options[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            options[key.strip()] = value.strip()
    return fusion.strip(), options


def _models(count):
    """`count` copies of --model built from one seed, one batch for them, and
    its size as printed."""
    name = FLAGS.model
    if not name.startswith("zoo:"):
        batch_size = FLAGS.batch or reference_models.default_batch(name, FLAGS.size)
        built = [reference_models.build(name, FLAGS.size, seed=0) for _ in range(count)]
        return built, built[0].make_batch(np.random.default_rng(1), batch_size), batch_size
    name = name[len("zoo:"):]
    built = [zoo.build(name, FLAGS.size, seed=0) for _ in range(count)]
    batch_size, seq = zoo.timed_shape(built[0], FLAGS.function, FLAGS.size)
    batch_size = FLAGS.batch or batch_size
    batch = built[0].make_batch(np.random.default_rng(1), batch_size, seq)
    return built, batch, batch_size if seq is None else f"{batch_size}x{seq}"


def main(argv):
    del argv
    plans = [parse_plan(p) for p in FLAGS.plans]
    if len(plans) < 2:
        raise app.UsageError("--plans needs two plans or more: the first is the baseline")
    if len(set(FLAGS.plans)) != len(FLAGS.plans):
        raise app.UsageError(f"--plans names a plan twice: {FLAGS.plans}")
    built, batch, batch_size = _models(len(plans))
    args = list(batch.inputs) + ([batch.labels] if FLAGS.function == "train_step" else [])
    calls = {}
    for label, (fusion, options), model in zip(FLAGS.plans, plans, built):
        # rewrite_cache off unless the plan says otherwise: the code checked out rewrites
        opt = fs.optimize(getattr(model, FLAGS.function),
                          **{"rewrite_cache": False, **options, "fusion": fusion})
        report = opt.prepare(*args)
        print(f"{label}: memory-intensive kernels TF {report.kernels_before} -> "
              f"{report.kernels_after}, rewrite {report.rewrite_seconds:.1f} s", flush=True)
        if report.exploration:   # explore's search and its plan guard's choice
            print(f"  {report.exploration}", flush=True)
        opt(*args)
        # A measured choice's first calls alternate its contenders: decided before timing.
        resolved = FusionOptions.from_call(**{**options, "fusion": fusion})
        timed = max(resolved.measured_choice,
                    resolved.measured_plans if fusion == "explore" else 0)
        for _ in range(3 * (timed + 1)):
            if opt.report().choice:
                break
            opt(*args)
        if opt.report().choice:
            print(f"  {opt.report().choice}", flush=True)
        calls[label] = opt
    wall, cpu = rounds.time_rounds(calls, args, FLAGS.rounds, FLAGS.warmup, FLAGS.seed)
    base = FLAGS.plans[0]
    print(f"{FLAGS.model} {FLAGS.function}, batch {batch_size}, {FLAGS.rounds} rounds; "
          f"ratio: {base}'s time over the plan's in the same round")
    for label in FLAGS.plans:
        line = (f"  {label:28s} median {1e3 * statistics.median(wall[label]):9.2f} ms, "
                f"CPU {1e3 * statistics.median(cpu[label]):9.2f} ms")
        if label != base:
            (low, mid, high), interval = rounds.ratio_summary(wall[base], wall[label])
            line += f"; ratio median {mid:.3f}x, middle half {low:.3f}-{high:.3f}x"
            if interval:
                line += ", 95% interval {:.3f}-{:.3f}x".format(*interval)
        print(line, flush=True)


if __name__ == "__main__":
    app.run(main)
