"""Build a CPU kernel for a cluster: generate, compile (cached), identify.

TF-free: used by the rewriter, and directly by tests and tools that check
kernels against NumPy without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import List, Sequence, Union

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.codegen import printer
from tf_fusionstitch.codegen.generate import generate_cpp
from tf_fusionstitch.runtime import cache, kernel_library

# Bumped whenever generated code changes meaning for the same spec, so a kernel
# key never names code from an older generator.
GENERATOR_VERSION = "cpu-14"


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


def build_cpu_kernel(cluster: ir.Cluster, timeout: float = 120) -> CompiledKernel:
    """Raises SpecError/UnsupportedCluster for an unfusible cluster and
    CompileError when the compiler is missing or fails."""
    (built,) = build_cpu_kernels([cluster], timeout=timeout)
    if isinstance(built, Exception):
        raise built
    return built


def build_cpu_kernels(clusters: Sequence[ir.Cluster], timeout: float = 120
                      ) -> List[Union[CompiledKernel, Exception]]:
    """build_cpu_kernel for each cluster, compiling the missing kernels
    several to a compiler run (runtime/kernel_library.py): a CompiledKernel,
    or the exception that stopped that cluster alone (SpecError and
    UnsupportedCluster from the generator, CompileError from the compiler)."""
    generated: List[object] = []
    for cluster in clusters:
        try:
            generated.append(generate_cpp(cluster))
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
        out.append(CompiledKernel(kernel_key(spec), spec, built.path, g.source, g.num_loops,
                                  g.buffered, len(g.schedules), built.symbol))
    return out


def kernel_key(spec: str) -> str:
    """A kernel's key in the op registry: its spec's and the generator's hash."""
    return cache.content_key(GENERATOR_VERSION, spec)[:32]
