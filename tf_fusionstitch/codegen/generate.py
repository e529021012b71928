"""Cluster -> complete kernel source for a target (schedule, lower, print)."""

from __future__ import annotations

import dataclasses

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.codegen import kernel_ir, printer, shape_fn
from tf_fusionstitch.schedule import Schedule, build_schedule


@dataclasses.dataclass(frozen=True)
class GeneratedKernel:
    source: str
    schedule: Schedule


def generate_cpp(cluster: ir.Cluster) -> GeneratedKernel:
    """Validates the cluster and prints its C++ kernel (docs/KERNEL_ABI.md)."""
    cluster.validate()
    sched = build_schedule(cluster)
    kernel = kernel_ir.lower(sched)
    target = printer.CPP
    source = "\n".join([
        printer.headers(target),
        shape_fn.print_meta(sched, target.export),
        shape_fn.print_shape_fn(sched, kernel, target.export),
        printer.print_kernel(kernel, target),
        "",
    ])
    return GeneratedKernel(source, sched)
