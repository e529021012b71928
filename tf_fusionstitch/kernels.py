"""Build a CPU kernel for a cluster: generate, compile (cached), identify.

TF-free: used by the rewriter, and directly by tests and tools that check
kernels against NumPy without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import pathlib

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.codegen.generate import generate_cpp
from tf_fusionstitch.runtime import cache, cpu_compiler

# Bumped whenever generated code changes meaning for the same spec, so a kernel
# key never names code from an older generator.
GENERATOR_VERSION = "cpu-13"


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    key: str                 # identifies (spec, generator, target) in the op registry
    spec: str                # canonical JSON the kernel was generated from
    path: pathlib.Path       # shared object exporting docs/KERNEL_ABI.md
    source: str
    num_loops: int
    buffered: tuple
    parts: int = 1           # a packed kernel's parts (codegen/pack.py)


def build_cpu_kernel(cluster: ir.Cluster, timeout: float = 120) -> CompiledKernel:
    """Raises SpecError/UnsupportedCluster for an unfusible cluster and
    CompileError when the compiler is missing or fails."""
    spec = cluster.to_json()
    generated = generate_cpp(cluster)
    path = cpu_compiler.compile_shared_object(generated.source, timeout=timeout)
    key = cache.content_key(GENERATOR_VERSION, spec)[:32]
    return CompiledKernel(key, spec, path, generated.source, generated.num_loops,
                          generated.buffered, len(generated.schedules))
