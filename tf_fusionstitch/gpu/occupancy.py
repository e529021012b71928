"""Occupancy of a CUDA kernel from its launch shape and ptxas' resources.

The occupancy term of FusionStitching's latency evaluator (docs/PAPERS.md, "Cost models"): how
many warps an SM keeps resident, limited by threads, blocks, registers and
shared memory per SM. The limits and allocation granularities are NVIDIA's
(CUDA occupancy calculator, cuda_occupancy.h: shared memory is allocated
in 256-byte units on compute capability 7.x, 128 on 8.x and 9.x; the driver
reserves 1 KiB per block from 8.0 on). TF-free.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SmLimits:
    max_threads: int
    max_blocks: int
    registers: int           # 32-bit registers per SM
    reg_alloc_unit: int      # registers are allocated per warp in units of this many
    max_regs_per_thread: int
    shared_bytes: int        # shared memory per SM usable by blocks
    smem_alloc_unit: int
    smem_reserved_per_block: int  # the driver's per-block reservation


SM_LIMITS = {
    "sm_70": SmLimits(2048, 32, 65536, 256, 255, 98304, 256, 0),       # V100: 96 KiB
    "sm_80": SmLimits(2048, 32, 65536, 256, 255, 167936, 128, 1024),   # A100: 164 KiB
    "sm_90": SmLimits(2048, 32, 65536, 256, 255, 233472, 128, 1024),   # H100/H200: 228 KiB
}


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def blocks_per_sm(arch: str, block_threads: int, registers: int, shared_bytes: int) -> int:
    """Blocks an SM keeps resident at once (0 when a block cannot run)."""
    lim = SM_LIMITS[arch]
    warps = -(-block_threads // 32)
    if registers > lim.max_regs_per_thread or block_threads > 1024:
        return 0
    by_threads = lim.max_threads // (warps * 32)
    regs_per_warp = _round_up(max(registers, 1) * 32, lim.reg_alloc_unit)
    by_registers = lim.registers // (regs_per_warp * warps)
    smem = _round_up(shared_bytes + lim.smem_reserved_per_block, lim.smem_alloc_unit)
    by_shared = lim.shared_bytes // smem if smem else lim.max_blocks
    return min(lim.max_blocks, by_threads, by_registers, by_shared)


def occupancy(arch: str, block_threads: int, registers: int, shared_bytes: int) -> float:
    """Resident warps per SM over the SM's maximum (0 when a block cannot run)."""
    blocks = blocks_per_sm(arch, block_threads, registers, shared_bytes)
    return blocks * -(-block_threads // 32) * 32 / SM_LIMITS[arch].max_threads
