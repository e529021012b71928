"""Build a CPU kernel for a cluster: generate, compile (cached), identify.

A kernel is built for a *target*: "cpu", the C++ kernel, or "cuda-emulated",
the cluster's CUDA schedule printed as C++ (codegen/gpu_printer.py: a block's
threads as loops per phase, with the CUDA kernel's index math, barriers and
shuffles), which the same CPU op runs. Both export docs/KERNEL_ABI.md's CPU
ABI. The kernel key names the target, so a graph's FusionStitch node says
which kernel it runs (`target_of`).

TF-free: used by the rewriter, and directly by tests and tools that check
kernels against NumPy without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import List, Sequence, Union

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.codegen import printer
from tf_fusionstitch.codegen.generate import generate_cpp, generate_gpu_emulation
from tf_fusionstitch.runtime import cache, kernel_library

# Bumped whenever generated code changes meaning for the same spec, so a kernel
# key never names code from an older generator.
GENERATOR_VERSION = "cpu-14"

CPU, CUDA_EMULATED = "cpu", "cuda-emulated"
TARGETS = (CPU, CUDA_EMULATED)


def generator(target: str):
    """The target's generator: cluster -> GeneratedKernel (CPU ABI source).
    Looked up per call, so a test may replace a generator of this module."""
    if target not in TARGETS:
        raise ValueError(f"unknown kernel target {target!r}; the targets are {TARGETS}")
    return generate_cpp if target == CPU else generate_gpu_emulation


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    key: str                 # identifies (spec, generator, target) in the op registry
    spec: str                # canonical JSON the kernel was generated from
    path: pathlib.Path       # shared object exporting docs/KERNEL_ABI.md
    source: str
    num_loops: int
    buffered: tuple
    parts: int = 1           # a packed kernel's parts (codegen/pack.py)
    # Suffix of its ABI symbols in `path`, a library of several kernels
    # (runtime/kernel_library.py); "" where it was compiled alone.
    symbol: str = ""

    def runner(self, *args, **kwargs):
        """The kernel loaded for NumPy: runtime.cpu_kernel.CpuKernel of its
        path and symbol (further arguments as CpuKernel's)."""
        from tf_fusionstitch.runtime.cpu_kernel import CpuKernel
        return CpuKernel(self.path, *args, symbol=self.symbol, **kwargs)


def build_cpu_kernel(cluster: ir.Cluster, timeout: float = 120,
                     target: str = CPU) -> CompiledKernel:
    """Raises SpecError/UnsupportedCluster for an unfusible cluster and
    CompileError when the compiler is missing or fails."""
    (built,) = build_cpu_kernels([cluster], timeout=timeout, target=target)
    if isinstance(built, Exception):
        raise built
    return built


def build_cpu_kernels(clusters: Sequence[ir.Cluster], timeout: float = 120,
                      target: str = CPU) -> List[Union[CompiledKernel, Exception]]:
    """build_cpu_kernel for each cluster, compiling the missing kernels
    several to a compiler run (runtime/kernel_library.py): a CompiledKernel,
    or the exception that stopped that cluster alone (SpecError and
    UnsupportedCluster from the generator, CompileError from the compiler)."""
    generate = generator(target)
    generated: List[object] = []
    for cluster in clusters:
        try:
            generated.append(generate(cluster))
        except Exception as e:  # noqa: BLE001  (that cluster's failure, as build_cpu_kernel's)
            generated.append(e)
    sources = [g.source for g in generated if not isinstance(g, Exception)]
    objects = iter(kernel_library.compile_kernels(sources, printer.headers(printer.CPP),
                                                  timeout=timeout))
    out: List[Union[CompiledKernel, Exception]] = []
    for cluster, g in zip(clusters, generated):
        if isinstance(g, Exception):
            out.append(g)
            continue
        built = next(objects)
        if isinstance(built, Exception):
            out.append(built)
            continue
        spec = cluster.to_json()
        out.append(CompiledKernel(kernel_key(spec, target), spec, built.path, g.source,
                                  g.num_loops, g.buffered, len(g.schedules), built.symbol))
    return out


def kernel_key(spec: str, target: str = CPU) -> str:
    """A kernel's key in the op registry: the hash of its spec, the generator
    and the target (the CPU target's key names no target, as before targets)."""
    generator(target)   # known, or ValueError
    parts = (GENERATOR_VERSION,) if target == CPU else (GENERATOR_VERSION, target)
    return cache.content_key(*parts, spec)[:32]


def target_of(spec: str, key: str) -> str:
    """The target whose kernel of `spec` has `key`; ir.SpecError if none."""
    for target in TARGETS:
        if kernel_key(spec, target) == key:
            return target
    raise ir.SpecError(
        f"the kernel_key {key[:40]!r} is not the hash of the spec under kernel generator "
        f"{GENERATOR_VERSION} for any target ({', '.join(TARGETS)}): the spec was edited "
        "or corrupted, or another version of tf_fusionstitch wrote it (convert the model "
        "again)")
