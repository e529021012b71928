"""The model zoo end to end: step times, first-call times and kernel counts (issue 28).

  python benchmarks/zoo.py                                   # every model, real sizes
  python benchmarks/zoo.py --models=resnet50,bert --functions=train_step --rounds=20
  python benchmarks/zoo.py --size=tiny --rounds=6 --out=/tmp/zoo.md

For each zoo model (benchmarks/zoo/: keras.applications CNNs and keras_hub backbones
built from their constructors with random weights), its inference function and, for the
models --train_models names, its train step:

  kernels      memory-intensive kernels of the graph TF runs after Grappler -> of the
               tf_fusionstitch plan (rewriters/kernel_count.py); fallbacks: clusters that
               stayed TF ops, and whether a trace fell back to the original function.
  first call   seconds of the first call of a fresh tf.function, tracing included: TF's own
               (the function as written), tf_fusionstitch's with empty kernel and rewrite
               caches (cold: tracing, Grappler, the rewrite, code generation, compilation,
               TF's own instantiation of the new graph) and with warm caches (warm: a new
               optimized function of a new tf.function, as a second process would run it);
               XLA's includes its compilation. The op library is built before the rows.
  step ms      median of --rounds interleaved rounds (one call of each contender per round,
               in a new random order: rounds.py) after --warmup rounds. TF: the
               tf.function; XLA: jit_compile=True of the same Python function; ORT: ONNX
               Runtime on the tf2onnx conversion (inference only, where it converts); fs:
               tf_fusionstitch.optimize(fn) (with --measured_choice=N, the one of the fused
               and the original function its first calls measured faster: a row says which).
  fs vs TF     TF's time over fs's in the same round: the median over rounds and its 95%
               interval (median_interval.py); above 1x fs is faster. A row whose whole
               interval lies below 1x is flagged. fs vs XLA likewise.
  diff         the largest difference of fs's first result from TF's (outputs; the first
               train step's loss, each contender starting from the same weights), relative
               to the result's largest magnitude, and XLA's beside it.

Train-step contenders share one copy of the model: each starts its checked first call from
the same initial weights (restored between them); in the timed rounds they update the same
variables, which changes no step's work. A failure in one row or contender is recorded in
the notes; the others still run. The summary gives the geometric means of fs vs TF per
function and the share of rows where fs beats XLA.
"""

import datetime
import math
import os
import pathlib
import statistics
import subprocess
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
sys.path.insert(1, str(_HERE.parent))
from benchmarks import zoo  # noqa: E402

import tf_fusionstitch as fs  # noqa: E402
from tf_fusionstitch import measured_choice  # noqa: E402

BEGIN, END = "<!-- zoo:begin -->", "<!-- zoo:end -->"
FUNCTIONS = ("inference", "train_step")
# Train steps timed by default: CNNs and transformers, every optimizer family but one.
DEFAULT_TRAIN = ("mobilenet_v2", "resnet50", "efficientnet_b0", "densenet121",
                 "convnext_tiny", "bert", "gpt2", "t5", "vit", "llama", "qwen2")

FLAGS = flags.FLAGS
flags.DEFINE_list("models", list(zoo.NAMES), "Zoo models to run (benchmarks/zoo/).")
flags.DEFINE_list("functions", list(FUNCTIONS), "inference and/or train_step.")
flags.DEFINE_list("train_models", list(DEFAULT_TRAIN), "Models whose train step is timed "
                  "(of --models); 'all' for every one.")
flags.DEFINE_enum("size", "real", list(zoo.SIZES), "The zoo's size set.")
flags.DEFINE_integer("batch", None, "Batch size of every row (default per family, "
                     "zoo.REAL_BATCH; 4 at tiny sizes).")
flags.DEFINE_integer("seq", None, "Sequence length of text rows (default 128 real, 16 tiny).")
flags.DEFINE_integer("rounds", 15, "Timed rounds.")
flags.DEFINE_integer("warmup", 2, "Untimed rounds after the first calls.")
flags.DEFINE_bool("ort", True, "Also time ONNX Runtime on inference rows.")
flags.DEFINE_integer("measured_choice", 0, "N > 0: the timed fs contender is "
                     "optimize(fn, measured_choice=N), which keeps the faster of the fused and "
                     "the original function after N timed pairs of calls (decided before the "
                     "rounds; the notes say which it kept). 0: always the fused function.")
flags.DEFINE_string("out", str(_HERE / "RESULTS.md"),
                    "Markdown file whose zoo section is (re)written; empty: do not write.")


