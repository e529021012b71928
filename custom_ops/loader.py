"""Build and load the FusionStitch op library; register kernels with it.

The library is compiled from fusion_stitch_op.cc (next to this file) against
the installed TensorFlow, cached like kernels, and loaded once per process.
Kernels are registered through ctypes on the very same library file, so the
dlopen handle, and with it the C++ kernel registry, is the op's own. Loading
also installs the op's resolver: a FusionStitch node whose kernel this process
has not registered (a loaded SavedModel's) has its spec checked when it
enters a graph and its kernel built from that spec when it first runs
(tf_fusionstitch/spec_kernels.py).
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import platform
import tempfile
import threading
from types import ModuleType

from tf_fusionstitch import spec_kernels, tensorflow_requirement

# Before TensorFlow loads: an unsupported or missing one fails here, saying what to install.
tensorflow_requirement.check()

import tensorflow as tf

from tf_fusionstitch.runtime import cache, cpu_compiler

SOURCE = pathlib.Path(__file__).with_name("fusion_stitch_op.cc")
BUILD_TIMEOUT_S = 600  # TF's headers are heavy: ~10 s normally, far more on a loaded box

_lock = threading.Lock()
_module: ModuleType | None = None
_cdll: ctypes.CDLL | None = None
# int resolve(int stage, const char* key, const char* spec, char* err, int64 errlen)
_RESOLVE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                               ctypes.c_void_p, ctypes.c_int64)
CHECK_SPEC, BUILD_KERNELS = 0, 1   # the op's stages (fusion_stitch_op.cc)


def load() -> ModuleType:
    """The op module (its `fusion_stitch` function); builds the library on first use.

    Raises cpu_compiler.CompileError (or CompilerNotFound) if it cannot be built.
    """
    global _module, _cdll
    with _lock:
        if _module is None:
            path = library_path()
            module = tf.load_op_library(str(path))
            # Same path, so dlopen returns the handle TF already holds.
            cdll = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
            cdll.fs_register_kernel.argtypes = [ctypes.c_char_p] * 4
            cdll.fs_register_kernel.restype = ctypes.c_int
            cdll.fs_last_error.argtypes = []
            cdll.fs_last_error.restype = ctypes.c_char_p
            cdll.fs_set_resolver.argtypes = [_RESOLVE_FN]
            cdll.fs_set_resolver.restype = None
            cdll.fs_set_resolver(_resolve_callback)
            _module, _cdll = module, cdll
        return _module


def _register_compiled(kernel) -> None:
    register_kernel(kernel.key, kernel.path, kernel.spec, kernel.symbol)


_resolver = spec_kernels.Resolver(_register_compiled)


def _resolve(stage: int, key: bytes, spec: bytes, err: int, errlen: int) -> int:
    """The op's resolver. Called from C++: it never raises, it says why."""
    try:
        (_resolver.check if stage == CHECK_SPEC else _resolver.build)(
            key.decode("utf-8"), spec.decode("utf-8"))
        return 0
    except Exception as e:  # noqa: BLE001  (the op reports it, naming the node)
        message = f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:errlen - 1]
        ctypes.memmove(err, message + b"\0", len(message) + 1)
        return 1


# Kept alive here: the op holds only the pointer.
_resolve_callback = _RESOLVE_FN(_resolve)


def register_kernel(key: str, so_path: str | os.PathLike, spec: str,
                    symbol: str = "") -> None:
    """Makes the kernel in `so_path` (generated from `spec`; its ABI symbols
    suffixed with `symbol` there, "" for plain names) runnable by
    FusionStitch nodes whose kernel_key is `key`. Idempotent per (key, spec)."""
    load()
    assert _cdll is not None
    rc = _cdll.fs_register_kernel(key.encode("utf-8"), os.fsencode(so_path),
                                  spec.encode("utf-8"), symbol.encode("ascii"))
    if rc != 0:
        # ctypes calls on this thread, and the error is thread-local in C++.
        message = (_cdll.fs_last_error() or b"unknown error").decode("utf-8", "replace")
        raise RuntimeError(f"cannot register FusionStitch kernel {key!r}: {message}")


def library_path() -> pathlib.Path:
    """The cached op library for this TensorFlow, built if needed."""
    try:
        source_text = SOURCE.read_text(encoding="utf-8")
    except OSError as exc:
        raise cpu_compiler.CompileError(
            f"the FusionStitch op source {SOURCE} is missing ({exc}); reinstall "
            f"tf_fusionstitch (custom_ops/*.cc is package data)") from exc
    compile_flags = list(tf.sysconfig.get_compile_flags())
    link_flags = list(tf.sysconfig.get_link_flags())
    flags = ["-std=c++17", "-shared", "-fPIC", "-O2", "-w", *compile_flags]
    key = cache.content_key(
        "fusion-stitch-op-v1", source_text, tf.__version__, tf.version.GIT_VERSION,
        "\0".join(flags), "\0".join(link_flags), cpu_compiler.compiler_identity(),
        platform.machine())

    def build(out_path: pathlib.Path) -> None:
        # Compile the text that was hashed, not whatever the file holds by now.
        with tempfile.TemporaryDirectory(prefix="tf_fusionstitch-op-") as tmp:
            src = pathlib.Path(tmp) / SOURCE.name
            src.write_text(source_text, encoding="utf-8")
            # Link flags after the source so -l:libtensorflow_framework.so.2 resolves.
            cpu_compiler.run_compiler([*flags, str(src), *link_flags, "-o", str(out_path)],
                                      timeout=BUILD_TIMEOUT_S,
                                      what="the FusionStitch op library")

    return cache.get_or_build(key, ".so", build)
