"""Rows split across blocks (gpu/mapping.split_plan, AStitch's scheme for
few very long rows): one launch per column loop, partials of a row's slices
combined through a workspace in slice order. The C++ emulation runs the
launches one after another over every block, so these tests check the slice
bounds (uneven, empty), the partials' combination (sums, means, max/min with
NaN flags, integers and booleans exactly) and which launch stores what.
TF-free; the emulation needs g++, the compile checks NVRTC and ptxas."""

import gpu_edge_clusters as edge
import numpy as np
import pytest

from tf_fusionstitch import patterns
from tf_fusionstitch.codegen import gpu_printer
from tf_fusionstitch.codegen.generate import generate_cuda
from tf_fusionstitch.gpu.mapping import split_phases, split_plan
from tf_fusionstitch.runtime import nvrtc
from tf_fusionstitch.runtime.cuda_kernel import launches
from tf_fusionstitch.schedule import build_schedule

N = None


@pytest.mark.parametrize("width,threads,row_blocks", [
    (1000, 128, 4),     # even slices
    (70, 32, 16),       # slices of 5: the last two are empty
    (5, 32, 8),         # one column a slice, three empty slices
    (3001, 64, 7),      # uneven slice count and length
])
def test_split_softmax_matches_numpy(width, threads, row_blocks):
    c = edge.softmax((N, width))
    plan = split_plan(build_schedule(c), threads, row_blocks)
    assert split_phases(plan.kernel) == 3   # max, sum, normalise
    rng = np.random.default_rng(width)
    for rows in (0, 1, 6):
        x = rng.standard_normal((rows, width)).astype(np.float32) * 4
        (y,) = edge.emulate_plan(c, plan, [x], reverse_threads=rows == 6)
        np.testing.assert_allclose(y, edge.softmax_reference(x), rtol=2e-5, atol=1e-6)


def test_a_nan_in_one_slice_reaches_every_slice_of_its_row():
    c = edge.softmax((N, 900))
    plan = split_plan(build_schedule(c), 64, 6)
    x = np.random.default_rng(1).standard_normal((3, 900)).astype(np.float32)
    x[1, 899] = np.nan   # in the last slice only
    (y,) = edge.emulate_plan(c, plan, [x])
    assert np.isnan(y[1]).all() and not np.isnan(y[[0, 2]]).any()
    np.testing.assert_allclose(y[[0, 2]], edge.softmax_reference(x[[0, 2]]), rtol=2e-5, atol=1e-6)


def test_split_layernorm_stores_its_mean_once_in_the_second_launch():
    pat = patterns.layernorm(768)
    plan = split_plan(build_schedule(pat.cluster), 256, 3)
    source = gpu_printer.print_cuda(plan, 2)
    second = source.split("if (fs_phase == 1)")[1].split("if (fs_phase == 2)")[0]
    assert "if (slice == 0 && tid == 0) t4[" in second       # mean: output 1
    assert source.count("if (slice == 0 && tid == 0) t4[") == 1
    inputs = pat.make_inputs(np.random.default_rng(2), 5)
    for reverse in (False, True):
        for got, want in zip(edge.emulate_plan(pat.cluster, plan, inputs, reverse), pat.reference(inputs)):
            np.testing.assert_allclose(got, want, rtol=pat.rtol, atol=pat.atol)


def test_split_integer_and_boolean_reductions_are_exact():
    """All four outputs are row values after the only loop: a second launch
    combines the partials and stores them."""
    c = edge.int_bool_reductions(45)
    plan = split_plan(build_schedule(c), 32, 4)
    assert split_phases(plan.kernel) == 2
    x = np.random.default_rng(3).integers(-2**31, 2**31 - 1, (9, 45)).astype(np.int32)
    x[0] = np.abs(x[0] // 2) + 1
    mean, mn, all_, any_ = edge.emulate_plan(c, plan, [x])
    np.testing.assert_array_equal(mean, np.trunc(x.astype(np.int64).sum(1) / 45).astype(np.int32))
    np.testing.assert_array_equal(mn, x.min(1))
    np.testing.assert_array_equal(all_, (x > 0).all(1))
    np.testing.assert_array_equal(any_, (x > 0).any(1))


def test_split_over_two_column_groups_and_run_time_row_lengths():
    c = edge.two_column_groups_f64()
    plan = split_plan(build_schedule(c), 64, 5)
    x = np.random.default_rng(4).standard_normal((4, 3, 300))
    y, ss = edge.emulate_plan(c, plan, [x])
    d = x - x.max((0, 2), keepdims=True)
    np.testing.assert_allclose(ss, (d * d).sum((0, 2), keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(y, d * (d * d).sum((0, 2), keepdims=True), rtol=1e-12)
    dyn = edge.softmax((N, N))
    plan = split_plan(build_schedule(dyn), 32, 8)
    for width in (1, 7, 1000):
        x = np.random.default_rng(width).standard_normal((3, width)).astype(np.float32)
        (y,) = edge.emulate_plan(dyn, plan, [x])
        np.testing.assert_allclose(y, edge.softmax_reference(x), rtol=2e-5, atol=1e-6)


def test_buffers_and_hoisting_give_way_to_recompute():
    plan = split_plan(build_schedule(patterns.softmax(3000).cluster), 256, 4)
    assert not plan.kernel.buffers and any("launches share no" in d for d in plan.dropped)
    bn = patterns.bn_inference_relu(64)
    with pytest.raises(ValueError, match="reductions"):
        split_plan(build_schedule(bn.cluster), 256, 4)


def test_launches_cover_rows_with_their_blocks():
    assert launches(13, 1, 8) == [(0, 13, 104)]
    per = (2**31 - 1) // 8
    assert launches(per + 3, 1, 8) == [(0, per, per * 8), (per, per + 3, 24)]


@pytest.mark.skipif(nvrtc.nvrtc_version() is None or nvrtc.ptxas_path() is None,
                    reason="needs NVRTC and ptxas")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_split_kernels_compile_without_spills(arch):
    for cluster, threads in ((edge.softmax((4, 65536)), 1024),
                             (patterns.layernorm(4096).cluster, 512),
                             (edge.int_bool_reductions(45), 32)):
        plan = split_plan(build_schedule(cluster), threads, 16)
        source = generate_cuda(cluster, plan=plan).source
        assert "const int fs_phase" in source and "* ws_a_" in source
        ptx = nvrtc.compile_ptx(source, arch, gpu_printer.NVRTC_OPTIONS)
        (res,) = nvrtc.ptxas_resources(ptx, arch)
        assert (res.spill_stores, res.spill_loads, res.stack_bytes) == (0, 0, 0), res
