"""Clusters the rewriter really makes, on the GPU target, without TensorFlow.

tests/gpu_clusters/bert_*.json are every cluster that optimize() builds for
a small BERT-style encoder's inference call and train step (forward,
backward, Keras Adam; collect_bert.py there regenerates them). Each must
compile for CUDA without spills at half occupancy or better, and its
emulated CUDA schedule must agree with the CPU kernel on random inputs:
bit for bit without reductions, within the order-of-summation tolerance with.
"""


import numpy as np
import pytest

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import patterns
from tf_fusionstitch.gpu import build as gpu_build
from tf_fusionstitch.gpu.occupancy import occupancy
from tf_fusionstitch.kernels import build_cpu_kernel
from tf_fusionstitch.runtime import nvrtc
from tf_fusionstitch.runtime.cpu_kernel import CpuKernel
from tf_fusionstitch.schedule import build_schedule
import repo_paths

SPECS = sorted((repo_paths.TESTS / "gpu_clusters").glob("bert_*.json"))


def load(path):
    return ir.Cluster.from_json(path.read_text())


def test_the_fixtures_are_there():
    assert len(SPECS) >= 30


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_emulated_cuda_schedule_agrees_with_the_cpu_kernel(path):
    cluster = load(path)
    reduces = bool(build_schedule(cluster).reductions)
    cpu = build_cpu_kernel(cluster).runner()
    gpu = CpuKernel(gpu_build.build_emulation(cluster))
    rng = np.random.default_rng(len(path.stem))
    for rows in (0, 1, 5):
        inputs = patterns.random_inputs(cluster, rows, rng)
        for want, got in zip(cpu.run(inputs), gpu.run(inputs, threads=2)):
            if reduces:
                err, ok = patterns.max_error(got, want, rtol=1e-4, atol=1e-5)
                assert ok, (path.stem, rows, err)
            else:
                np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(nvrtc.nvrtc_version() is None or nvrtc.ptxas_path() is None,
                    reason="needs NVRTC (pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12) "
                           "and ptxas (CUDA toolkit)")
@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_compiles_for_sm90_without_spills(path):
    generated, builds = gpu_build.compile_cuda(load(path), ("sm_90",))
    res = builds["sm_90"].resources
    assert (res.spill_stores, res.spill_loads, res.stack_bytes) == (0, 0, 0), res
    threads = generated.plan.mapping.block_threads
    assert occupancy("sm_90", threads, res.registers, res.shared_bytes) >= 0.5, res
