"""Cluster -> complete kernel source for a target (schedule, lower, print):
C++ (generate_cpp), CUDA (generate_cuda) and the CUDA schedule emulated in
C++ (generate_gpu_emulation)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.codegen import gpu_printer, kernel_ir, pack, printer, scatter, shape_fn
from tf_fusionstitch.gpu.choice import plan_gpu
from tf_fusionstitch.gpu.mapping import GpuPlan
from tf_fusionstitch.schedule import UnsupportedCluster, build_schedule


@dataclasses.dataclass(frozen=True)
class GeneratedKernel:
    source: str
    schedules: tuple         # one Schedule; one per part of a packed kernel

    @property
    def num_loops(self) -> int:
        return max(s.num_loops for s in self.schedules)

    @property
    def buffered(self) -> tuple:
        return tuple(sorted(set().union(*(s.buffered for s in self.schedules))))


def generate_cpp(cluster: ir.Cluster) -> GeneratedKernel:
    """Validates the cluster and prints its C++ kernel (docs/KERNEL_ABI.md);
    a cluster of unconnected parts becomes a packed kernel (codegen/pack.py)."""
    cluster.validate()
    if scatter.is_scatter(cluster):   # segment sums: a kernel of their own
        form = scatter.scatter_form(cluster)
        return GeneratedKernel(scatter.generate_scatter_cpp(cluster),
                               (build_schedule(form.rows),))
    parts = ir.connected_parts(cluster)
    if len(parts) > 1:
        return GeneratedKernel(*pack.generate_packed_cpp(cluster, parts))
    sched = build_schedule(cluster)
    kernel = kernel_ir.lower(sched, kernel_ir.cpu_lanes(sched))
    target = printer.CPP
    source = "\n".join([
        printer.headers(target),
        shape_fn.print_meta(sched, target.export),
        shape_fn.print_shape_fn(sched, kernel, target.export),
        printer.print_kernel(kernel, target),
        "",
    ])
    return GeneratedKernel(source, (sched,))


@dataclasses.dataclass(frozen=True)
class GeneratedCudaKernel:
    source: str              # CUDA C++ for NVRTC: `fs_kernel` (docs/KERNEL_ABI.md, "CUDA kernels")
    plan: GpuPlan            # schedule as lowered for the GPU, and its mapping
    n_ext: int               # run-time extents the kernel takes after its buffers
    host_source: str         # C++ with fs_meta and fs_shape: the launcher's extents and grid


def generate_cuda(cluster: ir.Cluster, gpu=None, plan: Optional[GpuPlan] = None
                  ) -> GeneratedCudaKernel:
    """Validates the cluster and prints its CUDA kernel (docs/KERNEL_ABI.md):
    for `plan`, else the plan chosen for `gpu` (gpu_cost.GPUS; None: the
    column-count thresholds). Raises UnsupportedCluster where the GPU target
    cannot fuse it."""
    cluster.validate()
    plan = plan or plan_gpu(gpu_schedule(cluster), gpu)
    n_ext = shape_fn.num_ext(plan.schedule)
    return GeneratedCudaKernel(gpu_printer.print_cuda(plan, n_ext), plan, n_ext,
                               _host_part(plan))


def generate_gpu_emulation(cluster: ir.Cluster, reverse_threads: bool = False, gpu=None,
                           plan: Optional[GpuPlan] = None) -> GeneratedKernel:
    """The CUDA kernel's schedule (as generate_cuda chooses it) as a C++
    block function (CPU ABI of docs/KERNEL_ABI.md): threads of a block run as
    loops per phase (in ascending or descending order), so the CPU runtime
    checks the GPU index math, barriers and shuffles."""
    cluster.validate()
    plan = plan or plan_gpu(gpu_schedule(cluster), gpu)
    source = "\n".join([_host_part(plan), gpu_printer.print_emulation(plan, reverse_threads),
                        ""])
    return GeneratedKernel(source, (plan.schedule,))


def gpu_schedule(cluster: ir.Cluster):
    """The cluster's schedule for the GPU target, which launches one kernel
    of one iteration space per cluster (parts that share it, such as sibling
    reductions of one input, are one kernel): UnsupportedCluster for
    segment sums, which only the CPU target prints, and from build_schedule
    for parts in different iteration spaces (a CPU pack)."""
    if scatter.is_scatter(cluster):
        raise UnsupportedCluster("segment sums have no GPU kernel yet: they stay TF ops "
                                 "on the GPU target")
    return build_schedule(cluster)


def _host_part(plan: GpuPlan) -> str:
    target = printer.CPP
    return "\n".join([printer.headers(target),
                      shape_fn.print_meta(plan.schedule, target.export),
                      shape_fn.print_shape_fn(plan.schedule, plan.kernel, target.export)])
