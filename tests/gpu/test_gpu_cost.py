"""The latency evaluator (tf_fusionstitch/gpu/cost.py), term by term, against
values computed by hand from its documented constants; its shared memory
against the printer's allocation; its register estimate against ptxas.
TF-free."""

import math

import gpu_edge_clusters as edge
import numpy as np
import pytest

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import kernel_cost, patterns
from tf_fusionstitch.codegen import gpu_printer, kernel_ir, primitives, printer
from tf_fusionstitch.gpu import build as gpu_build, choice as gpu_choice, cost as gpu_cost
from tf_fusionstitch.gpu.choice import plan_gpu
from tf_fusionstitch.gpu.cost import (BARRIER_CYCLES, DIVMOD_CYCLES, DRAM_LATENCY_CYCLES,
                                      EXPENSIVE_CYCLES, KERNEL_BOUNDARY_S, LOOP_CYCLES,
                                      SHUFFLE_CYCLES)
from tf_fusionstitch.gpu.mapping import GpuMapping, finish_plan, split_plan, static_cols
from tf_fusionstitch.gpu.occupancy import blocks_per_sm, occupancy
from tf_fusionstitch.runtime import nvrtc
from tf_fusionstitch.runtime.cpu_kernel import CpuKernel
from tf_fusionstitch.schedule import build_schedule

T, op = ir.TensorType, ir.make_op
N = None
PATTERNS = patterns.standard_patterns()
_CTYPE_BYTES = {"float": 4, "double": 8, "int": 4, "int32_t": 4, "int64_t": 8, "bool": 1}


def test_v100_occupancy_uses_256_byte_units_and_no_reservation():
    """sm_70: 96 KiB per SM; 40000 B round to 40192, 2 blocks fit; no 1 KiB
    per-block reservation, so 48 KiB blocks fit twice. 33 registers x 32
    lanes round to 1280 per warp: 65536 / (1280 x 8) = 6 blocks of 256."""
    assert blocks_per_sm("sm_70", 256, 32, 0) == 8
    assert blocks_per_sm("sm_70", 256, 32, 40000) == 2
    assert blocks_per_sm("sm_70", 128, 32, 48 * 1024) == 2
    assert blocks_per_sm("sm_70", 256, 33, 0) == 6
    assert occupancy("sm_70", 256, 33, 0) == 0.75


def _softmax_128():
    return plan_gpu(build_schedule(edge.softmax((N, 128))))


def test_warp_cycles_of_a_warp_per_row_softmax_by_hand():
    """128 columns over 32 lanes: 4 per lane. Row index: one div/mod. Loop 0:
    loop, load (4 sectors), max with its NaN flag; xor tree of 5 steps over
    2 words. Loop 1: x from its register (free: 4 columns per lane are
    cached), sub, exp, shared store, sum; tree over 1 word. Loop 2: shared
    load, div, store. Two Finish statements."""
    plan = _softmax_128()
    assert plan.mapping == GpuMapping("warp", 256, 8, 128)
    assert plan.register_cached == ("v_x",)
    loop0 = 4 * (LOOP_CYCLES + 4 + 2) + 5 * (SHUFFLE_CYCLES * 2 + 2)
    loop1 = 4 * (LOOP_CYCLES + 1 + EXPENSIVE_CYCLES["exp"] + 4 + 1) + 5 * (SHUFFLE_CYCLES + 1)
    loop2 = 4 * (LOOP_CYCLES + 4 + EXPENSIVE_CYCLES["div"] + 4)
    assert gpu_cost.warp_cycles(plan, 128) == DIVMOD_CYCLES + 2 + loop0 + loop1 + loop2 == 243


def test_block_per_row_adds_a_barrier_and_partials_per_reduction():
    """The same softmax with a block of 256 per row: one column per thread
    (x kept in its register for loop 1), and after each tree the 8 warps'
    partials (words + combines each)."""
    s = build_schedule(edge.softmax((N, 128)))
    warp = _softmax_128()
    block = finish_plan(warp.schedule, warp.kernel, GpuMapping("block", 256, 1, 128), ())
    assert block.register_cached == ("v_x",)
    per_col = ((LOOP_CYCLES + 4 + 2) + (LOOP_CYCLES + 1 + 8 + 4 + 1)
               + (LOOP_CYCLES + 4 + 10 + 4))
    trees = 5 * (SHUFFLE_CYCLES * 2 + 2) + 5 * (SHUFFLE_CYCLES + 1)
    partials = 2 * BARRIER_CYCLES + 8 * (2 + 2) + 8 * (1 + 1)
    assert s.num_loops == 3
    assert gpu_cost.warp_cycles(block, 128) == DIVMOD_CYCLES + 2 + per_col + trees + partials


