"""The reference models end to end: kernel counts, rewrite time and step time (issue 4).

  python benchmarks/models.py                                # all five, real sizes
  python benchmarks/models.py --models=bert,dien --size=tiny --repeats=3 --out=/tmp/m.md

For each model of benchmarks/models/ (its training step, and BERT's inference too):

  kernels   memory-intensive kernels (rewriters/kernel_count.py) of the graph TF runs after
            Grappler, of the plan XLA's fusion rules make (`optimize(fn, fusion="xla_like")`)
            and of the FusionStitch plan (`optimize(fn)`): the paper's Table 2 column.
  cold s    the FusionStitch rewrite (Grappler, exploration, code generation, compilation;
            Report.rewrite_seconds) with an empty kernel cache: every row gets a fresh
            TF_FUSIONSTITCH_CACHE_DIR (0700) before its first optimize. The op library itself
            is built (or found in the usual cache) once per process before that, as an
            installation would, and is not counted. With --fs_fusion=explore and calibrated
            costs, the machine's cost calibration (rewriters/cpu_costs.py, once per machine)
            is measured once before the rows, reported on its own, and given to each row's
            fresh directory, as a machine that has run optimize before keeps it.
  warm s    the same rewrite again in a new OptimizedFunction: kernels and the rewrite
            itself come from the caches (tf_fusionstitch/rewrite_cache.py).
  TF/XLA/xla_like/fs
            median step time of tf.function, tf.function(jit_compile=True) of the same Python
            function, the xla_like plan's function and the FusionStitch-optimized function
            (the issue's bar: the chosen plan never slower than xla_like). Each contender has its own
            model built from the same seed (identical initial weights, checked); calls are
            interleaved (one call of each per round, in a new random order) after --warmup
            rounds; each time is time.perf_counter around one call whose result is not copied
            out (eager CPU execution returns when the work is done). The details also give
            fs against xla_like round by round (the median and middle half of xla_like's
            time over fs's in each round, rounds.py), which a busy machine's drift does
            not move, and the median's 95% interval (median_interval.py; six rounds or
            more); a row whose whole interval lies below 1x (fs slower) gets a note.
  diff      |loss - TF's loss| of the first step (before any update), for each contender; for
            inference, the max abs difference of the outputs. A difference above
            --rtol * max(1, |TF|) is flagged in the notes, and the model is still timed.

A failure in one model or contender is recorded in the table's notes; the others still run.
"""

import ast
import datetime
import os
import pathlib
import statistics
import sys
import tempfile
import time
import traceback
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import results_md  # noqa: E402  (benchmarks/ is this script's directory, first on sys.path)
import rounds  # noqa: E402
import run_context  # noqa: E402

_HERE = pathlib.Path(__file__).resolve().parent
# This file shadows nothing: `models` on sys.path[0] is the package benchmarks/models/ (a
# package wins over a module of the same name), but its modules import `benchmarks.models`,
# so the repository root goes on the path too.
sys.path.insert(1, str(_HERE.parent))
from benchmarks import models as reference_models  # noqa: E402

import tf_fusionstitch as fs  # noqa: E402
from tf_fusionstitch.rewriters import cpu_costs  # noqa: E402

BEGIN, END = "<!-- models:begin -->", "<!-- models:end -->"
ALL_MODELS = tuple(reference_models.MODELS)
CONTENDERS = ("TF", "XLA", "xla_like", "fs")

FLAGS = flags.FLAGS
flags.DEFINE_list("models", list(ALL_MODELS), f"Comma-separated subset of {', '.join(ALL_MODELS)}.")
flags.DEFINE_enum("size", "real", list(reference_models.SIZES), "The models' size set.")
flags.DEFINE_integer("batch", None, "Batch size of every model; default per model "
                     "(benchmarks/models/'s DEFAULT_BATCH at real sizes, 4 at tiny).")
flags.DEFINE_list("override", [], "Size overrides, model.size=value, e.g. bert.layers=6 "
                  "(values are Python literals).")
flags.DEFINE_integer("repeats", 7, "Timed rounds (one call of each contender per round); "
                     "the median is reported.")
flags.DEFINE_integer("warmup", 2, "Untimed rounds after the first (checked) call.")
flags.DEFINE_float("rtol", 1e-4, "First-step loss / inference output differences above "
                   "rtol * max(1, |TF|) are flagged.")
