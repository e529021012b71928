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

import collections
import glob
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
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

import results_md  # noqa: E402  (benchmarks/ is first on sys.path)
import rounds  # noqa: E402
import run_context  # noqa: E402

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(1, str(_HERE.parent))
from benchmarks import zoo  # noqa: E402

import tf_fusionstitch as fs  # noqa: E402

BEGIN, END = "<!-- small_shapes:begin -->", "<!-- small_shapes:end -->"
MATMUL_OPS = {"MatMul", "_MklMatMul", "_FusedMatMul", "_MklFusedMatMul", "BatchMatMul",
              "BatchMatMulV2", "BatchMatMulV3", "_MklBatchMatMulV2", "Einsum", "_MklEinsum",
              "Conv2D", "_MklConv2D", "_FusedConv2D", "_MklFusedConv2D",
              "DepthwiseConv2dNative", "_MklDepthwiseConv2dNative"}
SHAPE_OPS = {"Shape", "ShapeN", "Reshape", "_MklReshape", "StridedSlice", "Pack", "Unpack",
             "ConcatV2", "Const", "Identity", "IdentityN", "ExpandDims", "Squeeze", "Fill",
             "Range", "Size", "Rank", "ZerosLike", "OnesLike", "Placeholder", "NoOp",
             "ReadVariableOp", "_Arg", "_Retval"}
XLA_OPS = {"_XlaRun", "_XlaCompile", "XlaLaunch", "_XlaMerge"}
CALL_EVENT = "small_shapes.call"   # our own event around each call and its results
CLASSES = ("matmul", "FusionStitch", "XLA cluster", "shape", "other")

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["bert", "gpt2"], "Zoo text models (benchmarks/zoo/text.py).")
flags.DEFINE_list("sizes", ["real"], f"The zoo's size sets ({', '.join(zoo.SIZES)}).")
flags.DEFINE_list("shapes", ["1x32", "4x128"], "batch x sequence length per row.")
flags.DEFINE_integer("calls", 20, "Profiled calls per contender.")
flags.DEFINE_integer("rounds", 20, "Interleaved timed rounds per row (no profiler).")
flags.DEFINE_string("out", str(_HERE / "RESULTS.md"),
                    "Markdown file whose small-shapes section is (re)written; empty: none.")


def op_class(op_type: str) -> str:
    if op_type == "FusionStitch":
        return "FusionStitch"
    if op_type in MATMUL_OPS:
        return "matmul"
    if op_type in XLA_OPS or op_type.startswith("__inference_"):   # jit_compile's executable
        return "XLA cluster"
    if op_type in SHAPE_OPS:
        return "shape"
    return "other"


def _op_type(event_name: str):
    """The op type of a profiler event named "node:Type", else None (the
    executor's and the runtime's own events are named otherwise)."""
    if " " in event_name or "::" in event_name or event_name.count(":") != 1:
        return None
    return event_name.split(":")[1] or None


def _union_length(intervals) -> int:
    total, end = 0, None
    for lo, hi in sorted(intervals):
        if end is None or lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def breakdown(space: xplane_pb2.XSpace, calls: int) -> dict:
    """Per-call microseconds of a profile of `calls` calls (see the module docstring)."""
    run_ps, ops, by_class = 0, [], collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if name == CALL_EVENT:
                    run_ps += event.duration_ps
                    continue
                op_type = _op_type(name)
                if op_type is None:
                    continue
                start = base + event.offset_ps
                ops.append((start, start + event.duration_ps))
                by_class[op_class(op_type)] += event.duration_ps
    busy = _union_length(ops)
    per_call = lambda ps: ps / 1e6 / calls   # noqa: E731  (ps -> us per call)
    return {"call": per_call(run_ps), "busy": per_call(busy),
            "overhead": per_call(max(run_ps - busy, 0)), "ops": len(ops) / calls,
            "classes": {c: per_call(by_class[c]) for c in CLASSES}}


def profile(fn, args, calls: int) -> dict:
    directory = tempfile.mkdtemp(prefix="small_shapes-")
    tf.profiler.experimental.start(directory)
    try:
        for _ in range(calls):
            with tf.profiler.experimental.Trace(CALL_EVENT):
                tf.nest.map_structure(lambda t: t.numpy(), fn(*args))
    finally:
        tf.profiler.experimental.stop()
    space = xplane_pb2.XSpace()
    path = glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True)[0]
    space.ParseFromString(pathlib.Path(path).read_bytes())
    return breakdown(space, calls)


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
