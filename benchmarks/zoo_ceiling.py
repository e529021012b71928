"""The fusion ceiling of each zoo model's inference: how much faster than TF a call
could get if only the matmul-class kernels cost anything (issue 28).

  python benchmarks/zoo_ceiling.py                           # every model, real sizes
  python benchmarks/zoo_ceiling.py --models=bert,vgg16 --calls=3 --out=/tmp/ceiling.md
  python benchmarks/zoo_ceiling.py --size=tiny --out=        # a quick look, no file

tf_fusionstitch never changes a matmul-class op (MatMul, BatchMatMul, Einsum, Conv2D,
DepthwiseConv2dNative and their remapper-fused and oneDNN forms: op_profile.CONTRACTIONS):
they stay TF's oneDNN kernels. Nor does it change what a nested jit_compile function
runs: Keras's grouped convolutions (ConvNeXt's depthwise 7x7 convolutions) are such
functions, one XLA executable each (op_profile.XLA_RUN), also counted as matmul-class
here. So a call under fs still takes at least the wall time during which some
matmul-class op runs. For each zoo model this script profiles --calls
calls of TF's own `model.inference` one at a time (op_profile.py; the zoo's batches:
--batch images, --batch x --seq tokens, as benchmarks/zoo.py times them), takes the call
of the median ceiling, and reports for it

  call         the call and the copy of its results, as the profiled caller sees it;
  matmul       the union of matmul-class op intervals over all threads;
  idle         the share of the call during which no op at all runs (executor overhead;
               a large one would also hide ops the profile does not name);
  ceiling      call / matmul: TF's time over fs's if every other op, and all of the
               executor's dispatch and scheduling, cost nothing; (range): the lowest
               and highest of the --calls calls' ceilings;
  TF ms        the median over --rounds calls without the profiler, beside the profiled
               call to show what the profiler adds;
  fs matmul    with --fs: the median matmul union of --calls profiled calls of
               tf_fusionstitch.optimize(model.inference): it should match TF's, fs
               leaving matmuls alone;
  fs vs TF     with --fs: TF's time over fs's, the median over --rounds interleaved rounds
               (rounds.py) on this machine; (zoo table): the median ratio of the zoo
               section of --zoo_results (benchmarks/zoo.py), possibly another machine;
  fs/ceiling   fs vs TF (this machine's with --fs, else the zoo table's) over the ceiling.

The summary gives the geometric mean of the ceilings: above it no fusion-only approach
can bring the zoo's geometric mean of fs vs TF.

Caveats. It is an upper bound for fusion alone, not an estimate:
  - every op other than a matmul-class one counts as free, and so does the executor's
    overhead between ops; fs removes much dispatch with the ops it fuses, but not all of
    it, and its kernels still take time;
  - the remapper's fusions (a bias add, activation or residual add folded into
    _FusedConv2D / _FusedMatMul) are matmul-class time on both sides: fs leaves them to
    the remapper, so their epilogues are counted as not removable;
  - an op running on another thread while a matmul runs is counted as free (only the
    matmul union counts), although fs would still have to run it;
  - a nested jit_compile function's XLA executable counts as matmul-class as a whole,
    the few element-wise ops XLA runs around its convolution included: fs cannot
    change them either;
  - call and matmul come from the same profiled calls, so the machine's load drifts out
    of the ratio; the profiler slows every op event a little, the many small
    non-matmul ops most, which raises the ceiling a bit (TF ms beside the profiled
    call shows how much the profiler adds in all).
A model whose fs vs TF exceeds its ceiling means the metric misses something (a
matmul-class op type not in op_profile.CONTRACTIONS, or matmuls that fs's graph runs
differently); the notes list matmul-like op types that are not in the class.
"""

import datetime
import math
import os
import pathlib
import re
import statistics
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402

import op_profile  # noqa: E402  (benchmarks/ is this script's directory, first on sys.path)
import results_md  # noqa: E402
import rounds  # noqa: E402
import run_context  # noqa: E402

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(1, str(_HERE.parent))
from benchmarks import zoo  # noqa: E402

import tf_fusionstitch as fs  # noqa: E402

