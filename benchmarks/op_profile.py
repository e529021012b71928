"""A call's time split by TF's profiler (tf.profiler.experimental): op events by class.

Shared by the benchmark scripts that read profiles (small_shapes.py, zoo_ceiling.py);
it defines no flags, so both can import it. `profile` runs a function's call
`calls` times under the profiler, each call and the copy of its results inside our
own CALL_EVENT, and `breakdown` reads the host planes' events:

  call        the CALL_EVENT events' time, per call;
  busy        the union of op events (some op runs on some thread), per call;
  overhead    call - busy;
  ops         op events per call;
  classes     the sum of op times per class (op_class), per call;
  unions      the union of op intervals per class, per call: the wall time during
              which some op of the class runs on some thread.

Times are microseconds. Op events are the executor's "node:Type" events; op times
overlap when two threads run ops at once, so classes may add up to more than busy,
a class's union never does.

With xla_runs=True an XLA executable that a graph op runs (CpuExecutable's
ExecuteAsyncOnStream event: a nested tf.function(jit_compile=True), such as Keras's
grouped convolution, run by an asynchronous call op that has no "node:Type" event of
its own) counts as an op of type XLA_RUN; by default such time is overhead.

op_class is small_shapes.py's classing (its matmul class is MATMUL_OPS);
contraction_class classes every contraction TF's oneDNN build runs (CONTRACTIONS:
MATMUL_OPS and the _MklNative* and other fused forms that MATMUL_OPS lacks) and XLA_RUN
as "matmul", against everything else, and fusion_ceiling is call over that class's
union (zoo_ceiling.py).
"""

import collections
import glob
import math
import os
import pathlib
import shutil
import tempfile

import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

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
# MATMUL_OPS, and the forms TF's oneDNN build gives the same contractions:
# its native-format ops (_MklNative*: every convolution of a keras.applications CNN,
# the dense layers' _MklNativeFusedMatMul), the remapper's fused depthwise convolution
# and batch matmul, and the layout pass's Pad folded into a convolution.
CONTRACTIONS = frozenset(MATMUL_OPS | {
    "_MklNativeConv2D", "_MklNativeFusedConv2D", "_MklNativeDepthwiseConv2dNative",
    "_MklNativeFusedDepthwiseConv2dNative", "_MklNativeFusedMatMul",
    "_MklNativeFusedBatchMatMulV2", "_MklNativeConv2DWithBias", "_MklNativePadWithConv2D",
    "_MklNativePadWithFusedConv2D", "_MklNativeConv3D", "_MklNativeFusedConv3D",
    "_FusedDepthwiseConv2dNative", "_MklFusedDepthwiseConv2dNative", "_FusedBatchMatMulV2",
    "_MklFusedBatchMatMulV2", "_MklBatchMatMul", "_MklConv2DWithBias", "_MklPadWithConv2D",
    "_MklPadWithFusedConv2D", "FusedPadConv2D", "FusedResizeAndPadConv2D", "Conv3D",
    "_FusedConv3D", "_MklConv3D"})
CONTRACTION_CLASSES = ("matmul", "other")
XLA_RUN_EVENT = "CpuExecutable::ExecuteAsyncOnStream"
XLA_RUN = "XlaExecutable"   # the op type breakdown(xla_runs=True) gives XLA_RUN_EVENT


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


def contraction_class(op_type: str) -> str:
    """"matmul" for a contraction or an XLA executable (XLA_RUN: code that a
    rewrite of the graph's ops leaves alone), else "other"."""
    return "matmul" if op_type in CONTRACTIONS or op_type == XLA_RUN else "other"


def fusion_ceiling(split: dict) -> float:
    """call / matmul union of a breakdown (classed by contraction_class);
    inf where no matmul-class op ran."""
    matmul = split["unions"]["matmul"]
    return split["call"] / matmul if matmul > 0 else math.inf


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


def breakdown(space: xplane_pb2.XSpace, calls: int, classify=op_class,
              classes=CLASSES, xla_runs: bool = False) -> dict:
    """Per-call microseconds of a profile of `calls` calls (see the module docstring),
    with op types classed by `classify` into `classes`; also "types": the sum of
    op times per op type, per call. xla_runs: XLA_RUN_EVENT events are ops of type
    XLA_RUN."""
    run_ps, ops, by_class = 0, [], collections.Counter()
    by_type, spans = collections.Counter(), collections.defaultdict(list)
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
                op_type = XLA_RUN if xla_runs and name == XLA_RUN_EVENT else _op_type(name)
                if op_type is None:
                    continue
                start = base + event.offset_ps
                ops.append((start, start + event.duration_ps))
                op_cls = classify(op_type)
                by_class[op_cls] += event.duration_ps
                by_type[op_type] += event.duration_ps
                spans[op_cls].append(ops[-1])
    busy = _union_length(ops)
    per_call = lambda ps: ps / 1e6 / calls   # noqa: E731  (ps -> us per call)
    return {"call": per_call(run_ps), "busy": per_call(busy),
            "overhead": per_call(max(run_ps - busy, 0)), "ops": len(ops) / calls,
            "classes": {c: per_call(by_class[c]) for c in classes},
            "unions": {c: per_call(_union_length(spans[c])) for c in classes},
            "types": {t: per_call(ps) for t, ps in by_type.items()}}


def read_space(directory: str) -> xplane_pb2.XSpace:
    """The XSpace the profiler wrote under `directory`."""
    space = xplane_pb2.XSpace()
    path = glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True)[0]
    space.ParseFromString(pathlib.Path(path).read_bytes())
    return space


def profile(fn, args, calls: int, **breakdown_args) -> dict:
    """breakdown() of `calls` calls of fn(*args) under the profiler, each call and the
    copy of its results to numpy inside one CALL_EVENT. The profile's files are
    removed once read."""
    directory = tempfile.mkdtemp(prefix="small_shapes-")
    tf.profiler.experimental.start(directory)
    try:
        for _ in range(calls):
            with tf.profiler.experimental.Trace(CALL_EVENT):
                tf.nest.map_structure(lambda t: t.numpy(), fn(*args))
    finally:
        tf.profiler.experimental.stop()
    try:
        return breakdown(read_space(directory), calls, **breakdown_args)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
