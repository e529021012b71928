"""The CUDA schedule, run on the CPU: emulated blocks against NumPy.

generate_gpu_emulation prints the CUDA kernel's body as C++ where a block's
threads are loops per phase (codegen/gpu_printer.py). These tests run it over
odd row counts (0, 1, fewer rows than a block, not a multiple of the rows per
block), odd column counts (1, not a multiple of 32 or of the block) and both
mappings (warp per row, block per row), with work split unevenly over CPU
threads as the ABI allows. They also check that the emulation would notice
a missing barrier or shuffle step. TF-free; needs only g++.
"""

import gpu_edge_clusters as edge
import numpy as np
import pytest

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import patterns
from tf_fusionstitch.codegen import gpu_printer, kernel_ir, printer
from tf_fusionstitch.gpu import build as gpu_build
from tf_fusionstitch.gpu.choice import plan_gpu
from tf_fusionstitch.runtime.cpu_kernel import CpuKernel, as_dtype
from tf_fusionstitch.schedule import build_schedule

T, op = ir.TensorType, ir.make_op
N = None
PATTERNS = patterns.standard_patterns()
ROWS = (0, 1, 5, 13, 37)


def emulate(cluster, inputs, threads=3, reverse_threads=False):
    kernel = CpuKernel(gpu_build.build_emulation(cluster, reverse_threads))
    return kernel.run(inputs, threads=threads, forward=True)


def check_pattern(pattern, rows, seed, reverse_threads=False):
    rng = np.random.default_rng(seed)
    inputs = pattern.make_inputs(rng, rows)
    outputs = emulate(pattern.cluster, inputs, reverse_threads=reverse_threads)
    for got, want in zip(outputs, pattern.reference(inputs)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=pattern.rtol, atol=pattern.atol)


@pytest.mark.parametrize("reverse_threads", [False, True], ids=["ascending", "descending"])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_standard_pattern_matches_numpy_for_odd_row_counts(name, reverse_threads):
    for seed, rows in enumerate(ROWS):
        check_pattern(PATTERNS[name], rows, seed, reverse_threads)


def test_tiny_rows_take_a_thread_short_rows_a_warp_and_long_rows_a_block():
    tiny = plan_gpu(build_schedule(edge.softmax((N, 8)))).mapping
    assert (tiny.kind, tiny.row_threads, tiny.rows_per_block) == ("thread", 1, 256)
    short = plan_gpu(build_schedule(PATTERNS["layernorm_768"].cluster)).mapping
    assert (short.kind, short.row_threads, short.rows_per_block) == ("warp", 32, 8)
    long = plan_gpu(build_schedule(PATTERNS["layernorm_4096"].cluster)).mapping
    assert (long.kind, long.row_threads, long.rows_per_block) == ("block", 256, 1)


@pytest.mark.parametrize("width", [2, 8])
def test_thread_per_row_softmax_across_block_boundaries(width):
    """256 rows per block: 0, one partial block, exactly one, one and a bit."""
    c = edge.softmax((N, width))
    rng = np.random.default_rng(width)
    for rows in (0, 5, 256, 300):
        x = rng.standard_normal((rows, width)).astype(np.float32) * 4
        (y,) = emulate(c, [x], reverse_threads=rows == 300)
        np.testing.assert_allclose(y, _np_softmax(x), rtol=2e-6, atol=1e-7)


def test_layernorm_keeps_its_row_in_registers_and_reads_x_once():
    """24 columns per lane, loops unrolled: the mean's loop loads x, the
    variance and output loops read the lane's registers."""
    plan = plan_gpu(build_schedule(PATTERNS["layernorm_768"].cluster))
    assert (plan.cols_per_thread, plan.register_cached) == (24, ("v_x",))
    source = gpu_printer.print_cuda(plan, 2)
    assert source.count("t0[") == 1 and source.count("= rc_v_x[j];") == 2
    # An exp in the loops: unrolled, its temporaries would cost more registers.
    assert not plan_gpu(build_schedule(PATTERNS["softmax_3000"].cluster)).register_cached


def test_softmax_keeps_exponentials_in_shared_memory_when_they_fit():
    plan = plan_gpu(build_schedule(PATTERNS["softmax_3000"].cluster))
    assert plan.kernel.buffers == {"v_e": "float32"} and not plan.dropped
    source = gpu_printer.print_cuda(plan, 2)
    assert "__shared__ float b_v_e[3000];" in source


