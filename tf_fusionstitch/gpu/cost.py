"""FusionStitching's latency evaluator for one GPU plan (docs/PAPERS.md, "Cost models").

    latency = max(memory, issue) + OVERLAP_LOSS x min(memory, issue)
    issue = waves x wave time

- *memory time*: the bytes the kernel must move through DRAM (every input
  read once, every output written once) over the bandwidth a copy reaches,
  plus what later loops reload from the L1/L2 over L2_BANDWIDTH_RATIO
  times that.
- *occupancy*: blocks resident per SM from the block size, registers (ptxas'
  count when given, else `estimate_registers`) and shared memory
  (`shared_bytes`, as the printer allocates it), by occupancy.py.
- *waves* = ceil(blocks / (SMs x resident blocks per SM)).
- *wave time*: a warp's issue cost `warp_cycles` (instructions weighted by
  their issue cycles: global and shared accesses by the 32-byte sectors a
  warp touches, transcendentals by their libm instruction counts, shuffle
  steps and barriers) times the warps sharing a scheduler, or, when too few
  warps are resident to hide memory latency, that cost plus the DRAM round
  trips of the warp's own dependent loads. Memory time is at least what the
  resident warps' bytes in flight allow per DRAM round trip (Little's law).
- a row split across blocks (mapping.split_plan) pays its slices'
  partials and KERNEL_BOUNDARY_S per extra launch.

It ranks candidate plans (choice.choose_plan); its absolute numbers
are estimates, not measurements. `LatencyModel` is `estimate` bound to one
GPU and problem size: the package's kernel_cost.KernelCostModel of GpuPlans,
as the CPU's delta evaluator is one of CPU kernels. No TensorFlow import here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Union

from tf_fusionstitch.codegen import kernel_ir as k
from tf_fusionstitch.codegen import primitives
from tf_fusionstitch.fusion_ir import DTYPE_BYTES, EXPENSIVE
from tf_fusionstitch.gpu.mapping import split_phases
from tf_fusionstitch.gpu.occupancy import SM_LIMITS, SmLimits, blocks_per_sm
from tf_fusionstitch.schedule import ELEMENTWISE_TILE


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    name: str
    arch: str                 # key of gpu_occupancy.SM_LIMITS (per-SM limits)
    sms: int
    dram_bytes_per_s: float
    clock_hz: float           # boost clock
    smem_per_block: int       # most shared memory one block may use (opt-in)
    l2_bytes: int

    @property
    def sm(self) -> SmLimits:
        return SM_LIMITS[self.arch]


# Public spec sheets. V100: SXM2, 80 SMs, 900 GB/s HBM2, 1530 MHz boost, 96 KiB
# shared per SM and block (Volta whitepaper, CUDA guide cc 7.0). A100: SXM4
# 40 GB, 108 SMs, 1555 GB/s HBM2, 1410 MHz, 164 KiB per SM / 163 KiB per block
# (Ampere whitepaper, cc 8.0). H100: SXM5, 132 SMs, 3.35 TB/s HBM3, 1980 MHz,
# 228 KiB per SM / 227 KiB per block (H100 datasheet, cc 9.0). H200: the H100
# chip with 4.8 TB/s HBM3e (H200 datasheet). Threads, blocks and registers per
# SM (2048, 32, 64K) are the same on all four (CUDA guide, compute capabilities).
# L2: 6, 40, 50 and 60 MB (the same sources; the H200's as CUDA reported it).
GPUS = {
    "V100": GpuSpec("V100", "sm_70", 80, 900e9, 1.530e9, 96 * 1024, 6 << 20),
    "A100": GpuSpec("A100", "sm_80", 108, 1555e9, 1.410e9, 163 * 1024, 40 << 20),
    "H100": GpuSpec("H100", "sm_90", 132, 3.35e12, 1.980e9, 227 * 1024, 50 << 20),
    "H200": GpuSpec("H200", "sm_90", 132, 4.8e12, 1.980e9, 227 * 1024, 60 << 20),
}

WARP = 32
SCHEDULERS = 4                # warp schedulers per SM (Volta to Hopper)
# A load's round trip to DRAM under load (queueing included), fitted to the
# H200 sweep (benchmarks/gpu_patterns.py --sweep, 2026-11-29; tests/
# gpu_measurements/h200_sweep.json): 0.76 us at 1.98 GHz, where an idle L2
# miss is 450-1000 cycles. It decides when too few bytes are in flight to
# reach the bandwidth.
DRAM_LATENCY_CYCLES = 1500
# The fraction of the datasheet bandwidth a copy reaches: 4.27 of 4.8 TB/s
# on the H200 (same run); assumed alike on the other parts.
DRAM_EFFICIENCY = 0.89
# A later loop reloading an input that is neither in registers nor in
# shared memory reads it from the L1 or L2, at this many times the copy
# bandwidth, and OVERLAP_LOSS of the shorter of memory and issue time adds
# to the longer. Both fitted to the H200 sweep, as BARRIER_CYCLES (a barrier
# and the partials' exchange around it) is.
L2_BANDWIDTH_RATIO = 3.0
OVERLAP_LOSS = 0.5
SECTOR = 32                   # bytes the L1 moves per access unit
BARRIER_CYCLES = 100
SHUFFLE_CYCLES = 2            # a shfl per 32-bit word
LOOP_CYCLES = 2               # counter, compare and branch per column
DIVMOD_CYCLES = 20            # a 64-bit / and % of a run-time extent
# A split row's launches follow one another: each boundary drains the GPU and
# starts the next grid (a few microseconds on these parts; assumed).
KERNEL_BOUNDARY_S = 3e-6
# nvcc unrolls a strided loop about 4 times, so that many columns' loads are
# in flight per thread; a fully unrolled loop has all of them in flight.
STRIDED_UNROLL = 4
# Instructions of CUDA's libm sequences (no fast math, --fmad=false), roughly:
# a MUFU approximation plus range reduction and refinement.
EXPENSIVE_CYCLES = {"exp": 8, "expm1": 12, "log": 10, "log1p": 12, "tanh": 14,
                    "sigmoid": 14, "elu": 10, "selu": 10, "softplus": 20, "erf": 16,
                    "erfc": 20, "sin": 20, "cos": 20, "pow": 40, "div": 10,
                    "reciprocal": 8, "rsqrt": 4, "sqrt": 8}
assert set(EXPENSIVE_CYCLES) == set(EXPENSIVE)

# Register estimate (when ptxas has not counted them): a fixed part for
# thread and row indices, loop state and addresses (ptxas keeps kernel
# parameters in the constant bank until used), the values that stay live, and
# at most BODY_REGISTERS of a loop body's temporaries (the compiler reorders
# a body to keep few of them live). Fitted to ptxas for the standard patterns.
BASE_REGISTERS = 18
BODY_REGISTERS = 8
# Fully unrolled loops (register-cached columns) keep no loop counters or
# bounds: ptxas gave a 128-column softmax 28 registers looped, 21 unrolled.
UNROLLED_SAVING = 6
# Unrolled loops with nothing cached keep some columns' values
# live to overlap their loads: about half a register a column (ptxas on the
# standard patterns' candidates: 32 columns a thread, 32 registers), more
# where it calls libm (assumed).
UNROLLED_WORDS = 0.5
UNROLLED_HEAVY_WORDS = 1.0

_BYTES = DTYPE_BYTES
# Compute type's width in registers (16-bit floats compute in float32).
_WORDS = primitives.COMPUTE_WORDS


def spec(gpu: Union[str, GpuSpec]) -> GpuSpec:
    if isinstance(gpu, GpuSpec):
        return gpu
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
    return GPUS[gpu]


def gpu_named(device_name: str) -> Optional[str]:
    """The GPUS key that a device name such as 'NVIDIA H100 80GB HBM3'
    contains, or None."""
    found = [key for key in GPUS if key in device_name.upper()]
    return found[0] if len(found) == 1 else None


@dataclasses.dataclass(frozen=True)
class Estimate:
    """One plan's predicted latency and what it comes from
    (kernel_cost.KernelEstimate)."""
    registers: int
    shared_bytes: int
    blocks: int
    blocks_per_sm: int
    occupancy: float          # resident warps over the SM's maximum
    waves: int
    warp_cycles: float        # one warp's issue cost
    wave_cycles: float
    memory_s: float
    compute_s: float

    @property
    def latency_s(self) -> float:
        # Memory and issue overlap, but not entirely: a block's barriers and
        # dependent reductions leave its loads idle for a while.
        return max(self.memory_s, self.compute_s) + OVERLAP_LOSS * min(self.memory_s,
                                                                       self.compute_s)


def _row_cols(plan) -> Optional[int]:
    s = plan.schedule
    extents = [s.static_extent[a] for a in s.col_axes]
    return None if any(e is None for e in extents) else math.prod(extents)


def work_items(plan, rows: int, cols: int) -> tuple:
    """(work items, columns per item): a tiled cluster's row is several items."""
    if plan.kernel.tiled and plan.kernel.col_groups:
        return rows * max(1, -(-cols // ELEMENTWISE_TILE)), min(cols, ELEMENTWISE_TILE)
    return rows, cols


# -- shared memory -----------------------------------------------------------

def shared_bytes(plan) -> int:
    """Static shared memory of the printed kernel (codegen/gpu_printer.py):
    hoisted columns, per-row buffers (one per reuse slot), and per-warp
    reduction partials when a block runs a row."""
    m, kr = plan.mapping, plan.kernel
    total = sum(primitives.COMPUTE_BYTES[d] for d in kr.hoisted.values()) * (m.smem_cols or 0)
    total += sum(primitives.COMPUTE_BYTES[d] for d in slot_dtypes(kr).values()) \
        * m.rows_per_block * (m.smem_cols or 0)
    if m.warps_per_row > 1:
        for accs in kr.accumulators:
            for a in accs:
                flag = 4 if primitives.tracks_nan(a) else 0   # the printer's int flag
                total += m.warps_per_row * (primitives.accumulator_bytes(a) + flag)
    return total


def buffer_slots(kernel: k.Kernel) -> dict:
    """Buffered value -> the shared array it lives in (the first value of its
    slot). A thread reads and writes only its own columns of a buffer in
    every loop, so a buffer whose last read is in an earlier loop than
    another's first write can hand its array over without a barrier."""
    first_store, last_load = {}, {}
    for loop, body in enumerate(kernel.loops):
        for st in body:
            if isinstance(st, k.BufStore) and st.pool == "b":
                first_store.setdefault(st.src, loop)
            elif isinstance(st, k.BufLoad) and st.pool == "b":
                last_load[st.src] = loop
    slots = {}          # slot name -> (compute dtype, loop of its last read)
    out = {}
    for v in sorted(kernel.buffers, key=lambda v: (first_store.get(v, 0), v)):
        ctype = primitives.COMPUTE_DTYPE[kernel.buffers[v]]
        free = [n for n, (d, end) in slots.items()
                if d == ctype and end < first_store.get(v, 0)]
        name = free[0] if free else v
        slots[name] = (ctype, last_load.get(v, first_store.get(v, 0)))
        out[v] = name
    return out


def slot_dtypes(kernel: k.Kernel) -> dict:
    """Shared array name -> compute dtype, one per reuse slot."""
    return {slot: primitives.COMPUTE_DTYPE[kernel.buffers[slot]]
            for slot in set(buffer_slots(kernel).values())}




# -- registers ---------------------------------------------------------------

def estimate_registers(plan) -> int:
    """32-bit registers per thread: BASE_REGISTERS, the register-cached
    columns, accumulators, row values read inside loops, and the widest loop
    body's values up to BODY_REGISTERS."""
    kr = plan.kernel
    regs = BASE_REGISTERS - (UNROLLED_SAVING if plan.cols_per_thread else 0)
    if plan.cols_per_thread and not plan.register_cached:
        heavy = any(isinstance(st, k.Compute) and st.prim in EXPENSIVE
                    for body in kr.loops for st in body)
        per_col = UNROLLED_HEAVY_WORDS if heavy else UNROLLED_WORDS
        regs += math.ceil(per_col * plan.cols_per_thread)
    regs += sum(_WORDS[_cached_dtype(kr, v)] for v in plan.register_cached) \
        * (plan.cols_per_thread or 0)
    regs += sum(primitives.accumulator_bytes(a) // 4 + primitives.tracks_nan(a)
                for accs in kr.accumulators for a in accs)
    row_values = {st.dst: st.dtype for seg in kr.segments for st in seg  # constants: immediates
                  if isinstance(st, (k.Load, k.Compute, k.Finish))
                  and getattr(st, "prim", None) != "const"}
    used_in_loops = {a for body in kr.loops for st in body for a in _reads(st)}
    regs += sum(_WORDS[d] for v, d in row_values.items() if v in used_in_loops)
    regs += min(BODY_REGISTERS, max((sum(_WORDS[st.dtype] for st in body
                                         if isinstance(st, (k.Load, k.Compute, k.BufLoad)))
                                     for body in kr.loops), default=0))
    return min(regs, 255)


def _reads(st) -> tuple:
    if isinstance(st, k.Compute):
        return st.args
    if isinstance(st, (k.Store, k.BufStore, k.Accumulate)):
        return (st.src,)
    return ()


def _cached_dtype(kr: k.Kernel, name: str) -> str:
    for body in kr.loops:
        for st in body:
            if isinstance(st, k.Load) and st.dst == name:
                return st.dtype
    raise KeyError(name)


# -- a warp's instruction cost -----------------------------------------------

def warp_cycles(plan, cols: int) -> float:
    """Issue cycles of one warp running its share of one work item (a thread
    per row: 32 rows at once) with `cols` columns per item."""
    m, kr = plan.mapping, plan.kernel
    per_thread = _per_thread(plan, cols)
    cycles = DIVMOD_CYCLES * len(kr.row_groups)
    for seg in kr.segments:
        cycles += sum(_stmt_cycles(st, plan, cols, in_loop=False, loop=-1) for st in seg)
    col_index = DIVMOD_CYCLES * (len(kr.col_groups) - 1)
    for loop, body in enumerate(kr.loops):
        per_col = LOOP_CYCLES + col_index + sum(
            _stmt_cycles(st, plan, cols, in_loop=True, loop=loop) for st in body)
        per_col += sum(1 + primitives.tracks_nan(a) for a in kr.accumulators[loop])
        cycles += per_thread * per_col
        cycles += _reduction_cycles(kr.accumulators[loop], m)
    for phase in range(1, _phases(plan)):  # a split row: partials combined per launch
        for loop in range(phase):
            for a in kr.accumulators[loop]:
                words = primitives.accumulator_bytes(a) // 4 + primitives.tracks_nan(a)
                cycles += m.row_blocks * (words + 1 + primitives.tracks_nan(a))
    if kr.prelude:  # hoisted columns: the block's threads share them, then a barrier
        per_col = LOOP_CYCLES + sum(_stmt_cycles(st, plan, cols, True, -1) for st in kr.prelude)
        cycles += -(-cols // m.block_threads) * per_col + BARRIER_CYCLES
    return float(cycles)


def _per_thread(plan, cols: int) -> int:
    """Columns one thread runs per loop (of its slice, where rows split)."""
    slice_cols = -(-cols // plan.mapping.row_blocks)
    return -(-slice_cols // plan.mapping.row_threads)


def _phases(plan) -> int:
    """Launches: 1, or a split row's (mapping.split_phases)."""
    return 1 if plan.mapping.row_blocks == 1 else split_phases(plan.kernel)


def _reduction_cycles(accs, m) -> float:
    if not accs or m.row_threads == 1:
        return 0.0
    words = sum(primitives.accumulator_bytes(a) // 4 + primitives.tracks_nan(a) for a in accs)
    combine = sum(1 + primitives.tracks_nan(a) for a in accs)
    cycles = 5 * (SHUFFLE_CYCLES * words + combine)        # xor tree over 32 lanes
    if m.warps_per_row > 1:   # partials through shared memory, a barrier, every thread combines
        cycles += BARRIER_CYCLES + m.warps_per_row * (words + combine)
    return float(cycles)


def _stmt_cycles(st, plan, cols: int, in_loop: bool, loop: int) -> float:
    m, kr = plan.mapping, plan.kernel
    if isinstance(st, k.Compute):
        if st.prim in primitives.FREE:
            return 0.0
        width = max(primitives.COMPUTE_WORDS[st.dtype], primitives.COMPUTE_WORDS[st.arg_dtype])
        return float(EXPENSIVE_CYCLES.get(st.prim, 1) * width)
    if isinstance(st, k.Load) and in_loop and st.dst in plan.register_cached \
            and loop > _first_load_loop(kr, st.dst):
        return 0.0           # this thread's register from an earlier loop
    if isinstance(st, (k.Load, k.Store)):
        return float(_sectors(kr.tensors[st.tensor], st.dtype, m, cols, in_loop, kr.row_groups))
    if isinstance(st, (k.BufLoad, k.BufStore)):
        return float(max(1, WARP * primitives.COMPUTE_BYTES[st.dtype] // SECTOR))
    return 1.0               # Finish and the like


def _first_load_loop(kr: k.Kernel, name: str) -> int:
    for loop, body in enumerate(kr.loops):
        if any(isinstance(st, k.Load) and st.dst == name for st in body):
            return loop
    return -1


def _sectors(tensor: k.Tensor, dtype: str, m, cols: int, in_loop: bool,
             row_groups) -> int:
    """32-byte sectors one warp-wide access touches. Lanes of a warp or block
    per row read consecutive columns; lanes of a thread per row read one
    row each, a row's length apart (row values: consecutive rows)."""
    b = _BYTES[dtype]
    if m.kind != "thread":
        return max(1, WARP * b // SECTOR) if in_loop else 1
    if not any(g in row_groups for g in tensor.groups):
        return 1                             # the same element for every lane
    stride = cols * b if in_loop else b
    return min(WARP, max(1, -(-WARP * stride // SECTOR)))


# -- the evaluator -----------------------------------------------------------

def dram_bytes(plan, rows: int, cols: int, l2_bytes: int = 0) -> int:
    """Every input read once and every output written once (tensors spanning
    only rows, or only columns, count that many elements). A split row's
    launches share no registers or shared memory: each launch reads the
    inputs of its loop again, from DRAM where the tensor outgrows half the
    L2 (the H200 sweep: 64 MB inputs split over 2 blocks a row ran 2.6x
    slower than unsplit)."""
    kr = plan.kernel
    reads = [1] * len(kr.tensors)
    if _phases(plan) > 1:
        reads = [0] * len(kr.tensors)
        for body in kr.loops:
            for t in {st.tensor for st in body if isinstance(st, k.Load)}:
                reads[t] += 1
    total = 0
    for tn, times in zip(kr.tensors, reads):
        size = _tensor_bytes(kr, tn, rows, cols)
        total += size * (max(times, 1) if 2 * size > l2_bytes else 1)
    return total


def _tensor_bytes(kr: k.Kernel, tn: k.Tensor, rows: int, cols: int) -> int:
    n = 1
    if any(g in kr.row_groups for g in tn.groups):
        n *= rows
    if any(g in kr.col_groups for g in tn.groups):
        n *= cols
    return n * _BYTES[tn.dtype]


def reread_bytes(plan, rows: int, cols: int) -> int:
    """Bytes that loops after a tensor's first read load again from the
    cache, where the value is not in this thread's registers (a split row's
    launches re-read from DRAM instead: dram_bytes counts those)."""
    kr = plan.kernel
    if _phases(plan) > 1:
        return 0
    seen, total = set(), 0
    for body in kr.loops:
        for st in body:
            if isinstance(st, k.Load) and st.tensor in seen \
                    and st.dst not in plan.register_cached:
                total += _tensor_bytes(kr, kr.tensors[st.tensor], rows, cols)
        seen |= {st.tensor for st in body if isinstance(st, k.Load)}
    return total


def estimate(plan, gpu: Union[str, GpuSpec], rows: int, cols: Optional[int] = None,
             registers: Optional[int] = None) -> Estimate:
    """The predicted latency of `plan` on `gpu` for `rows` rows (the product
    of the row extents) of `cols` columns (default: the static row length)."""
    g = spec(gpu)
    cols = _row_cols(plan) if cols is None else cols
    if cols is None:
        raise ValueError("the row length is dynamic: pass the columns to assume")
    m = plan.mapping
    regs = estimate_registers(plan) if registers is None else registers
    smem = shared_bytes(plan)
    items, item_cols = work_items(plan, rows, cols)
    blocks = -(-items // m.rows_per_block) * m.row_blocks
    bps = blocks_per_sm(g.arch, m.block_threads, regs, smem) if smem <= g.smem_per_block else 0
    warps_per_block = m.block_threads // WARP
    occ = bps * warps_per_block * WARP / g.sm.max_threads
    w_cycles = warp_cycles(plan, item_cols)
    moved = dram_bytes(plan, rows, cols, g.l2_bytes)
    bandwidth = g.dram_bytes_per_s * DRAM_EFFICIENCY
    memory_s = moved / bandwidth + reread_bytes(plan, rows, cols) / (L2_BANDWIDTH_RATIO
                                                                      * bandwidth)
    if bps == 0:
        return Estimate(regs, smem, blocks, 0, 0.0, 0, w_cycles, math.inf, memory_s, math.inf)
    if blocks == 0:
        return Estimate(regs, smem, 0, bps, occ, 0, w_cycles, 0.0, memory_s, 0.0)
    waves = -(-blocks // (g.sms * bps))
    # Little's law: resident warps keep only so many bytes in flight per DRAM
    # round trip; too few of them cannot reach the peak bandwidth.
    warps = min(blocks, g.sms * bps) * warps_per_block
    in_flight = warps * WARP * bytes_in_flight(plan, item_cols)
    memory_s = max(memory_s, moved * DRAM_LATENCY_CYCLES / g.clock_hz / max(in_flight, 1))
    resident = min(bps, -(-blocks // g.sms)) * warps_per_block
    issue = w_cycles * -(-resident // SCHEDULERS)
    wave_cycles = max(issue, w_cycles + _latency_chain(plan, item_cols))
    boundaries = (_phases(plan) - 1) * KERNEL_BOUNDARY_S
    return Estimate(regs, smem, blocks, bps, occ, waves, w_cycles, wave_cycles, memory_s,
                    waves * wave_cycles / g.clock_hz + boundaries)


@dataclasses.dataclass(frozen=True)
class LatencyModel:
    """`estimate` for `rows` rows of `cols` columns (default: each plan's
    static row length) on `gpu` (kernel_cost.KernelCostModel)."""
    gpu: Union[str, GpuSpec]
    rows: int
    cols: Optional[int] = None

    def estimate(self, plan, registers: Optional[int] = None) -> Estimate:
        return estimate(plan, self.gpu, self.rows, self.cols, registers)


def _in_flight_cols(plan, cols: int) -> int:
    per_thread = _per_thread(plan, cols)
    return max(1, per_thread if plan.cols_per_thread else min(per_thread, STRIDED_UNROLL))


def bytes_in_flight(plan, cols: int) -> int:
    """Bytes one thread has requested at once: its first loop's global loads
    for the columns in flight."""
    first = plan.kernel.loops[0] if plan.kernel.loops else []
    per_col = sum(_BYTES[st.dtype] for st in first if isinstance(st, k.Load))
    return per_col * _in_flight_cols(plan, cols)


def _latency_chain(plan, cols: int) -> float:
    """DRAM round trips a warp waits for in sequence: per loop that loads
    from global memory, one per batch of columns in flight."""
    per_thread = _per_thread(plan, cols)
    in_flight = _in_flight_cols(plan, cols)
    trips = 0
    for loop, body in enumerate(plan.kernel.loops):
        if any(isinstance(st, k.Load) and not (st.dst in plan.register_cached
                                               and loop > _first_load_loop(plan.kernel, st.dst))
               for st in body):
            trips += -(-per_thread // in_flight)
    return float(trips * DRAM_LATENCY_CYCLES)
