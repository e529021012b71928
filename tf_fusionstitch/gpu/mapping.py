"""GPU mapping of a schedule: which threads run a work item (row).

`schedule.py` decides what a row computes and in which column loops; this
module decides how a CUDA block runs it (AStitch's adaptive mapping):

- *thread per row*: rows of at most `THREAD_ROW_MAX_COLS` columns get one
  thread each, a block's threads taking consecutive rows. A warp per row
  would leave most lanes idle; here no thread waits and nothing is exchanged.
- *warp per row*: rows of at most `WARP_ROW_MAX_COLS` columns (known at
  optimization time) get one warp each, `rows_per_block` rows per block. The
  column loops stride over the 32 lanes; a reduction is a shuffle tree that
  leaves the result in every lane (warp composition). No barrier is needed
  after the hoisted prelude.
- *block per row*: longer or run-time rows get a whole block. A reduction is a
  shuffle tree per warp, then one partial per warp in shared memory, a
  barrier, and every thread combines the partials in the same order (block
  composition), so all threads hold the same result for the next loop.

Where every row has the same static number of columns per thread (at most
`MAX_COLS_PER_THREAD`), the column loops are unrolled and inputs that later
loops read again stay in that thread's registers (`register_cached`, within
`REGISTER_CACHE_WORDS`) instead of being loaded again.

Values a later loop needs (schedule.buffered) live in shared memory when the
row length is static and they fit; otherwise they are recomputed from the
inputs (the paper's thread composition). Hoisted per-column values are
computed once per block into shared memory under the same condition, else
inline. Either fallback re-lowers the schedule, so the kernel IR says exactly
what the kernel does.

These thresholds are the plan without a target GPU (`threshold_plan`). Given
one, `choice.plan_gpu(s, gpu="H100")` lets FusionStitching's latency
evaluator (cost.py) choose among every mapping, block size and
buffer-or-recompute alternative, keeping this plan where nothing is predicted
faster. No TensorFlow import here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from tf_fusionstitch.codegen import kernel_ir
from tf_fusionstitch.codegen.primitives import COMPUTE_BYTES, COMPUTE_WORDS
from tf_fusionstitch.fusion_ir import EXPENSIVE
from tf_fusionstitch.schedule import ELEMENTWISE_TILE, Schedule

WARP = 32
# Up to 8 columns a warp per row would idle at least 3 of 4 lanes; one thread
# loops over them, and a warp's loads still cover 32 consecutive rows.
THREAD_ROW_MAX_COLS = 8
# A warp-per-row reduction needs no barrier or shared memory; up to 32
# elements per lane still keep enough loads in flight per warp. Longer rows
# need more threads to hide memory latency.
WARP_ROW_MAX_COLS = 1024
BLOCK_THREADS = 256
MAX_ROWS_PER_BLOCK = 8              # 8 warps: 256 threads, like block-per-row
# Static __shared__ memory of one block is capped at 48 KiB; keep 4 KiB for
# the per-warp reduction partials and headroom.
SMEM_BUDGET = 44 * 1024

# Register-cached inputs need unrolled loops (arrays indexed by the unrolled
# counter live in registers): at most this many columns per thread, and at
# most this many 32-bit registers of cached values; with ~30 for the rest a
# thread stays under 64 registers, half of an SM's warps resident.
MAX_COLS_PER_THREAD = 24
# Loops of a reduction with a static, evenly split trip count up to this are
# unrolled whether or not anything is cached: nvcc does not unroll a strided
# loop far enough to keep a row's loads in flight. On the H200 a 1024-column
# softmax, a warp a row (32 columns a lane), ran at 73% of copy bandwidth
# looped, 72% with only its first loop unrolled, 82-83% with every loop
# unrolled (by hand, then generated). Not for elementwise clusters: unrolled
# with erf or tanh, ptxas kept no more loads in flight (20 registers).
MAX_UNROLLED_COLS = 32
REGISTER_CACHE_WORDS = 24
# A loop with a libm call unrolls into that many calls' temporaries; up to
# this many columns per thread they still fit beside the cached values.
HEAVY_CACHE_COLS = 8


@dataclasses.dataclass(frozen=True)
class GpuMapping:
    kind: str                    # "thread", "warp" or "block": who runs one row
    block_threads: int
    rows_per_block: int
    smem_cols: Optional[int]     # static columns a shared buffer holds (None: no buffers)
    # Blocks that split one row (AStitch's split of few, very long rows): each
    # takes a contiguous slice of the columns; see split_plan.
    row_blocks: int = 1

    @property
    def row_threads(self) -> int:
        """Threads that share one row's column loops."""
        return {"thread": 1, "warp": WARP}.get(self.kind, self.block_threads)

    @property
    def warps_per_row(self) -> int:
        return self.row_threads // WARP


