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
The rewrite cache is off unless --rewrite_cache is set (its key hashes the rewrite's
source, so an entry is always the plan of the code checked out). A plan
with a measured choice (explore's measured_plans, measured_choice) is called until it has
decided, and the decision is printed, before the rounds.

One process's interval holds the noise between its rounds, not the spread between two
instances of one plan: on an A/A control (one plan under two labels) the second label
measured 1.011x (1.002-1.027) against the first (benchmarks/RESULTS.md, issue 29). A plan's
speed is what a user's process gets, so `--processes=N` runs the comparison in N fresh
processes one after the other (each builds, rewrites, decides and times its own instances,
with its own round order), then summarises per plan the processes' median ratios: their
median, their range and the 95% interval of that median over processes (from six). The
processes share the rewrite cache, so each plan is rewritten once.
"""

import ast
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

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
from tf_fusionstitch import measured_choice  # noqa: E402
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
flags.DEFINE_integer("seed", 2, "Seed of the rounds' orders (process i of --processes: "
                     "seed + i).")
flags.DEFINE_integer("processes", 1, "Fresh processes to run the comparison in, one after "
                     "the other; above 1 the ratios are summarised over processes.")
flags.DEFINE_bool("rewrite_cache", False, "Let each plan come from the rewrite cache "
                  "(--processes sets it for its processes).")
flags.DEFINE_string("json_out", None, "Also write this process's times, kernels and "
                    "choices as JSON to this path (what --processes reads).")


# What a process of --processes gets from this run; it sets the others itself.
_SHARED_FLAGS = ("model", "function", "size", "batch", "plans", "rounds", "warmup")


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
    if FLAGS.processes < 1:
        raise app.UsageError(f"--processes must be at least 1, got {FLAGS.processes}")
    if FLAGS.processes > 1:
        _compare_in_processes(FLAGS.processes)
        return
    result = _compare(plans)
    if FLAGS.json_out:
        pathlib.Path(FLAGS.json_out).write_text(json.dumps(result), encoding="utf-8")


def _compare(plans):
    """Builds, rewrites and times every plan in this process; prints the summary and
    returns the times, kernel counts and choices per label."""
    built, batch, batch_size = _models(len(plans))
    args = list(batch.inputs) + ([batch.labels] if FLAGS.function == "train_step" else [])
    calls, kernels, choices = {}, {}, {}
    for label, (fusion, options), model in zip(FLAGS.plans, plans, built):
        # the rewrite cache as --rewrite_cache says, unless the plan says otherwise
        opt = fs.optimize(getattr(model, FLAGS.function),
                          **{"rewrite_cache": FLAGS.rewrite_cache, **options, "fusion": fusion})
        report = opt.prepare(*args)
        kernels[label] = report.kernels_after
        print(f"{label}: memory-intensive kernels TF {report.kernels_before} -> "
              f"{report.kernels_after}, rewrite {report.rewrite_seconds:.1f} s", flush=True)
        if report.exploration:   # explore's search and its plan guard's choice
            print(f"  {report.exploration}", flush=True)
        opt(*args)
        # A measured choice's first calls alternate its contenders: decided before timing.
        resolved = FusionOptions.from_call(**{**options, "fusion": fusion})
        plans_timed = resolved.measured_plans if fusion == "explore" else 0
        contenders = 1 + bool(plans_timed) + bool(resolved.measured_choice)
        for _ in range(measured_choice.calls_to_decide(
                max(resolved.measured_choice, plans_timed), contenders)):
            if opt.report().choice:
                break
            opt(*args)
        choices[label] = opt.report().choice or ""
        if choices[label]:
            print(f"  {choices[label]}", flush=True)
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
    return {"batch": str(batch_size), "wall": wall, "cpu": cpu, "kernels": kernels,
            "choices": choices}


def _compare_in_processes(count):
    """Runs this comparison in `count` fresh processes, one after the other, and prints
    per plan the summary over processes."""
    results = []
    with tempfile.TemporaryDirectory(prefix="compare_plans-") as tmp:
        for i in range(count):
            out = pathlib.Path(tmp) / f"process{i}.json"
            argv = [sys.executable, str(pathlib.Path(__file__).resolve()),
                    *_flags_for_one_process(), "--processes=1", "--rewrite_cache=true",
                    f"--seed={FLAGS.seed + i}", f"--json_out={out}"]
            print(f"--- process {i + 1} of {count}", flush=True)
            if subprocess.run(argv).returncode != 0:
                raise SystemExit(f"process {i + 1} of {count} failed (its output is above); "
                                 f"command: {' '.join(argv)}")
            results.append(json.loads(out.read_text(encoding="utf-8")))
    base = FLAGS.plans[0]
    print(f"{FLAGS.model} {FLAGS.function}, batch {results[0]['batch']}, {count} processes "
          f"of {FLAGS.rounds} rounds; ratio: the median over processes of each process's "
          f"median of {base}'s time over the plan's in the same round")
    for label in FLAGS.plans:
        medians = [statistics.median(r["wall"][label]) for r in results]
        kernels = sorted({r["kernels"][label] for r in results})
        line = (f"  {label:28s} median {1e3 * statistics.median(medians):9.2f} ms, "
                f"kernels {'/'.join(map(str, kernels))}")
        if label != base:
            mid, (lowest, highest), interval = rounds.process_ratio_summary(
                [(r["wall"][base], r["wall"][label]) for r in results])
            line += f"; ratio median {mid:.3f}x, processes {lowest:.3f}-{highest:.3f}x"
            if interval:
                line += ", 95% interval {:.3f}-{:.3f}x".format(*interval)
        print(line, flush=True)
        kept = [_kept_function(r["choices"][label]) for r in results if r["choices"][label]]
        if kept:
            counts = ", ".join(f"the {k} function in {kept.count(k)}" for k in sorted(set(kept)))
            print(f"    measured choice (processes above): {counts} of {count} processes",
                  flush=True)


def _kept_function(choice):
    """'fused' from a report's 'measured choice: runs the fused function (...)'."""
    found = re.match(r"measured choice: runs the (.+?) function", choice)
    return found.group(1) if found else choice


def _flags_for_one_process():
    """This run's _SHARED_FLAGS as a process of --processes gets them."""
    return [f"--{name}={','.join(value) if isinstance(value, list) else value}"
            for name, value in FLAGS.flag_values_dict().items()
            if name in _SHARED_FLAGS and value is not None]


if __name__ == "__main__":
    app.run(main)