BEGIN, END = "<!-- zoo_ceiling:begin -->", "<!-- zoo_ceiling:end -->"
ZOO_BEGIN, ZOO_END = "<!-- zoo:begin -->", "<!-- zoo:end -->"
MATMUL_LIKE = re.compile(r"MatMul|Conv|Einsum", re.IGNORECASE)   # for the notes' check

FLAGS = flags.FLAGS
flags.DEFINE_list("models", list(zoo.NAMES), "Zoo models to profile (benchmarks/zoo/).")
flags.DEFINE_enum("size", "real", list(zoo.SIZES), "The zoo's size set.")
flags.DEFINE_integer("batch", 4, "Batch size (benchmarks/zoo.py's inference batch).")
flags.DEFINE_integer("seq", None, "Sequence length of text models (default 128 real, "
                     "16 tiny, as benchmarks/zoo.py).")
flags.DEFINE_integer("calls", 5, "Profiled calls per model.")
flags.DEFINE_integer("warmup", 2, "Untimed calls after the first (tracing) call.")
flags.DEFINE_integer("rounds", 6, "Timed rounds without the profiler (TF ms; fs vs TF).")
flags.DEFINE_bool("fs", True, "Also profile and time tf_fusionstitch.optimize of each "
                  "inference (fs matmul, fs vs TF on this machine).")
flags.DEFINE_string("zoo_results", str(_HERE / "RESULTS.md"),
                    "Markdown file whose zoo section gives fs vs TF; empty: none.")
flags.DEFINE_string("out", str(_HERE / "RESULTS.md"),
                    "Markdown file whose zoo_ceiling section is (re)written; empty: none.")


def geometric_mean(values) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def zoo_ratios(path: str) -> dict:
    """model -> fs vs TF (the median) of the inference rows of the zoo section in
    `path`; {} where there is no such file or section."""
    if not path or not os.path.exists(path):
        return {}
    text = pathlib.Path(path).read_text()
    start, stop = text.find(ZOO_BEGIN), text.find(ZOO_END)
    if start < 0 or stop < start:
        return {}
    header, ratios = None, {}
    for line in text[start:stop].splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            continue
        row = dict(zip(header, cells))
        match = re.match(r"([\d.]+)x", row.get("fs vs TF (95% interval)", ""))
        if row.get("function") == "inference" and match:
            ratios[row["model"]] = float(match.group(1))
    return ratios


