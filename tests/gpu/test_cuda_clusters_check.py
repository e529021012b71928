"""The zoo's CUDA cluster check (tests/cuda_clusters_testlib.py) fails where
it should: a kernel whose emulation computes something else, a spill ptxas
reports, a spill outside the named causes. (Without these, a check that
passes on every zoo cluster could be one that never looks.)"""

import dataclasses
import json

import pytest

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import kernels, patterns
from tf_fusionstitch.codegen.generate import generate_cuda
from tf_fusionstitch.codegen.gpu_printer import KERNEL_NAME, NVRTC_OPTIONS
from tf_fusionstitch.gpu import build as gpu_build
from tf_fusionstitch.runtime import nvrtc
import cuda_clusters_testlib as ctl

needs_nvrtc = pytest.mark.skipif(bool(ctl.unavailable()), reason=ctl.unavailable())


def gelu():
    return patterns.standard_patterns()["bias_gelu_tanh_1024"].cluster


def with_spills(real, **counts):
    """ptxas_resources whose report of the kernel says `counts`."""
    def report(ptx, arch, *args, **kwargs):
        return [dataclasses.replace(r, **counts) for r in real(ptx, arch, *args, **kwargs)]
    return report


@needs_nvrtc
def test_a_standard_pattern_passes():
    assert ctl.problems({"gelu": gelu()}) == {}


def test_an_emulation_that_computes_something_else_fails(monkeypatch):
    real = kernels.generator(kernels.CUDA_EMULATED)

    def broken(cluster):   # the emulation of the cluster with its first mul an add
        i = next(i for i, op in enumerate(cluster.ops) if op.prim == "mul")
        ops = list(cluster.ops)
        ops[i] = dataclasses.replace(ops[i], prim="add")
        return real(dataclasses.replace(cluster, ops=tuple(ops)))
    monkeypatch.setattr(kernels, "generator",
                        lambda t: broken if t == kernels.CUDA_EMULATED else
                        kernels.generate_cpp)
    (line,) = ctl.emulation_problems({"gelu": gelu()})
    assert line.startswith("gelu: the emulated CUDA kernel differs from the CPU kernel")


@needs_nvrtc
def test_kernels_compiled_together_report_what_each_reports_alone():
    clusters = [p.cluster for p in patterns.standard_patterns().values()]
    source = ctl.batched_source([generate_cuda(c, None).source for c in clusters])
    for arch in ctl.ARCHS:
        together = {r.kernel: r for r in nvrtc.ptxas_resources(
            nvrtc.compile_ptx(source, arch, NVRTC_OPTIONS), arch)}
        for i, cluster in enumerate(clusters):
            alone = gpu_build.compile_cuda(cluster, (arch,))[1][arch].resources
            assert together[f"{KERNEL_NAME}_{i}"] == dataclasses.replace(
                alone, kernel=f"{KERNEL_NAME}_{i}")


@needs_nvrtc
def test_a_kernel_nvrtc_rejects_is_named(monkeypatch):
    real = gpu_build.generate_cuda

    def broken(cluster, *args, **kwargs):   # the second kernel's own code does not compile
        g = real(cluster, *args, **kwargs)
        if cluster is clusters["b"]:
            prelude, end, own = g.source.partition(ctl.PRELUDE_END)
            g = dataclasses.replace(g, source=prelude + end + own.replace(
                "{", "{ undeclared = 1;", 1))
        return g
    clusters = {"a": gelu(), "b": patterns.standard_patterns()["softmax_128"].cluster}
    monkeypatch.setattr(gpu_build, "generate_cuda", broken)
    monkeypatch.setattr(ctl, "generate_cuda", broken)
    (line,) = ctl.batch_compile_problems(clusters)
    assert line.startswith("b: does not compile: CudaCompileError")


@needs_nvrtc
def test_a_spill_fails(monkeypatch):
    monkeypatch.setattr(nvrtc, "ptxas_resources",
                        with_spills(nvrtc.ptxas_resources, spill_stores=8, spill_loads=8))
    lines = ctl.problems({"gelu": gelu()})["gelu"]
    assert [line.split(":")[1].strip() for line in lines] == list(ctl.ARCHS)
    assert all("spills 8/8 bytes" in line for line in lines)


@needs_nvrtc
def test_a_stack_frame_fails(monkeypatch):
    monkeypatch.setattr(nvrtc, "ptxas_resources",
                        with_spills(nvrtc.ptxas_resources, stack_bytes=16))
    assert len(ctl.compile_problems("gelu", gelu())) == len(ctl.ARCHS)


def test_named_causes_cover_only_their_case():
    sincos = ir.Cluster.from_json(json.dumps({
        "inputs": [{"name": "x", "type": {"dtype": "float32", "shape": [None, 8]}}],
        "ops": [{"name": "s", "prim": "sin", "inputs": ["x"], "attrs": {},
                 "type": {"dtype": "float32", "shape": [None, 8]}}],
        "outputs": ["s"], "version": 1}))
    stack = nvrtc.KernelResources("fs_kernel", "sm_90", 30, 0, 32, 0, 0)
    spilled = dataclasses.replace(stack, spill_stores=8, spill_loads=8)
    assert ctl.spill_reason(sincos, stack) is not None      # sinf's local array
    assert ctl.spill_reason(sincos, spilled) is None        # but no spills
    assert ctl.spill_reason(gelu(), stack) is None
    assert ctl.mismatch_rule(gelu()) is None               # float32, not a named spec
    assert ctl.mismatch_rule(sincos) is None


@needs_nvrtc
def test_sm80_division_spills_are_named_only_when_the_slow_path_is_their_cause(monkeypatch):
    """The named sm_80 cause of a spill in a kernel that divides is checked,
    not assumed: the same kernel with approximate division (div.full, no slow
    path to call) must assemble without it."""
    softmax = patterns.standard_patterns()["softmax_128"].cluster   # divides by its sum
    sm80 = nvrtc.KernelResources("fs_kernel", "sm_80", 48, 0, 8, 4, 4)
    real = nvrtc.ptxas_resources

    def ieee_only(ptx, arch, *args, **kwargs):   # spills where the IEEE division is
        spills = 4 if "div.rn.f32" in ptx else 0
        return [dataclasses.replace(r, spill_stores=spills, spill_loads=spills)
                for r in real(ptx, arch, *args, **kwargs)]
    monkeypatch.setattr(nvrtc, "ptxas_resources", ieee_only)
    assert "slow path" in ctl.spill_reason(softmax, sm80)
    monkeypatch.setattr(nvrtc, "ptxas_resources", with_spills(real, spill_stores=4))
    assert ctl.spill_reason(softmax, sm80) is None            # spills either way
    assert ctl.spill_reason(softmax, dataclasses.replace(sm80, arch="sm_90")) is None