flags.DEFINE_string("out", str(_HERE / "RESULTS.md"),
                    "Markdown file whose models section is (re)written; empty: do not write.")
flags.DEFINE_alias("results", "out")
flags.DEFINE_bool("inference", True, "Also benchmark BERT's inference function.")
flags.DEFINE_string("fs_fusion", "stitch", "The fusion strategy of the fs contender "
                    "(optimize's fusion option; 'stitch' is optimize's default).")
flags.DEFINE_enum("fs_costs", None, ["calibrated", "builtin"], "With --fs_fusion=explore: "
                  "the delta evaluator's costs (optimize's costs option; default calibrated).")

INFERENCE_MODELS = ("bert",)


# --------------------------------------------------------------------------- helpers

def _overrides():
    result = {}
    for item in FLAGS.override:
        try:
            key, value = item.split("=", 1)
            model, size = key.split(".", 1)
            result.setdefault(model, {})[size] = ast.literal_eval(value)
        except (ValueError, SyntaxError) as e:
            raise app.UsageError(f"--override {item!r}: expected model.size=value ({e})")
        if model not in ALL_MODELS:
            raise app.UsageError(f"--override {item!r}: unknown model {model!r}")
    return result


def _calibrate(cache_root):
    """This machine's cost calibration record, measured in a directory of its
    own, and what to say of it; (None, None) when the fs contender does not
    use calibrated costs."""
    if FLAGS.fs_fusion != "explore" or FLAGS.fs_costs == "builtin":
        return None, None
    run_context.fresh_cache_dir(cache_root, "calibration")
    _, source = cpu_costs.for_this_machine()
    record = cpu_costs.cached_record()
    if record is None:  # calibration failed: every row prices with the builtin costs
        return None, f"Cost calibration: {source}."
    return record, (f"Cost calibration (once per machine, before the rows, not in cold s): "
                    f"{record['seconds']:.2f} s.")


def _max_abs_diff(actual, expected):
    worst, scale = 0.0, 0.0
    for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected)):
        a = np.asarray(a, np.float64)
        e = np.asarray(e, np.float64)
        if e.size:
            worst = max(worst, float(np.max(np.abs(a - e))))
            scale = max(scale, float(np.max(np.abs(e))))
    return worst, scale


def _traced(opt, args):
    """Traces (and so rewrites) the version of `opt` that a call with `args`
    runs, without running it; returns (report, wall seconds, warnings)."""
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        report = opt.prepare(*args)
    wall = time.perf_counter() - t0
    return report, wall, [str(w.message) for w in caught
                          if issubclass(w.category, RuntimeWarning)]


# --------------------------------------------------------------------------- one row

def _build_each(name, sizes):
    """One build per contender from one seed, checked identical: each trains its own."""
    built = [reference_models.build(name, FLAGS.size, seed=0, **sizes) for _ in CONTENDERS]
    first = built[0].model.weights
    for other in built[1:]:
        for a, b in zip(first, other.model.weights):
            if not np.array_equal(a.numpy(), b.numpy()):
                raise AssertionError(f"two builds of {name} differ in {a.path}")
    return built


