"""The TF-free core on its own: fusion IR -> schedule -> C++ -> run with NumPy.

No TensorFlow here: these are the checks that run where only numpy and a C++
compiler exist, against NumPy references on fresh random inputs.
"""

import json

import numpy as np
import pytest

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.codegen import printer
from tf_fusionstitch.kernels import build_cpu_kernel
from tf_fusionstitch.runtime.cpu_kernel import KernelShapeError, as_dtype
from tf_fusionstitch.schedule import UnsupportedCluster, build_schedule
from test_column_reductions import column_softmax

T, op = ir.TensorType, ir.make_op
N = None
RNG = np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def streaming_at_any_static_size(monkeypatch):
    """Kernels of small static outputs get their streaming loops too, so
    that run() covers them (printer.STREAM_MIN_BYTES)."""
    monkeypatch.setattr(printer, "STREAM_MIN_BYTES", 0)


def run(cluster, inputs, threads=2):
    """Runs with outputs forwarded into input buffers where the kernel allows,
    as the FusionStitch op does, and with streaming stores whatever the
    output's size, so every test covers the in-place and streamed cases."""
    kernel = build_cpu_kernel(cluster)
    types = cluster.types()
    runner = kernel.runner([as_dtype(types[o].dtype) for o in cluster.outputs])
    runner.set_stream_min_bytes(0)  # small outputs take the streaming path too
    return runner.run(inputs, threads=threads, forward=True), kernel


def layernorm_cluster(width):
    row = T("float32", (N, 1))
    full = T("float32", (N, width))
    return ir.Cluster(
        (("x", full), ("g", T("float32", (width,))), ("b", T("float32", (width,)))),
        (op("mean", "reduce_mean", ["x"], row, axes=[1], keep_dims=True),
         op("d", "sub", ["x", "mean"], full),
         op("sq", "square", ["d"], full),
         op("var", "reduce_mean", ["sq"], row, axes=[1], keep_dims=True),
         op("eps", "const", [], T("float32", ()), value=1e-5),
         op("ve", "add", ["var", "eps"], row),
         op("rs", "rsqrt", ["ve"], row),
         op("n", "mul", ["d", "rs"], full),
         op("s", "mul", ["n", "g"], full),
         op("y", "add", ["s", "b"], full)),
        ("y", "mean"))


def test_layernorm_is_one_kernel_with_three_loops_and_matches_numpy():
    c = layernorm_cluster(96)
    x = RNG.standard_normal((37, 96), dtype=np.float32)
    g = RNG.standard_normal(96, dtype=np.float32)
    b = RNG.standard_normal(96, dtype=np.float32)
    (y, mean), kernel = run(c, [x, g, b])
    mu = x.mean(1, keepdims=True)
    ref = (x - mu) / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, mu, rtol=1e-5, atol=1e-6)
    assert kernel.num_loops == 3
    # Batch size is a run-time extent: a new size runs the same shared object.
    (y2, _), kernel2 = run(c, [x[:5], g, b])
    assert kernel2.path == kernel.path and y2.shape == (5, 96)


def test_softmax_buffers_the_exponentials_and_propagates_nan():
    s = (N, 5, 33)
    kept = T("float32", (N, 5, 1))
    c = ir.Cluster((("x", T("float32", s)),), (
        op("m", "reduce_max", ["x"], kept, axes=[-1], keep_dims=True),
        op("d", "sub", ["x", "m"], T("float32", s)),
        op("e", "exp", ["d"], T("float32", s)),
        op("z", "reduce_sum", ["e"], kept, axes=[2], keep_dims=True),
        op("y", "div", ["e", "z"], T("float32", s))), ("y",))
    x = RNG.standard_normal((7, 5, 33), dtype=np.float32) * 4
    x[0, 0, 3] = np.nan
    (y,), kernel = run(c, [x])
    e = np.exp(x - x.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True)
    assert np.isnan(y[0, 0]).all()
    mask = ~np.isnan(ref)
    np.testing.assert_allclose(y[mask], ref[mask], rtol=2e-6, atol=1e-7)
    assert kernel.buffered == ("e",)