def _shape(model, function):
    batch, seq = zoo.timed_shape(model, function, FLAGS.size)
    if seq is not None:   # a text model
        seq = FLAGS.seq or seq
    return FLAGS.batch or batch, seq


def _fresh(fn):
    """A new, untraced tf.function of `fn`'s Python function: its first call traces."""
    return tf.function(fn.python_function, input_signature=fn.input_signature)


def _timed_first_call(fn, args):
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        result = fn(*args)
    return result, time.perf_counter() - t0, [str(w.message) for w in caught]


# Run in a child process: tf2onnx freezes every weight into the graph and
# copies it several times over (VGG16's conversion went past this 24 GB
# machine's memory), and a child that runs out takes only itself down.
_CONVERT = """
import sys
import numpy as np, tensorflow as tf, tf2onnx
sys.path.insert(0, sys.argv[1])
from benchmarks import zoo
name, size, out = sys.argv[2:5]
shapes = [(tuple(int(d) for d in s.split("x")), dt) for s, dt in
          (arg.split(":") for arg in sys.argv[5:])]
model = zoo.build(name, size, seed=0)
sig = [tf.TensorSpec(shape, tf.as_dtype(dt), name=f"in{i}") for i, (shape, dt) in
       enumerate(shapes)]
onnx_model, _ = tf2onnx.convert.from_function(
    tf.function(model.inference.python_function, input_signature=sig), input_signature=sig)
with open(out, "wb") as f:
    f.write(onnx_model.SerializeToString())
"""
ONNX_CONVERT_TIMEOUT_S = 1200


def _ort_contender(name, arrays):
    """run_context.ort_session_contender on the tf2onnx conversion of zoo model
    `name`'s inference (seed 0, as run_row builds it) at the arrays' shapes,
    converted in a child process; (None, reason) where that fails."""
    with tempfile.TemporaryDirectory(prefix="fs-zoo-onnx-") as tmp:
        out = os.path.join(tmp, "model.onnx")
        shapes = [f"{'x'.join(map(str, a.shape))}:{a.dtype.name}" for a in arrays]
        try:
            res = subprocess.run([sys.executable, "-c", _CONVERT, str(_HERE.parent), name,
                                  FLAGS.size, out] + shapes, capture_output=True, text=True,
                                 timeout=ONNX_CONVERT_TIMEOUT_S,
                                 env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        except subprocess.TimeoutExpired:
            return None, f"tf2onnx took over {ONNX_CONVERT_TIMEOUT_S} s"
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["no output"])[-1]
            return None, (f"tf2onnx's conversion exited with {res.returncode}"
                          + (" (killed: out of memory?)" if res.returncode < 0 else "")
                          + f": {last[:200]}")
        return run_context.ort_session_contender(pathlib.Path(out).read_bytes(), arrays)


def _decide(optimized, args):
    """Calls `optimized` until its measured choice is made; the report's line on it."""
    for _ in range(measured_choice.calls_to_decide(FLAGS.measured_choice, 2)):
        if optimized.report().choice:
            break
        optimized(*args)
    return optimized.report().choice or "measured choice not made"


def _relative_diff(a, b):
    worst, scale = 0.0, 0.0
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if y.size:
            worst = max(worst, float(np.max(np.abs(x - y))))
            scale = max(scale, float(np.max(np.abs(y))))
    return worst / scale if scale else worst


