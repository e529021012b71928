"""The GPU target's clusters checked as `cuda_check --clusters` checks
exported specs, many at a time (TF-free; tests/models/test_zoo.py runs it
on every zoo model's clusters).

Each distinct cluster must
- compile with NVRTC and assemble with ptxas for each of ARCHS,
- without spills and without a stack frame, except where KNOWN_SPILLS names
  the cause,
- and its emulated CUDA schedule (the plan compile_cuda compiled) must agree
  with its CPU kernel on random inputs (output_checks.agrees_with_cpu, the
  tool's comparison), or, where KNOWN_MISMATCHES names why it cannot, within
  the tolerance named there.

CPU and emulated kernels are compiled several to a compiler run (kernels.py;
those the emulated target already built come from the kernel cache), CUDA
kernels BATCH to an NVRTC and ptxas run (batched_source), on threads beside
the emulations.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import pathlib
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import kernels, patterns
from tf_fusionstitch.codegen.generate import generate_cuda
from tf_fusionstitch.codegen.gpu_printer import KERNEL_NAME, NVRTC_OPTIONS
from tf_fusionstitch.gpu import build as gpu_build
from tf_fusionstitch.runtime import nvrtc
from tf_fusionstitch.tools.output_checks import agrees_with_cpu

ARCHS = gpu_build.DEFAULT_ARCHS                     # sm_80 and sm_90
ROWS = (0, 1, 13, 37)                               # cuda_check's default --rows
# A row count is left out where the inputs would pass this many elements
# (0 and 1 never are): a CNN's dynamic dimension is its batch, and one image
# of 56x56 already spans many blocks of every mapping. With all four counts a
# tenth of the zoo's clusters took 417M input elements, most of the check's
# time; so capped, 112M.
MAX_ELEMENTS = 1 << 19
BATCH = 32                                          # kernels per NVRTC and ptxas run
PRELUDE_END = "// ---- end of CUDA prelude ----\n"


@dataclasses.dataclass(frozen=True)
class KnownSpill:
    """Spills or a stack frame that a cluster may have on the `archs`, with
    the reason, recognised by `applies(cluster, ptxas' resources)`."""
    reason: str
    archs: Tuple[str, ...]
    applies: Callable[[ir.Cluster, nvrtc.KernelResources], bool]


def _prims(cluster: ir.Cluster) -> set:
    return {op.prim for op in cluster.ops}


def _spill_free_without_ieee_slow_paths(cluster: ir.Cluster, arch: str) -> bool:
    """Whether the cluster's kernel, compiled with approximate division and
    square root (which have no slow path), assembles without spills."""
    ptx = nvrtc.compile_ptx(generate_cuda(cluster, None).source, arch,
                            NVRTC_OPTIONS + ("--prec-div=false", "--prec-sqrt=false"))
    return not any(r.spill_stores or r.spill_loads or r.stack_bytes
                   for r in nvrtc.ptxas_resources(ptx, arch))


# Measured on every zoo cluster (tiny sizes, inference and train step) with
# CUDA 13's NVRTC and ptxas: all of them compile for sm_80 and sm_90, and these
# are the only ones with spills or a stack frame (7 of 2614 distinct clusters).
# None can be removed by the kernel printer alone today; each is named so that
# any other spill fails the check.
KNOWN_SPILLS = [
    KnownSpill(
        "CUDA's sinf and cosf keep a small local array for the reduction of large "
        "arguments (Payne-Hanek): a stack frame, no spills (rotary embeddings of "
        "llama, mistral, gemma, qwen2, phi3)",
        ("sm_80", "sm_90"),
        lambda c, r: bool(_prims(c) & {"sin", "cos"}) and not (r.spill_stores
                                                                or r.spill_loads)),
    KnownSpill(
        "on sm_80 ptxas calls the IEEE-rounded division and square root's slow path as "
        "a subroutine and saves the registers live across the call; inside a per-thread "
        "loop over columns with a dozen pointers live those saves are spills, at 32-48 "
        "registers, far below the limit (a batch norm's moving statistics and rsqrt over "
        "8 channels in the MobileNet train steps; sm_90 compiles the same kernel without). "
        "Recognised by its cause: the same kernel with approximate division and square "
        "root (no slow path to call) does not spill",
        ("sm_80",),
        lambda c, r: bool(_prims(c) & {"div", "reciprocal", "sqrt", "rsqrt"})
        and _spill_free_without_ieee_slow_paths(c, r.arch)),
    KnownSpill(
        "one thread computes hundreds of scalar outputs: an optimizer's per-variable "
        "scalars (bias corrections, pow of the step count) fused side by side into one "
        "kernel with ~1000 pointer parameters, whose registers run out (EfficientNetV2B0's "
        "train step: 730 outputs); the rewriter would have to split such a cluster",
        ("sm_80", "sm_90"),
        lambda c, r: len(c.outputs) >= 256
        and all(c.types()[o].shape == () for o in c.outputs)),
]


@dataclasses.dataclass(frozen=True)
class KnownMismatch:
    """Clusters (`applies`) whose emulation is measured to differ from the
    CPU kernel beyond output_checks' tolerance for `reason`; they must still
    agree within `rtol` (normwise, as compare_outputs), which is named here
    rather than hidden in the comparison."""
    reason: str
    rtol: float
    applies: Callable[[ir.Cluster], bool]


_REDUCTIONS = {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"}


def _sixteen_bit_sums(cluster: ir.Cluster) -> bool:
    types = [t for _, t in cluster.inputs] + [op.type for op in cluster.ops]
    return (any(t.dtype in ("bfloat16", "float16") for t in types)
            and bool(_prims(cluster) & _REDUCTIONS))


# Measured on every zoo cluster (seed 0, ROWS): the only emulations that fail
# output_checks.agrees_with_cpu. Outputs that random inputs make ill-conditioned
# (an optimizer's division by a random second moment near 0 after a batch sum:
# MobileNetV3Small's and Xception's batch norms, DeBERTa-v3's relative position
# embedding) need no rule: the check measures how far float32 rounding alone moves
# them (output_checks.within_float32_spread).
KNOWN_MISMATCHES = [
    KnownMismatch(
        "bfloat16 values computed from a sum: the GPU sums in another order than the "
        "CPU kernel, so the float32 sum lands 1 or 2 float32 units away and its "
        "bfloat16 rounding one bfloat16 unit away (2^-8 of the value: 0.0039 at 0.57, "
        "0.0156 at 2.8); a 16-bit result has no float64 reference to fall back on. "
        "Allowed: one bfloat16 unit of the output's largest magnitude (MobileNetV3Large's "
        "mixed_bfloat16 batch norms, 5 clusters)",
        2.0 ** -7, _sixteen_bit_sums),
]


def mismatch_rule(cluster: ir.Cluster) -> Optional[KnownMismatch]:
    return next((k for k in KNOWN_MISMATCHES if k.applies(cluster)), None)


def unavailable() -> str:
    """Why the check cannot run here ("" where it can)."""
    if nvrtc.nvrtc_version() is None or nvrtc.ptxas_path() is None:
        return ("needs NVRTC (pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12) and ptxas "
                "(CUDA toolkit)")
    return ""


def spill_reason(cluster: ir.Cluster, resources: nvrtc.KernelResources) -> Optional[str]:
    """The KNOWN_SPILLS reason that covers these spills, if any."""
    return next((k.reason for k in KNOWN_SPILLS
                 if resources.arch in k.archs and k.applies(cluster, resources)), None)


def _resource_problems(name: str, cluster: ir.Cluster, res) -> List[str]:
    if res is None:
        return [f"{name}: ptxas gave no resource report"]
    if (res.spill_stores or res.spill_loads or res.stack_bytes) \
            and spill_reason(cluster, res) is None:
        return [f"{name}: {res.arch}: spills {res.spill_stores}/{res.spill_loads} bytes "
                f"(stores/loads), stack frame {res.stack_bytes} bytes, "
                f"{res.registers} registers"]
    return []


def compile_problems(name: str, cluster: ir.Cluster, archs=ARCHS) -> List[str]:
    """NVRTC and ptxas of one cluster (gpu/build.compile_cuda): what went
    wrong, as readable lines."""
    try:
        _, builds = gpu_build.compile_cuda(cluster, archs)
    except Exception as exc:  # noqa: BLE001  (a kernel NVRTC or ptxas rejects fails the check)
        return [f"{name}: does not compile: {type(exc).__name__}: {str(exc)[:500]}"]
    return [line for built in builds.values()
            for line in _resource_problems(name, cluster, built.resources)]


def batched_source(sources: Sequence[str]) -> str:
    """Generated CUDA kernels as one translation unit: the prelude once, each
    kernel's own code in a namespace of its own with its entry function
    renamed KERNEL_NAME_<i>. NVRTC's and ptxas' start and the prelude cost a
    kernel alone about as much as its own code; ptxas allocates registers per
    entry function, so each kernel's report is the one it has alone (measured
    on the zoo's 2614 clusters: identical for sm_80 and sm_90, in a third of
    the time; tests/gpu/test_cuda_clusters_check.py checks the patterns).
    ValueError where the sources do not share the prelude."""
    parts = []
    for i, source in enumerate(sources):
        prelude, end, own = source.partition(PRELUDE_END)
        entry = f" {KERNEL_NAME}("
        if not end or own.count(entry) != 1 or (parts and parts[0] != prelude + end):
            raise ValueError("not a generated kernel with the shared prelude")
        if not parts:
            parts.append(prelude + end)
        parts.append(f"namespace k{i} {{\n{own.replace(entry, f' {KERNEL_NAME}_{i}(')}\n}}\n")
    return "".join(parts)


def batch_compile_problems(clusters: Mapping[str, ir.Cluster], archs=ARCHS) -> List[str]:
    """compile_problems of several clusters, compiled as one batched_source
    per architecture; where NVRTC or ptxas rejects the batch, each cluster
    alone, so that the lines name the ones that fail."""
    try:
        source = batched_source([generate_cuda(c, None).source for c in clusters.values()])
        found = {}
        for arch in archs:
            ptx = nvrtc.compile_ptx(source, arch, NVRTC_OPTIONS)
            found[arch] = {r.kernel: r for r in nvrtc.ptxas_resources(ptx, arch)}
    except Exception:  # noqa: BLE001  (compile_problems says which and why)
        return [line for name, cluster in clusters.items()
                for line in compile_problems(name, cluster, archs)]
    return [line for i, (name, cluster) in enumerate(clusters.items()) for arch in archs
            for line in _resource_problems(name, cluster,
                                           found[arch].get(f"{KERNEL_NAME}_{i}"))]


def row_counts(cluster: ir.Cluster, rows=ROWS) -> List[int]:
    """The counts of `rows` at which the cluster's inputs stay within
    MAX_ELEMENTS (an upper bound: each dynamic dimension taking the count)."""
    one = patterns.random_inputs(cluster, 1, np.random.default_rng(0))
    dynamic = [t.shape.count(None) for _, t in cluster.inputs]
    return [n for n in rows
            if sum(a.size * n ** d for a, d in zip(one, dynamic)) <= MAX_ELEMENTS or n <= 1]


def emulation_problems(clusters: Mapping[str, ir.Cluster], rows=ROWS, seed=0) -> List[str]:
    """Each cluster's emulated CUDA schedule against its CPU kernel."""
    names, todo = list(clusters), list(clusters.values())
    cpu = kernels.build_cpu_kernels(todo, target=kernels.CPU)
    emulated = kernels.build_cpu_kernels(todo, target=kernels.CUDA_EMULATED)
    bad = []
    for name, cluster, c, e in zip(names, todo, cpu, emulated):
        for what, built in (("CPU kernel", c), ("emulated CUDA kernel", e)):
            if isinstance(built, Exception):
                bad.append(f"{name}: the {what} does not build: {type(built).__name__}: "
                           f"{str(built)[:500]}")
        if isinstance(c, Exception) or isinstance(e, Exception):
            continue
        counts = row_counts(cluster, rows)
        err, ok = agrees_with_cpu(e.runner(), c.runner(), cluster, counts,
                                  np.random.default_rng(seed))
        known = None if ok else mismatch_rule(cluster)
        if known is not None:   # the same inputs, within the rule's named tolerance
            err, ok = agrees_with_cpu(e.runner(), c.runner(), cluster, counts,
                                      np.random.default_rng(seed), rtol=known.rtol)
        if not ok:
            bad.append(f"{name}: the emulated CUDA kernel differs from the CPU kernel "
                       f"(largest error {err:.3g})")
    return bad


