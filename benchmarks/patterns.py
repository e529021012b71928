"""Reference memory-intensive patterns: TF vs XLA vs ONNX Runtime vs tf_fusionstitch.

In one run, on the same random inputs, each pattern is timed as
  TF      tf.function
  XLA     tf.function(jit_compile=True)
  ORT     ONNX Runtime on the tf2onnx conversion ("n/a" with the reason if it fails)
  fs      tf_fusionstitch.optimize(tf.function) (the error text if it fails)
  floor   bytes that must move (inputs read once, outputs written once) divided by
          the copy bandwidth measured in this run (~256 MB copied by one thread or
          one chunk per core, whichever is faster).

Each time is the median of --repeats calls after --warmup calls, measured with
time.perf_counter around one call on tensors already on the device, without
.numpy() on the result (eager CPU execution returns when the work is done; .numpy()
would add a copy). ORT is timed as session.run with numpy inputs. Every contender's
result is checked against TF's (max abs difference).

  python benchmarks/patterns.py                       # all patterns, writes RESULTS.md
  python benchmarks/patterns.py --patterns=softmax --small --out=/tmp/r.md
"""

import concurrent.futures
import datetime
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

import results_md  # benchmarks/ is this script's directory, first on sys.path
import run_context

_HERE = os.path.dirname(os.path.abspath(__file__))
BEGIN, END = "<!-- patterns:begin -->", "<!-- patterns:end -->"

ALL_PATTERNS = ("layernorm", "softmax", "bias_gelu", "residual_layernorm", "bn_relu")

FLAGS = flags.FLAGS
flags.DEFINE_list("patterns", list(ALL_PATTERNS),
                  f"Comma-separated subset of {', '.join(ALL_PATTERNS)}. bias_gelu also "
                  "times the tanh form.")
flags.DEFINE_integer("repeats", 15, "Timed calls per contender; the median is reported.")
flags.DEFINE_integer("warmup", 3, "Untimed calls before timing.")
flags.DEFINE_string("out", os.path.join(_HERE, "RESULTS.md"),
                    "Markdown file whose patterns section is (re)written; empty: do not "
                    "write. Default benchmarks/RESULTS.md, or nothing with --small.")
flags.DEFINE_bool("small", False, "Tiny sizes, for a smoke test of the script.")

EPS_LN = 1e-5
EPS_BN = 1e-3


# --------------------------------------------------------------------------- patterns
# Written the way a user writes them.

def layernorm(x, gamma, beta):
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
    return centered * tf.math.rsqrt(var + EPS_LN) * gamma + beta


def softmax(x):
    return tf.nn.softmax(x, axis=-1)


def bias_gelu(x, bias):
    return tf.nn.gelu(x + bias, approximate=False)


def bias_gelu_tanh(x, bias):
    return tf.nn.gelu(x + bias, approximate=True)


def residual_layernorm(x, residual, gamma, beta):
    return layernorm(x + residual, gamma, beta)


def bn_relu(x, scale, offset, mean, variance):
    y, _, _ = tf.compat.v1.nn.fused_batch_norm(
        x, scale, offset, mean=mean, variance=variance, epsilon=EPS_BN,
        data_format="NHWC", is_training=False)
    return tf.nn.relu(y)


def _cases(small):
    """(row name, function, input shapes) per pattern, at the sizes of
    docs/DESIGN.md, "Reference patterns"."""
    ln = (64, 128) if small else (16384, 1024)
    sm = (4, 16, 16) if small else (96, 128, 128)
    gl = (64, 256) if small else (4096, 3072)
    rl = (64, 96) if small else (16384, 768)
    bn = (2, 8, 8, 16) if small else (32, 56, 56, 64)
    c = bn[-1]
    return {
        "layernorm": [("layernorm", layernorm, [ln, ln[-1:], ln[-1:]])],
        "softmax": [("softmax", softmax, [sm])],
        "bias_gelu": [("bias+gelu", bias_gelu, [gl, gl[-1:]]),
                      ("bias+gelu(tanh)", bias_gelu_tanh, [gl, gl[-1:]])],
        "residual_layernorm": [("residual add+layernorm", residual_layernorm,
                                [rl, rl, rl[-1:], rl[-1:]])],
        "bn_relu": [("batchnorm(inference)+relu", bn_relu, [bn, (c,), (c,), (c,), (c,)])],
    }