def test_forwarded_output_is_stored_after_every_load_of_its_input():
    """Found by the fuzzer: `y` may take `m`'s buffer, and `z` reads `m` after
    `y` is computed; storing `y` at once clobbered `m` before that read."""
    f, b = T("float32", (2, 3)), T("bool", (2, 3))
    c = ir.Cluster((("m", f), ("a", f), ("k", b)), (
        op("y", "neg", ["a"], f),
        op("z", "select", ["k", "y", "m"], f)), ("y", "z"))
    assert (0, 1) in build_schedule(c).forward
    a, m = (RNG.standard_normal((2, 3), dtype=np.float32) for _ in range(2))
    k = RNG.random((2, 3)) < 0.5
    (y, z), _ = run(c, [m, a, k])
    np.testing.assert_array_equal(y, -a)
    np.testing.assert_array_equal(z, np.where(k, -a, m))


@pytest.mark.parametrize("rows,streams", [(None, True), (4, False), (4096, True)])
def test_streaming_loops_only_where_outputs_can_reach_the_threshold(monkeypatch, rows,
                                                                     streams):
    """A kernel whose float32 outputs are statically below the default
    threshold (4 x 1024 x 4 bytes) has no streaming loop, which it would
    never run; one of unknown rows or of 4096 x 1024 x 4 bytes = 16 MiB has."""
    monkeypatch.setattr(printer, "STREAM_MIN_BYTES", 16 << 20)
    full = T("float32", (rows, 1024))
    c = ir.Cluster((("x", full),), (op("y", "tanh", ["x"], full),), ("y",))
    assert ("fs_stream_f32(&" in build_cpu_kernel(c).source) == streams


@pytest.mark.parametrize("width", [1000, 10000])
def test_streaming_stores_give_the_same_bits(width):
    """Large float32 outputs go out with streaming stores in whole vectors, the
    tail with ordinary ones; both paths must write the same values (width 1000:
    a row loop with a tail; 10000: tiled loops)."""
    c = layernorm_cluster(width) if width == 1000 else ir.Cluster(
        (("a", T("float32", (N, 1))), ("b", T("float32", (1, width)))),
        (op("p", "mul", ["a", "b"], T("float32", (N, width))),
         op("y", "tanh", ["p"], T("float32", (N, width)))), ("y", "p"))
    kernel = build_cpu_kernel(c)
    assert "fs_stream_f32(&" in kernel.source  # a streaming loop, not the prelude
    types = c.types()
    runner = kernel.runner([as_dtype(types[o].dtype) for o in c.outputs])
    inputs = [RNG.standard_normal((5, width if width == 1000 else 1), dtype=np.float32)]
    inputs += ([RNG.standard_normal(width, dtype=np.float32) for _ in range(2)]
               if width == 1000 else [RNG.standard_normal((1, width), dtype=np.float32)])
    runner.set_stream_min_bytes(1 << 62)
    plain = runner.run(inputs, threads=2)
    runner.set_stream_min_bytes(0)
    streamed = runner.run(inputs, threads=2)
    for p, q in zip(plain, streamed):
        np.testing.assert_array_equal(p.view(np.uint32), q.view(np.uint32))


def test_reduction_over_leading_and_interleaved_axes():
    c = ir.Cluster((("x", T("float64", (4, N, 6))),), (
        op("mx", "reduce_max", ["x"], T("float64", (N,)), axes=[0, 2], keep_dims=False),
        op("sq", "mul", ["x", "x"], T("float64", (4, N, 6))),
        op("ss", "reduce_sum", ["sq"], T("float64", (N,)), axes=[0, 2], keep_dims=False),
        op("w", "add", ["mx", "ss"], T("float64", (N,)))), ("w",))
    x = RNG.standard_normal((4, 9, 6))
    (w,), _ = run(c, [x])
    np.testing.assert_allclose(w, x.max((0, 2)) + (x * x).sum((0, 2)), rtol=1e-12)
    (w0,), _ = run(c, [x[:, :0]])   # empty run-time extent
    assert w0.shape == (0,)


