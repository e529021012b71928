"""Packed kernels (codegen/pack.py): unconnected parts of one cluster, each
with its own iteration space, run in one launch. TF-free: fusion IR -> C++ ->
run with NumPy on fresh random inputs."""

import numpy as np
import pytest

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.kernels import build_cpu_kernel
from tf_fusionstitch.runtime.cpu_kernel import KernelShapeError, as_dtype

T, op = ir.TensorType, ir.make_op
N = None
RNG = np.random.default_rng(2026)


def run(cluster, inputs, threads=2, forward=True):
    kernel = build_cpu_kernel(cluster)
    types = cluster.types()
    runner = kernel.runner([as_dtype(types[o].dtype) for o in cluster.outputs])
    return runner.run(inputs, threads=threads, forward=forward), kernel


def three_parts():
    """Four parts: softmax over the rows of x[?, 64]; exp(2 y) of a float64
    y[5, 7]; the sum of z[?]; |x|. Three iteration spaces, x read by two parts."""
    x, row = T("float32", (N, 64)), T("float32", (N, 1))
    y = T("float64", (5, 7))
    z = T("float32", (N,))
    return ir.Cluster(
        (("x", x), ("y", y), ("z", z)),
        (op("m", "reduce_max", ["x"], row, axes=[1], keep_dims=True),
         op("d", "sub", ["x", "m"], x),
         op("e", "exp", ["d"], x),
         op("s", "reduce_sum", ["e"], row, axes=[1], keep_dims=True),
         op("p", "div", ["e", "s"], x),
         op("two", "const", [], T("float64", ()), value=2.0),
         op("y2", "mul", ["y", "two"], y),
         op("ey", "exp", ["y2"], y),
         op("zs", "reduce_sum", ["z"], T("float32", ()), axes=[0], keep_dims=False),
         op("xa", "abs", ["x"], x)),
        ("p", "ey", "zs", "xa"))


def test_connected_parts_split_where_no_value_flows():
    parts = ir.connected_parts(three_parts())
    assert [p.cluster.outputs for p in parts] == [("p",), ("ey",), ("zs",), ("xa",)]
    assert [p.inputs for p in parts] == [(0,), (1,), (2,), (0,)]
    assert [p.outputs for p in parts] == [(0,), (1,), (2,), (3,)]
    for p in parts:
        p.cluster.validate()