@dataclasses.dataclass(frozen=True)
class GpuPlan:
    schedule: Schedule           # as lowered (buffers or hoisting may have been dropped)
    kernel: kernel_ir.Kernel
    mapping: GpuMapping
    dropped: tuple               # why buffers/hoisting fell back, for reports
    # Columns per thread when every row has the same static count (loops are
    # then unrolled), else None; and the input values that loops after the
    # first read from that thread's registers instead of memory.
    cols_per_thread: Optional[int] = None
    register_cached: tuple = ()


def static_cols(s: Schedule) -> Optional[int]:
    """Columns of a whole row, when every column axis is static."""
    extents = [s.static_extent[a] for a in s.col_axes]
    if any(e is None for e in extents):
        return None
    return math.prod(extents)


def threshold_plan(s: Schedule) -> GpuPlan:
    """The plan the column-count thresholds above choose, without a target GPU."""
    cols = static_cols(s)
    per_item = None if cols is None else (min(cols, ELEMENTWISE_TILE) if s.tiled else cols)
    types = s.cluster.types()
    dropped = []
    s, hoisted_bytes, why = fit_hoisted(s)
    dropped += why
    row_bytes = sum(COMPUTE_BYTES[types[v].dtype] for v in s.buffered) * (cols or 0)

    if per_item is not None and per_item <= THREAD_ROW_MAX_COLS:
        kind, threads, row_choices = "thread", BLOCK_THREADS, (BLOCK_THREADS,)
    elif per_item is not None and per_item <= WARP_ROW_MAX_COLS:
        # Fewer rows per block before giving up buffers: each row needs its own.
        row_choices = tuple(MAX_ROWS_PER_BLOCK >> i
                            for i in range(MAX_ROWS_PER_BLOCK.bit_length()))  # 8, 4, 2, 1
        kind, threads = "warp", None
    else:
        kind, threads, row_choices = "block", BLOCK_THREADS, (1,)
    fitting = [r for r in row_choices if hoisted_bytes + r * row_bytes <= SMEM_BUDGET]
    if s.buffered and (not cols or not fitting):
        dropped.append("buffered values recomputed: the row length is " + _why(cols))
        s = dataclasses.replace(s, buffered=frozenset())
    rows = fitting[0] if fitting and s.buffered else row_choices[0]
    mapping = GpuMapping(kind, threads or rows * WARP, rows, cols)
    return finish_plan(s, kernel_ir.lower(s), mapping, tuple(dropped))