def test_thread_per_row_loads_touch_a_sector_per_lane_past_32_byte_rows():
    """A thread per row: a warp's load spans 32 rows. Rows of 2 floats (8 B)
    share sectors: 32 x 8 / 32 = 8; rows of 16 floats touch one per lane."""
    for width, sectors in ((2, 8), (16, 32)):
        s = build_schedule(edge.softmax((N, width)))
        base = plan_gpu(s)
        plan = finish_plan(base.schedule, base.kernel, GpuMapping("thread", 256, 256, width), ())
        x_load = plan.kernel.loops[0][0]
        assert gpu_cost._stmt_cycles(x_load, plan, width, True, 0) == sectors


def test_estimate_of_a_softmax_on_h100_by_hand():
    """25344 rows = 3 waves of 132 SMs x 8 blocks x 8 rows (32 registers:
    8 blocks of 256 threads; 4 KiB of buffer + 1 KiB reserved: 45 would fit).
    A full SM: 64 warps, 16 per scheduler, so a wave takes 16 warps' cycles
    (more than one warp's cycles + its one DRAM round trip: loop 1 reads x
    from registers). Memory: x read and y written once at the copy
    bandwidth (DRAM_EFFICIENCY of 3.35 TB/s); 8448 warps with 16 B per lane
    in flight cover the loaded DRAM latency (Little's law) on the H100, by
    less than 2x. Memory and issue overlap but for OVERLAP_LOSS of the
    shorter."""
    plan = _softmax_128()
    rows = 25344
    e = gpu_cost.estimate(plan, "H100", rows, registers=32)
    assert (e.blocks, e.blocks_per_sm, e.waves, e.shared_bytes) == (3168, 8, 3, 4096)
    assert e.occupancy == 1.0
    assert e.wave_cycles == 243 * 16 > 243 + DRAM_LATENCY_CYCLES
    assert e.compute_s == pytest.approx(3 * 243 * 16 / 1.98e9)
    moved = rows * 128 * 4 * 2
    assert gpu_cost.dram_bytes(plan, rows, 128) == moved
    bandwidth = moved / (3.35e12 * gpu_cost.DRAM_EFFICIENCY)
    little = moved * DRAM_LATENCY_CYCLES / 1.98e9 / (8448 * 32 * 16)
    assert little < bandwidth < 2 * little
    assert e.memory_s == pytest.approx(bandwidth)
    assert e.latency_s == pytest.approx(e.memory_s + gpu_cost.OVERLAP_LOSS * e.compute_s)
    # V100: 80 SMs x 8 blocks a wave, 900 GB/s: there the bandwidth binds.
    v = gpu_cost.estimate(plan, "V100", rows, registers=32)
    assert v.waves == math.ceil(3168 / 640)
    assert v.memory_s == pytest.approx(moved / (900e9 * gpu_cost.DRAM_EFFICIENCY))


def test_the_latency_model_is_the_estimate_through_the_kernel_cost_interface():
    """LatencyModel binds estimate to a GPU and problem size: a
    kernel_cost.KernelCostModel whose estimates are estimate's, and
    KernelEstimates; it is what choice.score_all ranks by."""
    plan = _softmax_128()
    model = gpu_cost.LatencyModel("H100", 25344)
    assert isinstance(model, kernel_cost.KernelCostModel)
    e = model.estimate(plan, registers=32)
    assert isinstance(e, kernel_cost.KernelEstimate)
    assert e == gpu_cost.estimate(plan, "H100", 25344, registers=32)
    assert gpu_cost.LatencyModel("A100", 100, 1000).estimate(plan) == \
        gpu_cost.estimate(plan, "A100", 100, 1000)
    scored = gpu_choice.score_all(plan.schedule, "H100", 25344)
    assert [c.estimate for c in scored] == [
        gpu_cost.estimate(c.plan, "H100", 25344, 128) for c in scored]