def test_elementwise_broadcast_tiles_and_forwards():
    c = ir.Cluster((("a", T("float32", (N, 1))), ("b", T("float32", (1, 10000)))), (
        op("p", "mul", ["a", "b"], T("float32", (N, 10000))),
        op("z", "const", [], T("float32", ()), value=0.0),
        op("c", "greater", ["p", "z"], T("bool", (N, 10000))),
        op("y", "select", ["c", "p", "z"], T("float32", (N, 10000))),
        op("yi", "cast", ["y"], T("int32", (N, 10000)))), ("y", "c", "yi"))
    a = RNG.standard_normal((3, 1), dtype=np.float32) * 5
    b = RNG.standard_normal((1, 10000), dtype=np.float32)
    (y, cond, yi), kernel = run(c, [a, b], threads=3)
    np.testing.assert_array_equal(y, np.maximum(a * b, 0))
    np.testing.assert_array_equal(cond, a * b > 0)
    np.testing.assert_array_equal(yi, np.maximum(a * b, 0).astype(np.int32))
    assert build_schedule(c).tiled


def test_hoists_per_channel_values_out_of_the_row_loop():
    s, p = (N, 5, 6, 16), (16,)
    c = ir.Cluster((("x", T("float32", s)), ("scale", T("float32", p)), ("var", T("float32", p))), (
        op("eps", "const", [], T("float32", ()), value=1e-3),
        op("ve", "add", ["var", "eps"], T("float32", p)),
        op("rs", "rsqrt", ["ve"], T("float32", p)),
        op("f", "mul", ["scale", "rs"], T("float32", p)),
        op("y", "mul", ["x", "f"], T("float32", s))), ("y",))
    x = RNG.standard_normal((3, 5, 6, 16), dtype=np.float32)
    scale = RNG.standard_normal(16, dtype=np.float32)
    var = np.abs(RNG.standard_normal(16, dtype=np.float32))
    (y,), _ = run(c, [x, scale, var])
    np.testing.assert_allclose(y, x * (scale / np.sqrt(var + 1e-3)), rtol=2e-6)
    assert build_schedule(c).hoisted == frozenset({"f"})


@pytest.mark.parametrize("dtype,np_dtype", [("float16", np.float16), ("bfloat16", None)])
def test_half_types_load_and_store_in_their_type_and_compute_in_float32(dtype, np_dtype):
    np_dtype = np_dtype or as_dtype("bfloat16")
    c = ir.Cluster((("x", T(dtype, (N, 300))),), (
        op("m", "reduce_mean", ["x"], T(dtype, (N, 1)), axes=[1], keep_dims=True),
        op("y", "sub", ["x", "m"], T(dtype, (N, 300)))), ("y",))
    x = RNG.standard_normal((6, 300)).astype(np_dtype)
    (y,), _ = run(c, [x])
    xf = x.astype(np.float32)
    ref = (xf - xf.mean(1, keepdims=True)).astype(np_dtype).astype(np.float32)
    np.testing.assert_allclose(y.astype(np.float32), ref, rtol=1e-2, atol=1e-2)


def test_integer_and_boolean_reductions_are_exact():
    c = ir.Cluster((("x", T("int32", (N, 7))),), (
        op("mean", "reduce_mean", ["x"], T("int32", (N,)), axes=[1], keep_dims=False),
        op("z", "const", [], T("int32", ()), value=0),
        op("pos", "greater", ["x", "z"], T("bool", (N, 7))),
        op("all", "reduce_all", ["pos"], T("bool", (N,)), axes=[1], keep_dims=False),
        op("any", "reduce_any", ["pos"], T("bool", (N,)), axes=[1], keep_dims=False)),
        ("mean", "all", "any"))
    x = RNG.integers(-50, 100, (9, 7)).astype(np.int32)
    x[0] = np.abs(x[0]) + 1
    (mean, all_, any_), _ = run(c, [x])
    np.testing.assert_array_equal(mean, np.trunc(x.sum(1) / 7).astype(np.int32))
    np.testing.assert_array_equal(all_, (x > 0).all(1))
    np.testing.assert_array_equal(any_, (x > 0).any(1))


def test_shape_function_rejects_inputs_that_do_not_broadcast_as_traced():
    c = layernorm_cluster(8)
    x = RNG.standard_normal((3, 8), dtype=np.float32)
    with pytest.raises(KernelShapeError, match=r"input 1 \(g\) has shape \[9\]"):
        run(c, [x, np.ones(9, np.float32), np.ones(8, np.float32)])


def test_json_round_trip_is_canonical():
    c = layernorm_cluster(64)
    text = c.to_json()
    assert ir.Cluster.from_json(text) == c
    assert ir.Cluster.from_json(text).to_json() == text


