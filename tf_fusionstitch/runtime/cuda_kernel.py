"""Launch a generated CUDA kernel with CuPy (docs/KERNEL_ABI.md, "CUDA kernels"; TF-free).

The host side is the CPU kernel's shape function: `HostShape` loads a shared
object exporting `fs_shape` (built from `GeneratedCudaKernel.host_source`)
and turns input shapes into output shapes, run-time extents and the number
of work items. `CudaKernel` loads a cubin that NVRTC built with the
project's options (runtime/nvrtc.py, cached like CPU kernels) through
`cupy.RawModule(path=...)`,
which needs a GPU and its driver, allocates outputs and launches blocks over
the work items, splitting grids larger than CUDA allows. It does not hand
the source to `RawModule(code=...)`: CuPy then appends -ftz=true, which
would flush denormals that TensorFlow's GPU kernels keep, and the binary
would no longer be the one the compile checks assembled.
"""

from __future__ import annotations

import ctypes
import os
from typing import Sequence

import numpy as np

from tf_fusionstitch.runtime.cpu_kernel import KernelShapeError

_I64P = ctypes.POINTER(ctypes.c_int64)
_ERR_LEN = 1024
_MAX_GRID_X = 2**31 - 1


class HostShape:
    """fs_shape of a kernel: shapes in, (output shapes, ext, work items) out."""

    def __init__(self, path: str | os.PathLike, in_ranks: Sequence[int],
                 out_ranks: Sequence[int], n_ext: int):
        self._lib = ctypes.CDLL(os.fspath(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        self._fn = self._lib.fs_shape
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [_I64P, _I64P, _I64P, _I64P, ctypes.c_char_p, ctypes.c_int64]
        self.in_ranks, self.out_ranks, self.n_ext = tuple(in_ranks), tuple(out_ranks), n_ext

    def __call__(self, shapes: Sequence[tuple]) -> tuple:
        if len(shapes) != len(self.in_ranks):
            raise ValueError(f"kernel takes {len(self.in_ranks)} inputs, got {len(shapes)}")
        for i, (shape, rank) in enumerate(zip(shapes, self.in_ranks)):
            if len(shape) != rank:
                raise KernelShapeError(f"input {i} has rank {len(shape)} (shape {shape}), "
                                       f"the kernel takes rank {rank}")
        dims = [d for s in shapes for d in s]
        in_dims = (ctypes.c_int64 * max(1, len(dims)))(*dims)
        out_dims = (ctypes.c_int64 * max(1, sum(self.out_ranks)))()
        ext = (ctypes.c_int64 * max(1, self.n_ext))()
        work = (ctypes.c_int64 * 2)()
        err = ctypes.create_string_buffer(_ERR_LEN)
        if self._fn(in_dims, out_dims, ext, work, err, _ERR_LEN) != 0:
            raise KernelShapeError(err.value.decode("utf-8", errors="replace"))
        out_shapes, pos = [], 0
        for rank in self.out_ranks:
            out_shapes.append(tuple(out_dims[pos:pos + rank]))
            pos += rank
        return out_shapes, tuple(ext[:self.n_ext]), work[0]


def device_dtype(name: str) -> np.dtype:
    """CuPy has no bfloat16: such tensors travel as their uint16 bits."""
    return np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)


def launches(work: int, rows_per_block: int, row_blocks: int = 1) -> list:
    """(begin, end, grid) per launch covering work items [0, work);
    `row_blocks` blocks share a row where a plan splits rows."""
    per_launch = _MAX_GRID_X // row_blocks * rows_per_block
    out = []
    for begin in range(0, work, per_launch):
        end = min(work, begin + per_launch)
        out.append((begin, end, -(-(end - begin) // rows_per_block) * row_blocks))
    return out


class CudaKernel:
    """A CUDA kernel of docs/KERNEL_ABI.md loaded on the current GPU."""

    def __init__(self, cubin_path: str | os.PathLike, host: HostShape, in_dtypes: Sequence,
                 out_dtypes: Sequence, block_threads: int, rows_per_block: int,
                 row_blocks: int = 1, phases: int = 1, workspace: Sequence = ()):
        """`row_blocks`, `phases`, `workspace`: a split row's blocks per row,
        launches, and workspace dtypes (one element per row and slice each;
        gpu_printer.split_workspace)."""
        import cupy  # the caller checked that CuPy and a GPU exist
        self._cupy = cupy
        module = cupy.RawModule(path=os.fspath(cubin_path))
        self.function = module.get_function("fs_kernel")  # docs/KERNEL_ABI.md
        self.host = host
        self.in_dtypes = [device_dtype(d) for d in in_dtypes]
        self.out_dtypes = [device_dtype(d) for d in out_dtypes]
        self.block_threads, self.rows_per_block = block_threads, rows_per_block
        self.row_blocks, self.phases = row_blocks, phases
        self.workspace = [np.dtype(d) for d in workspace]

    def run(self, inputs: Sequence) -> list:
        """Outputs (CuPy arrays) for inputs (NumPy or CuPy arrays); bfloat16
        tensors in and out as uint16 bits (`device_dtype`)."""
        cp = self._cupy
        arrays = [cp.ascontiguousarray(cp.asarray(a)) for a in inputs]
        for i, (a, want) in enumerate(zip(arrays, self.in_dtypes)):
            if a.dtype != want:  # the kernel would read the bytes as `want`
                raise TypeError(f"input {i} has dtype {a.dtype}, the kernel takes {want}")
        out_shapes, ext, work = self.host([a.shape for a in arrays])
        outputs = [cp.empty(s, dtype=d) for s, d in zip(out_shapes, self.out_dtypes)]
        extents = [np.int64(e) for e in ext]
        for begin, end, grid in launches(work, self.rows_per_block, self.row_blocks):
            args = (np.int64(begin), np.int64(end), *arrays, *outputs, *extents)
            if self.row_blocks == 1:
                self.function((grid,), (self.block_threads,), args)
                continue
            # Launches on one stream run in order: each sees the last one's partials.
            ws = [cp.empty((end - begin) * self.row_blocks, dtype=d) for d in self.workspace]
            for phase in range(self.phases):
                self.function((grid,), (self.block_threads,), (*args, np.int32(phase), *ws))
        return outputs
