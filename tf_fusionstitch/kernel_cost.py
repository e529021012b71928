"""The interface every kernel cost evaluator of the package implements.

Two evaluators price a fused kernel before anything runs:

- the CPU delta evaluator (rewriters/cpu_cost_model.py, CpuEvaluator), with
  which fusion="explore" decides which ops form one kernel;
- the GPU latency evaluator (gpu/cost.py, LatencyModel), with which
  gpu/choice.py decides how a CUDA block runs a kernel already formed.

Both compute the same thing for one kernel: the time it moves its bytes
(`memory_s`), the time of its arithmetic or instruction issue
(`compute_s`), and the latency they add up to once the two overlap and the
evaluator's own terms join them (`latency_s`; the CPU adds a launch and its
cache penalty, the GPU the part of the shorter time that does not overlap).
An evaluator is bound to its machine and problem size, so its `estimate`
takes the kernel alone: a `KernelCostModel[K]` prices kernels of type K.

Only the CPU evaluator also prices the alternative, the kernel's ops run
alone by TensorFlow (its Delta): exploring what to fuse needs that
baseline, choosing a mapping for a kernel already formed does not.
No TensorFlow import here.
"""

from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable

K = TypeVar("K", contravariant=True)


@runtime_checkable
class KernelEstimate(Protocol):
    """One kernel's predicted time, in seconds."""

    memory_s: float    # its bytes through memory at the bandwidth it reaches
    compute_s: float   # its arithmetic, or its instructions' issue

    @property
    def latency_s(self) -> float:
        """The kernel's predicted time: both parts overlapped, plus the
        evaluator's own terms."""
        ...


@runtime_checkable
class KernelCostModel(Protocol[K]):
    """An evaluator for one machine and problem size."""

    def estimate(self, kernel: K) -> KernelEstimate:
        ...
