"""Where the time of a small model's call goes, under TF, XLA and tf_fusionstitch.

  python benchmarks/small_shapes.py                        # BERT and GPT-2, two shapes
  python benchmarks/small_shapes.py --models=llama --sizes=tiny --shapes=4x128
  python benchmarks/small_shapes.py --sizes=tiny,real --shapes=4x64,1x32

At small shapes a call is short enough that what surrounds the arithmetic counts:
the executor's dispatch of each op, ops left between kernels, and kernels too small
to spread over the thread pool. This script runs each contender's call --calls times
under TF's profiler (tf.profiler.experimental) and splits the median call by the
profile's events:

  call        a call and the copy of its results to numpy, as the caller sees it;
  busy        time some op runs on some thread (the union of op events), per call;
  overhead    call - busy: the executor's dispatch, scheduling and hand-offs between
              threads while no op runs;
  by class    the sum of op times per class (matmul-like ops, FusionStitch kernels,
              XLA's cluster, shape ops, every other TF op), and the op count per call.

Op times overlap when two threads run ops at once, so classes may add up to more
than busy. Profiling costs a few microseconds per event; step times come from
interleaved rounds without the profiler, as in benchmarks/zoo.py.
"""

import os
import pathlib
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from op_profile import CLASSES, profile  # noqa: E402  (benchmarks/ is first on sys.path)
import results_md  # noqa: E402
import rounds  # noqa: E402
import run_context  # noqa: E402

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(1, str(_HERE.parent))
from benchmarks import zoo  # noqa: E402

import tf_fusionstitch as fs  # noqa: E402

BEGIN, END = "<!-- small_shapes:begin -->", "<!-- small_shapes:end -->"

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["bert", "gpt2"], "Zoo text models (benchmarks/zoo/text.py).")
flags.DEFINE_list("sizes", ["real"], f"The zoo's size sets ({', '.join(zoo.SIZES)}).")
flags.DEFINE_list("shapes", ["1x32", "4x128"], "batch x sequence length per row.")
flags.DEFINE_integer("calls", 20, "Profiled calls per contender.")
flags.DEFINE_integer("rounds", 20, "Interleaved timed rounds per row (no profiler).")
flags.DEFINE_string("out", str(_HERE / "RESULTS.md"),
                    "Markdown file whose small-shapes section is (re)written; empty: none.")


def run_row(name: str, size: str, batch: int, seq: int, cache_root: str) -> dict:
    model = zoo.build(name, size, seed=0)
    args = list(model.make_batch(np.random.default_rng(1), batch, seq).inputs)
    run_context.fresh_cache_dir(cache_root, f"{name}-{size}-{batch}x{seq}")
    original = model.inference
    calls = {"TF": original,
             "XLA": tf.function(original.python_function,
                                input_signature=original.input_signature, jit_compile=True),
             "fs": fs.optimize(original)}
    for fn in calls.values():
        fn(*args)
    report = calls["fs"].report()
    row = {"model": name, "size": size, "shape": f"{batch}x{seq}", "kernels": (report.kernels_before,
                                                                report.kernels_after),
           "profiles": {k: profile(fn, args, FLAGS.calls) for k, fn in calls.items()}}
    times, _ = rounds.time_rounds(calls, args, FLAGS.rounds, 2)
    row["ms"] = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    return row


HEADER = ["model", "size", "batch x seq", "contender", "step ms", "call us", "busy us",
          "overhead us", "ops per call"] + [f"{c} us" for c in CLASSES]


def _cells(row):
    for contender, p in row["profiles"].items():
        yield [row["model"], row["size"], row["shape"], contender, f"{row['ms'][contender]:.3g}",
               f"{p['call']:.0f}", f"{p['busy']:.0f}", f"{p['overhead']:.0f}",
               f"{p['ops']:.0f}"] + [f"{p['classes'][c]:.0f}" for c in CLASSES]


def section(rows, load, source) -> str:
    lines = [BEGIN, "## Small shapes (`benchmarks/small_shapes.py`)", "",
             f"{run_context.machine_line(load)}; {source} at the start.", "",
             f"`{' '.join(['python benchmarks/small_shapes.py'] + sys.argv[1:])}`. Size sets "
             f"{', '.join(FLAGS.sizes)}; {FLAGS.calls} profiled calls and {FLAGS.rounds} interleaved "
             "rounds per row. Columns as the script's docstring defines them; fs kernels: "
             + ", ".join(f"{r['model']} {r['size']} {r['shape']} {r['kernels'][0]} -> "
                         f"{r['kernels'][1]}"
                         for r in rows) + ".", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for row in rows for cells in _cells(row)]
    return "\n".join(lines + ["", END]) + "\n"


def main(argv):
    del argv
    unknown = [s for s in FLAGS.sizes if s not in zoo.SIZES]
    if unknown:
        raise app.UsageError(f"--sizes: unknown size set(s) {unknown}; known: "
                             f"{', '.join(zoo.SIZES)}")
    load, source = os.getloadavg()[0], run_context.source_state()
    from tf_fusionstitch.custom_ops import loader
    loader.load()   # the op library is part of the installation, not of a rewrite
    rows = []
    with tempfile.TemporaryDirectory(prefix="small_shapes-cache-") as cache_root:
        for size in FLAGS.sizes:
            for name in FLAGS.models:
                for shape in FLAGS.shapes:
                    batch, seq = (int(v) for v in shape.split("x"))
                    row = run_row(name, size, batch, seq, cache_root)
                    rows.append(row)
                    for cells in _cells(row):
                        print("  ".join(cells), flush=True)
    text = section(rows, load, source)
    print(text)
    if FLAGS.out:
        results_md.write_section(FLAGS.out, BEGIN, END, text)


if __name__ == "__main__":
    app.run(main)