def _edited(cluster, edit):
    obj = json.loads(cluster.to_json())
    edit(obj)
    return json.dumps(obj)


@pytest.mark.parametrize("edit,message", [
    (lambda o: o["ops"][0]["attrs"].update(axes=[7]), "out of range"),
    (lambda o: o["ops"][1].update(prim="system"), "unknown primitive"),
    (lambda o: o["ops"][1].update(name='x"); system("rm -rf /'), "not an identifier"),
    (lambda o: o["inputs"][0].update(name="in put"), "not an identifier"),
    (lambda o: o["ops"][2]["type"].update(shape=[None, 5]), "declared"),
    (lambda o: o["ops"][2]["type"].update(dtype="string"), "unsupported dtype"),
    (lambda o: o["ops"][1].update(inputs=["x", "later"]), "not defined before"),
    (lambda o: o["ops"][4]["attrs"].update(value="__import__('os')"), "constant value"),
    (lambda o: o.update(outputs=["x"]), "not a value computed"),
    (lambda o: o.update(extra=1), "unexpected keys"),
])
def test_edited_specs_are_rejected_before_any_code_is_generated(edit, message):
    with pytest.raises(ir.SpecError, match=message):
        ir.Cluster.from_json(_edited(layernorm_cluster(64), edit))


def test_schedule_refuses_reductions_over_different_axes():
    c = ir.Cluster((("x", T("float32", (N, 8))),), (
        op("a", "reduce_sum", ["x"], T("float32", (N,)), axes=[1], keep_dims=False),
        op("b", "reduce_sum", ["x"], T("float32", (8,)), axes=[0], keep_dims=False)),
        ("a", "b"))
    with pytest.raises(UnsupportedCluster, match="different axes"):
        build_schedule(c)


def _unary_chain(prims, dtype="float32"):
    s = (N, 256)
    ops, prev = [], "x"
    for i, p in enumerate(prims):
        if p in ("maximum", "minimum", "div_no_nan", "floor_mod"):
            ops.append(op(f"v{i}", p, [prev, "y"], T(dtype, s)))
        elif p == "select":
            ops.append(op(f"c{i}", "greater", [prev, "y"], T("bool", s)))
            ops.append(op(f"v{i}", "select", [f"c{i}", prev, "y"], T(dtype, s)))
        else:
            ops.append(op(f"v{i}", p, [prev], T(dtype, s)))
        prev = ops[-1].name
    used_y = any("y" in o.inputs for o in ops)
    inputs = (("x", T(dtype, s)),) + ((("y", T(dtype, s)),) if used_y else ())
    return ir.Cluster(inputs, tuple(ops), (prev,))


VECTORISED = {
    "layernorm": layernorm_cluster(1024),
    "column_softmax": column_softmax(768),
    "activations": _unary_chain(["relu", "relu6", "elu", "selu", "softplus", "sign", "abs"]),
    "transcendentals": _unary_chain(["exp", "log1p", "tanh", "sigmoid", "erf", "erfc", "expm1"]),
    # floor_mod, pow, sin and cos call libm (scalar) and are left out on purpose.
    "binary_selects": _unary_chain(["maximum", "minimum", "div_no_nan", "select"]),
    "float64": _unary_chain(["relu", "maximum", "select", "sqrt"], "float64"),
}


def test_work_estimate_keeps_small_kernels_on_one_thread():
    """TF's thread pool (Eigen's cost model) runs work below about 2e5 cost
    units on the calling thread, as it does its own small ops: a recurrent
    cell's backward kernel, 40 light ops over ten 128 x 36 inputs, stays
    there (handing it to another thread cost more than the kernel in
    DIEN's loops); the same kernel over 4096 times the rows is spread."""
    full = T("float32", (N, 36))
    inputs = tuple((f"x{i}", full) for i in range(10))
    ops, value = [], "x0"
    for k in range(40):
        ops.append(op(f"v{k}", "mul" if k % 2 else "add", [value, f"x{k % 10}"], full))
        value = f"v{k}"
    c = ir.Cluster(inputs, tuple(ops), tuple(f"v{k}" for k in range(30, 40)),
                   equal_dims=(tuple((f"x{i}", 0) for i in sorted(range(10), key=str)),))
    runner = build_cpu_kernel(c).runner()
    _, _, work = runner.shape_call([(128, 36)] * 10)
    assert work[0] * work[1] < 200_000
    _, _, work = runner.shape_call([(128 * 4096, 36)] * 10)
    assert work[0] * work[1] > 100_000_000