def run_row(name, function, cache_root):
    row = {"model": name, "function": function, "ms": {}, "first": {}, "diff": {},
           "notes": [], "ratios": {}}
    stage = "build"
    try:
        model = zoo.build(name, FLAGS.size, seed=0)
        batch, seq = _shape(model, function)
        row["batch"] = batch if seq is None else f"{batch}x{seq}"
        data = model.make_batch(np.random.default_rng(1), batch, seq)
        args = list(data.inputs) + ([data.labels] if function == "train_step" else [])
        original = getattr(model, function)
        state = list(model.model.variables) + list(model.optimizer.variables)
        initial = [v.numpy() for v in state]

        def from_initial_weights(call):
            for v, value in zip(state, initial):
                v.assign(value)
            return call()

        calls, first = {}, {}
        stage = "TF first call"
        calls["TF"] = _fresh(original)
        first["TF"], row["first"]["TF"], _ = from_initial_weights(
            lambda: _timed_first_call(calls["TF"], args))
        stage = "fs first call (cold)"
        run_context.fresh_cache_dir(cache_root, f"{name}-{function}")
        cold = fs.optimize(_fresh(original))
        first["fs"], row["first"]["fs cold"], warns = from_initial_weights(
            lambda: _timed_first_call(cold, args))
        row["notes"] += [f"fs: {w}" for w in warns]
        report = cold.report()
        row["kernels"] = (report.kernels_before, report.kernels_after)
        row["fallbacks"] = len(report.fallbacks)
        row["failure"] = report.failure
        row["rewrite"] = (report.rewrite_seconds, report.compile_seconds, report.compilations)
        stage = "fs first call (warm)"
        calls["fs"] = fs.optimize(_fresh(original), measured_choice=FLAGS.measured_choice)
        _, row["first"]["fs warm"], _ = from_initial_weights(
            lambda: _timed_first_call(calls["fs"], args))
        if FLAGS.measured_choice:
            stage = "fs measured choice"
            row["notes"].append("fs: " + _decide(calls["fs"], args))
        stage = "XLA first call"
        xla = tf.function(original.python_function, input_signature=original.input_signature,
                          jit_compile=True)
        try:
            first["XLA"], row["first"]["XLA"], _ = from_initial_weights(
                lambda: _timed_first_call(xla, args))
            calls["XLA"] = xla
        except Exception as e:  # noqa: BLE001  (XLA lacks some ops on CPU)
            row["notes"].append(f"XLA failed: {run_context.one_line(e)}")
        if function == "inference" and FLAGS.ort:
            stage = "ORT conversion"
            t0 = time.perf_counter()
            ort, why = _ort_contender(name, [np.asarray(a) for a in data.inputs])
            if ort is None:
                row["notes"].append(f"ORT: {why}")
            else:
                first["ORT"] = ort()
                row["first"]["ORT"] = time.perf_counter() - t0
                calls["ORT"] = lambda *_: ort()
        for label in ("fs", "XLA", "ORT"):
            if label in first:
                row["diff"][label] = _relative_diff(first[label], first["TF"])
        print(f"    kernels {row['kernels'][0]} -> {row['kernels'][1]}, first call "
              + ", ".join(f"{k} {v:.1f} s" for k, v in row["first"].items())
              + "; diff " + ", ".join(f"{k} {v:.1e}" for k, v in row["diff"].items()),
              flush=True)
        stage = "timing"
        times, _ = rounds.time_rounds(calls, args, FLAGS.rounds, FLAGS.warmup)
        row["ms"] = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        for base in ("TF", "XLA"):
            if base in times:
                row["ratios"][base] = rounds.ratio_summary(times[base], times["fs"])
        interval = row["ratios"]["TF"][1]
        if interval and interval[1] < 1.0:
            row["notes"].append("fs is slower than TF: the 95% interval of the round-by-round "
                                "median, {:.3f}-{:.3f}x, lies below 1".format(*interval))
        print("    median ms " + ", ".join(f"{k} {v:.1f}" for k, v in row["ms"].items())
              + "; fs vs TF " + _ratio_text(row, "TF") + ", vs XLA " + _ratio_text(row, "XLA"),
              flush=True)
    except Exception as e:  # noqa: BLE001
        row["notes"].append(f"failed at {stage}: {run_context.one_line(e)}")
        traceback.print_exc()
    return row


def _ratio_text(row, base):
    if base not in row["ratios"]:
        return "n/a"
    (_, median, _), interval = row["ratios"][base]
    return f"{median:.2f}x" + (" ({:.2f}-{:.2f})".format(*interval) if interval else "")


def _first_text(row):
    f = row["first"]
    if "TF" not in f or "fs cold" not in f:
        return "n/a"
    return (f"{f['TF']:.1f} / {f['fs cold']:.1f} / {f.get('fs warm', float('nan')):.1f} "
            f"({f['fs cold'] / f['TF']:.2f}x, {f.get('fs warm', float('nan')) / f['TF']:.2f}x)")


HEADER = ["model", "function", "batch", "kernels TF -> fs", "fallbacks",
          "first call s TF / fs cold / fs warm", "TF ms", "XLA ms", "ORT ms", "fs ms",
          "fs vs TF (95% interval)", "fs vs XLA (95% interval)", "diff fs / XLA"]


def _cells(row):
    ms = row["ms"]
    kernels = row.get("kernels")
    fallbacks = ("trace failed" if row.get("failure") else str(row["fallbacks"])
                 if "fallbacks" in row else "n/a")
    diff = " / ".join(f"{row['diff'][k]:.1e}" if k in row["diff"] else "n/a"
                      for k in ("fs", "XLA"))
    return [row["model"], row["function"], str(row.get("batch", "n/a")),
            f"{kernels[0]} -> {kernels[1]}" if kernels else "n/a", fallbacks,
            _first_text(row)] + [f"{ms[k]:.4g}" if k in ms else "n/a"
                                 for k in ("TF", "XLA", "ORT", "fs")] + [
        _ratio_text(row, "TF"), _ratio_text(row, "XLA"), diff]


