"""CUDA kernels on a real GPU, against NumPy (skipped where CuPy finds none).

The launch path is checked everywhere: the host shape function (the CPU
kernel's fs_shape) and the grid split. With a GPU, every standard pattern
runs through cupy.RawModule at odd row counts and must match NumPy within
the pattern's tolerance, as the emulation does on the CPU. TF-free.
"""

import gpu_edge_clusters as edge
import numpy as np
import pytest

from tf_fusionstitch import patterns
from tf_fusionstitch.gpu import build as gpu_build
from tf_fusionstitch.codegen.generate import generate_cuda
from tf_fusionstitch.runtime import cpu_compiler
from tf_fusionstitch.runtime.cpu_kernel import KernelShapeError
from tf_fusionstitch.runtime.cuda_kernel import device_dtype, launches

PATTERNS = patterns.standard_patterns()

try:  # the host side (fs_shape) is C++ compiled for the CPU
    cpu_compiler.compiler_command()
except cpu_compiler.CompilerNotFound as exc:
    pytest.skip(f"no C++ compiler for the kernels' host side: {exc}", allow_module_level=True)


def test_host_shape_gives_outputs_extents_and_work_items():
    host = gpu_build.host_shape(generate_cuda(PATTERNS["layernorm_768"].cluster))
    out_shapes, ext, work = host([(13, 768), (768,), (768,)])
    assert out_shapes == [(13, 768), (13, 1)] and work == 13 and ext[:2] == (13, 768)
    with pytest.raises(KernelShapeError, match="input 1"):
        host([(13, 768), (767,), (768,)])


def test_bfloat16_travels_as_bits_on_the_device():
    assert device_dtype("bfloat16") == np.uint16 and device_dtype("float16") == np.float16


def test_launches_cover_every_work_item_once():
    assert launches(0, 8) == []
    assert launches(13, 8) == [(0, 13, 2)]
    big = (2**31 - 1) * 8 + 5
    assert launches(big, 8) == [(0, big - 5, 2**31 - 1), (big - 5, big, 1)]


@pytest.mark.gpu
def test_plans_chosen_for_this_device_match_numpy():
    """The latency evaluator's plans for the device: 4 static rows of 65536
    columns (on the GPUs gpu_cost knows, each row split over 16-32 blocks:
    three launches through a workspace), and a softmax of dynamic rows
    (chosen for gpu_choice.ASSUMED_ROWS)."""
    long_rows = edge.softmax((4, 65536))
    x = np.random.default_rng(4).standard_normal((4, 65536)).astype(np.float32) * 4
    (y,) = (o.get() for o in gpu_build.load_cuda(long_rows, gpu="auto").run([x]))
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=2e-5, atol=1e-6)
    pattern = PATTERNS["softmax_3000"]
    inputs = pattern.make_inputs(np.random.default_rng(5), 77)
    kernel = gpu_build.load_cuda(pattern.cluster, gpu="auto")
    for got, want in zip((o.get() for o in kernel.run(inputs)), pattern.reference(inputs)):
        np.testing.assert_allclose(got, want, rtol=pattern.rtol, atol=pattern.atol)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_standard_pattern_on_the_gpu_matches_numpy(name):
    pattern = PATTERNS[name]
    kernel = gpu_build.load_cuda(pattern.cluster)
    rng = np.random.default_rng(0)
    for rows in (0, 1, 13, 1000):
        inputs = pattern.make_inputs(rng, rows)
        outputs = [o.get() for o in kernel.run(inputs)]
        for got, want in zip(outputs, pattern.reference(inputs)):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=pattern.rtol, atol=pattern.atol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sixteen_bit_layernorm_on_the_gpu_matches_the_emulation(dtype):
    """Same schedule, same rounding points: the GPU agrees with the emulated
    kernel to the 16-bit type's rounding (CUDA's sqrt and division are
    correctly rounded; the order of the sums differs)."""
    import gpu_edge_clusters as edge
    from tf_fusionstitch.runtime.cpu_kernel import CpuKernel, as_dtype
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="NumPy needs ml_dtypes for bfloat16")
    c = edge.half_layernorm(dtype)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((77, 768)).astype(as_dtype(dtype))
    g = rng.standard_normal(768).astype(as_dtype(dtype))
    want = CpuKernel(gpu_build.build_emulation(c)).run([x, g])
    bits = [a.view(np.uint16) if dtype == "bfloat16" else a for a in (x, g)]
    y, y32 = (o.get() for o in gpu_build.load_cuda(c).run(bits))
    if dtype == "bfloat16":
        y = y.view(as_dtype("bfloat16"))
    np.testing.assert_allclose(y32, want[1], rtol=1e-4, atol=1e-4)
    tol = 2 ** -7 if dtype == "bfloat16" else 2 ** -10
    np.testing.assert_allclose(y.astype(np.float32), want[0].astype(np.float32), rtol=tol,
                               atol=tol)


@pytest.mark.gpu
def test_cuda_check_runs_checks_and_times_each_kernel_on_the_gpu(tmp_path):
    import subprocess
    import sys
    spec = tmp_path / "softmax_70.json"
    spec.write_text(patterns.softmax(70).cluster.to_json())
    res = subprocess.run([sys.executable, "-m", "tf_fusionstitch.tools.cuda_check",
                          "--nopatterns", f"--clusters={spec}", "--arch=sm_90", "--rows=0,5",
                          "--on_gpu=yes", "--run_rows=1000", "--run_timed=5"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [l for l in res.stdout.splitlines() if l.startswith("softmax_70 ")]
    assert len(lines) == 2 and " yes " in lines[1], res.stdout  # the emulation's, the GPU's
    assert res.stdout.splitlines()[-1] == "cuda_check: 1 kernels, 1 compiled, 1 checked, 0 failed"
