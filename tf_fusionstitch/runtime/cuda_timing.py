"""Timing generated CUDA kernels on the current GPU with CuPy (TF-free).

Shared by benchmarks/gpu_patterns.py and tools/cuda_check.py: the device's
architecture and L2, its copy bandwidth (the ceiling memory-bound kernels
are measured against), CUDA-event timing of calls queued behind a spin
kernel (so launch gaps stay out), host-clock timing of back-to-back calls
(for comparing with JAX, whose kernels run on a stream our events cannot
bracket), and a kernel bound to fixed device buffers. Needs a GPU.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import numpy as np

from tf_fusionstitch.codegen.gpu_printer import NVRTC_OPTIONS
from tf_fusionstitch.runtime import nvrtc
from tf_fusionstitch.runtime.cuda_kernel import launches

COPY_BYTES = 1 << 30          # copy-bandwidth buffer: far larger than any L2
MAX_INPUT_SETS = 64


# A float4 copy (one vector per thread) and a spin on the global timer that
# keeps the GPU busy while the host enqueues the timed calls behind it.
HELPERS = r"""
extern "C" __global__ void fs_copy4(const float4* __restrict__ src, float4* __restrict__ dst,
                                    long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}
extern "C" __global__ void fs_spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


class Device:
    """The current GPU: architecture, L2, helper kernels, event timing."""

    def __init__(self, cp):
        self.cp = cp
        dev = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"]
        self.name = name.decode() if isinstance(name, bytes) else name
        self.arch = "sm_" + dev.compute_capability
        self.l2_bytes = int(props.get("l2CacheSize", 0)) or 64 << 20
        module = cp.RawModule(path=str(nvrtc.cached_cubin(HELPERS, self.arch, NVRTC_OPTIONS)))
        self._copy4 = module.get_function("fs_copy4")
        self._spin = module.get_function("fs_spin")

    def spin(self, ms: float) -> None:
        self._spin((1,), (1,), (np.uint64(int(ms * 1e6)),))

    def event_times(self, calls: Sequence[Callable], n_timed: int, n_warmup: int) -> tuple:
        """(median ms per call, host ms to enqueue them, spin ms): calls[i % len]
        for each timed call, an event pair around each, enqueued behind a spin."""
        cp = self.cp
        for i in range(n_warmup):
            calls[i % len(calls)]()
        cp.cuda.Device().synchronize()
        pairs = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(n_timed)]
        spin_ms = 5.0 + 0.05 * n_timed
        self.spin(spin_ms)
        t0 = time.perf_counter()
        for i, (start, end) in enumerate(pairs):
            start.record()
            calls[i % len(calls)]()
            end.record()
        host_ms = (time.perf_counter() - t0) * 1e3
        pairs[-1][1].synchronize()
        times = [cp.cuda.get_elapsed_time(s, e) for s, e in pairs]
        return statistics.median(times), host_ms, spin_ms

    def copy_bandwidth(self, n_timed: int) -> dict:
        """GB/s (bytes read + written) of a D2D memcpy and of the float4 kernel."""
        cp = self.cp
        src = cp.random.random(COPY_BYTES // 4, dtype=cp.float32)
        dst = cp.empty_like(src)
        n4 = src.size // 4
        memcpy = lambda: dst.data.copy_from_device_async(src.data, src.nbytes)  # noqa: E731
        kernel = lambda: self._copy4((-(-n4 // 256),), (256,), (src, dst, np.int64(n4)))  # noqa
        out = {}
        for label, fn in (("memcpy", memcpy), ("kernel", kernel)):
            ms, _, _ = self.event_times([fn], n_timed, 3)
            out[label] = 2 * src.nbytes / (ms * 1e-3) / 1e9
        if not cp.array_equal(src, dst):
            raise AssertionError("the copy kernel did not copy its buffer")
        return out  # the caller frees the buffers' pool blocks


def input_sets(bytes_per_call: int, l2_bytes: int) -> int:
    """Copies of the inputs to rotate so that a call's data left the L2 since
    its last use: the calls in between move at least twice the L2."""
    return min(MAX_INPUT_SETS, 1 + -(-2 * l2_bytes // max(1, bytes_per_call)))


class BoundKernel:
    """One call of a generated kernel on fixed device buffers: the host shape
    function runs once and outputs and workspace are allocated up front, so
    a call is the kernel's launches alone (as in CudaKernel.run, which the
    correctness check also runs)."""

    def __init__(self, kernel, arrays: Sequence):
        """`kernel`: a runtime.cuda_kernel.CudaKernel; `arrays`: its inputs on the device."""
        import cupy as cp  # the caller checked that a GPU exists
        out_shapes, ext, work = kernel.host([a.shape for a in arrays])
        # NaN until a launch writes them: a kernel that skips an element fails the check.
        self.outputs = [cp.full(s, np.nan, dtype=d) if d.kind == "f" else cp.empty(s, dtype=d)
                        for s, d in zip(out_shapes, kernel.out_dtypes)]
        extents = [np.int64(e) for e in ext]
        self._launches = []
        for begin, end, grid in launches(work, kernel.rows_per_block, kernel.row_blocks):
            args = (np.int64(begin), np.int64(end), *arrays, *self.outputs, *extents)
            if kernel.row_blocks == 1:
                self._launches.append(((grid,), (kernel.block_threads,), args))
                continue
            ws = [cp.empty((end - begin) * kernel.row_blocks, dtype=d) for d in kernel.workspace]
            for phase in range(kernel.phases):
                self._launches.append(((grid,), (kernel.block_threads,),
                                       (*args, np.int32(phase), *ws)))
        self._fn = kernel.function

    def __call__(self) -> None:
        for grid, block, args in self._launches:
            self._fn(grid, block, args)


def wall_per_call(call: Callable[[int], object], wait: Callable[[object], None],
                  n_calls: int, n_batches: int) -> float:
    """Median over batches of host ms per call, n_calls back to back, then wait."""
    per = []
    wait(call(0))
    for _ in range(n_batches):
        t0 = time.perf_counter()
        last = None
        for i in range(n_calls):
            last = call(i)
        wait(last)
        per.append((time.perf_counter() - t0) * 1e3 / n_calls)
    return statistics.median(per)
