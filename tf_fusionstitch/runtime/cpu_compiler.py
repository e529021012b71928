"""Compile generated C++ kernels into cached shared objects (TF-free).

The compiler is `$CXX` (may carry arguments, e.g. "ccache g++") or `g++`.
The cache key covers everything that changes the binary: source, flags, the
compiler's full version and the host CPU's feature flags (because of
-march=native), so a cache directory shared between machines is safe.

A host without a compiler can still use a warm cache: the cache records what
it knows of the default compiler (`g++`, $CXX unset: its version and whether
it takes -march=native) whenever that compiler builds a key, and where $CXX is
unset and no g++ is on PATH the keys are computed from that record; only a
build then fails, with CompilerNotFound (a serving host that loads a
converted SavedModel, README "SavedModels").
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import platform
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from typing import Sequence

from tf_fusionstitch.runtime import cache

# Flags every kernel is built with. -ffp-contract=off keeps a*b+c as two
# roundings, like TensorFlow's own kernels (numerics contract); -fwrapv makes
# integer overflow wrap as in TF; -fvisibility=hidden keeps all but the ABI
# symbols private (kernels mark fs_meta/fs_shape/fs_run visibility("default")).
# -O2, not -O3: the kernels' loops are `#pragma omp simd`, which GCC vectorises
# at -O2 too, and -O3's extra unrolling and versioning bought no measurable
# speed (5 zoo models and the reference patterns, interleaved, every 95%
# interval of O2/O3 around 1.0x) while costing a quarter of a cold call's
# compile time (MobileNetV2's train step: 5.1 -> 3.8 s). docs/DESIGN.md.
OPT_LEVEL = "-O2"
DEFAULT_FLAGS = (
    "-std=c++17", OPT_LEVEL, "-fPIC", "-shared", "-fopenmp-simd", "-ffp-contract=off",
    "-fwrapv", "-fno-math-errno", "-fvisibility=hidden",
)

_STDERR_LINES = 30

# Kernels compiled by compile_shared_object in this process, alone or several
# in one library (cache hits do not count). Read by the optimize() report.
compilations = 0
_count_lock = threading.Lock()


class CompileError(RuntimeError):
    """The C++ compiler failed, timed out, or could not be run."""


class CompilerNotFound(CompileError):
    """No C++ compiler on PATH (or $CXX names one that does not exist)."""


class CompileTimeout(CompileError):
    """The compiler ran longer than the allowed time and was killed."""


# Seconds a version or -march probe may take (a healthy compiler needs well under 1).
_PROBE_TIMEOUT_S = 30

def compile_shared_object(source: str, *, extra_flags: Sequence[str] = (),
                          timeout: float = 120, kernels: int = 1) -> pathlib.Path:
    """Path of a cached shared object built from C++ `source`.

    Built at most once per (source, flags, compiler, CPU), across processes.
    `kernels`: how many kernels the source holds (what `compilations` counts).
    Raises CompilerNotFound, CompileTimeout or CompileError.
    """
    if isinstance(extra_flags, str):
        raise TypeError(f"extra_flags must be a sequence of flags, not the string "
                        f"{extra_flags!r}; write extra_flags=[{extra_flags!r}]")
    flags, extra = _flags(timeout), [str(flag) for flag in extra_flags]

    def build(out_path: pathlib.Path) -> None:
        global compilations
        command = compiler_command()   # only a build needs one: a warm cache serves without
        with tempfile.TemporaryDirectory(prefix="tf_fusionstitch-src-") as tmp:
            src = pathlib.Path(tmp) / "kernel.cc"
            src.write_text(source, encoding="utf-8")
            # Extra flags after the source, so libraries (-l...) link.
            run_compiler([*flags, str(src), *extra, "-o", str(out_path)], timeout=timeout,
                         what="a fused kernel" if kernels == 1 else f"{kernels} fused kernels",
                         command=command)
        with _count_lock:
            compilations += kernels

    return cache.get_or_build(object_key(source, extra_flags=extra, timeout=timeout), ".so",
                              build)


def object_key(source: str, *, extra_flags: Sequence[str] = (), timeout: float = 120) -> str:
    """The cache key compile_shared_object stores the object of `source` under."""
    flags, extra = _flags(timeout), [str(flag) for flag in extra_flags]
    return cache.content_key("cpu-kernel-v1", source, "\0".join(flags + ["--"] + extra),
                             compiler_identity(timeout=min(timeout, _PROBE_TIMEOUT_S)),
                             cpu_fingerprint())


def _flags(timeout: float) -> list[str]:
    # The probes share the caller's time limit: a hung compiler must not stall
    # optimize() for minutes before the fallback.
    return [*DEFAULT_FLAGS, *host_arch_flags(timeout=min(timeout, _PROBE_TIMEOUT_S))]


def compiler_command() -> list[str]:
    """The compiler command line prefix: shlex-split $CXX, or ['g++']."""
    raw = os.environ.get("CXX", "").strip()
    command = shlex.split(raw) if raw else ["g++"]
    if shutil.which(command[0]) is None:
        source = f"$CXX={raw!r}" if raw else "'g++' (the default when $CXX is unset)"
        raise CompilerNotFound(
            f"no C++ compiler found: {source} is not an executable on PATH. "
            f"Install one (e.g. `apt-get install g++`) or set the CXX environment "
            f"variable to a C++17 compiler such as g++ or clang++.")
    return command


def compiler_identity(timeout: float = _PROBE_TIMEOUT_S) -> str:
    """The compiler's full version text (part of every cache key)."""
    recorded = _recorded_default()
    if recorded is not None:
        return recorded["identity"]
    return _identity(tuple(compiler_command()), timeout)