def _np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("rows,width", [(9, 2000), (3, 1), (17, 33), (2, 0)])
def test_dynamic_row_length_recomputes_instead_of_buffering(rows, width):
    c = edge.softmax((N, N))
    plan = plan_gpu(build_schedule(c))
    assert plan.mapping.kind == "block" and not plan.kernel.buffers
    assert any("recomputed" in why for why in plan.dropped)
    x = np.random.default_rng(rows).standard_normal((rows, width)).astype(np.float32) * 4
    (y,) = emulate(c, [x])
    if width:
        np.testing.assert_allclose(y, _np_softmax(x), rtol=2e-6, atol=1e-7)
    assert y.shape == (rows, width)


def test_one_column_rows_and_nan_rows():
    c = edge.softmax((N, 1))
    x = np.random.default_rng(0).standard_normal((11, 1)).astype(np.float32)
    (y,) = emulate(c, [x])
    np.testing.assert_array_equal(y, np.ones_like(x))
    c = edge.softmax((N, 70))
    x = np.random.default_rng(1).standard_normal((10, 70)).astype(np.float32)
    x[3, 69] = np.nan  # the NaN flag must cross lanes: it sits in lane 5 only
    (y,) = emulate(c, [x])
    assert np.isnan(y[3]).all() and not np.isnan(np.delete(y, 3, 0)).any()
    np.testing.assert_allclose(np.delete(y, 3, 0), _np_softmax(np.delete(x, 3, 0)), rtol=2e-6,
                               atol=1e-7)


def _tanh_chain(width, depth):
    """depth tanh values of a row, all needed again after the row's sum."""
    f, row = T("float64", (N, width)), T("float64", (N, 1))
    ops = [op("t0", "tanh", ["x"], f)]
    ops += [op(f"t{i}", "tanh", [f"t{i - 1}"], f) for i in range(1, depth)]
    ops.append(op("s", "reduce_sum", [f"t{depth - 1}"], row, axes=[1], keep_dims=True))
    ops.append(op("y0", "mul", ["t0", "s"], f))
    ops += [op(f"y{i}", "add", [f"y{i - 1}", f"t{i}"], f) for i in range(1, depth)]
    return ir.Cluster((("x", f),), tuple(ops), (f"y{depth - 1}",))


def _np_tanh_chain(x, depth):
    ts = [np.tanh(x)]
    for _ in range(1, depth):
        ts.append(np.tanh(ts[-1]))
    y = ts[0] * ts[-1].sum(1, keepdims=True)
    for t in ts[1:]:
        y = y + t
    return y


@pytest.mark.parametrize("depth,rows_per_block,buffered", [(2, 2, True), (6, 8, False)])
def test_warp_rows_per_block_shrink_for_buffers_then_buffers_give_way(depth, rows_per_block,
                                                                       buffered):
    """1024 float64 columns: 2 buffers (16 KiB a row) fit 2 rows per block;
    6 (48 KiB) fit no row, so they are recomputed and 8 rows share a block."""
    c = _tanh_chain(1024, depth)
    plan = plan_gpu(build_schedule(c))
    assert plan.mapping.kind == "warp" and plan.mapping.rows_per_block == rows_per_block
    assert bool(plan.kernel.buffers) == buffered
    assert any("recomputed" in why for why in plan.dropped) != buffered
    x = np.random.default_rng(depth).standard_normal((11, 1024))
    (y,) = emulate(c, [x])
    np.testing.assert_allclose(y, _np_tanh_chain(x, depth), rtol=1e-12, atol=1e-12)


def test_float64_softmax_buffers_doubles_in_shared_memory():
    c = edge.softmax((N, 2000), "float64")
    plan = plan_gpu(build_schedule(c))
    assert plan.mapping.kind == "block" and plan.kernel.buffers == {"v_e": "float64"}
    x = np.random.default_rng(7).standard_normal((6, 2000)) * 10
    (y,) = emulate(c, [x])
    np.testing.assert_allclose(y, _np_softmax(x), rtol=1e-13, atol=1e-300)