def run_row(name, function, sizes, batch_size, cache_root, calibration=None):
    """One table row: kernel counts, rewrite times, step times, first-step differences.
    `calibration`: the machine's cost calibration record, for the row's fresh cache."""
    row = {"model": name, "function": function, "batch": batch_size, "ms": {}, "diff": {},
           "notes": [], "kernels": None}
    stage = "build"
    try:
        if function == "train_step":
            built = _build_each(name, sizes)
            fns = dict(zip(CONTENDERS, (m.train_step for m in built)))
        else:  # inference does not change weights: one model serves every contender
            built = [reference_models.build(name, FLAGS.size, seed=0, **sizes)]
            fns = {label: built[0].inference for label in CONTENDERS}
        batch = built[0].make_batch(np.random.default_rng(1), batch_size)
        args = list(batch.inputs) + ([batch.labels] if function == "train_step" else [])

        stage = f"optimize ({FLAGS.fs_fusion}, cold)"
        run_context.fresh_cache_dir(cache_root, f"{name}-{function}")
        if calibration is not None:
            cpu_costs.store(calibration)
        fs_fn = fs.optimize(fns["fs"], **_fs_options())
        cold, cold_wall, warns = _traced(fs_fn, args)
        row["notes"] += [f"fs: {w}" for w in warns]
        row["exploration"] = cold.exploration
        stage = f"optimize ({FLAGS.fs_fusion}, warm)"
        warm, _, _ = _traced(fs.optimize(fns["fs"], **_fs_options()), args)
        stage = "optimize (xla_like)"
        xla_like_fn = fs.optimize(fns["xla_like"], fusion="xla_like")
        xla_like, _, warns = _traced(xla_like_fn, args)
        row["notes"] += [f"xla_like: {w}" for w in warns]
        row.update(cold=cold.rewrite_seconds, cold_wall=cold_wall,
                   cold_compilations=cold.compilations, warm=warm.rewrite_seconds,
                   warm_compilations=warm.compilations, xla_like_seconds=xla_like.rewrite_seconds,
                   kernels=(cold.kernels_before, xla_like.kernels_after, cold.kernels_after),
                   fused=len(cold.fused_clusters), fallbacks=len(cold.fallbacks))
        if xla_like.kernels_before != cold.kernels_before:
            row["notes"].append(f"TF kernel counts differ between the two rewrites: "
                                f"{cold.kernels_before} ({FLAGS.fs_fusion}), "
                                f"{xla_like.kernels_before} (xla_like)")
        if warm.kernels_after != cold.kernels_after:
            row["notes"].append(f"the warm rewrite's plan has {warm.kernels_after} kernels, "
                                f"the cold one {cold.kernels_after}")
        print(f"    kernels TF {cold.kernels_before} -> xla_like {xla_like.kernels_after} -> "
              f"fs {cold.kernels_after}; rewrite cold {cold.rewrite_seconds:.2f} s "
              f"({cold.compilations} compilations, {cold_wall:.2f} s with tracing), warm "
              f"{warm.rewrite_seconds:.2f} s ({warm.compilations}), xla_like "
              f"{xla_like.rewrite_seconds:.2f} s", flush=True)
        if cold.exploration:
            print(f"    exploration: {cold.exploration}", flush=True)

        stage = "first call"
        py = fns["XLA"].python_function
        xla_fn = tf.function(py, input_signature=fns["XLA"].input_signature, jit_compile=True)
        calls = {"TF": fns["TF"], "XLA": xla_fn, "xla_like": xla_like_fn, "fs": fs_fn}
        first = {}
        for label, f in calls.items():
            t0 = time.perf_counter()
            try:
                first[label] = f(*args)
            except Exception as e:
                row["notes"].append(f"{label} failed on the first call: {run_context.one_line(e)}")
                continue
            row[f"first_{label}"] = time.perf_counter() - t0
        if "TF" not in first:
            return row
        for label in CONTENDERS[1:]:
            if label in first:
                diff, scale = _max_abs_diff(first[label], first["TF"])
                row["diff"][label] = diff
                if not diff <= FLAGS.rtol * max(1.0, scale):
                    row["notes"].append(f"{label} differs from TF on the first call by "
                                        f"{diff:.2e} (|TF| up to {scale:.3g}, tolerance "
                                        f"{FLAGS.rtol:g} relative)")
        print("    first call: " + ", ".join(f"{k} {row[f'first_{k}']:.2f} s" for k in first)
              + "; diff vs TF: " + ", ".join(f"{k} {v:.2e}" for k, v in row["diff"].items()),
              flush=True)

        stage = "timing"
        times, _ = rounds.time_rounds({k: calls[k] for k in CONTENDERS if k in first}, args,
                                      FLAGS.repeats, FLAGS.warmup)
        row["ms"] = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        row["spread"] = {k: 1e3 * (max(v) - min(v)) for k, v in times.items()}
        if "fs" in times and "xla_like" in times:
            row["paired"], row["paired_interval"] = rounds.ratio_summary(times["xla_like"],
                                                                         times["fs"])
            if row["paired_interval"] and row["paired_interval"][1] < 1.0:
                row["notes"].append("fs is slower than xla_like: the 95% interval of the "
                                    "round-by-round median, {:.3f}-{:.3f}x, lies below 1"
                                    .format(*row["paired_interval"]))
        print("    median ms: " + ", ".join(f"{k} {v:.1f}" for k, v in row["ms"].items())
              + ("; fs vs xla_like round by round: median {1:.3f}x, middle half "
                 "{0:.3f}-{2:.3f}x".format(*row["paired"]) if "paired" in row else "")
              + _interval_text(row),
              flush=True)
    except Exception as e:
        row["notes"].append(f"failed at {stage}: {run_context.one_line(e)}")
        traceback.print_exc()
    return row


