"""Reductions that keep the innermost axis on the CPU (kernel_ir.cpu_lanes):
a work item is a block of adjacent kept elements, every row value an array
over them, and the column loops run the lanes innermost. TF-free: fusion IR
-> C++ -> run with NumPy on fresh random inputs, across block edges (kept
extents around CPU_LANES), thread counts and dtypes."""

import numpy as np
import pytest

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.codegen import kernel_ir, printer
from tf_fusionstitch.kernels import build_cpu_kernel
from tf_fusionstitch.runtime.cpu_kernel import as_dtype
from tf_fusionstitch.schedule import build_schedule

T, op = ir.TensorType, ir.make_op
N = None
RNG = np.random.default_rng(77)
LANES = kernel_ir.CPU_LANES


@pytest.fixture(autouse=True)
def streaming_at_any_static_size(monkeypatch):
    monkeypatch.setattr(printer, "STREAM_MIN_BYTES", 0)   # run() covers streaming too


def run(cluster, inputs, threads=2):
    kernel = build_cpu_kernel(cluster)
    types = cluster.types()
    runner = kernel.runner([as_dtype(types[o].dtype) for o in cluster.outputs])
    runner.set_stream_min_bytes(0)
    return runner.run(inputs, threads=threads, forward=True), kernel


def bias_grad(width, dtype="float32"):
    """Sum over the rows of g * 2 (and g * 2 itself): a bias gradient."""
    full = T(dtype, (N, width))
    return ir.Cluster((("g", full),),
                      (op("two", "const", [], T(dtype, ()), value=2.0),
                       op("d", "mul", ["g", "two"], full),
                       op("s", "reduce_sum", ["d"], T(dtype, (width,)), axes=[0],
                          keep_dims=False)),
                      ("s", "d"))


@pytest.mark.parametrize("width", [1, LANES - 1, LANES, LANES + 1, 40, 768])
@pytest.mark.parametrize("rows,threads", [(1, 1), (37, 2), (1000, 3)])
def test_a_bias_gradient_matches_numpy(width, rows, threads):
    c = bias_grad(width)
    # (a width of 1 is no axis: the sum then reduces the only axis, a row)
    assert kernel_ir.cpu_lanes(build_schedule(c)) == (LANES if width > 1 else 0)
    g = RNG.standard_normal((rows, width), dtype=np.float32)
    (s, d), kernel = run(c, [g.copy()], threads)
    np.testing.assert_array_equal(d, g * np.float32(2))
    np.testing.assert_allclose(s, (g.astype(np.float64) * 2).sum(0), rtol=1e-5, atol=1e-4)
    assert ("l0 + l" in kernel.source) == (width > 1)


def test_an_empty_batch_sums_to_zero():
    (s, d), _ = run(bias_grad(20), [np.zeros((0, 20), np.float32)])
    np.testing.assert_array_equal(s, np.zeros(20, np.float32))
    assert d.shape == (0, 20)


def test_nhwc_batchnorm_statistics_and_normalisation():
    """mean and variance over N, H, W per channel, then the normalised x:
    row values (the statistics) are read inside later column loops."""
    x_t, c_t = T("float32", (N, 5, 7, 24)), T("float32", (1, 1, 1, 24))
    c = ir.Cluster(
        (("x", x_t),),
        (op("m", "reduce_mean", ["x"], c_t, axes=[0, 1, 2], keep_dims=True),
         op("d", "sub", ["x", "m"], x_t),
         op("sq", "square", ["d"], x_t),
         op("v", "reduce_mean", ["sq"], c_t, axes=[0, 1, 2], keep_dims=True),
         op("eps", "const", [], T("float32", ()), value=1e-3),
         op("ve", "add", ["v", "eps"], c_t),
         op("r", "rsqrt", ["ve"], c_t),
         op("y", "mul", ["d", "r"], x_t)),
        ("y", "m", "v"))
    x = RNG.standard_normal((3, 5, 7, 24), dtype=np.float32) * 3 + 1
    (y, m, v), _ = run(c, [x.copy()], threads=2)
    mu = x.mean((0, 1, 2), keepdims=True)
    var = ((x - mu) ** 2).mean((0, 1, 2), keepdims=True)
    np.testing.assert_allclose(m, mu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v, var, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y, (x - mu) / np.sqrt(var + 1e-3), rtol=1e-5, atol=1e-5)


