"""Tests of the TF-free runtime: disk cache, CPU compiler, CpuKernel.

No TensorFlow here (docs/DESIGN.md, "TF-free core": the runtime must work without it).
"""

import hashlib
import multiprocessing
import os
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from tf_fusionstitch.runtime import cache, cpu_compiler, cpu_kernel

# out[r] = sum(x[r, :]); work items are rows. Rejects rows of zero length to
# exercise the shape error path.
ROW_SUM_KERNEL = r"""
#include <cstdint>
#include <cstdio>
#define FS_EXPORT extern "C" __attribute__((visibility("default")))
FS_EXPORT const int64_t fs_meta[] = {2, 1, 1, 1, /*in ranks*/ 2, /*out ranks*/ 1,
                                     /*in dtypes: DT_DOUBLE*/ 2, /*out dtypes*/ 2,
                                     /*n_fwd*/ 0};
FS_EXPORT int fs_shape(const int64_t* in_dims, int64_t* out_dims, int64_t* ext,
                       int64_t* work, char* err, int64_t errlen) {
  if (in_dims[1] == 0) {
    snprintf(err, errlen, "row_sum needs at least one column, got shape [%lld,0]",
             (long long)in_dims[0]);
    return 1;
  }
  out_dims[0] = in_dims[0];
  ext[0] = in_dims[1];
  work[0] = in_dims[0];
  work[1] = in_dims[1];
  return 0;
}
FS_EXPORT void fs_run(int64_t begin, int64_t end, const int64_t* ext, void* const* bufs) {
  const double* x = static_cast<const double*>(bufs[0]);
  double* out = static_cast<double*>(bufs[1]);
  for (int64_t r = begin; r < end; ++r) {
    double s = 0;
    for (int64_t c = 0; c < ext[0]; ++c) s += x[r * ext[0] + c];
    out[r] = s;
  }
}
"""


# --- cache directory -------------------------------------------------------

def test_cache_dir_is_created_0700_even_with_permissive_umask(tmp_path, monkeypatch):
    target = tmp_path / "a" / "b" / "fs"
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(target))
    old_umask = os.umask(0)
    try:
        assert cache.cache_dir() == target
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o700