def _inputs(name, shapes, rng):
    arrays = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    if name.startswith("batchnorm"):
        arrays[-1] = np.abs(arrays[-1]) + 0.5  # a variance is positive
    return arrays


# --------------------------------------------------------------------------- measuring

def _median_ms(call, warmup, repeats):
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def copy_bandwidth(nbytes=256 << 20, repeats=7):
    """Bytes/s of a copy (read + write counted), median of `repeats`, the faster of
    one thread and one chunk per core (the fused kernels use every core, so a
    one-thread floor would be one they can beat)."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    threads = os.cpu_count() or 1
    chunks = np.array_split(np.arange(src.size), threads)
    bounds = [(c[0], c[-1] + 1) for c in chunks if c.size]

    def parallel_copy():
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:  # numpy drops the GIL
            list(pool.map(lambda b: np.copyto(dst[b[0]:b[1]], src[b[0]:b[1]]), bounds))

    best = min(statistics.median(_timed(fn) for _ in range(repeats))
               for fn in (lambda: np.copyto(dst, src), parallel_copy))
    return 2 * nbytes / best


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _max_diff(result, reference):
    diff = np.abs(np.asarray(result, np.float64) - reference)
    return float(np.max(diff)) if diff.size else 0.0


def _fs_contender(tf_fn):
    """(optimized callable, None) or (None, error text)."""
    try:
        import tf_fusionstitch as fs
        return fs.optimize(tf_fn), None
    except Exception as e:  # the compiler is optional for this script: record, go on
        return None, run_context.one_line(e)


def run_case(name, fn, shapes, rng, bandwidth):
    arrays = _inputs(name, shapes, rng)
    tensors = [tf.constant(a) for a in arrays]
    row = {"name": name, "shape": "x".join(map(str, shapes[0])), "ms": {}, "diff": {},
           "note": {}}

    tf_fn = tf.function(fn)
    reference = np.asarray(tf_fn(*tensors).numpy(), np.float64)
    out_bytes = reference.size * 4
    row["floor"] = 1e3 * (sum(a.nbytes for a in arrays) + out_bytes) / bandwidth

    contenders = {"TF": tf_fn, "XLA": tf.function(fn, jit_compile=True)}
    fast, err = _fs_contender(tf_fn)
    if fast is not None:
        contenders["fs"] = fast
    else:
        row["note"]["fs"] = err

    for label, f in contenders.items():
        try:
            row["diff"][label] = _max_diff(f(*tensors), reference)
            row["ms"][label] = _median_ms(lambda: f(*tensors), FLAGS.warmup, FLAGS.repeats)
        except Exception as e:
            row["note"][label] = run_context.one_line(e)
    # optimize() rewrites on the first call, so the report exists only after one.
    row["report"] = fast.report() if fast is not None and "fs" in row["diff"] else None

    ort_call, reason = run_context.ort_contender(fn, arrays)
    if ort_call is None:
        row["note"]["ORT"] = reason
    else:
        row["diff"]["ORT"] = _max_diff(ort_call(), reference)
        row["ms"]["ORT"] = _median_ms(ort_call, FLAGS.warmup, FLAGS.repeats)
    return row


# --------------------------------------------------------------------------- reporting

CONTENDERS = ("TF", "XLA", "ORT", "fs")


def _versions():
    parts = [f"TF {tf.__version__}", f"numpy {np.__version__}"]
    for mod in ("onnxruntime", "tf2onnx"):
        try:
            parts.append(f"{mod} {__import__(mod).__version__}")
        except Exception:
            pass
    return ", ".join(parts)


def _fmt_ms(row, label):
    return f"{row['ms'][label]:.3g}" if label in row["ms"] else "n/a"


def _derived(row):
    """(fs speed-up vs the faster of TF/XLA, fs/floor, kernels before->after) as text."""
    ms = row["ms"]
    best = min((ms[k] for k in ("TF", "XLA") if k in ms), default=None)
    speedup = f"{best / ms['fs']:.2f}x" if "fs" in ms and best else "n/a"
    vs_floor = f"{ms['fs'] / row['floor']:.2f}" if "fs" in ms else "n/a"
    rep = row["report"]
    kernels = (f"{getattr(rep, 'kernels_before', '?')} -> {getattr(rep, 'kernels_after', '?')}"
               if rep is not None else "n/a")
    return speedup, vs_floor, kernels


def _diffs(row):
    return ", ".join(f"{k} {row['diff'][k]:.1e}" for k in CONTENDERS if k in row["diff"]
                     and k != "TF")


def print_table(rows):
    head = f"{'pattern':<27}{'TF':>9}{'XLA':>9}{'ORT':>9}{'fs':>9}{'floor':>9}" \
           f"{'fs gain':>9}{'fs/floor':>9}  kernels   max|diff| vs TF"
    print(head)
    print("-" * len(head))
    for r in rows:
        speedup, vs_floor, kernels = _derived(r)
        print(f"{r['name']:<27}" + "".join(f" {_fmt_ms(r, k):>8}" for k in CONTENDERS) +
              f" {r['floor']:>8.3g}{speedup:>9}{vs_floor:>9}  {kernels:<9} {_diffs(r)}")
    for r in rows:
        for k, note in r["note"].items():
            print(f"  {r['name']}: {k}: {note}")
    for r in rows:
        if r["report"] is not None:
            print(f"\n--- fs report: {r['name']}\n{r['report']}")


def markdown(rows, bandwidth, load):
    lines = [
        BEGIN,
        "## Patterns (`benchmarks/patterns.py`)",
        "",
        f"{datetime.date.today().isoformat()}; {results_md.cpu_model()}, {os.cpu_count()} cores; "
        f"{_versions()}; Python {platform.python_version()}; load average {load:.1f} "
        f"before the run.",
        f"float32, random normal inputs; median of {FLAGS.repeats} calls after {FLAGS.warmup} "
        f"warm-up calls, in ms, results not copied out. Floor: inputs read once + outputs "
        f"written once at the measured copy bandwidth ({bandwidth / 1e9:.1f} GB/s, the "
        f"faster of a 1-thread and a per-core copy of 256 MB; fs/floor below 1 means "
        f"fs moved its bytes faster than that copy, e.g. with streaming stores). fs gain: "
        f"the faster of TF/XLA divided by fs."
        + (" **Smoke-test sizes (--small).**" if FLAGS.small else "")
        + (" **Other work was running (load >= 1): times are inflated and noisy; rerun "
           "`make bench` on an idle machine.**" if load >= 1.0 else ""),
        "",
        "| pattern | shape | TF | XLA | ORT | fs | floor | fs gain | fs/floor | kernels "
        "before -> after | max abs diff vs TF |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        speedup, vs_floor, kernels = _derived(r)
        lines.append(f"| {r['name']} | {r['shape']} | " +
                     " | ".join(_fmt_ms(r, k) for k in CONTENDERS) +
                     f" | {r['floor']:.3g} | {speedup} | {vs_floor} | {kernels} | {_diffs(r)} |")
    notes = [f"- {r['name']}, {k}: {note.replace('|', '/')}" for r in rows
             for k, note in r["note"].items()]
    if notes:
        lines += ["", "Not measured:", ""] + notes
    lines.append(END)
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    unknown = set(FLAGS.patterns) - set(ALL_PATTERNS)
    if unknown:
        raise app.UsageError(f"unknown --patterns {sorted(unknown)}; choose from {ALL_PATTERNS}")
    out = FLAGS.out if (FLAGS["out"].present or not FLAGS.small) else ""
    load = os.getloadavg()[0]  # other work running now skews every time below

    bandwidth = copy_bandwidth()
    print(f"{results_md.cpu_model()}, {os.cpu_count()} cores, {_versions()}; load average "
          f"{load:.1f}; copy bandwidth {bandwidth / 1e9:.1f} GB/s", flush=True)
    rng = np.random.default_rng(0)
    cases = _cases(FLAGS.small)
    rows = []
    for pattern in FLAGS.patterns:
        for name, fn, shapes in cases[pattern]:
            print(f"... {name}", flush=True)
            rows.append(run_case(name, fn, shapes, rng, bandwidth))
    print()
    print_table(rows)
    if out:
        results_md.write_section(out, BEGIN, END, markdown(rows, bandwidth, load))
        print(f"\nwrote {out}")


if __name__ == "__main__":
    app.run(main)