def column_softmax(width):
    """softmax over the rows (axis 0) of x[?, width], per column."""
    f, col = T("float32", (N, width)), T("float32", (1, width))
    return ir.Cluster((("x", f),),
                      (op("mx", "reduce_max", ["x"], col, axes=[0], keep_dims=True),
                       op("d", "sub", ["x", "mx"], f),
                       op("e", "exp", ["d"], f),
                       op("s", "reduce_sum", ["e"], col, axes=[0], keep_dims=True),
                       op("p", "div", ["e", "s"], f)),
                      ("p",))


def test_a_buffered_value_keeps_every_lane():
    """exp is buffered across the softmax's two loops, one buffer slot per
    column and lane."""
    c = column_softmax(33)
    assert "e" in build_schedule(c).buffered
    x = RNG.standard_normal((50, 33), dtype=np.float32)
    (p,), _ = run(c, [x.copy()], threads=2)
    e = np.exp(x - x.max(0, keepdims=True))
    np.testing.assert_allclose(p, e / e.sum(0, keepdims=True), rtol=1e-5, atol=1e-7)


def test_max_propagates_nan_per_lane_and_int_mean_does_not_wrap():
    fx = T("float32", (N, 20))
    ix = T("int32", (N, 20))
    c = ir.Cluster((("x", fx), ("k", ix)),
                   (op("mx", "reduce_max", ["x"], T("float32", (20,)), axes=[0],
                       keep_dims=False),
                    op("mk", "reduce_mean", ["k"], T("int32", (20,)), axes=[0],
                       keep_dims=False)),
                   ("mx", "mk"))
    x = RNG.standard_normal((9, 20), dtype=np.float32)
    x[4, 3] = np.nan
    x[0, 17] = np.nan
    k = RNG.integers(2**30, 2**31 - 1, size=(9, 20), dtype=np.int32)
    (mx, mk), _ = run(c, [x, k], threads=2)
    want = x.max(0)
    np.testing.assert_array_equal(np.isnan(mx), np.isnan(want))
    np.testing.assert_array_equal(mx[~np.isnan(want)], want[~np.isnan(want)])
    np.testing.assert_array_equal(mk, (k.astype(np.int64).sum(0) // 9).astype(np.int32))


def test_an_outer_kept_axis_and_a_run_time_broadcast():
    """Reduce axis 1 of [A, B, C] keeping A and C (items span A and blocks of
    C); the kept innermost dimension is dynamic, and y's may be 1 at run time
    (a stride of 0 across the lanes)."""
    f = T("float64", (3, 11, N))
    c = ir.Cluster((("x", f), ("y", f)),
                   (op("p", "mul", ["x", "y"], f),
                    op("s", "reduce_sum", ["p"], T("float64", (3, N)), axes=[1],
                       keep_dims=False)),
                   ("s", "p"))
    x = RNG.standard_normal((3, 11, 19))
    for y in (RNG.standard_normal((3, 11, 19)), RNG.standard_normal((3, 11, 1))):
        (s, p), _ = run(c, [x, y], threads=2)
        np.testing.assert_array_equal(p, x * y)
        np.testing.assert_allclose(s, (x * y).sum(1), rtol=1e-12, atol=1e-12)


def test_a_value_that_varies_by_column_only_is_computed_once_per_call():
    """exp(w) of a per-row weight w[70, 1] depends on no kept element: it is
    hoisted out of the blocks (one column buffer for all lanes)."""
    f, w_t = T("float32", (70, 40)), T("float32", (70, 1))
    c = ir.Cluster((("x", f), ("w", w_t)),
                   (op("ew", "exp", ["w"], w_t),
                    op("p", "mul", ["x", "ew"], f),
                    op("s", "reduce_sum", ["p"], T("float32", (40,)), axes=[0],
                       keep_dims=False)),
                   ("s",))
    assert build_schedule(c).hoisted == {"ew"}
    x = RNG.standard_normal((70, 40), dtype=np.float32)
    w = RNG.standard_normal((70, 1), dtype=np.float32)
    (s,), _ = run(c, [x, w], threads=2)
    np.testing.assert_allclose(s, (x * np.exp(w)).sum(0), rtol=1e-5, atol=1e-5)