@pytest.mark.parametrize("rows,threads", [(3, 1), (300, 2), (0, 2), (4096, 4)])
def test_a_pack_of_four_iteration_spaces_matches_numpy(rows, threads):
    x = RNG.standard_normal((rows, 64), dtype=np.float32)
    y = RNG.standard_normal((5, 7))
    z = RNG.standard_normal(rows * 3 + 1, dtype=np.float32)
    (p, ey, zs, xa), kernel = run(three_parts(), [x, y, z.copy()], threads=threads)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(p, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ey, np.exp(y * 2), rtol=1e-12)
    np.testing.assert_allclose(zs, z.sum(), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(xa, np.abs(x))
    assert p.shape == xa.shape == (rows, 64) and ey.shape == (5, 7) and zs.shape == ()
    assert "fs_run_p3" in kernel.source and kernel.num_loops == 3


def test_an_input_two_parts_read_is_never_overwritten():
    # x feeds two parts; neither may take its buffer for an output, or the
    # other part (possibly on another thread) would read a written element.
    c = ir.Cluster((("x", T("float32", (N, 16))),),
                   (op("a", "neg", ["x"], T("float32", (N, 16))),
                    op("s", "reduce_sum", ["x"], T("float32", (N,)), axes=[1], keep_dims=False)),
                   ("a", "s"))
    x = RNG.standard_normal((2000, 16), dtype=np.float32)
    (a, s), kernel = run(c, [x.copy()], threads=4, forward=True)
    np.testing.assert_array_equal(a, -x)
    np.testing.assert_allclose(s, x.sum(1), rtol=1e-5, atol=1e-5)
    meta_forward = kernel.source.split("fs_meta[] = {")[1].split("}")[0].split(", ")
    assert meta_forward[-1] == "0"  # no forward pairs


def test_a_part_alone_may_still_reuse_its_input():
    c = ir.Cluster((("x", T("float32", (N, 16))), ("y", T("float32", (8,)))),
                   (op("a", "neg", ["x"], T("float32", (N, 16))),
                    op("b", "exp", ["y"], T("float32", (8,)))),
                   ("a", "b"))
    source = build_cpu_kernel(c).source
    meta = source.split("fs_meta[] = {")[1].split("}")[0].split(", ")
    assert meta[-5:] == ["2", "0", "0", "1", "1"]  # a may take x's buffer, b y's


def test_shape_errors_name_the_ops_input():
    x = RNG.standard_normal((4, 64), dtype=np.float32)
    with pytest.raises(KernelShapeError, match=r"input 1 \(y\)"):
        run(three_parts(), [x, RNG.standard_normal((5, 8)), RNG.standard_normal(3).astype(np.float32)])


def test_chunks_balance_a_large_part_against_small_ones():
    """The pack's items are chunks of about equal cost: a large elementwise
    part is cut into many, a tiny one stays one."""
    c = ir.Cluster((("x", T("float32", (N, 1024))), ("y", T("float32", (3,)))),
                   (op("a", "tanh", ["x"], T("float32", (N, 1024))),
                    op("b", "exp", ["y"], T("float32", (3,)))),
                   ("a", "b"))
    kernel = build_cpu_kernel(c)
    runner = kernel.runner([np.float32, np.float32])
    _, ext, work = runner.shape_call([(4096, 1024), (3,)])
    chunks = list(ext)[-2:]
    assert chunks[0] > 16 and chunks[1] == 1 and work[0] == sum(chunks)


def test_constants_do_not_join_parts_and_are_written_once():
    # Lowering shares one const between kernels; each part gets its copy,
    # and a const that is an output too is a part of its own.
    f = T("float32", (N, 8))
    c = ir.Cluster((("x", f), ("y", T("float32", (3, 5)))),
                   (op("k", "const", [], T("float32", ()), value=0.5),
                    op("a", "mul", ["x", "k"], f),
                    op("b", "add", ["y", "k"], T("float32", (3, 5)))),
                   ("a", "b", "k"))
    parts = ir.connected_parts(c)
    assert [[o.name for o in p.cluster.ops] for p in parts] == [["k"], ["k", "a"], ["k", "b"]]
    assert [p.outputs for p in parts] == [(2,), (0,), (1,)]
    x, y = RNG.standard_normal((9, 8), dtype=np.float32), RNG.standard_normal((3, 5), dtype=np.float32)
    (a, b, k), _ = run(c, [x, y])
    np.testing.assert_array_equal(a, x * np.float32(0.5))
    np.testing.assert_array_equal(b, y + np.float32(0.5))
    assert k == np.float32(0.5)


def test_a_constant_nothing_reads_joins_no_part():
    # Pow(x, 3) lowers to x * x * x and leaves its exponent unread: one part,
    # one kernel, not a pack with an empty second part.
    f = T("float32", (N, 8))
    c = ir.Cluster((("x", f),),
                   (op("e", "const", [], T("float32", ()), value=3.0),
                    op("s", "square", ["x"], f),
                    op("c", "mul", ["s", "x"], f)),
                   ("c",))
    (part,) = ir.connected_parts(c)
    assert [o.name for o in part.cluster.ops] == ["s", "c"]
    x = RNG.standard_normal((5, 8), dtype=np.float32)
    (c_out,), kernel = run(c, [x])
    np.testing.assert_array_equal(c_out, np.square(x) * x)
    assert kernel.parts == 1


def _siblings():
    """Two elementwise parts over the same inputs (x - y; 2 x y) and one
    over x alone (|x|)."""
    f = T("float32", (N, 16))
    return ir.Cluster((("x", f), ("y", f)),
                      (op("d", "sub", ["x", "y"], f),
                       op("two", "const", [], T("float32", ()), value=2.0),
                       op("m", "mul", ["y", "x"], f),
                       op("m2", "mul", ["m", "two"], f),
                       op("a", "abs", ["x"], f)),
                      ("d", "m2", "a"))


def test_elementwise_parts_that_read_the_same_inputs_run_as_one_loop():
    from tf_fusionstitch.codegen.pack import join_siblings
    cluster = _siblings()
    parts = join_siblings(cluster, ir.connected_parts(cluster))
    assert [p.outputs for p in parts] == [(0, 1), (2,)]
    assert [p.inputs for p in parts] == [(0, 1), (0,)]
    # y's rows broadcast at run time: both siblings' spaces are x's rows.
    for y_rows in (37, 1):
        x = RNG.standard_normal((37, 16), dtype=np.float32)
        y = RNG.standard_normal((y_rows, 16), dtype=np.float32)
        (d, m2, a), kernel = run(cluster, [x, y], threads=2)
        np.testing.assert_array_equal(d, x - y)
        np.testing.assert_array_equal(m2, (y * x) * np.float32(2))
        np.testing.assert_array_equal(a, np.abs(x))
        assert kernel.parts == 2


def test_parts_with_a_reduction_or_other_inputs_stay_apart():
    from tf_fusionstitch.codegen.pack import join_siblings
    f, row = T("float32", (N, 16)), T("float32", (N, 1))
    cluster = ir.Cluster((("x", f), ("y", f)),
                         (op("d", "sub", ["x", "y"], f),
                          op("s", "reduce_sum", ["x"], row, axes=[1], keep_dims=True),
                          op("t", "add", ["s", "y"], f),
                          op("e", "exp", ["y"], f)),
                         ("d", "t", "e"))
    parts = ir.connected_parts(cluster)
    assert len(join_siblings(cluster, parts)) == len(parts) == 3


def _updates(shapes):
    """One optimizer-like update per shape, v - (0.1 g) (v v), each reading
    its own two inputs; every other one lists its ops in another order. The
    parts of one shape differ only in names and that order."""
    inputs, ops, outputs = [], [], []
    for k, shape in enumerate(shapes):
        t = T("float32", shape)
        inputs += [(f"v{k}", t), (f"g{k}", t)]
        step = [op(f"lr{k}", "const", [], T("float32", ()), value=0.1),
                op(f"s{k}", "mul", [f"g{k}", f"lr{k}"], t)]
        square = [op(f"w{k}", "mul", [f"v{k}", f"v{k}"], t)]
        ops += (step + square if k % 2 else square + step) + [
            op(f"p{k}", "mul", [f"s{k}", f"w{k}"], t),
            op(f"u{k}", "sub", [f"v{k}", f"p{k}"], t)]
        outputs.append(f"u{k}")
    return ir.Cluster(tuple(inputs), tuple(ops), tuple(outputs))


def test_parts_alike_but_for_names_share_one_run_function():
    """Five same-shaped updates and two of other shapes: three run (and
    shape) functions in the source, and every part still reads and writes
    its own buffers."""
    shapes = [(64, 48)] * 5 + [(N, 48), (7,)]
    cluster = _updates(shapes)
    sizes = [(64, 48)] * 5 + [(300, 48), (7,)]
    inputs = [RNG.standard_normal(s, dtype=np.float32) for s in sizes for _ in range(2)]
    outs, kernel = run(cluster, [x.copy() for x in inputs], threads=2, forward=False)
    assert kernel.source.count("static void fs_run_p") == 3
    assert kernel.source.count(" int fs_shape_p") == 3
    assert kernel.parts == 7
    for k, u in enumerate(outs):
        v, g = inputs[2 * k], inputs[2 * k + 1]
        np.testing.assert_array_equal(u, v - (g * np.float32(0.1)) * (v * v))


def test_a_shared_run_function_reports_the_parts_own_input():
    cluster = _updates([(N, 48)] * 3)
    good = [RNG.standard_normal((5, 48), dtype=np.float32) for _ in range(6)]
    good[5] = RNG.standard_normal((5, 47), dtype=np.float32)
    with pytest.raises(KernelShapeError, match=r"input 5 \(g2\)"):
        run(cluster, good)