@pytest.mark.parametrize("name", sorted(VECTORISED))
def test_every_column_loop_is_vectorised(name, tmp_path):
    """A scalar column loop is a silent 4-16x loss: GCC refuses to vectorise
    loops with `c ? a : b` on computed floats unless -ffast-math, so selects go
    through masks. This checks every `#pragma omp simd` loop is vectorised."""
    import subprocess
    from tf_fusionstitch.codegen.generate import generate_cpp
    from tf_fusionstitch.runtime import cpu_compiler
    source = generate_cpp(VECTORISED[name]).source
    path = tmp_path / "k.cc"
    path.write_text(source)
    flags = [f for f in cpu_compiler.DEFAULT_FLAGS if f != "-shared"]
    res = subprocess.run([*cpu_compiler.compiler_command(), *flags,
                          *cpu_compiler.host_arch_flags(), "-c", str(path), "-o",
                          str(tmp_path / "k.o"), "-fopt-info-vec-optimized"],
                         capture_output=True, text=True, check=True)
    lines = source.splitlines()
    pragmas = [i + 1 for i, l in enumerate(lines) if l.strip().startswith("#pragma omp simd")]
    vectorised = {int(m.split(":")[1]) for m in res.stderr.splitlines()
                  if "loop vectorized" in m and m.startswith(str(path))}
    # GCC reports a loop at its `for` line or the first lines of its body.
    scalar = [p for p in pragmas if not vectorised & {p + 1, p + 2, p + 3}]
    assert pragmas and not scalar, (scalar, res.stderr[-2000:])


def test_dynamic_dimensions_may_broadcast_at_run_time():
    """TF broadcasts a dimension that turns out to be 1 at run time; so do we."""
    c = ir.Cluster((("x", T("float32", (N, 8))), ("y", T("float32", (N, 8))),
                    ("z", T("float32", (4, 8)))), (
        op("a", "add", ["x", "y"], T("float32", (N, 8))),
        op("b", "mul", ["a", "z"], T("float32", (4, 8)))), ("b",))
    assert build_schedule(c).maybe_broadcast == [(0, 0), (1, 0)]
    z = RNG.standard_normal((4, 8), dtype=np.float32)
    for nx, ny in ((4, 4), (1, 4), (4, 1), (1, 1)):
        x = RNG.standard_normal((nx, 8), dtype=np.float32)
        y = RNG.standard_normal((ny, 8), dtype=np.float32)
        (b,), _ = run(c, [x, y, z])
        np.testing.assert_allclose(b, (x + y) * z, rtol=1e-6)
    with pytest.raises(KernelShapeError, match="Incompatible shapes"):
        run(c, [np.ones((3, 8), np.float32), np.ones((4, 8), np.float32), z])


def _proven_equal_batches():
    """x * sigmoid(y) beside y: both batches dynamic, proven equal by the rewriter."""
    full = T("float32", (N, 8))
    return ir.Cluster((("x", full), ("y", full)), (
        op("s", "sigmoid", ["y"], full),
        op("a", "mul", ["x", "s"], full)), ("a", "s"),
        equal_dims=((("x", 0), ("y", 0)),))


def test_extents_proven_equal_do_not_broadcast_and_are_checked():
    """Without the proof, output s could be smaller than the iteration space
    (x's batch 1 against y's 4), so the cluster would not fuse; with it there
    is no run-time broadcast, and a call that breaks the proof is refused."""
    c = _proven_equal_batches()
    with pytest.raises(UnsupportedCluster, match="smaller than the iteration space"):
        build_schedule(ir.Cluster(c.inputs, c.ops, c.outputs))
    assert build_schedule(c).maybe_broadcast == []
    assert ir.Cluster.from_json(c.to_json()) == c
    x = RNG.standard_normal((5, 8), dtype=np.float32)
    y = RNG.standard_normal((5, 8), dtype=np.float32)
    (a, s), _ = run(c, [x, y])
    np.testing.assert_allclose(s, 1 / (1 + np.exp(-y)), rtol=1e-6)
    np.testing.assert_allclose(a, x * s, rtol=1e-6)
    with pytest.raises(KernelShapeError, match="Incompatible shapes"):
        run(c, [np.ones((1, 8), np.float32), y])