# --------------------------------------------------------------------------- reporting

def _interval_text(row):
    """The median's 95% interval (median_interval.py), when there were rounds enough."""
    interval = row.get("paired_interval")
    return ", 95% interval of the median {:.3f}-{:.3f}x".format(*interval) if interval else ""


def _kernel_text(row):
    k = row["kernels"]
    return f"{k[0]} / {k[1]} / {k[2]}" if k else "n/a"


def _ratio(row):
    k = row["kernels"]
    return f"{100.0 * k[2] / k[1]:.0f}%" if k and k[1] else "n/a"


def _fmt(row, key, fmt):
    return format(row[key], fmt) if key in row else "n/a"


def _ms(row, label):
    return f"{row['ms'][label]:.4g}" if label in row["ms"] else "n/a"


def _speedup(row, base):
    ms = row["ms"]
    return f"{ms[base] / ms['fs']:.2f}x" if "fs" in ms and base in ms else "n/a"


def _diff_text(row):
    return ", ".join(f"{k} {row['diff'][k]:.1e}" for k in CONTENDERS[1:] if k in row["diff"]) \
        or "n/a"


def _cells(row):
    return [row["model"], row["function"], str(row["batch"]), _kernel_text(row), _ratio(row),
            _fmt(row, "cold", ".2f"), _fmt(row, "warm", ".2f"), _ms(row, "TF"),
            _ms(row, "XLA"), _ms(row, "xla_like"), _ms(row, "fs"), _speedup(row, "TF"),
            _speedup(row, "XLA"), _speedup(row, "xla_like"), _diff_text(row)]


HEADER = ["model", "function", "batch", "kernels TF / xla_like / fs", "fs/xla_like",
          "cold s", "warm s", "TF ms", "XLA ms", "xla_like ms", "fs ms", "fs vs TF",
          "fs vs XLA", "fs vs xla_like", "first-step diff vs TF"]


def print_table(rows):
    widths = [max(len(h), *(len(_cells(r)[i]) for r in rows)) for i, h in enumerate(HEADER)]
    print("  ".join(h.ljust(w) for h, w in zip(HEADER, widths)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(_cells(r), widths)))
    for r in rows:
        for note in r["notes"]:
            print(f"  {r['model']} {r['function']}: {note}")


def _fs_options():
    """optimize()'s options for the fs contender, from the flags."""
    options = {"fusion": FLAGS.fs_fusion}
    if FLAGS.fs_costs is not None:
        options["costs"] = FLAGS.fs_costs
    return options