def test_few_long_rows_are_bound_by_latency_and_by_bytes_in_flight():
    """4 rows of 65536 columns, a block of 256 per row: 4 blocks, 32 warps on
    the whole GPU. Each thread loads 256 columns, 4 at a time: 64 round trips
    in each of the 3 loops that read x (256 KiB of exponentials cannot stay
    in shared memory); and 32 warps x 32 lanes x 16 B in flight per round
    trip move far less than the peak bandwidth."""
    s = build_schedule(edge.softmax((4, 65536)))
    base = plan_gpu(s)
    assert base.mapping.kind == "block" and base.mapping.block_threads == 256
    assert not base.kernel.buffers
    e = gpu_cost.estimate(base, "H100", 4)
    assert (e.blocks, e.waves) == (4, 1)
    chain = 3 * 64 * DRAM_LATENCY_CYCLES
    assert e.wave_cycles == e.warp_cycles + chain > e.warp_cycles * 2
    moved = 4 * 65536 * 4 * 2
    assert e.memory_s == pytest.approx(moved * DRAM_LATENCY_CYCLES / 1.98e9 / (32 * 32 * 16))
    assert e.memory_s > 10 * moved / 3.35e12


def test_a_split_row_costs_its_slice_its_partials_and_its_launches():
    """4 rows x 65536 split over 16 blocks of 512: 4096 columns a slice, 8 a
    thread. Loops as in the warp softmax, with 16 warps' partials after each
    tree; launch 1 combines the 16 slices' max (2 words), launch 2 also
    their sum. Three launches: two boundaries. One block of 16 warps per SM:
    a warp waits out 2 round trips (8 columns, 4 in flight) in each loop."""
    plan = split_plan(build_schedule(edge.softmax((4, 65536))), 512, 16)
    loop0 = 8 * (LOOP_CYCLES + 4 + 2) + 5 * (SHUFFLE_CYCLES * 2 + 2) + BARRIER_CYCLES + 16 * 4
    loop1 = 8 * (LOOP_CYCLES + 4 + 1 + 8 + 1) + 5 * (SHUFFLE_CYCLES + 1) + BARRIER_CYCLES + 16 * 2
    loop2 = 8 * (LOOP_CYCLES + 4 + 1 + 8 + 10 + 4)
    partials = 16 * (2 + 1 + 1) + 16 * (2 + 1 + 1) + 16 * (1 + 1)
    w = DIVMOD_CYCLES + 2 + loop0 + loop1 + loop2 + partials
    assert gpu_cost.warp_cycles(plan, 65536) == w == 947
    e = gpu_cost.estimate(plan, "H100", 4, registers=32)
    assert (e.blocks, e.waves) == (64, 1)
    assert e.wave_cycles == w + 3 * 2 * DRAM_LATENCY_CYCLES > w * 4
    assert e.compute_s == pytest.approx(e.wave_cycles / 1.98e9 + 2 * KERNEL_BOUNDARY_S)


def test_a_plan_that_cannot_be_resident_is_infinitely_slow():
    plan = _softmax_128()
    e = gpu_cost.estimate(plan, "H100", 1000, registers=255 + 1)
    assert e.blocks_per_sm == 0 and e.latency_s == math.inf


def test_dynamic_rows_need_an_assumed_length():
    plan = plan_gpu(build_schedule(edge.softmax((N, N))))
    with pytest.raises(ValueError, match="dynamic"):
        gpu_cost.estimate(plan, "A100", 100)
    assert gpu_cost.estimate(plan, "A100", 100, cols=1000).latency_s > 0
    with pytest.raises(ValueError, match="unknown GPU"):
        gpu_cost.spec("Z80")


def test_device_names_map_to_specs():
    assert gpu_cost.gpu_named("NVIDIA H200") == "H200"
    assert gpu_cost.gpu_named("NVIDIA A100-SXM4-40GB") == "A100"
    assert gpu_cost.gpu_named("Tesla V100-SXM2-16GB") == "V100"
    assert gpu_cost.gpu_named("NVIDIA GeForce RTX 4090") is None


def _printer_shared_bytes(plan) -> int:
    """What print_cuda declares (every launch's arrays, for a split row)."""
    shared = gpu_printer.shared_union(gpu_printer.phase_bodies(plan, gpu_printer.CUDA))
    return sum(_CTYPE_BYTES[ctype] * count for _, ctype, count in shared)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_shared_bytes_equal_what_the_printer_allocates_for_every_candidate(name):
    s = build_schedule(PATTERNS[name].cluster)
    plans = gpu_choice.candidate_plans(s)
    splittable = bool(s.reductions) and static_cols(s) >= 2 * 128  # a column a thread
    assert any(p.mapping.row_blocks > 1 for p in plans) == splittable
    for plan in plans:
        assert gpu_cost.shared_bytes(plan) == _printer_shared_bytes(plan), plan.mapping


