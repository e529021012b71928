"""benchmarks/op_profile.py's per-class unions and the fusion ceiling that
benchmarks/zoo_ceiling.py reports: call time over the wall time during which
some matmul-class op runs.

A hand-built profile checks the arithmetic (overlapping matmuls on two threads
count once, other ops and the runtime's own events not at all, per call); a
small function profiled for real checks that TF's oneDNN contractions land in
the matmul class under the names this TF build gives them. XLA executables of
nested jit_compile functions count as matmul-class only when asked.
"""

import math
import re
import sys

import numpy as np
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

import repo_paths

sys.path.insert(0, str(repo_paths.BENCHMARKS))
import op_profile  # noqa: E402

US = 1_000_000   # picoseconds per microsecond


def _space(lines):
    """An XSpace with one host plane; `lines` is [(timestamp_ns, [(name, start_us,
    end_us), ...])], each event's start relative to its line's timestamp."""
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    ids = {}
    for timestamp_ns, events in lines:
        line = plane.lines.add(timestamp_ns=timestamp_ns)
        for name, start, end in events:
            if name not in ids:
                ids[name] = len(ids) + 1
                plane.event_metadata[ids[name]].id = ids[name]
                plane.event_metadata[ids[name]].name = name
            line.events.add(metadata_id=ids[name], offset_ps=start * US,
                            duration_ps=(end - start) * US)
    device = space.planes.add(name="/device:GPU:0")   # not a host plane: ignored
    device.event_metadata[1].name = "gpu:_MklMatMul"
    device.lines.add().events.add(metadata_id=1, offset_ps=0, duration_ps=10_000 * US)
    return space


def _split(space, calls):
    return op_profile.breakdown(space, calls, classify=op_profile.contraction_class,
                                classes=op_profile.CONTRACTION_CLASSES)


def test_ceiling_of_a_synthetic_profile():
    call = op_profile.CALL_EVENT
    space = _space([
        (0, [(call, 0, 100), ("dense:_MklNativeFusedMatMul", 10, 40), ("relu:Relu", 40, 50),
             ("ExecutorState::Process", 0, 100),            # the runtime's: not an op
             (call, 200, 300), ("conv:_MklConv2D", 210, 260)]),
        # another thread, 5 us later: overlaps the first matmul by 10 us (it runs
        # 30-60 us), and a Mul that overlaps no matmul
        (5_000, [("qk:_MklBatchMatMulV2", 25, 55), ("mul:Mul", 55, 85)]),
    ])
    split = _split(space, calls=2)
    assert split["call"] == 100                         # (100 + 100) / 2 calls
    assert split["unions"]["matmul"] == 50              # (10..60 and 210..260) / 2
    assert split["classes"]["matmul"] == 55             # (30 + 30 + 50) / 2: sums overlap
    assert split["unions"]["other"] == 20               # (Relu 40..50 + Mul 60..90) / 2
    assert split["busy"] == 65                          # 10..90 and 210..260, over 2
    assert split["ops"] == 2.5
    assert split["types"] == {"_MklNativeFusedMatMul": 15, "_MklConv2D": 25,
                              "_MklBatchMatMulV2": 15, "Relu": 5, "Mul": 15}
    assert op_profile.fusion_ceiling(split) == 2.0
    # small_shapes.py's own classing is unchanged: _MklNativeFusedMatMul is "other" there
    legacy = op_profile.breakdown(space, 2)
    assert legacy["classes"]["matmul"] == 40 and legacy["classes"]["other"] == 35
    assert legacy["call"] == split["call"] and legacy["busy"] == split["busy"]