def test_reduction_over_two_column_groups_in_float64():
    """Columns (axes 0 and 2) are one linear index that each thread splits
    back into its two coordinates; float64 accumulators take the shuffles."""
    c = edge.two_column_groups_f64()
    assert plan_gpu(build_schedule(c)).mapping.kind == "block"  # 1200 columns
    x = np.random.default_rng(2).standard_normal((4, 7, 300))
    y, ss = emulate(c, [x])
    d = x - x.max((0, 2), keepdims=True)
    np.testing.assert_allclose(ss, (d * d).sum((0, 2), keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(y, d * (d * d).sum((0, 2), keepdims=True), rtol=1e-12)


def test_integer_and_boolean_reductions_are_exact_across_lanes():
    c = edge.int_bool_reductions(45)
    x = np.random.default_rng(3).integers(-2**31, 2**31 - 1, (12, 45)).astype(np.int32)
    x[0] = np.abs(x[0] // 2) + 1
    x[1] = -np.abs(x[1] // 2) - 1
    mean, mn, all_, any_ = emulate(c, [x])
    np.testing.assert_array_equal(mean, np.trunc(x.astype(np.int64).sum(1) / 45).astype(np.int32))
    np.testing.assert_array_equal(mn, x.min(1))
    np.testing.assert_array_equal(all_, (x > 0).all(1))
    np.testing.assert_array_equal(any_, (x > 0).any(1))


def test_elementwise_rows_longer_than_a_tile_split_into_items():
    """Without reductions a row of 10000 columns is three 4096-column items;
    each item is a block, its threads striding over the item's columns."""
    c = edge.long_elementwise(10000)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 10000)).astype(np.float32)
    b = rng.standard_normal(10000).astype(np.float32)
    t, p = emulate(c, [a, b])
    np.testing.assert_array_equal(p, a * b)
    np.testing.assert_allclose(t, np.tanh(a * b), rtol=3e-7, atol=1e-7)


def test_hoisted_channel_values_are_shared_by_a_block_per_row():
    pat = patterns.bn_inference_relu(2048, hw=2)
    plan = plan_gpu(build_schedule(pat.cluster))
    assert plan.mapping.kind == "block" and set(plan.kernel.hoisted) == {"v_f", "v_sh"}
    for rows in (0, 1, 3):
        check_pattern(pat, rows, rows)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sixteen_bit_floats_load_and_store_as_such_and_compute_in_float32(dtype):
    """As the C++ target: values compute in float32 and round to the 16-bit
    type where they are stored (y) or cast (y32: as in TF, the cast reads y as
    its 16-bit type stores it, so y32 equals y)."""
    c = edge.half_layernorm(dtype)
    np_dtype = as_dtype(dtype)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((13, 768)).astype(np_dtype)
    g = rng.standard_normal(768).astype(np_dtype)
    y, y32 = emulate(c, [x, g])
    xf, gf = x.astype(np.float32), g.astype(np.float32)
    d = xf - xf.mean(1, keepdims=True)
    ref = d / np.sqrt((d * d).mean(1, keepdims=True) + np.float32(1e-3)) * gf
    np.testing.assert_array_equal(y32, y.astype(np.float32))
    tol = 2 ** -8 if dtype == "bfloat16" else 2 ** -11  # half an ulp, relative
    np.testing.assert_allclose(y32, ref, rtol=tol + 1e-4, atol=tol * 2 ** -14 + 1e-4)


def test_dynamic_dimensions_broadcast_at_run_time_as_in_tf():
    """x or y of one row at run time broadcast with stride 0 (ext flags)."""
    c = ir.Cluster((("x", T("float32", (N, 40))), ("y", T("float32", (N, 40))),
                    ("z", T("float32", (6, 40)))), (
        op("a", "add", ["x", "y"], T("float32", (N, 40))),
        op("s", "reduce_sum", ["a"], T("float32", (N, 1)), axes=[1], keep_dims=True),
        op("b", "mul", ["a", "z"], T("float32", (6, 40))),
        op("o", "sub", ["b", "s"], T("float32", (6, 40)))), ("o",))
    rng = np.random.default_rng(9)
    z = rng.standard_normal((6, 40)).astype(np.float32)
    for nx, ny in ((6, 6), (1, 6), (6, 1), (1, 1)):
        x = rng.standard_normal((nx, 40)).astype(np.float32)
        y = rng.standard_normal((ny, 40)).astype(np.float32)
        (o,) = emulate(c, [x, y, z])
        a = x + y
        np.testing.assert_allclose(o, a * z - a.sum(1, keepdims=True), rtol=1e-5, atol=1e-5)


def test_transposed_tensors_read_and_write_through_their_strides():
    """Attention's head split: a bias add written in two transposed layouts
    (outputs) from an input in a third, at dynamic batch and sequence."""
    c = ir.Cluster((("x", T("float32", (N, N, 3, 8))), ("b", T("float32", (3, 8)))), (
        op("y", "add", ["x", "b"], T("float32", (N, N, 3, 8))),
        op("q", "transpose", ["y"], T("float32", (N, 3, N, 8)), perm=[0, 2, 1, 3]),
        op("k", "transpose", ["y"], T("float32", (N, 3, 8, N)), perm=[0, 2, 3, 1])),
        ("q", "k"))
    rng = np.random.default_rng(10)
    b = rng.standard_normal((3, 8)).astype(np.float32)
    for batch, seq in ((2, 5), (1, 1), (3, 70), (0, 4)):
        x = rng.standard_normal((batch, seq, 3, 8)).astype(np.float32)
        q, k = emulate(c, [x, b])
        np.testing.assert_array_equal(q, np.transpose(x + b, (0, 2, 1, 3)))
        np.testing.assert_array_equal(k, np.transpose(x + b, (0, 2, 3, 1)))


# -- the emulation notices broken synchronisation ---------------------------

def _without(monkeypatch, drop):
    real = gpu_printer.GpuBody.sync

    def sync(self, point):
        if drop(point):
            self.parts.append(self.lines)
            self.lines = []
        else:
            real(self, point)
    monkeypatch.setattr(gpu_printer.GpuBody, "sync", sync)


@pytest.mark.parametrize("name", ["layernorm_4096", "bn_inference_relu_64"])
@pytest.mark.parametrize("reverse_threads", [False, True], ids=["ascending", "descending"])
def test_a_missing_barrier_gives_wrong_results(monkeypatch, name, reverse_threads):
    """Without the barrier, a thread reads another warp's partial sum (or a
    hoisted value) before it is written: the emulation's shared memory starts
    as NaN. Both thread orders notice: each warp reads every warp's partial,
    and warp-per-row reads hoisted columns that other warps computed."""
    pat = PATTERNS[name]
    _without(monkeypatch, lambda p: isinstance(p, kernel_ir.Barrier))
    inputs = pat.make_inputs(np.random.default_rng(5), 11)
    out = emulate(pat.cluster, inputs, reverse_threads=reverse_threads)
    assert not np.allclose(out[0], pat.reference(inputs)[0], rtol=pat.rtol, atol=pat.atol)


def test_a_missing_shuffle_step_gives_wrong_results(monkeypatch):
    pat = PATTERNS["softmax_128"]
    _without(monkeypatch, lambda p: isinstance(p, kernel_ir.Shuffle) and p.offset == 4)
    inputs = pat.make_inputs(np.random.default_rng(6), 9)
    (y,) = emulate(pat.cluster, inputs)
    assert not np.allclose(y, pat.reference(inputs)[0], rtol=pat.rtol, atol=pat.atol)


def test_a_bfloat16_value_cast_to_float16_is_rounded_to_bfloat16_first():
    """As TF: a bfloat16 product is stored (rounded) as bfloat16 before the
    cast to float16 reads it; casting the unrounded float32 product rounds
    once instead, which differs in the last float16 bits."""
    bf16, f16 = T("bfloat16", (N, 64)), T("float16", (N, 64))
    c = ir.Cluster((("x", bf16), ("y", bf16)), (
        op("p", "mul", ["x", "y"], bf16),
        op("h", "cast", ["p"], f16)), ("h",))
    rng = np.random.default_rng(10)
    bf16_np = as_dtype("bfloat16")
    x, y = (rng.standard_normal((7, 64)).astype(bf16_np) for _ in range(2))
    (h,) = emulate(c, [x, y])
    product = x.astype(np.float32) * y.astype(np.float32)
    np.testing.assert_array_equal(h, product.astype(bf16_np).astype(np.float16))
    assert (product.astype(np.float16) != h).any()   # the two roundings do differ here


def test_cuda_casts_round_a_16_bit_source_to_its_type_first():
    """The CUDA printer's casts follow the C++ printer's rule (the emulation
    prints the C++ one, so it cannot see a CUDA-only difference)."""
    for frm, to in (("bfloat16", "float16"), ("float16", "bfloat16"),
                    ("bfloat16", "float32"), ("float16", "int32")):
        rounded = printer.CUDA.round_16bit[frm].format("v")
        assert rounded in printer.cast("v", frm, to, printer.CUDA), (frm, to)
