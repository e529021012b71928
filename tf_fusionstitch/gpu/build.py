"""The GPU target's build steps for one cluster, usable without a GPU (TF-free).

- `build_emulation`: the CUDA kernel's schedule printed as a C++ block
  function (codegen/gpu_printer.py) and compiled like a CPU kernel; run it
  with `runtime.cpu_kernel.CpuKernel` to check the GPU index math, barriers
  and shuffles against NumPy.
- `compile_cuda`: the CUDA kernel compiled by NVRTC to PTX per architecture,
  with ptxas' resource report (registers, shared memory, spills) where a
  CUDA toolkit's ptxas is installed.
- `host_shape` / `load_cuda`: the kernel's host side (fs_shape, compiled for
  the CPU) and the kernel loaded on a GPU with CuPy.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Dict, Optional, Sequence

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.codegen.generate import (GeneratedCudaKernel, generate_cuda,
                                              generate_gpu_emulation)
from tf_fusionstitch.codegen.gpu_printer import KERNEL_NAME, NVRTC_OPTIONS, split_workspace
from tf_fusionstitch.gpu import cost
from tf_fusionstitch.gpu.mapping import split_phases
from tf_fusionstitch.runtime import cpu_compiler, nvrtc
from tf_fusionstitch.runtime.cuda_kernel import CudaKernel, HostShape

DEFAULT_ARCHS = ("sm_80", "sm_90")


def build_emulation(cluster: ir.Cluster, reverse_threads: bool = False,
                    timeout: float = 120, gpu=None, plan=None) -> pathlib.Path:
    """Shared object (docs/KERNEL_ABI.md, CPU ABI) emulating the CUDA kernel
    (of `plan`, or the one generate_cuda chooses for `gpu`);
    `reverse_threads` runs each phase's threads in descending order."""
    source = generate_gpu_emulation(cluster, reverse_threads, gpu, plan).source
    return cpu_compiler.compile_shared_object(source, timeout=timeout)


@dataclasses.dataclass(frozen=True)
class CudaBuild:
    arch: str
    ptx: str
    resources: Optional[nvrtc.KernelResources]   # None where ptxas is not installed


def compile_cuda(cluster: ir.Cluster, archs: Sequence[str] = DEFAULT_ARCHS,
                 assemble: bool = True, gpu=None) -> tuple:
    """(GeneratedCudaKernel, {arch: CudaBuild}), the plan chosen for `gpu`
    (None: by thresholds). Raises NvrtcUnavailable without NVRTC,
    CudaCompileError when NVRTC or ptxas rejects the kernel."""
    generated: GeneratedCudaKernel = generate_cuda(cluster, gpu)
    builds: Dict[str, CudaBuild] = {}
    for arch in archs:
        ptx = nvrtc.compile_ptx(generated.source, arch, NVRTC_OPTIONS)
        resources = None
        if assemble and nvrtc.ptxas_path():
            (resources,) = [r for r in nvrtc.ptxas_resources(ptx, arch)
                            if r.kernel == KERNEL_NAME]
        builds[arch] = CudaBuild(arch, ptx, resources)
    return generated, builds


def host_shape(generated: GeneratedCudaKernel, timeout: float = 120) -> HostShape:
    """The kernel's fs_shape, compiled for the host."""
    path = cpu_compiler.compile_shared_object(generated.host_source, timeout=timeout)
    c = generated.plan.schedule.cluster
    types = c.types()
    return HostShape(path, [t.rank for _, t in c.inputs], [types[o].rank for o in c.outputs],
                     generated.n_ext)


def device_gpu() -> Optional[str]:
    """The cost.GPUS name of the current device, or None (needs CuPy)."""
    import cupy
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return cost.gpu_named(name.decode() if isinstance(name, bytes) else name)


def load_cuda(cluster: ir.Cluster, gpu=None, plan=None) -> CudaKernel:
    """The cluster's CUDA kernel on the current GPU (needs CuPy and a GPU),
    compiled by NVRTC for the device's architecture with NVRTC_OPTIONS: of
    `plan`, else of the plan chosen for `gpu` (a cost.GPUS name; "auto":
    the one the device's name contains, if any; None: the thresholds)."""
    import cupy
    if gpu == "auto":
        gpu = device_gpu()
    generated = generate_cuda(cluster, gpu, plan)
    arch = "sm_" + cupy.cuda.Device().compute_capability
    cubin = nvrtc.cached_cubin(generated.source, arch, NVRTC_OPTIONS)
    c = generated.plan.schedule.cluster
    types = c.types()
    m = generated.plan.mapping
    workspace = [_WORKSPACE_DTYPES[ctype] for _, ctype in split_workspace(generated.plan)]
    return CudaKernel(cubin, host_shape(generated), [t.dtype for _, t in c.inputs],
                      [types[o].dtype for o in c.outputs], m.block_threads, m.rows_per_block,
                      m.row_blocks, split_phases(generated.plan.kernel), workspace)


# C types of workspace arrays (gpu_printer.split_workspace) as NumPy dtypes.
_WORKSPACE_DTYPES = {"float": "float32", "double": "float64", "int": "int32",
                     "int32_t": "int32", "int64_t": "int64"}