def test_xla_executables_of_nested_functions_count_as_matmul_class_when_asked():
    # ConvNeXt's grouped convolutions: an async call op (no "node:Type" event) whose
    # XLA executable runs the convolution; by default only an op event counts
    space = _space([(0, [(op_profile.CALL_EVENT, 0, 100), ("a:_MklMatMul", 0, 10),
                         ("ExecutorState::ProcessAsync::Start", 20, 70),
                         (op_profile.XLA_RUN_EVENT, 22, 68), ("convolution.1", 23, 60),
                         ("b:Mul", 70, 80)])])
    plain = _split(space, calls=1)
    assert plain["unions"]["matmul"] == 10 and plain["busy"] == 20
    assert op_profile.fusion_ceiling(plain) == 10.0
    runs = op_profile.breakdown(space, 1, classify=op_profile.contraction_class,
                                classes=op_profile.CONTRACTION_CLASSES, xla_runs=True)
    assert runs["unions"]["matmul"] == 56 and runs["busy"] == 66   # 10 + 46 (22..68)
    assert runs["types"][op_profile.XLA_RUN] == 46 and runs["ops"] == 3
    assert op_profile.fusion_ceiling(runs) == 100 / 56
    assert op_profile.breakdown(space, 1)["busy"] == 20   # small_shapes.py's default


def test_no_matmul_gives_an_infinite_ceiling():
    space = _space([(0, [(op_profile.CALL_EVENT, 0, 10), ("a:Relu", 1, 3)])])
    assert op_profile.fusion_ceiling(_split(space, calls=1)) == math.inf


def test_a_real_profile_puts_the_contractions_in_the_matmul_class():
    rng = np.random.default_rng(0)
    w = tf.constant(rng.standard_normal((256, 256)), tf.float32)
    kernel = tf.constant(rng.standard_normal((3, 3, 8, 8)), tf.float32)

    @tf.function
    def fn(x, image):
        y = tf.nn.relu(tf.matmul(x, w) + 1.0)
        y = tf.tanh(y * 0.5) + tf.exp(-y)
        z = tf.nn.conv2d(image, kernel, 1, "SAME")
        return tf.reduce_sum(y, axis=1), tf.reduce_mean(tf.sigmoid(z) * z)

    args = [tf.constant(rng.standard_normal((64, 256)), tf.float32),
            tf.constant(rng.standard_normal((2, 16, 16, 8)), tf.float32)]
    fn(*args)
    split = op_profile.profile(fn, args, 3, classify=op_profile.contraction_class,
                               classes=op_profile.CONTRACTION_CLASSES)
    contractions = [t for t in split["types"] if t in op_profile.CONTRACTIONS]
    missed = [t for t in split["types"] if re.search("MatMul|Conv", t)
              and t not in op_profile.CONTRACTIONS]
    assert len(contractions) >= 2 and not missed, split["types"]
    assert split["unions"]["matmul"] >= max(split["types"][t] for t in contractions), split
    assert 0 < split["unions"]["matmul"] < split["call"], split
    assert split["unions"]["other"] > 0, split          # relu, tanh, exp, reductions
    assert op_profile.fusion_ceiling(split) == split["call"] / split["unions"]["matmul"] > 1


def test_a_nested_jit_compile_function_shows_as_an_xla_run():
    rng = np.random.default_rng(0)
    kernel = tf.constant(rng.standard_normal((3, 3, 1, 16)), tf.float32)

    @tf.function(jit_compile=True)
    def grouped(image):   # as Keras runs a grouped convolution: 16 groups of 1 channel
        return tf.nn.conv2d(image, kernel, 1, "SAME")

    @tf.function
    def fn(image):
        return tf.nn.relu(grouped(image * 2.0))

    args = [tf.constant(rng.standard_normal((2, 32, 32, 16)), tf.float32)]
    fn(*args)
    split = op_profile.profile(fn, args, 3, classify=op_profile.contraction_class,
                               classes=op_profile.CONTRACTION_CLASSES, xla_runs=True)
    assert split["types"].get(op_profile.XLA_RUN, 0) > 0, split["types"]
    assert split["unions"]["matmul"] >= split["types"][op_profile.XLA_RUN], split