def summary(rows):
    """Lines: geometric means of fs vs TF per function, rows faster than XLA, first calls."""
    lines = []
    for function in FUNCTIONS:
        medians = [r["ratios"]["TF"][0][1] for r in rows
                   if r["function"] == function and "TF" in r["ratios"]]
        if medians:
            geo = math.exp(statistics.fmean(math.log(m) for m in medians))
            below = [r["model"] for r in rows if r["function"] == function and "TF" in
                     r["ratios"] and r["ratios"]["TF"][1] and r["ratios"]["TF"][1][1] < 1.0]
            lines.append(f"- {function}: fs vs TF geometric mean {geo:.3f}x over "
                         f"{len(medians)} models; interval below 1x: "
                         f"{', '.join(below) or 'none'}.")
    versus = [r for r in rows if "XLA" in r["ratios"]]
    if versus:
        faster = [r for r in versus if r["ratios"]["XLA"][0][1] > 1.0]
        lines.append(f"- fs faster than XLA (median over rounds) on {len(faster)} of "
                     f"{len(versus)} rows ({100.0 * len(faster) / len(versus):.0f}%).")
    firsts = [r for r in rows if r["function"] == "train_step" and "fs cold" in r["first"]]
    if firsts:
        worst_cold = max(firsts, key=lambda r: r["first"]["fs cold"] / r["first"]["TF"])
        worst_warm = max(firsts, key=lambda r: r["first"].get("fs warm", 0) / r["first"]["TF"])
        lines.append(f"- train steps' first call over TF's: cold at most "
                     f"{worst_cold['first']['fs cold'] / worst_cold['first']['TF']:.2f}x "
                     f"({worst_cold['model']}), warm at most "
                     f"{worst_warm['first']['fs warm'] / worst_warm['first']['TF']:.2f}x "
                     f"({worst_warm['model']}).")
    return lines


def markdown(rows, load, seconds, source, during):
    lines = [BEGIN, "## Model zoo (`benchmarks/zoo.py`)", "",
             f"{datetime.date.today().isoformat()}; {run_context.machine_line(load)}; the run took "
             f"{seconds / 60:.1f} min; {during}; {source} at the start.",
             f"`{' '.join(['python benchmarks/zoo.py'] + sys.argv[1:])}`. Sizes: "
             f"{FLAGS.size}; {FLAGS.rounds} interleaved rounds after {FLAGS.warmup} warm-up "
             "rounds. Columns as the script's docstring defines them: first call with "
             "tracing (fs cold: empty caches; fs warm: caches warm), step times in ms, fs vs "
             "TF and vs XLA as the median over rounds of the other's time over fs's with "
             "its 95% interval (above 1x: fs faster), diff relative to the result's "
             "largest magnitude.", "", "Summary:", ""] + summary(rows) + [""]
    notes = [f"{r['model']} {r['function']}: {n}" for r in rows for n in r["notes"]]
    lines += results_md.table_and_notes(HEADER, [_cells(r) for r in rows], notes) + [END]
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    if zoo.unknown_names(FLAGS.models):
        raise app.UsageError(zoo.unknown_names(FLAGS.models))
    bad = set(FLAGS.functions) - set(FUNCTIONS)
    if bad:
        raise app.UsageError(f"unknown --functions {sorted(bad)}; choose from {FUNCTIONS}")
    train = set(zoo.NAMES) if FLAGS.train_models == ["all"] else set(FLAGS.train_models)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    source = run_context.source_state()
    print(f"{run_context.machine_line(load)}; {source}", flush=True)
    from tf_fusionstitch.custom_ops import loader
    loader.load()   # the op library is part of the installation, not of a rewrite
    rows = []
    with tempfile.TemporaryDirectory(prefix="fs-zoo-bench-") as cache_root, \
            run_context.LoadSampler() as sampler:
        os.chmod(cache_root, 0o700)
        for name in FLAGS.models:
            for function in FLAGS.functions:
                if function == "train_step" and name not in train:
                    continue
                print(f"... {name} {function}", flush=True)
                rows.append(run_row(name, function, cache_root))
    seconds = time.perf_counter() - start
    print("\n" + "\n".join("  ".join(_cells(r)) for r in rows))
    print("\n".join([""] + summary(rows)))
    print(f"\nzoo: {len(rows)} rows in {seconds:.1f} s; {sampler.text()}")
    if FLAGS.out:
        results_md.write_section(FLAGS.out, BEGIN, END,
                                 markdown(rows, load, seconds, source, sampler.text()))
        print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
    app.run(main)