def fit_hoisted(s: Schedule) -> tuple:
    """(schedule, shared bytes of its hoisted columns, why they were dropped):
    hoisted values go inline where the row length is dynamic or they would
    take more than half the shared memory budget."""
    cols = static_cols(s)
    types = s.cluster.types()
    hoisted_bytes = sum(COMPUTE_BYTES[types[v].dtype] for v in s.hoisted) * (cols or 0)
    # An empty row (0 columns) needs no buffer, and C++ has no arrays of size 0.
    if s.hoisted and (not cols or hoisted_bytes > SMEM_BUDGET // 2):
        return (dataclasses.replace(s, hoisted=frozenset()), 0,
                ["hoisted values computed inline: the row length is " + _why(cols)])
    return s, hoisted_bytes, []


def finish_plan(s: Schedule, kernel: kernel_ir.Kernel, mapping: GpuMapping,
                dropped: tuple) -> GpuPlan:
    """The plan of `kernel` (lowered from `s`) under `mapping`: no shared
    columns without buffers, and the register-cached inputs where every
    thread has the same static number of columns."""
    cols = static_cols(s)
    if not s.buffered and not s.hoisted:
        mapping = dataclasses.replace(mapping, smem_cols=None)
    per_thread = None
    if cols is not None and (not s.tiled or cols <= ELEMENTWISE_TILE):  # one item per row
        per_thread = -(-cols // mapping.row_threads)
        if per_thread > MAX_UNROLLED_COLS:
            per_thread = None
    cached = ()
    if per_thread and per_thread <= MAX_COLS_PER_THREAD:
        cached = _register_cached(kernel, per_thread)
    if per_thread and not cached and (not s.reductions or cols % mapping.row_threads):
        # Elementwise: ptxas keeps few loads in flight unrolled anyway. A
        # ragged last column unrolled behind its guard made ptxas spill
        # (softmax_3000 on sm_80).
        per_thread = None
    return GpuPlan(s, kernel, mapping, tuple(dropped), per_thread, cached)


def split_plan(s: Schedule, block_threads: int, row_blocks: int) -> GpuPlan:
    """A block per row slice, `row_blocks` slices a row (AStitch's split of
    very long rows across blocks, for few rows that would leave SMs idle).
    Blocks of one row meet only through global memory, so the kernel runs in
    `split_phases` launches: launch k runs column loop k on every slice and
    writes each slice's reduction partials to a workspace; launch k + 1
    combines a row's partials in slice order (every block gets the same
    value), then goes on. Shared buffers and hoisted columns cannot outlive
    a launch: values are recomputed, loops are not unrolled."""
    if s.tiled or not s.reductions:
        raise ValueError("only clusters with reductions split their rows")
    dropped = []
    if s.buffered:
        dropped.append("buffered values recomputed: a split row's launches share no memory")
    if s.hoisted:
        dropped.append("hoisted values computed inline: a split row's launches share no memory")
    s = dataclasses.replace(s, buffered=frozenset(), hoisted=frozenset())
    mapping = GpuMapping("block", block_threads, 1, None, row_blocks)
    return GpuPlan(s, kernel_ir.lower(s), mapping, tuple(dropped))


def split_phases(kernel: kernel_ir.Kernel) -> int:
    """Launches of a split plan: one per column loop, and one more when the
    last loop reduces (its results are combined and stored after it)."""
    return len(kernel.loops) + (1 if kernel.accumulators[-1] else 0)


def _register_cached(kernel: kernel_ir.Kernel, per_thread: int) -> tuple:
    """Inputs loaded again in later loops, first come first, while their
    per-thread registers fit REGISTER_CACHE_WORDS. Not where a loop that
    reads them has an expensive op and a thread runs more than
    HEAVY_CACHE_COLS columns: unrolled, its temporaries (a libm call's each
    column) cost more registers than the reload costs time (ptxas gave a
    5000-column log-softmax 68 registers). Up to that many, caching won on
    the H200: a 128-column softmax went from 10.2 to 7.1 us."""
    loops_of: dict = {}
    for k, body in enumerate(kernel.loops):
        for st in body:
            if isinstance(st, kernel_ir.Load):
                loops_of.setdefault(st.dst, (st.dtype, set()))[1].add(k)
    heavy = {k for k, body in enumerate(kernel.loops)
             if any(isinstance(st, kernel_ir.Compute) and st.prim in EXPENSIVE for st in body)}
    cached, words = [], 0
    for name, (dtype, loops) in loops_of.items():
        cost = per_thread * COMPUTE_WORDS[dtype]
        light = not loops & heavy or per_thread <= HEAVY_CACHE_COLS
        if len(loops) > 1 and light and words + cost <= REGISTER_CACHE_WORDS:
            cached.append(name)
            words += cost
    return tuple(cached)


def _why(cols: Optional[int]) -> str:
    return {None: "dynamic", 0: "empty"}.get(cols, "too long for shared memory")