def test_cache_dir_falls_back_to_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.delenv(cache.ENV_CACHE_DIR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "tf_fusionstitch"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "tf_fusionstitch"


def test_refuses_group_writable_dir(isolated_cache):
    isolated_cache.mkdir(mode=0o700)
    os.chmod(isolated_cache, 0o770)
    with pytest.raises(cache.CacheError, match="writable by group or others") as info:
        cache.cache_dir()
    assert str(isolated_cache) in str(info.value)
    assert "chmod 700" in str(info.value)


def test_refuses_dir_owned_by_another_user(isolated_cache, monkeypatch):
    isolated_cache.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(isolated_cache, 12345, -1)  # really foreign
    else:
        monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
    with pytest.raises(cache.CacheError, match="owned by uid") as info:
        cache.cache_dir()
    assert str(isolated_cache) in str(info.value)
    assert cache.ENV_CACHE_DIR in str(info.value)


def test_refuses_unwritable_dir(isolated_cache, monkeypatch):
    isolated_cache.mkdir(mode=0o700)
    if os.geteuid() == 0:  # root writes anywhere; simulate the check failing
        monkeypatch.setattr(os, "access", lambda *a, **k: False)
    else:
        os.chmod(isolated_cache, 0o500)
    with pytest.raises(cache.CacheError, match="not writable"):
        cache.cache_dir()


def test_refuses_a_file_as_cache_dir(isolated_cache):
    isolated_cache.write_text("not a directory")
    with pytest.raises(cache.CacheError, match="not a directory"):
        cache.cache_dir()


# --- keys and artifacts ----------------------------------------------------

def test_content_key_is_stable_and_unambiguous():
    assert cache.content_key("a", "b") == cache.content_key("a", "b")
    assert cache.content_key("ab", "c") != cache.content_key("a", "bc")
    assert len(cache.content_key("x")) == 64


@pytest.mark.parametrize("bad", ["../x", "a/b", ".hidden", "", "a b"])
def test_rejects_keys_that_are_not_plain_names(bad):
    with pytest.raises(ValueError, match="content_key"):
        cache.get_or_build(bad, ".so", lambda p: p.write_bytes(b""))


def _writer(payload: bytes, calls: list):
    def build(path):
        calls.append(path)
        path.write_bytes(payload)
    return build


def test_builds_once_then_reuses(isolated_cache):
    calls = []
    first = cache.get_or_build("k1", ".bin", _writer(b"payload", calls))
    second = cache.get_or_build("k1", ".bin", _writer(b"other", calls))
    assert first == second == isolated_cache / "k1.bin"
    assert first.read_bytes() == b"payload"
    assert len(calls) == 1
    assert calls[0].parent == isolated_cache and calls[0].name.endswith(".bin")
    sidecar = (isolated_cache / "k1.bin.sha256").read_text().strip()
    assert sidecar == hashlib.sha256(b"payload").hexdigest()


@pytest.mark.parametrize("damage", ["truncate", "alter", "drop_sidecar"])
def test_damaged_artifact_is_detected_and_rebuilt(isolated_cache, damage):
    calls = []
    path = cache.get_or_build("k2", ".bin", _writer(b"0123456789", calls))
    if damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(4)
    elif damage == "alter":
        path.write_bytes(b"0123456780")
    else:
        (isolated_cache / "k2.bin.sha256").unlink()
    again = cache.get_or_build("k2", ".bin", _writer(b"0123456789", calls))
    assert again.read_bytes() == b"0123456789"
    assert len(calls) == 2


def test_failed_build_leaves_no_files_and_can_be_retried(isolated_cache):
    def failing(path):
        path.write_bytes(b"half")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        cache.get_or_build("k3", ".bin", failing)
    leftovers = {p.name for p in isolated_cache.iterdir()} - {"k3.bin.lock"}
    assert leftovers == set()
    assert cache.get_or_build("k3", ".bin", _writer(b"ok", [])).read_bytes() == b"ok"


def test_build_that_writes_nothing_is_an_error():
    with pytest.raises(cache.CacheError, match="produced no file"):
        cache.get_or_build("k4", ".bin", lambda path: None)


def _slow_build_worker(cache_dir, log_path, barrier, results):
    os.environ[cache.ENV_CACHE_DIR] = cache_dir

    def build(path):
        with open(log_path, "a") as log:
            log.write(f"{os.getpid()}\n")
        time.sleep(0.5)  # long enough that the other process must wait
        path.write_bytes(b"built once")

    barrier.wait()
    path = cache.get_or_build("shared", ".bin", build)
    results.put((str(path), path.read_bytes()))


def test_two_processes_build_one_artifact(isolated_cache, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    log = tmp_path / "builds.log"
    procs = [ctx.Process(target=_slow_build_worker,
                         args=(str(isolated_cache), str(log), barrier, results))
             for _ in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(log.read_text().splitlines()) == 1
    assert got == [(str(isolated_cache / "shared.bin"), b"built once")] * 2


# --- compiler ----------------------------------------------------------------

def test_compiles_once_and_caches(isolated_cache):
    before = cpu_compiler.compilations
    first = cpu_compiler.compile_shared_object(ROW_SUM_KERNEL)
    second = cpu_compiler.compile_shared_object(ROW_SUM_KERNEL)
    assert first == second and first.parent == isolated_cache and first.suffix == ".so"
    assert cpu_compiler.compilations == before + 1
    other = cpu_compiler.compile_shared_object(ROW_SUM_KERNEL, extra_flags=["-DVARIANT=1"])
    assert other != first and cpu_compiler.compilations == before + 2


def test_key_covers_compiler_and_cpu(monkeypatch):
    first = cpu_compiler.compile_shared_object(ROW_SUM_KERNEL)
    monkeypatch.setattr(cpu_compiler, "cpu_fingerprint", lambda: "another-cpu")
    assert cpu_compiler.compile_shared_object(ROW_SUM_KERNEL) != first
    monkeypatch.setattr(cpu_compiler, "compiler_identity", lambda timeout=30: "g++ 99")
    assert len({first, cpu_compiler.compile_shared_object(ROW_SUM_KERNEL)}) == 2


def _compile_worker(cache_dir, barrier, results):
    os.environ[cache.ENV_CACHE_DIR] = cache_dir
    barrier.wait()
    path = cpu_compiler.compile_shared_object(ROW_SUM_KERNEL)
    results.put((str(path), cpu_compiler.compilations))


def test_two_processes_compiling_the_same_kernel_share_one_result(isolated_cache):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_compile_worker, args=(str(isolated_cache), barrier, results))
             for _ in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert got[0][0] == got[1][0]
    assert sorted(count for _, count in got) == [0, 1]  # one real compile in all
    assert len(list(isolated_cache.glob("*.so"))) == 1


def test_missing_compiler_says_how_to_fix(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(cpu_compiler.CompilerNotFound, match="CXX") as info:
        cpu_compiler.compile_shared_object(ROW_SUM_KERNEL)
    assert "/nonexistent/g++" in str(info.value)
    assert isinstance(info.value, cpu_compiler.CompileError)
    assert isinstance(info.value, RuntimeError)


def test_a_warm_cache_serves_without_a_compiler(isolated_cache, monkeypatch):
    built = cpu_compiler.compile_shared_object(ROW_SUM_KERNEL)
    monkeypatch.setenv("PATH", str(isolated_cache / "no_compiler_here"))
    assert cpu_compiler.compile_shared_object(ROW_SUM_KERNEL) == built
    with pytest.raises(cpu_compiler.CompilerNotFound, match="'g\\+\\+'"):
        cpu_compiler.compile_shared_object(ROW_SUM_KERNEL + "// not in the cache\n")


def test_failing_compiler_raises_compile_error(monkeypatch):
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(cpu_compiler.CompileError, match="exited with status 1") as info:
        cpu_compiler.compile_shared_object(ROW_SUM_KERNEL)
    assert not isinstance(info.value, cpu_compiler.CompilerNotFound)


def test_compile_error_carries_compiler_messages(isolated_cache):
    before = cpu_compiler.compilations
    with pytest.raises(cpu_compiler.CompileError, match="undeclared_name") as info:
        cpu_compiler.compile_shared_object("int f() { return undeclared_name; }\n")
    assert "error" in str(info.value)
    assert cpu_compiler.compilations == before
    assert not list(isolated_cache.glob("*.so"))


def test_compiler_timeout_is_reported(tmp_path, monkeypatch):
    slow = tmp_path / "slow-cxx"
    # Answers probes at once, hangs on the real compile.
    slow.write_text('#!/bin/sh\ncase "$*" in *kernel.cc*) sleep 30;; esac\nexit 1\n')
    slow.chmod(0o755)
    monkeypatch.setenv("CXX", str(slow))
    start = time.monotonic()
    with pytest.raises(cpu_compiler.CompileTimeout, match="timed out after 1 s"):
        cpu_compiler.compile_shared_object(ROW_SUM_KERNEL, timeout=1)
    assert time.monotonic() - start < 15


def test_extra_flags_must_be_a_sequence():
    with pytest.raises(TypeError, match="extra_flags"):
        cpu_compiler.compile_shared_object(ROW_SUM_KERNEL, extra_flags="-O2")


# --- CpuKernel -----------------------------------------------------------------

def test_cpu_kernel_runs_and_threads_agree():
    kernel = cpu_kernel.CpuKernel(cpu_compiler.compile_shared_object(ROW_SUM_KERNEL))
    assert kernel.meta == cpu_kernel.KernelMeta(2, 1, 1, 1, (2,), (1,), ("float64",),
                                                ("float64",), ())
    assert kernel.in_dtypes == kernel.out_dtypes == (np.dtype(np.float64),)
    rng = np.random.default_rng(0)
    for rows in (1, 7, 1000):
        x = rng.standard_normal((rows, 33))
        expected = np.array([sum(row.tolist()) for row in x])  # same summation order
        for threads in (1, 3):
            (out,) = kernel.run([x], threads=threads)
            np.testing.assert_array_equal(out, expected)
    (empty,) = kernel.run([np.zeros((0, 4))])
    assert empty.shape == (0,)
    # Non-contiguous input is made dense first.
    x = rng.standard_normal((33, 5)).T
    np.testing.assert_array_equal(kernel.run([x])[0], np.array([sum(r.tolist()) for r in x]))


def test_cpu_kernel_errors():
    kernel = cpu_kernel.CpuKernel(cpu_compiler.compile_shared_object(ROW_SUM_KERNEL),
                                  out_dtypes=[np.float64], in_dtypes=[np.float64])
    with pytest.raises(cpu_kernel.KernelShapeError, match=r"at least one column, got shape \[3,0\]"):
        kernel.run([np.zeros((3, 0))])
    with pytest.raises(cpu_kernel.KernelShapeError, match="rank"):
        kernel.run([np.zeros(3)])
    with pytest.raises(TypeError, match="float32"):
        kernel.run([np.zeros((3, 3), np.float32)])
    with pytest.raises(ValueError, match="2 output dtypes"):
        cpu_kernel.CpuKernel(kernel.path, out_dtypes=[np.float64, np.float64])


def test_cpu_kernel_dtypes_come_from_fs_meta():
    path = cpu_compiler.compile_shared_object(ROW_SUM_KERNEL)
    kernel = cpu_kernel.CpuKernel(path)
    # A wrong input dtype is refused, whether narrower or as wide as float64.
    for dtype in (np.float32, np.int64, np.uint16, np.bool_):
        with pytest.raises(TypeError, match=rf"input 0 has dtype {np.dtype(dtype)}, "
                                            r"the kernel takes float64"):
            kernel.run([np.zeros((3, 3), dtype)])
    with pytest.raises(TypeError, match="int64"):
        kernel.run([[[1, 2], [3, 4]]])  # a list becomes int64, not float64
    # Given dtypes must agree with fs_meta.
    assert cpu_kernel.CpuKernel(path, [np.float64], ["float64"]).out_dtypes == (
        np.dtype(np.float64),)
    with pytest.raises(ValueError, match="output 0 was generated for float64, but dtype "
                                         "float32 was given"):
        cpu_kernel.CpuKernel(path, out_dtypes=[np.float32])
    with pytest.raises(ValueError, match="input 0 was generated for float64"):
        cpu_kernel.CpuKernel(path, in_dtypes=["int64"])
    with pytest.raises(ValueError, match="2 input dtypes"):
        cpu_kernel.CpuKernel(path, in_dtypes=[np.float64, np.float64])


def test_cpu_kernel_bfloat16_takes_ml_dtypes_or_uint16_bits():
    # out = x, bitwise, for bfloat16 vectors.
    source = ROW_SUM_KERNEL.replace("/*in dtypes: DT_DOUBLE*/ 2, /*out dtypes*/ 2",
                                    "/*in dtypes*/ 14, /*out dtypes*/ 14").replace(
        "/*in ranks*/ 2, /*out ranks*/ 1", "/*in ranks*/ 1, /*out ranks*/ 1")
    start = source.index("FS_EXPORT int fs_shape")
    source = source[:start] + r"""
FS_EXPORT int fs_shape(const int64_t* in_dims, int64_t* out_dims, int64_t* ext,
                       int64_t* work, char* err, int64_t errlen) {
  out_dims[0] = ext[0] = work[0] = in_dims[0];
  work[1] = 1;
  return 0;
}
FS_EXPORT void fs_run(int64_t begin, int64_t end, const int64_t* ext, void* const* bufs) {
  for (int64_t i = begin; i < end; ++i)
    static_cast<uint16_t*>(bufs[1])[i] = static_cast<const uint16_t*>(bufs[0])[i];
}
"""
    path = cpu_compiler.compile_shared_object(source)
    kernel = cpu_kernel.CpuKernel(path)
    assert kernel.meta.in_dtypes == kernel.meta.out_dtypes == ("bfloat16",)
    bf16 = cpu_kernel.as_dtype("bfloat16")
    assert kernel.out_dtypes == (bf16,)
    x = np.array([1.5, -2.0, 3.0], dtype=np.float32).astype(bf16)
    (out,) = kernel.run([x])
    assert out.dtype == bf16 and out.view(np.uint16).tolist() == x.view(np.uint16).tolist()
    bits = cpu_kernel.CpuKernel(path, out_dtypes=[np.uint16], in_dtypes=[np.uint16])
    (out,) = bits.run([x.view(np.uint16)])
    assert out.dtype == np.uint16 and out.tolist() == x.view(np.uint16).tolist()
    (out,) = kernel.run([x.view(np.uint16)])  # uint16 bits are accepted as input too
    assert out.view(np.uint16).tolist() == x.view(np.uint16).tolist()
    for wrong in (np.float16, np.int16, np.float32):
        with pytest.raises(TypeError, match="the kernel takes bfloat16"):
            kernel.run([np.zeros(3, wrong)])
    with pytest.raises(ValueError, match="generated for bfloat16"):
        cpu_kernel.CpuKernel(path, out_dtypes=[np.float16])


def test_cpu_kernel_rejects_unknown_dtype_codes():
    bad = ROW_SUM_KERNEL.replace("/*in dtypes: DT_DOUBLE*/ 2", "/*in dtypes*/ 7")  # DT_STRING
    with pytest.raises(cpu_kernel.KernelLoadError, match=r"unsupported dtype code\(s\) \[7\]"):
        cpu_kernel.CpuKernel(cpu_compiler.compile_shared_object(bad))


def test_cpu_kernel_rejects_wrong_abi_and_hidden_symbols():
    wrong_abi = ROW_SUM_KERNEL.replace("fs_meta[] = {2,", "fs_meta[] = {1,")
    with pytest.raises(cpu_kernel.KernelLoadError, match="ABI version 1; this runtime "
                                                         "supports 2"):
        cpu_kernel.CpuKernel(cpu_compiler.compile_shared_object(wrong_abi), [np.float64])
    hidden = ROW_SUM_KERNEL.replace('__attribute__((visibility("default")))', "")
    with pytest.raises(cpu_kernel.KernelLoadError, match="visibility"):
        cpu_kernel.CpuKernel(cpu_compiler.compile_shared_object(hidden), [np.float64])


def test_runtime_does_not_import_tensorflow():
    code = ("import sys, tf_fusionstitch.runtime.cache, tf_fusionstitch.runtime.cpu_compiler, "
            "tf_fusionstitch.runtime.cpu_kernel; assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
