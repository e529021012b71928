"""The FusionStitch op's GPU kernel, checked where no GPU (and no CUDA build of
TensorFlow) is: its source compiles against TensorFlow's headers with
GOOGLE_CUDA and the CUDA driver API's header, so it cannot rot, and its launch
geometry, code every build compiles and exports (fs_launches), agrees with the
Python launcher that ran the kernels on an H200 (runtime/cuda_kernel.launches)."""

import ctypes
import os
import pathlib
import shutil
import subprocess

import pytest
import tensorflow as tf

from tf_fusionstitch.custom_ops import loader
from tf_fusionstitch.runtime import cpu_compiler
from tf_fusionstitch.runtime.cuda_kernel import launches


def cuda_include_dir():
    """The CUDA toolkit's include directory (cuda.h), or None."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(pathlib.Path(nvcc).resolve().parents[1]))
    for root in filter(None, roots):
        include = pathlib.Path(root) / "include"
        if (include / "cuda.h").is_file():
            return include
    return None


def test_the_gpu_kernel_compiles_against_tensorflow_and_cuda_headers():
    include = cuda_include_dir()
    if include is None:
        pytest.skip("no CUDA toolkit headers (cuda.h): set CUDA_HOME or install the "
                    "CUDA toolkit to compile the op's GPU kernel")
    source = loader.SOURCE.read_text()
    assert "REGISTER_KERNEL_BUILDER(Name(\"FusionStitch\").Device(DEVICE_GPU)" in source
    for cuda in ("1", "0"):   # the GPU build, and the CPU build as the op library has it
        res = subprocess.run(
            [*cpu_compiler.compiler_command(), "-std=c++17", "-fsyntax-only", "-w", f"-DGOOGLE_CUDA={cuda}",
             f"-I{include}", *tf.sysconfig.get_compile_flags(), str(loader.SOURCE)],
            capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, f"GOOGLE_CUDA={cuda}:\n{res.stderr[-4000:]}"


def _fs_launches(work, rows_per_block, row_blocks):
    loader.load()
    lib = ctypes.CDLL(str(loader.library_path()), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    fn = lib.fs_launches
    fn.argtypes = [ctypes.c_int64] * 3 + [ctypes.POINTER(ctypes.c_int64), ctypes.c_int64]
    fn.restype = ctypes.c_int64
    out = (ctypes.c_int64 * 30)()
    n = fn(work, rows_per_block, row_blocks, out, 10)
    assert n <= 10
    return [tuple(out[3 * i:3 * i + 3]) for i in range(n)]


@pytest.mark.parametrize("work,rows_per_block,row_blocks", [
    (0, 8, 1),                 # nothing to launch
    (1, 256, 1),               # fewer rows than a block
    (1000, 8, 1),              # warp per row: 125 blocks
    (1001, 8, 1),              # and a last, partial block
    (7, 1, 4),                 # split rows: 4 blocks a row
    ((1 << 31) + 5, 1, 1),     # past CUDA's largest grid: two launches
    (3 << 30, 1, 3),           # split rows past it: the grid stays within it
])
def test_launch_geometry_agrees_with_the_python_launcher(work, rows_per_block, row_blocks):
    got = _fs_launches(work, rows_per_block, row_blocks)
    assert got == launches(work, rows_per_block, row_blocks)
    assert all(grid <= (1 << 31) - 1 for _, _, grid in got)
    covered = [(b, e) for b, e, _ in got]
    assert covered == sorted(covered) and sum(e - b for b, e in covered) == work
