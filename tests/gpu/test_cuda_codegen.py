"""CUDA kernels compiled without a GPU: NVRTC to PTX, ptxas for resources.

Every standard pattern (tf_fusionstitch/patterns.py) is compiled for sm_80
and sm_90 with NVRTC (CuPy's low-level binding; no driver needed), then
assembled by ptxas -v: no spills, no stack frame, registers and shared
memory that keep at least half the SM's warps resident, and exactly the
shared memory the mapping planned. Tests skip, naming what is missing, where
CuPy/NVRTC or ptxas are not installed (`pip install -e .[cuda]`; ptxas comes
with a CUDA toolkit).
Correctness of the same schedule is tests/gpu/test_gpu_emulation.py. TF-free.
"""

import subprocess
import sys

import gpu_edge_clusters as edge
import pytest

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import patterns
from tf_fusionstitch.codegen import gpu_printer, primitives, printer
from tf_fusionstitch.codegen.generate import generate_cuda
from tf_fusionstitch.gpu import build as gpu_build
from tf_fusionstitch.gpu.occupancy import occupancy
from tf_fusionstitch.runtime import nvrtc

PATTERNS = patterns.standard_patterns()
ARCHS = ("sm_80", "sm_90")
NVRTC_VERSION = nvrtc.nvrtc_version()
needs_nvrtc = pytest.mark.skipif(
    NVRTC_VERSION is None,
    reason="NVRTC not available: pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12 "
           "(setup.py extra `cuda`)")
needs_ptxas = pytest.mark.skipif(
    nvrtc.ptxas_path() is None, reason="ptxas not on PATH (it comes with a CUDA toolkit)")

# Half the SM's warps resident: the least a memory-bound kernel should run at
# to keep enough loads in flight.
MIN_OCCUPANCY = 0.5
_CTYPE_BYTES = {"float": 4, "double": 8, "int": 4, "int32_t": 4, "int64_t": 8, "bool": 1}


@pytest.mark.parametrize("target", [printer.CPP, printer.CUDA], ids=lambda t: t.name)
def test_target_tables_cover_every_dtype(target):
    """Each target says how to store every dtype and how each 16-bit float
    loads, stores and rounds: the printers ask the table, never the target."""
    assert set(target.storage) == set(ir.DTYPES)
    for table in (target.load_16bit, target.store_16bit, target.round_16bit):
        assert set(table) == set(primitives.HALF_DTYPES)
        assert all(template.count("{}") == 1 for template in table.values())


def planned_shared_bytes(plan) -> int:
    body = gpu_printer.GpuBody(plan, gpu_printer.CUDA)
    return sum(_CTYPE_BYTES[ctype] * count for _, ctype, count in body.shared)


@needs_nvrtc
@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_standard_pattern_compiles_for_arch_without_spills(name, arch):
    generated, builds = gpu_build.compile_cuda(PATTERNS[name].cluster, (arch,))
    res = builds[arch].resources
    assert res.arch == arch
    assert (res.spill_stores, res.spill_loads, res.stack_bytes) == (0, 0, 0), res
    assert res.shared_bytes == planned_shared_bytes(generated.plan) <= 48 * 1024, res
    threads = generated.plan.mapping.block_threads
    assert occupancy(arch, threads, res.registers, res.shared_bytes) >= MIN_OCCUPANCY, res
    assert f".target {arch}" in builds[arch].ptx


@needs_nvrtc
@needs_ptxas
@pytest.mark.parametrize("name", sorted(edge.EDGE_CLUSTERS))
def test_edge_clusters_compile_for_sm90_without_spills(name):
    """float64 and int64 shuffles, bool reductions, column splits, recompute."""
    generated, builds = gpu_build.compile_cuda(edge.EDGE_CLUSTERS[name], ("sm_90",))
    res = builds["sm_90"].resources
    assert (res.spill_stores, res.spill_loads, res.stack_bytes) == (0, 0, 0), res
    assert res.shared_bytes == planned_shared_bytes(generated.plan), res
    threads = generated.plan.mapping.block_threads
    assert occupancy("sm_90", threads, res.registers, res.shared_bytes) >= MIN_OCCUPANCY, res


def every_primitive(dtype):
    """One output per unary and binary primitive that `dtype` allows (the
    fusion IR decides which), plus casts and a select: each _EXPR template
    must compile under the CUDA table."""
    from tf_fusionstitch import fusion_ir as ir
    T, op = ir.TensorType, ir.make_op
    full = (7, 40)  # static rows: x and y may not broadcast against each other at run time
    compare = ("less", "greater", "equal", "not_equal", "less_equal", "greater_equal")
    base = (("x", T(dtype, full)), ("y", T(dtype, full)))
    ops = []
    for prim in ir.UNARY + ir.BINARY:
        if prim in ("cast", "logical_not", "logical_and", "logical_or"):
            continue
        args = ["x"] if prim in ir.UNARY else ["x", "y"]
        out = "bool" if prim in ("isfinite", "isnan") + compare else dtype
        candidate = op(f"p_{prim}", prim, args, T(out, full))
        try:
            ir.Cluster(base, (candidate,), (candidate.name,)).validate()
        except ir.SpecError:
            continue  # not defined for this dtype
        ops.append(candidate)
    ops += [op("c_bool", "less", ["x", "y"], T("bool", full)),
            op("sel", "select", ["c_bool", "x", "y"], T(dtype, full)),
            op("to_f64", "cast", ["x"], T("float64", full)),
            op("to_i32", "cast", ["x"], T("int32", full)),
            op("from_bool", "cast", ["c_bool"], T(dtype, full))]
    return ir.Cluster(base, tuple(ops), tuple(o.name for o in ops))


