"""Run a generated CPU kernel (docs/KERNEL_ABI.md) on NumPy arrays (TF-free).

This is the TF-free twin of the FusionStitch op's CPU path: same shape call,
same buffer layout, same work-item loop. It lets the fusion IR, schedule and
codegen be tested against NumPy without TensorFlow, and splitting the work
over threads checks that work items really are independent.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import os
from typing import Optional, Sequence

import numpy as np

from tf_fusionstitch.fusion_ir import DTYPE_CODES, MAX_META_COUNT

ABI_VERSION = 2
_MAX_RANK = 254      # TensorFlow's limit
_ERR_LEN = 1024

_I64P = ctypes.POINTER(ctypes.c_int64)
_DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}


class KernelLoadError(RuntimeError):
    """The shared object is not a loadable kernel of this ABI."""


class KernelInputError(ValueError):
    """fs_check_inputs refused the inputs' values (TF's InvalidArgument)."""


class KernelShapeError(ValueError):
    """The kernel's shape function rejected the inputs (or their ranks are wrong)."""


@dataclasses.dataclass(frozen=True)
class KernelMeta:
    """fs_meta, decoded."""
    abi_version: int
    n_in: int
    n_out: int
    n_ext: int
    in_ranks: tuple[int, ...]
    out_ranks: tuple[int, ...]
    in_dtypes: tuple[str, ...]   # NumPy-style names: 'float32', ..., 'bfloat16'
    out_dtypes: tuple[str, ...]
    forward: tuple[tuple[int, int], ...]  # (output index, input index) pairs