def host_arch_flags(timeout: float = _PROBE_TIMEOUT_S) -> tuple[str, ...]:
    """('-march=native',) when the compiler accepts it, else ()."""
    recorded = _recorded_default()
    if recorded is not None:
        return tuple(recorded["arch_flags"])
    flags = _arch_flags(tuple(compiler_command()), timeout)
    if not os.environ.get("CXX", "").strip():
        _record_default(compiler_identity(timeout), flags)
    return flags


_DEFAULT_RECORD = ("default-compiler", ".json")   # a cache entry: key, suffix


def _recorded_default() -> dict | None:
    """The cache's record of the default compiler, where $CXX is unset and no
    g++ is on PATH (else None: the compiler answers for itself)."""
    if os.environ.get("CXX", "").strip() or shutil.which("g++") is not None:
        return None
    try:
        data = cache.read_verified(*_DEFAULT_RECORD)
        record = json.loads(data) if data is not None else None
    except (cache.CacheError, OSError, ValueError):
        return None
    if not (isinstance(record, dict) and isinstance(record.get("identity"), str)
            and isinstance(record.get("arch_flags"), list)
            and all(isinstance(f, str) for f in record["arch_flags"])):
        return None
    return record


def _record_default(identity: str, arch_flags: tuple[str, ...]) -> None:
    try:
        _write_record(str(cache.cache_dir()), identity, arch_flags)
    except (cache.CacheError, OSError):
        pass   # without the record, a host with no compiler only misses the cache


@functools.lru_cache(maxsize=None)
def _write_record(directory: str, identity: str, arch_flags: tuple[str, ...]) -> None:
    """Once per process and cache directory (`directory`: the lookup key)."""
    data = json.dumps({"identity": identity, "arch_flags": list(arch_flags)},
                      sort_keys=True).encode("utf-8")
    if cache.read_verified(*_DEFAULT_RECORD) != data:
        cache.write_verified(*_DEFAULT_RECORD, data)


def cpu_fingerprint() -> str:
    """The CPU feature flags line of /proc/cpuinfo, else the machine name."""
    return _cpu_flags_line()


@functools.lru_cache(maxsize=1)
def _cpu_flags_line() -> str:
    # Read once: every kernel's key needs it, and a process stays on one CPU type.
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                # x86 says "flags", aarch64 says "Features".
                if name.strip() in ("flags", "Features"):
                    return f"{platform.machine()}:{' '.join(sorted(value.split()))}"
    except OSError:
        pass
    return platform.machine()


def run_compiler(args: Sequence[str], *, timeout: float, what: str = "C++ source",
                 command: Sequence[str] | None = None) -> None:
    """Runs `<compiler> args...`; raises CompileError (with stderr) unless it succeeds."""
    command = list(command) if command is not None else compiler_command()
    argv = [*command, *args]
    try:
        returncode, stderr = _run(argv, timeout)
    except subprocess.TimeoutExpired:
        raise CompileTimeout(
            f"compiling {what} timed out after {timeout:g} s and was killed "
            f"(command: {shlex.join(argv)}). The generated source may be too large; "
            f"raise the timeout or check the machine's load.") from None
    except OSError as exc:
        raise CompileError(f"could not run the compiler {command[0]!r}: {exc}") from exc
    if returncode != 0:
        lines = stderr.splitlines()
        shown = "\n".join(lines[:_STDERR_LINES])
        more = f"\n... ({len(lines) - _STDERR_LINES} more lines)" if len(lines) > _STDERR_LINES else ""
        raise CompileError(
            f"compiling {what} failed: {command[0]} exited with status {returncode}\n"
            f"command: {shlex.join(argv)}\n{shown or '(no compiler output)'}{more}")


def _run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
    # Own process group, so a timeout also kills cc1plus/ld, not only the driver.
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    return proc.returncode, stderr.decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=None)
def _identity(command: tuple[str, ...], timeout: float) -> str:
    parts = []
    for flag in ("-dumpfullversion", "--version"):
        try:
            code, out = _run_capture([*command, flag], timeout)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if code == 0 and out.strip():
            parts.append(out.strip())
    # A compiler that answers neither still gets a stable key; compiling will
    # then fail with its own message.
    return "\n".join(parts) or f"unknown compiler {shlex.join(command)}"


@functools.lru_cache(maxsize=None)
def _arch_flags(command: tuple[str, ...], timeout: float) -> tuple[str, ...]:
    with tempfile.TemporaryDirectory(prefix="tf_fusionstitch-probe-") as tmp:
        src = pathlib.Path(tmp) / "probe.cc"
        src.write_text("int fs_probe(int x) { return x + 1; }\n", encoding="utf-8")
        argv = [*command, "-march=native", "-c", str(src), "-o", str(pathlib.Path(tmp) / "probe.o")]
        try:
            code, _ = _run(argv, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            return ()
    return ("-march=native",) if code == 0 else ()


def _run_capture(argv: Sequence[str], timeout: float) -> tuple[int, str]:
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=timeout, check=False)
    return proc.returncode, proc.stdout.decode("utf-8", errors="replace")