def problems(clusters: Mapping[str, ir.Cluster], archs=ARCHS, workers: int = 2
             ) -> Dict[str, List[str]]:
    """{name: what is wrong with it, as readable lines} for the clusters of
    `clusters` ({name: cluster}) that fail; {} when all pass. NVRTC and
    ptxas run on `workers` threads while the emulations run."""
    items = list(clusters.items())
    batches = [dict(items[i:i + BATCH]) for i in range(0, len(items), BATCH)]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        compiled = [pool.submit(batch_compile_problems, b, archs) for b in batches]
        lines = emulation_problems(clusters)
        for f in compiled:
            lines += f.result()
    bad: Dict[str, List[str]] = {}
    for line in sorted(lines):
        bad.setdefault(line.split(":", 1)[0], []).append(line)
    return bad


class CheckedOnce:
    """Which clusters passed already in this test session: one empty file
    per kernel key in `directory`, so that the zoo's many models, in several
    processes (pytest-xdist workers, `make test`'s parts), check a cluster
    they share once. A cluster that fails is checked again by the next
    model that has it, and fails there too."""

    def __init__(self, directory):
        self._dir = pathlib.Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(cluster: ir.Cluster) -> str:
        return kernels.kernel_key(cluster.to_json(), kernels.CUDA_EMULATED)

    def unchecked(self, clusters: Mapping[str, ir.Cluster]) -> Dict[str, ir.Cluster]:
        return {n: c for n, c in clusters.items() if not (self._dir / self.key(c)).exists()}

    def passed(self, clusters: Mapping[str, ir.Cluster]) -> None:
        for cluster in clusters.values():
            (self._dir / self.key(cluster)).touch()


def session_record() -> CheckedOnce:
    """The record shared by the processes of one test session (tests/conftest.py)."""
    return CheckedOnce(pathlib.Path(os.environ["TF_FUSIONSTITCH_TEST_SESSION_CACHE"])
                       / "cuda-clusters-passed")