@pytest.mark.parametrize("classes,message", [
    ([[["x", 0]]], "two or more"),
    ([[["y", 0], ["x", 0]]], "sorted list"),
    ([[["x", 1], ["y", 0]]], "not a dynamic extent"),
    ([[["x", 0], ["z", 0]]], "not a dynamic extent"),
    ([[["x", 0], ["y", 0]], [["x", 0], ["y", 0]]], "twice"),
    ("x", "list of lists"),
])
def test_edited_equal_dims_are_rejected(classes, message):
    def edit(o):
        o["equal_dims"] = classes
    with pytest.raises(ir.SpecError, match=message):
        ir.Cluster.from_json(_edited(_proven_equal_batches(), edit))


def test_a_part_keeps_what_is_proven_of_its_own_inputs():
    full = T("float32", (N, 8))
    c = ir.Cluster((("x", full), ("y", full), ("z", full)), (
        op("a", "mul", ["x", "y"], full),
        op("b", "neg", ["z"], full)), ("a", "b"),
        equal_dims=((("x", 0), ("y", 0), ("z", 0)),))
    first, second = ir.connected_parts(c)
    assert first.cluster.equal_dims == ((("x", 0), ("y", 0)),)
    assert second.cluster.equal_dims == ()


def test_no_run_time_broadcast_along_a_reduced_axis():
    """x[?] may be 1 at run time and broadcast against y[2] only after the
    reduction: fusing would reduce over 2 copies, so the schedule refuses."""
    c = ir.Cluster((("x", T("float32", (N,))), ("y", T("float32", (2,)))), (
        op("s", "reduce_sum", ["x"], T("float32", (1,)), axes=[0], keep_dims=True),
        op("d", "sub", ["x", "s"], T("float32", (N,))),
        op("o", "mul", ["d", "y"], T("float32", (2,)))), ("o",))
    with pytest.raises(UnsupportedCluster, match="reduces"):
        build_schedule(c)


def test_output_that_does_not_see_every_source_of_a_broadcast_axis_is_refused():
    """x[?]*2 is an output beside x*2 + y[3]: with x of size 1 at run time the
    first output has 1 element, not 3, so the cluster is not fused."""
    c = ir.Cluster((("x", T("float32", (N,))), ("y", T("float32", (3,)))), (
        op("two", "const", [], T("float32", ()), value=2.0),
        op("a", "mul", ["x", "two"], T("float32", (N,))),
        op("b", "add", ["a", "y"], T("float32", (3,)))), ("b", "a"))
    with pytest.raises(UnsupportedCluster, match="smaller than the iteration space"):
        build_schedule(c)


def test_int32_mean_does_not_wrap_like_tf():
    c = ir.Cluster((("x", T("int32", (N, 2))),), (
        op("m", "reduce_mean", ["x"], T("int32", (N,)), axes=[1], keep_dims=False),), ("m",))
    (m,), _ = run(c, [np.full((3, 2), 2**31 - 1, np.int32)])
    np.testing.assert_array_equal(m, np.full(3, 2**31 - 1, np.int32))


def test_shape_functions_compile_at_o1_and_block_functions_at_the_flags_o3():
    # Shape functions run once per call (shape_fn.SHAPE_FN_ATTRIBUTES); the
    # block functions are what must stay fast.
    from tf_fusionstitch.codegen import shape_fn
    from test_packed_kernels import three_parts
    for c in (layernorm_cluster(96), three_parts()):
        source = build_cpu_kernel(c).source
        definitions = [line for line in source.splitlines()
                       if line.rstrip().endswith("{") and "(" in line and
                       ("fs_shape" in line or "fs_run" in line) and "=" not in line]
        shapes = [d for d in definitions if " fs_shape" in d]
        runs = [d for d in definitions if " fs_run" in d]
        assert shapes and runs, definitions
        assert all(shape_fn.SHAPE_FN_ATTRIBUTES in d for d in shapes), shapes
        assert not any("optimize" in d for d in runs), runs