def run_row(name: str, cache_root: str) -> dict:
    row = {"model": name, "notes": []}
    stage = "build"
    try:
        model = zoo.build(name, FLAGS.size, seed=0)
        seq = ((FLAGS.seq or (16 if FLAGS.size == "tiny" else 128))
               if model.family == "text" else None)
        row["batch"] = str(FLAGS.batch) if seq is None else f"{FLAGS.batch}x{seq}"
        args = list(model.make_batch(np.random.default_rng(1), FLAGS.batch, seq).inputs)
        calls = {"TF": model.inference}
        if FLAGS.fs:
            run_context.fresh_cache_dir(cache_root, name)
            calls["fs"] = fs.optimize(model.inference)
        splits = {}
        for label, fn in calls.items():
            stage = f"{label} first calls"
            for _ in range(1 + FLAGS.warmup):
                fn(*args)
            stage = f"{label} profile"
            splits[label] = [op_profile.profile(fn, args, 1,
                                                classify=op_profile.contraction_class,
                                                classes=op_profile.CONTRACTION_CLASSES,
                                                xla_runs=True)
                             for _ in range(FLAGS.calls)]
        stage = "timing"
        times, _ = rounds.time_rounds(calls, args, FLAGS.rounds, 0)
        row["ms"] = 1e3 * statistics.median(times["TF"])
        if FLAGS.fs:
            row["fs_matmul"] = statistics.median(x["unions"]["matmul"] for x in splits["fs"])
            row["ratio"] = rounds.ratio_summary(times["TF"], times["fs"])[0][1]
            report = calls["fs"].report()
            row["kernels"] = (report.kernels_before, report.kernels_after)
        # each call profiled alone: the call of the median ceiling, and the range
        ceilings = sorted((op_profile.fusion_ceiling(x), i) for i, x in enumerate(splits["TF"]))
        split = row["split"] = splits["TF"][ceilings[len(ceilings) // 2][1]]
        row["ceiling"] = op_profile.fusion_ceiling(split)
        row["range"] = (ceilings[0][0], ceilings[-1][0])
        missed = sorted(t for t in split["types"] if MATMUL_LIKE.search(t)
                        and t not in op_profile.CONTRACTIONS)
        if missed:
            row["notes"].append("matmul-like op types counted as other: " + ", ".join(missed))
        if op_profile.XLA_RUN in split["types"]:
            row["notes"].append(
                f"{100 * split['types'][op_profile.XLA_RUN] / split['call']:.0f}% of TF's call "
                "in XLA executables of nested jit_compile functions (matmul-class here)")
        if row["ceiling"] == math.inf:
            row["notes"].append("no matmul-class op ran: left out of the geometric mean")
        print(f"    {_line(row)}", flush=True)
    except Exception as e:  # noqa: BLE001  (one model's failure is a note)
        row["notes"].append(f"failed at {stage}: {run_context.one_line(e)}")
        traceback.print_exc()
    return row


def _top_other(split, n=3):
    """The n op types of most time outside the matmul class, as shares of the call."""
    others = sorted(((us, t) for t, us in split["types"].items()
                     if op_profile.contraction_class(t) != "matmul"), reverse=True)[:n]
    return ", ".join(f"{t} {100 * us / split['call']:.0f}%" for us, t in others) or "none"


def _line(row):
    s = row["split"]
    return (f"{row['model']} {row['batch']}: call {s['call'] / 1e3:.1f} ms, matmul union "
            f"{s['unions']['matmul'] / 1e3:.1f} ms, ceiling {row['ceiling']:.3f}x "
            f"(TF ms {row['ms']:.1f} without the profiler)"
            + (f"; fs matmul union {row['fs_matmul'] / 1e3:.1f} ms, fs vs "
               f"TF {row['ratio']:.3f}x" if "ratio" in row else ""))


HEADER = ["model", "batch", "TF ms", "call ms", "matmul ms", "matmul share", "idle",
          "ops per call", "ceiling (range)", "fs matmul ms", "fs vs TF", "fs vs TF (zoo table)",
          "fs / ceiling", "largest other op types"]


def _fs_ratio(row, ratios):
    """fs vs TF of this run, else the zoo table's; None if neither."""
    return row.get("ratio", ratios.get(row["model"]))


def _cells(row, ratios):
    if "split" not in row:
        return [row["model"], row.get("batch", "n/a")] + ["n/a"] * (len(HEADER) - 2)
    s, ceiling = row["split"], row["ceiling"]
    here, table, ratio = row.get("ratio"), ratios.get(row["model"]), _fs_ratio(row, ratios)
    return [row["model"], row["batch"], f"{row['ms']:.4g}", f"{s['call'] / 1e3:.4g}",
            f"{s['unions']['matmul'] / 1e3:.4g}",
            f"{100 * s['unions']['matmul'] / s['call']:.0f}%",
            f"{100 * s['overhead'] / s['call']:.0f}%", f"{s['ops']:.0f}",
            f"{ceiling:.3f}x ({row['range'][0]:.3f}-{row['range'][1]:.3f})",
            f"{row['fs_matmul'] / 1e3:.4g}" if "fs_matmul" in row else "n/a",
            f"{here:.3f}x" if here else "n/a", f"{table:.2f}x" if table else "n/a",
            f"{100 * ratio / ceiling:.0f}%" if ratio and ceiling != math.inf else "n/a",
            _top_other(s)]


def summary(rows, ratios):
    done = [r for r in rows if "ceiling" in r and r["ceiling"] != math.inf]
    if not done:
        return ["- no model profiled."]
    geo = geometric_mean(r["ceiling"] for r in done)
    lines = [f"- fusion ceiling: geometric mean {geo:.3f}x over {len(done)} models "
             f"(min {min(r['ceiling'] for r in done):.3f}x, max "
             f"{max(r['ceiling'] for r in done):.3f}x)."]
    below = [r["model"] for r in done if r["ceiling"] < 1.15]
    lines.append(f"- ceiling below 1.15x: {len(below)} of {len(done)} models "
                 f"({', '.join(below) or 'none'}).")
    for what, ratio_of in (("this run's", lambda r: r.get("ratio")),
                           ("the zoo table's", lambda r: ratios.get(r["model"]))):
        paired = [(r, ratio_of(r)) for r in done if ratio_of(r)]
        if not paired:
            continue
        fs_geo = geometric_mean(ratio for _, ratio in paired)
        ceil_geo = geometric_mean(r["ceiling"] for r, _ in paired)
        over = [f"{r['model']} ({ratio:.2f}x > {r['ceiling']:.3f}x)"
                for r, ratio in paired if ratio > r["ceiling"]]
        lines.append(f"- {what} fs vs TF over the same {len(paired)} models: geometric mean "
                     f"{fs_geo:.3f}x against their ceilings' {ceil_geo:.3f}x; fs vs TF above "
                     f"the ceiling: {', '.join(over) or 'none'}.")
    return lines


def markdown(rows, ratios, load, seconds, source, during):
    lines = [BEGIN, "## Fusion ceiling of the zoo's inference (`benchmarks/zoo_ceiling.py`)",
             "",
             f"{datetime.date.today().isoformat()}; {run_context.machine_line(load)}; the run "
             f"took {seconds / 60:.1f} min; {during}; {source} at the start.",
             f"`{' '.join(['python benchmarks/zoo_ceiling.py'] + sys.argv[1:])}`. Sizes: "
             f"{FLAGS.size}; per model {FLAGS.calls} profiled calls of TF's inference"
             + (" and of fs's" if FLAGS.fs else "") + f" after {1 + FLAGS.warmup} untimed "
             f"ones, then {FLAGS.rounds} timed rounds without the profiler. Columns as the "
             "script's docstring defines them: TF ms without the profiler; call and matmul "
             "(the union of matmul-class op intervals) of the profiled call of the median "
             "ceiling; idle: share of the call with no op running; ceiling = call / "
             "matmul, TF's time over fs's if everything but the matmul-class kernels cost "
             "nothing (an upper bound for fusion alone); fs matmul and fs vs TF (median over "
             "rounds) of this run, where --fs; fs vs TF (zoo table) from the zoo section; "
             "largest other op types as shares of the call.", "", "Summary:", ""]
    lines += summary(rows, ratios) + [""]
    notes = [f"{r['model']}: {n}" for r in rows for n in r["notes"]]
    lines += results_md.table_and_notes(HEADER, [_cells(r, ratios) for r in rows], notes) + [END]
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    if zoo.unknown_names(FLAGS.models):
        raise app.UsageError(zoo.unknown_names(FLAGS.models))
    if FLAGS.calls < 1:
        raise app.UsageError("--calls must be at least 1")
    load, source = os.getloadavg()[0], run_context.source_state()
    ratios = zoo_ratios(FLAGS.zoo_results)
    print(f"{run_context.machine_line(load)}; {source}", flush=True)
    if FLAGS.fs:
        from tf_fusionstitch.custom_ops import loader
        loader.load()   # the op library is part of the installation, not of a rewrite
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fs-zoo-ceiling-") as cache_root, \
            run_context.LoadSampler() as sampler:
        os.chmod(cache_root, 0o700)
        for name in FLAGS.models:
            print(f"... {name}", flush=True)
            rows.append(run_row(name, cache_root))
    seconds = time.perf_counter() - start
    print("\n" + "\n".join("  ".join(_cells(r, ratios)) for r in rows))
    print("\n".join([""] + summary(rows, ratios)))
    print(f"\nzoo_ceiling: {len(rows)} models in {seconds:.1f} s; {sampler.text()}")
    if FLAGS.out:
        results_md.write_section(FLAGS.out, BEGIN, END,
                                 markdown(rows, ratios, load, seconds, source, sampler.text()))
        print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
    app.run(main)