def markdown(rows, load, seconds, sizes_text, source, during, calibration_text=None):
    batch_text = ""
    if FLAGS.size == "real" and FLAGS.batch is None:
        batch_text = (" with small batches (the batch column), so that one training step "
                      "takes about a second or two on this 2-core CPU and every model fits "
                      "the run")
    fs_call = "optimize(fn" + "".join(f", {k}={v!r}" for k, v in _fs_options().items()
                                      if (k, v) != ("fusion", "stitch")) + ")"
    lines = [
        BEGIN,
        "## Reference models (`benchmarks/models.py`)",
        "",
        f"{datetime.date.today().isoformat()}; {run_context.machine_line(load)}; the run took "
        f"{seconds / 60:.1f} min; {during}; {source} at the start.",
        f"`{' '.join(['python benchmarks/models.py'] + sys.argv[1:])}`. "
        f"Sizes: {FLAGS.size}{sizes_text}{batch_text}. "
        "Kernels: memory-intensive kernels of the graph TF runs after Grappler / of the "
        f"xla_like plan / of the FusionStitch plan (fs: `{fs_call}`), each for the "
        "version the timed calls run (it may assume input sizes equal that every call "
        "checks, tf_fusionstitch/versions.py). "
        "Cold / warm: the FusionStitch rewrite "
        "(Grappler, exploration, code generation, compilation) with empty caches / "
        "again in a new optimized function (kernel and rewrite caches warm). Step times: "
        "median of "
        f"{FLAGS.repeats} interleaved calls (a new random order each round) after "
        f"{FLAGS.warmup} warm-up rounds, in ms; XLA "
        "is `tf.function(jit_compile=True)` of the same Python function, xla_like is "
        "`optimize(fn, fusion='xla_like')` (XLA's fusion rules in this tool); each contender "
        "trains its own copy of the model from identical initial weights. Diff: |loss - TF "
        "loss| of the first step (max abs output difference for inference)."
        + (f" {calibration_text}" if calibration_text else "")
        + (" **Load was >= 1 before the run: other work may have inflated the times.**"
           if load >= 1.0 else ""),
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    for r in rows:
        lines.append("| " + " | ".join(_cells(r)) + " |")
    notes = [f"- {r['model']} {r['function']}: {n.replace('|', '/')}" for r in rows
             for n in r["notes"]]
    details = []
    for r in rows:
        if "cold" in r:
            first = ", ".join(f"{k} {r[f'first_{k}']:.1f} s" for k in CONTENDERS
                              if f"first_{k}" in r)
            details.append(
                f"- {r['model']} {r['function']}: cold rewrite {r['cold']:.2f} s "
                f"({r['cold_compilations']} kernels compiled; {r['cold_wall']:.2f} s with TF's "
                f"tracing), warm {r['warm']:.2f} s ({r['warm_compilations']} compiled), "
                f"xla_like rewrite {r['xla_like_seconds']:.2f} s; {r['fused']} FusionStitch "
                f"kernels, {r['fallbacks']} fallbacks; first call (incl. XLA's compilation) "
                f"{first}."
                + (" Step-time spread (max - min of the timed calls): " +
                   ", ".join(f"{k} {v:.3g} ms" for k, v in r["spread"].items()) + "."
                   if r.get("spread") else "")
                + (" fs vs xla_like round by round (xla_like's time over fs's in the same "
                   "round): median {1:.3f}x, middle half {0:.3f}-{2:.3f}x".format(*r["paired"])
                   + _interval_text(r) + "." if r.get("paired") else "")
                + (f" Exploration: {r['exploration']}." if r.get("exploration") else ""))
    lines += ["", "Details:", ""] + details
    lines += ["", "Notes:", ""] + (notes or ["- none: every contender ran on every row "
                                             "and agreed with TF."])
    lines.append(END)
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    unknown = set(FLAGS.models) - set(ALL_MODELS)
    if unknown:
        raise app.UsageError(f"unknown --models {sorted(unknown)}; choose from {ALL_MODELS}")
    if FLAGS.fs_costs is not None and FLAGS.fs_fusion != "explore":
        raise app.UsageError(f"--fs_costs applies only to --fs_fusion=explore, got "
                             f"--fs_fusion={FLAGS.fs_fusion}")
    overrides = _overrides()
    load = os.getloadavg()[0]  # other work running now skews every time below
    start = time.perf_counter()
    source = run_context.source_state()
    print(f"{run_context.machine_line(load)}; {source}", flush=True)

    # The op library is part of the installation, not of a rewrite: build or find it in
    # the usual cache before the kernels move to fresh directories.
    from tf_fusionstitch.custom_ops import loader
    loader.load()

    rows = []
    sizes_text = []
    with tempfile.TemporaryDirectory(prefix="fs-models-bench-") as cache_root, \
            run_context.LoadSampler() as sampler:
        os.chmod(cache_root, 0o700)
        calibration, calibration_text = _calibrate(cache_root)
        if calibration_text:
            print(calibration_text, flush=True)
        for name in FLAGS.models:
            sizes = overrides.get(name, {})
            batch = FLAGS.batch or reference_models.default_batch(name, FLAGS.size)
            if sizes:
                sizes_text.append(f"{name} " + ", ".join(f"{k}={v}" for k, v in sizes.items()))
            functions = ["train_step"]
            if FLAGS.inference and name in INFERENCE_MODELS:
                functions.append("inference")
            for function in functions:
                print(f"... {name} {function} (batch {batch})", flush=True)
                rows.append(run_row(name, function, sizes, batch, cache_root, calibration))
    seconds = time.perf_counter() - start
    print()
    print_table(rows)
    print(f"\nmodels: {len(rows)} rows in {seconds:.1f} s; {sampler.text()}")
    if FLAGS.out:
        text = markdown(rows, load, seconds,
                        (" with overrides " + "; ".join(sizes_text)) if sizes_text else "",
                        source, sampler.text(), calibration_text)
        results_md.write_section(FLAGS.out, BEGIN, END, text)
        print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
    app.run(main)