def test_cost_model_sizes_values_as_the_printers_declare_them():
    """Compute values, accumulators and NaN flags: the cost model's sizes
    (codegen/primitives.py) are those of the C types the printers declare."""
    for dtype in ir.DTYPES:
        assert _CTYPE_BYTES[printer.COMPUTE[dtype]] == primitives.COMPUTE_BYTES[dtype], dtype
        for kind in ir.REDUCE:
            a = kernel_ir.Accumulate("v_r", kind, "v_x", dtype)
            ctype = printer.KernelPrinter.acc_type(dtype, kind)
            assert _CTYPE_BYTES[ctype] == primitives.accumulator_bytes(a), (kind, dtype)
            assert primitives.tracks_nan(a) == (kind in ("reduce_max", "reduce_min")
                                                and dtype in ir.FLOAT_DTYPES)
    assert _CTYPE_BYTES[printer.FLAG_TYPE] == 4   # cost.shared_bytes' NaN flag partials


def _two_softmaxes(width):
    """e1 lives in loops 0-1, e2 in loops 2-3: one shared array serves both."""
    f, r = T("float32", (N, width)), T("float32", (N, 1))
    c = ir.Cluster((("x", f),), (
        op("e1", "exp", ["x"], f),
        op("s1", "reduce_sum", ["e1"], r, axes=[1], keep_dims=True),
        op("y1", "div", ["e1", "s1"], f),
        op("t", "reduce_max", ["y1"], r, axes=[1], keep_dims=True),
        op("d", "sub", ["x", "t"], f),
        op("e2", "exp", ["d"], f),
        op("s2", "reduce_sum", ["e2"], r, axes=[1], keep_dims=True),
        op("y", "div", ["e2", "s2"], f)), ("y", "y1"))

    def ref(x):
        x = x.astype(np.float64)
        e1 = np.exp(x)
        y1 = e1 / e1.sum(1, keepdims=True)
        e2 = np.exp(x - y1.max(1, keepdims=True))
        return e2 / e2.sum(1, keepdims=True), y1
    return c, ref


def test_buffers_with_disjoint_lifetimes_share_one_shared_array():
    c, ref = _two_softmaxes(300)
    plan = plan_gpu(build_schedule(c))
    assert set(plan.kernel.buffers) == {"v_e1", "v_e2"}
    assert gpu_cost.buffer_slots(plan.kernel) == {"v_e1": "v_e1", "v_e2": "v_e1"}
    assert gpu_cost.shared_bytes(plan) == _printer_shared_bytes(plan) == 8 * 300 * 4
    source = gpu_printer.print_cuda(plan, 2)
    assert "b_v_e1[" in source and "b_v_e2" not in source
    x = np.random.default_rng(3).standard_normal((21, 300)).astype(np.float32)
    for reverse in (False, True):
        got = CpuKernel(gpu_build.build_emulation(c, reverse)).run([x], threads=2)
        for g, w in zip(got, ref(x)):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6)


def test_overlapping_buffers_keep_their_own_arrays():
    plan = plan_gpu(build_schedule(edge.softmax((N, 200))))
    c = ir.Cluster((("x", T("float32", (N, 64))),), (
        op("a", "tanh", ["x"], T("float32", (N, 64))),
        op("b", "exp", ["x"], T("float32", (N, 64))),
        op("s", "reduce_sum", ["a"], T("float32", (N, 1)), axes=[1], keep_dims=True),
        op("u", "mul", ["a", "s"], T("float32", (N, 64))),
        op("y", "add", ["u", "b"], T("float32", (N, 64)))), ("y",))
    both = plan_gpu(build_schedule(c))
    assert set(gpu_cost.buffer_slots(both.kernel).values()) == {"v_a", "v_b"}
    assert gpu_cost.buffer_slots(plan.kernel) == {"v_e": "v_e"}


@pytest.mark.skipif(nvrtc.nvrtc_version() is None or nvrtc.ptxas_path() is None,
                    reason="needs NVRTC and ptxas")
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_register_estimate_is_within_a_third_of_ptxas(name):
    generated, builds = gpu_build.compile_cuda(PATTERNS[name].cluster, ("sm_90",))
    counted = builds["sm_90"].resources.registers
    estimated = gpu_cost.estimate_registers(generated.plan)
    assert abs(estimated - counted) <= counted / 3, (estimated, counted)