def as_dtype(dtype) -> np.dtype:
    """np.dtype for a dtype or name; 'bfloat16' is ml_dtypes.bfloat16 if present, else uint16 bits."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        try:
            import ml_dtypes  # optional: ships with TensorFlow and JAX
            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            return np.dtype(np.uint16)
    return np.dtype(dtype)


def _matches(name: str, dtype) -> bool:
    """Whether NumPy dtype `dtype` has the layout of fs_meta dtype `name`."""
    dtype = np.dtype(dtype)
    if name == "bfloat16":  # ml_dtypes.bfloat16, or its bits as uint16
        return dtype == as_dtype("bfloat16") or dtype == np.dtype(np.uint16)
    return dtype == np.dtype(name)


class CpuKernel:
    """A loaded kernel .so; its dtypes come from fs_meta. `symbol`: the
    kernel's suffix in a library of several (its symbols are fs_meta_<symbol>,
    ...; docs/KERNEL_ABI.md), "" for a kernel compiled alone. `out_dtypes` and
    `in_dtypes`, when given, must agree with them (bfloat16 may be given as
    uint16 bits); `out_dtypes` then picks the outputs' NumPy dtypes. Input
    arrays are checked against fs_meta on every run."""

    def __init__(self, path: str | os.PathLike, out_dtypes: Optional[Sequence] = None,
                 in_dtypes: Optional[Sequence] = None, symbol: str = ""):
        self.path = os.fspath(path)
        self.symbol = symbol
        try:
            self._lib = ctypes.CDLL(self.path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as exc:
            raise KernelLoadError(f"cannot load kernel {self.path}: {exc}") from exc
        self.meta = _read_meta(self._lib, self.path, self._name("fs_meta"))
        self._shape = _symbol(self._lib, self.path, self._name("fs_shape"))
        self._shape.restype = ctypes.c_int
        self._shape.argtypes = [_I64P, _I64P, _I64P, _I64P, ctypes.c_char_p, ctypes.c_int64]
        self._run = _symbol(self._lib, self.path, self._name("fs_run"))
        self._run.restype = None
        self._run.argtypes = [ctypes.c_int64, ctypes.c_int64, _I64P,
                              ctypes.POINTER(ctypes.c_void_p)]
        self._check = getattr(self._lib, self._name("fs_check_inputs"), None)   # optional
        if self._check is not None:
            self._check.restype = ctypes.c_int
            self._check.argtypes = [_I64P, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                    ctypes.c_int64]
        self.out_dtypes = self._dtypes("output", self.meta.out_dtypes, out_dtypes)
        self.in_dtypes = self._dtypes("input", self.meta.in_dtypes, in_dtypes)

    def _name(self, abi_symbol: str) -> str:
        return f"{abi_symbol}_{self.symbol}" if self.symbol else abi_symbol

    def set_stream_min_bytes(self, n: int) -> None:
        """Outputs of at least `n` bytes per call use streaming stores (the
        kernel's default is 16 MiB; 0 streams every aligned float32 output).
        Process-wide for this kernel's library (every kernel in it)."""
        setter = getattr(self._lib, "fs_set_stream_min_bytes", None)
        if setter is None:
            raise KernelLoadError(f"kernel {self.path} has no fs_set_stream_min_bytes")
        setter.restype = None
        setter.argtypes = [ctypes.c_int64]
        setter(int(n))

    def _dtypes(self, what: str, names: tuple, given: Optional[Sequence]) -> tuple:
        if given is None:
            return tuple(as_dtype(n) for n in names)
        given = tuple(as_dtype(d) for d in given)
        if len(given) != len(names):
            raise ValueError(f"kernel {self.path} has {len(names)} {what}s but "
                             f"{len(given)} {what} dtypes were given")
        for i, (name, dtype) in enumerate(zip(names, given)):
            if not _matches(name, dtype):
                raise ValueError(f"kernel {self.path}: {what} {i} was generated for "
                                 f"{name}, but dtype {dtype} was given")
        return given

    def run(self, inputs: Sequence[np.ndarray], threads: int = 1,
            forward: bool = False) -> list[np.ndarray]:
        """Outputs for `inputs`; work items are split over `threads` threads.

        With `forward`, outputs share buffers with inputs as the FusionStitch op
        does (fs_meta's forward pairs; the callers' arrays are copied first, so
        they stay intact): the in-place case that tests must exercise."""
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        arrays = self._check_inputs(inputs)
        meta = self.meta
        out_shapes, ext, work = self.shape_call([a.shape for a in arrays])
        if self._check is not None:   # the inputs' values, before anything is written
            in_bufs = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
            err = ctypes.create_string_buffer(_ERR_LEN)
            if self._check(ext, in_bufs, err, _ERR_LEN) != 0:
                raise KernelInputError(err.value.decode("utf-8", errors="replace")
                                       or "(no message)")
        outputs = [_aligned_empty(shape, dtype)
                   for shape, dtype in zip(out_shapes, self.out_dtypes)]
        if forward:
            arrays = list(arrays)
            taken = set()  # outputs and inputs already paired, as in TF: once each
            for out, inp in meta.forward:
                a = arrays[inp]
                if ({("out", out), ("in", inp)} & taken or a.shape != outputs[out].shape
                        or a.dtype != outputs[out].dtype):
                    continue
                taken |= {("out", out), ("in", inp)}
                arrays[inp] = outputs[out] = a.copy()

        bufs = (ctypes.c_void_p * max(1, len(arrays) + len(outputs)))(
            *[a.ctypes.data for a in (*arrays, *outputs)])
        total = work[0]
        if total < 0:
            raise KernelLoadError(f"kernel {self.path}: fs_shape returned {total} work items")
        if total > 0:
            self._run_items(total, ext, bufs, threads)
        return outputs

    def shape_call(self, input_shapes: Sequence[tuple]):
        """fs_shape for inputs of these shapes: (output shapes, the `ext`
        array, the `work` array); KernelShapeError with the kernel's message."""
        meta = self.meta
        in_dims = _int64_array([d for shape in input_shapes for d in shape])
        out_dims = _int64_array([0] * sum(meta.out_ranks))
        ext = _int64_array([0] * meta.n_ext)
        work = _int64_array([0, 0])
        err = ctypes.create_string_buffer(_ERR_LEN)
        if self._shape(in_dims, out_dims, ext, work, err, _ERR_LEN) != 0:
            message = err.value.decode("utf-8", errors="replace") or "(no message)"
            raise KernelShapeError(message)
        out_shapes, pos = [], 0
        for rank in meta.out_ranks:
            shape = tuple(out_dims[pos:pos + rank])
            pos += rank
            if any(d < 0 for d in shape):
                raise KernelLoadError(f"kernel {self.path}: fs_shape returned a negative "
                                      f"output extent {shape} (a code generation bug)")
            out_shapes.append(shape)
        return out_shapes, ext, work

    def _check_inputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        meta = self.meta
        if len(inputs) != meta.n_in:
            raise ValueError(f"kernel takes {meta.n_in} inputs, got {len(inputs)}")
        arrays = []
        for i, x in enumerate(inputs):
            # Dense row-major buffers, as the ABI wants; asarray keeps a rank-0
            # input rank 0 (ascontiguousarray would make it 1-d).
            a = np.asarray(x, order="C")
            if not _matches(meta.in_dtypes[i], a.dtype):
                raise TypeError(f"input {i} has dtype {a.dtype}, the kernel takes "
                                f"{meta.in_dtypes[i]}")
            if a.ndim != meta.in_ranks[i]:
                raise KernelShapeError(f"input {i} has rank {a.ndim} (shape {a.shape}), "
                                       f"the kernel takes rank {meta.in_ranks[i]}")
            arrays.append(a)
        return arrays

    def _run_items(self, total: int, ext, bufs, threads: int) -> None:
        if threads == 1:
            self._run(0, total, ext, bufs)
            return
        # More chunks than threads, of uneven sizes: any partition must agree.
        chunks = min(total, threads * 4)
        bounds = [total * i // chunks for i in range(chunks + 1)]
        # ctypes releases the GIL during the call, so chunks run in parallel.
        with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
            futures = [pool.submit(self._run, lo, hi, ext, bufs)
                       for lo, hi in zip(bounds, bounds[1:]) if hi > lo]
            for f in futures:
                f.result()


def _aligned_empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised array on a 64-byte boundary, as TF allocates tensors
    (kernels may use aligned streaming stores there)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + _ALIGN, dtype=np.uint8)
    skip = (-raw.ctypes.data) % _ALIGN
    return raw[skip:skip + n].view(dtype).reshape(shape)


_ALIGN = 64


def _int64_array(values: Sequence[int]):
    # Never zero-length, so the kernel always receives a valid pointer.
    return (ctypes.c_int64 * max(1, len(values)))(*values)


def _symbol(lib: ctypes.CDLL, path: str, name: str):
    try:
        return getattr(lib, name)
    except AttributeError:
        raise KernelLoadError(
            f"kernel {path} does not export {name}; kernels are built with "
            f"-fvisibility=hidden, so the ABI symbols need "
            f'extern "C" __attribute__((visibility("default")))') from None


def _read_meta(lib: ctypes.CDLL, path: str, symbol: str = "fs_meta") -> KernelMeta:
    _symbol(lib, path, symbol)  # a clear error if it is missing
    words = ctypes.cast(ctypes.addressof(ctypes.c_int64.in_dll(lib, symbol)), _I64P)
    # Read fs_meta front to back, checking each count before it sizes a read.
    version = words[0]
    if version != ABI_VERSION:
        raise KernelLoadError(f"kernel {path} has ABI version {version}; this runtime "
                              f"supports {ABI_VERSION}. Clear the cache and rebuild.")
    n_in, n_out, n_ext = words[1], words[2], words[3]
    for name, n, low in (("n_in", n_in, 0), ("n_out", n_out, 1), ("n_ext", n_ext, 0)):
        if not low <= n <= MAX_META_COUNT:
            raise KernelLoadError(f"kernel {path}: fs_meta {name} = {n} is out of range")
    ranks = [words[4 + i] for i in range(n_in + n_out)]
    if any(not 0 <= r <= _MAX_RANK for r in ranks):
        raise KernelLoadError(f"kernel {path}: fs_meta has an invalid rank in {ranks}")
    codes = [words[4 + n_in + n_out + i] for i in range(n_in + n_out)]
    bad = [c for c in codes if c not in _DTYPE_NAMES]
    if bad:
        raise KernelLoadError(f"kernel {path}: fs_meta has unsupported dtype code(s) {bad}")
    dtypes = [_DTYPE_NAMES[c] for c in codes]
    at = 4 + 2 * (n_in + n_out)
    n_fwd = words[at]
    if not 0 <= n_fwd <= n_in * n_out:
        raise KernelLoadError(f"kernel {path}: fs_meta n_fwd = {n_fwd} is out of range")
    forward = tuple((words[at + 1 + 2 * k], words[at + 2 + 2 * k]) for k in range(n_fwd))
    for out, inp in forward:
        if not (0 <= out < n_out and 0 <= inp < n_in):
            raise KernelLoadError(f"kernel {path}: fs_meta forward pair ({out}, {inp}) "
                                  f"names no such output/input")
    return KernelMeta(version, n_in, n_out, n_ext, tuple(ranks[:n_in]),
                      tuple(ranks[n_in:]), tuple(dtypes[:n_in]), tuple(dtypes[n_in:]),
                      forward)