@needs_nvrtc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "int32",
                                   "int64"])
def test_every_primitive_compiles_for_cuda(dtype):
    cluster = every_primitive(dtype)
    assert len(cluster.ops) > 15
    nvrtc.compile_ptx(generate_cuda(cluster).source, "sm_90", gpu_printer.NVRTC_OPTIONS)


def test_warp_per_row_needs_no_block_barrier_and_block_per_row_one_per_reduction_loop():
    """The mappings' synchronisation, read off the printed kernels."""
    def counts(name):
        src = generate_cuda(PATTERNS[name].cluster).source
        return src.count("__syncthreads();"), src.count("__shfl_xor_sync(")
    assert counts("layernorm_768") == (0, 10)          # 2 sums x 5 xor steps
    assert counts("layernorm_4096") == (2, 10)
    assert counts("softmax_3000") == (2, 15)           # max also shuffles its NaN flag
    assert counts("bias_gelu_erf_3072") == (0, 0)
    assert counts("bn_inference_relu_64") == (1, 0)    # hoisted channel values


def test_cuda_kernel_signature_follows_the_abi():
    """Buffers as typed, non-aliasing pointers, then the extents fs_shape
    writes: two axes and one run-time broadcast flag for each of x and res
    (dynamic rows)."""
    g = generate_cuda(PATTERNS["residual_layernorm_1024"].cluster)
    assert ('extern "C" __global__ void __launch_bounds__(256) fs_kernel(const int64_t begin, '
            'const int64_t end, const float* __restrict__ t0, const float* __restrict__ t1, '
            'const float* __restrict__ t2, const float* __restrict__ t3, '
            'float* __restrict__ t4, float* __restrict__ t5, const int64_t ext0, const int64_t ext1, '
            'const int64_t ext2, const int64_t ext3) {') in g.source
    assert g.n_ext == 4 and (g.plan.mapping.block_threads, g.plan.mapping.rows_per_block) == (256, 8)
    assert "fs_shape" in g.host_source and "fs_meta" in g.host_source


@needs_nvrtc
def test_nvrtc_builds_a_cubin_for_sm90():
    cubin = nvrtc.compile_cubin(generate_cuda(PATTERNS["softmax_128"].cluster).source, "sm_90",
                                gpu_printer.NVRTC_OPTIONS)
    assert cubin[:4] == b"\x7fELF"


@needs_nvrtc
def test_layernorm_neither_contracts_nor_flushes_denormals():
    """--fmad=false: x*y+z stays two roundings as on the CPU (NVRTC's default
    would fuse 8 of them here); no -ftz: denormals are kept. (expf's own
    implementation uses an ftz instruction internally; layernorm has none.)"""
    source = generate_cuda(PATTERNS["layernorm_768"].cluster).source
    ptx = nvrtc.compile_ptx(source, "sm_90", gpu_printer.NVRTC_OPTIONS)
    assert "fma.rn" not in ptx and ".ftz" not in ptx
    assert "fma.rn.f32" in nvrtc.compile_ptx(source, "sm_90", ("--std=c++17",))


@needs_nvrtc
def test_cubins_are_cached_by_source_arch_and_options():
    source = generate_cuda(PATTERNS["softmax_128"].cluster).source
    path = nvrtc.cached_cubin(source, "sm_90", gpu_printer.NVRTC_OPTIONS)
    assert path.read_bytes()[:4] == b"\x7fELF"
    assert nvrtc.cached_cubin(source, "sm_90", gpu_printer.NVRTC_OPTIONS) == path
    assert nvrtc.cached_cubin(source, "sm_80", gpu_printer.NVRTC_OPTIONS) != path
    assert nvrtc.cached_cubin(source, "sm_90", ("--std=c++17",)) != path


@needs_nvrtc
def test_nvrtc_errors_carry_the_compiler_log():
    with pytest.raises(nvrtc.CudaCompileError, match="undefined_name"):
        nvrtc.compile_ptx('extern "C" __global__ void k() { undefined_name(); }', "sm_80")


def test_occupancy_follows_the_sm_limits():
    """Hand-computed: 65 registers round to 2304 per warp, 3 blocks of 8 warps
    fit 64K registers; a 32-thread block hits the 32-blocks-per-SM limit;
    45000 B of shared memory (+1 KiB reserved) fit 5 blocks in 228 KiB and 3
    in 164 KiB."""
    assert occupancy("sm_90", 256, 32, 0) == 1.0
    assert occupancy("sm_90", 256, 64, 0) == 0.5
    assert occupancy("sm_90", 256, 65, 0) == 0.375
    assert occupancy("sm_80", 32, 20, 0) == 0.5
    assert occupancy("sm_90", 256, 32, 45000) == 0.625
    assert occupancy("sm_80", 256, 32, 45000) == 0.375
    assert occupancy("sm_90", 256, 256, 0) == 0.0


def test_ptxas_report_is_parsed_per_kernel():
    report = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'fs_kernel' for 'sm_90'
ptxas info    : Function properties for fs_kernel
    24 bytes stack frame, 16 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 12096 bytes smem
ptxas info    : Compiling entry function 'other' for 'sm_90'
ptxas info    : Function properties for other
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers
"""
    a, b = nvrtc.parse_ptxas_report(report, "sm_90")
    assert a == nvrtc.KernelResources("fs_kernel", "sm_90", 40, 12096, 24, 16, 8)
    assert b == nvrtc.KernelResources("other", "sm_90", 10, 0, 0, 0, 0)


def test_gpu_codegen_imports_no_tensorflow():
    code = ("import sys, tf_fusionstitch.gpu.build, tf_fusionstitch.patterns; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
