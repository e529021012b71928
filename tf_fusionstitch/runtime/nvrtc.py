"""Compile CUDA kernels with NVRTC, and read ptxas' resource report (TF-free).

Works without a GPU: CuPy's high-level `compile_using_nvrtc` asks the driver
for its version and fails on a machine without one, so this calls the
low-level binding `cupy.cuda.nvrtc` (createProgram/compileProgram/getPTX/
getCUBIN), which needs only the NVRTC library (`nvidia-cuda-nvrtc-cu12`).
`ptxas -v` (from a CUDA toolkit, where installed) assembles the PTX for an
architecture and reports registers, shared memory and spills per kernel.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
import subprocess
import tempfile
from typing import Optional, Sequence

from tf_fusionstitch.runtime import cache


class NvrtcUnavailable(RuntimeError):
    """CuPy or the NVRTC library is not installed."""


class CudaCompileError(RuntimeError):
    """NVRTC or ptxas rejected a kernel (the log is in the message)."""


def nvrtc_version() -> Optional[tuple]:
    """(major, minor) of the loadable NVRTC, or None when there is none."""
    try:
        from cupy.cuda import nvrtc
        return tuple(nvrtc.getVersion())
    except Exception:  # ImportError, or CuPy's error for a missing libnvrtc
        return None


def compile_ptx(source: str, arch: str, options: Sequence[str] = (),
                name: str = "kernel.cu") -> str:
    """PTX of `source` for `arch` ("sm_80", "sm_90", ...)."""
    return _compile(source, f"-arch=compute_{_number(arch)}", options, name, cubin=False)


def compile_cubin(source: str, arch: str, options: Sequence[str] = (),
                  name: str = "kernel.cu") -> bytes:
    """SASS (a cubin) of `source` for `arch`, assembled by NVRTC itself."""
    return _compile(source, f"-arch=sm_{_number(arch)}", options, name, cubin=True)


def cached_cubin(source: str, arch: str, options: Sequence[str] = ()) -> pathlib.Path:
    """Path of the cubin of `source` for `arch` in the kernel cache
    (runtime/cache.py), keyed by source, architecture, options and the NVRTC
    version; built once across processes."""
    version = nvrtc_version()
    if version is None:
        raise NvrtcUnavailable("NVRTC cannot be loaded: pip install cupy-cuda12x "
                               "nvidia-cuda-nvrtc-cu12 (the `cuda` extra)")
    sm = f"sm_{_number(arch)}"
    key = cache.content_key("cuda-cubin-v1", source, sm, "\0".join(options),
                            "nvrtc %d.%d" % version)

    def build(out_path: pathlib.Path) -> None:
        out_path.write_bytes(compile_cubin(source, sm, options))
    return cache.get_or_build(key, ".cubin", build)


def _number(arch: str) -> str:
    m = re.fullmatch(r"(?:sm_|compute_)?(\d+[a-z]?)", arch)
    if not m:
        raise ValueError(f"architecture {arch!r} is not of the form sm_90")
    return m.group(1)


def _compile(source: str, arch_flag: str, options: Sequence[str], name: str, cubin: bool):
    try:
        from cupy.cuda import nvrtc
    except ImportError as exc:
        raise NvrtcUnavailable("CuPy is not installed: pip install cupy-cuda12x "
                               "nvidia-cuda-nvrtc-cu12 (the `cuda` extra)") from exc
    try:
        prog = nvrtc.createProgram(source, name, [], [])
    except Exception as exc:  # libnvrtc missing: CuPy raises on first use
        raise NvrtcUnavailable(f"NVRTC cannot be loaded ({exc}); "
                               "pip install nvidia-cuda-nvrtc-cu12") from exc
    try:
        try:
            nvrtc.compileProgram(prog, [arch_flag, *options])
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog)
            raise CudaCompileError(f"NVRTC failed for {arch_flag}: {exc}\n{log}") from None
        return nvrtc.getCUBIN(prog) if cubin else _text(nvrtc.getPTX(prog))
    finally:
        nvrtc.destroyProgram(prog)


def _text(ptx) -> str:
    if isinstance(ptx, bytes):
        return ptx.rstrip(b"\0").decode("ascii")
    return ptx


@dataclasses.dataclass(frozen=True)
class KernelResources:
    """ptxas' report for one kernel on one architecture."""
    kernel: str
    arch: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int


def ptxas_path() -> Optional[str]:
    return shutil.which("ptxas")


def ptxas_resources(ptx: str, arch: str, timeout: float = 120) -> list:
    """Assembles `ptx` for `arch` with `ptxas -v`; one KernelResources per kernel."""
    exe = ptxas_path()
    if exe is None:
        raise FileNotFoundError("ptxas is not on PATH (it comes with the CUDA toolkit)")
    sm = f"sm_{_number(arch)}"
    with tempfile.TemporaryDirectory(prefix="tf_fusionstitch-ptx-") as tmp:
        src = f"{tmp}/k.ptx"
        with open(src, "w", encoding="ascii") as f:
            f.write(ptx)
        proc = subprocess.run([exe, "-v", f"-arch={sm}", src, "-o", f"{tmp}/k.cubin"],
                              capture_output=True, text=True, timeout=timeout)
    report = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise CudaCompileError(f"ptxas failed for {sm}:\n{report[-4000:]}")
    return parse_ptxas_report(report, sm)


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_report(report: str, arch: str) -> list:
    """KernelResources from `ptxas -v` output (one block per entry function)."""
    out = []
    for block in re.split(r"(?=ptxas info\s*: Compiling entry function)", report):
        entry = _ENTRY.search(block)
        if not entry:
            continue
        frame, used = _FRAME.search(block), _USED.search(block)
        if not (frame and used):
            raise CudaCompileError(f"unexpected ptxas report:\n{block[:2000]}")
        smem = _SMEM.search(block[used.start():])
        out.append(KernelResources(entry.group(1), entry.group(2) or arch,
                                   int(used.group(1)), int(smem.group(1)) if smem else 0,
                                   int(frame.group(1)), int(frame.group(2)),
                                   int(frame.group(3))))
    return out
