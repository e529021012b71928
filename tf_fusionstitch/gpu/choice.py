"""Choosing a GPU plan with the latency evaluator (FusionStitching's tuning).

For one schedule, `candidate_plans` enumerates the mappings the printer can
run: a thread per row (blocks of 128-1024 threads), a warp per row (1-32 rows
per block), a block per row (128-1024 threads) and, for rows with
reductions, a row split over 2-64 blocks (AStitch); and, per expensive value
that a later loop needs, keeping it in shared memory or recomputing it (the
paper tries expensive elementwise ops both ways). `choose_plan` keeps the
candidate with the lowest predicted latency (cost.LatencyModel) and the
column-count thresholds' plan unless a candidate beats it by more than
`TIE`: the model ranks, it does not measure. No TensorFlow import here.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import List, Optional

from tf_fusionstitch.codegen import kernel_ir
from tf_fusionstitch.gpu import cost
from tf_fusionstitch.gpu.mapping import (SMEM_BUDGET, WARP, GpuMapping, GpuPlan, finish_plan,
                                         fit_hoisted, split_plan, static_cols, threshold_plan)
from tf_fusionstitch.schedule import ELEMENTWISE_TILE, Schedule

BLOCK_SIZES = (128, 256, 512, 1024)
WARP_ROWS = (1, 2, 4, 8, 16, 32)
SPLIT_ROW_BLOCKS = (2, 4, 8, 16, 32, 64)   # blocks sharing one row, where rows split
# A thread per row past this many columns serialises a row's loads in one
# thread and touches a sector per lane per column; not worth evaluating.
THREAD_ROW_CANDIDATE_COLS = 32
# All subsets of up to this many buffered values; beyond, all or none.
MAX_BUFFER_SUBSET = 3
# Row count assumed for a dynamic batch (BERT-base: batch 32 x sequence 512)
# and row length assumed where it is dynamic.
ASSUMED_ROWS = 16384
ASSUMED_COLS = 1024
# A candidate must be predicted this much faster than the thresholds' plan.
TIE = 0.02


@dataclasses.dataclass(frozen=True)
class Scored:
    plan: GpuPlan
    estimate: cost.Estimate


def row_count(s: Schedule) -> Optional[int]:
    """Rows of the iteration space when every row axis is static."""
    sizes = [s.static_extent[a] for a in range(s.num_axes) if a not in s.col_axes]
    return None if any(e is None for e in sizes) else math.prod(sizes)


def candidate_plans(s: Schedule) -> List[GpuPlan]:
    s, _, why = fit_hoisted(s)
    cols = static_cols(s)
    per_item = None if cols is None else (min(cols, ELEMENTWISE_TILE) if s.tiled else cols)
    out = []
    for buffered in _buffer_choices(s, cols):
        sb = dataclasses.replace(s, buffered=buffered)
        dropped = tuple(why)
        if buffered != s.buffered:
            gone = ", ".join(sorted(s.buffered - buffered))
            dropped += (f"recomputed by choice ({gone}): predicted faster than a buffer",)
        kernel = kernel_ir.lower(sb)
        for mapping in _mappings(per_item, cols):
            plan = finish_plan(sb, kernel, mapping, dropped)
            if cost.shared_bytes(plan) <= SMEM_BUDGET:
                out.append(plan)
    if s.reductions and not s.tiled and cols:
        # AStitch's split of long rows: every thread keeps a column or more.
        out += [split_plan(s, t, n) for t in BLOCK_SIZES for n in SPLIT_ROW_BLOCKS
                if cols >= n * t]
    return out


def _buffer_choices(s: Schedule, cols: Optional[int]) -> list:
    if not s.buffered:
        return [frozenset()]
    if not cols:  # dynamic or empty rows: no shared columns
        return [frozenset()]
    values = sorted(s.buffered)
    if len(values) > MAX_BUFFER_SUBSET:
        return [s.buffered, frozenset()]
    return [frozenset(c) for n in range(len(values), -1, -1)
            for c in itertools.combinations(values, n)]


def _mappings(per_item: Optional[int], cols: Optional[int]) -> list:
    out = []
    if per_item is not None and per_item <= THREAD_ROW_CANDIDATE_COLS:
        out += [GpuMapping("thread", t, t, cols) for t in BLOCK_SIZES]
    if per_item is not None:
        out += [GpuMapping("warp", r * WARP, r, cols) for r in WARP_ROWS]
    out += [GpuMapping("block", t, 1, cols) for t in BLOCK_SIZES]
    return out


def score_all(s: Schedule, gpu, rows: Optional[int] = None) -> List[Scored]:
    model = cost.LatencyModel(gpu, *extents(s, rows))
    return [Scored(p, model.estimate(p)) for p in candidate_plans(s)]


def extents(s: Schedule, rows: Optional[int]) -> tuple:
    """(rows, columns) to evaluate for. Without reductions a dynamic batch may
    sit in the column (tiled) axes, leaving no row axes: assume as many
    elements in all as ASSUMED_ROWS rows of ASSUMED_COLS."""
    if rows is None:
        rows = row_count(s) or ASSUMED_ROWS
    cols = static_cols(s)
    if cols is None:
        cols = ASSUMED_COLS
        if s.tiled:
            cols = max(cols, ASSUMED_ROWS * ASSUMED_COLS // max(rows, 1))
    return rows, cols


def plan_gpu(s: Schedule, gpu=None, rows: Optional[int] = None) -> GpuPlan:
    """The mapping of `s`, lowered for it: the column-count thresholds' plan
    (mapping.threshold_plan), or, given a `gpu` (a cost.GPUS name or
    GpuSpec), the candidate that the latency evaluator predicts fastest for
    `rows` rows (choose_plan)."""
    default = threshold_plan(s)
    return default if gpu is None else choose_plan(s, gpu, rows, default)


def choose_plan(s: Schedule, gpu, rows: Optional[int] = None,
                default: Optional[GpuPlan] = None) -> GpuPlan:
    """The fastest candidate for `gpu`; `default` (the thresholds' plan) where
    none is predicted more than TIE faster."""
    scored = score_all(s, gpu, rows)
    best = min(scored, key=lambda c: c.estimate.latency_s)
    if default is None:
        return best.plan
    base = cost.LatencyModel(gpu, *extents(s, rows)).estimate(default).latency_s
    if best.estimate.latency_s < base * (1 - TIE):
        return best.plan
    return default


def describe(plan: GpuPlan) -> str:
    """'warp x8', 'block 512', 'thread x256'; 'block 256 /16': a row split over 16
    blocks; '+2buf': values kept in shared memory."""
    m = plan.mapping
    text = {"thread": f"thread x{m.rows_per_block}", "warp": f"warp x{m.rows_per_block}",
            "block": f"block {m.block_threads}"}[m.kind]
    if m.row_blocks > 1:
        text += f" /{m.row_blocks}"
    n = len(plan.kernel.buffers)
    return text + (f" +{n}buf" if n else "")
