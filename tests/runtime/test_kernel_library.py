"""Kernels compiled several to a library (runtime/kernel_library.py), TF-free:
each kernel of a library loads under its own symbols and computes its own
result; one that does not compile fails alone; every kernel stays cached
under its own source."""

import multiprocessing
import os

import numpy as np
import pytest

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.codegen import printer
from tf_fusionstitch.codegen.generate import generate_cpp
from tf_fusionstitch.kernels import build_cpu_kernels
from tf_fusionstitch.runtime import cache, cpu_compiler, kernel_library
from tf_fusionstitch.runtime.cpu_kernel import CpuKernel, KernelLoadError, KernelShapeError

T, op = ir.TensorType, ir.make_op
PRELUDE = printer.headers(printer.CPP)
RNG = np.random.default_rng(77)


def scaled_tanh(scale: float) -> ir.Cluster:
    """y = tanh(x * scale) + scale: kernels that differ by a constant."""
    full = T("float32", (None, 24))
    return ir.Cluster((("x", full),), (
        op("c", "const", [], T("float32", ()), value=scale),
        op("m", "mul", ["x", "c"], full),
        op("t", "tanh", ["m"], full),
        op("y", "add", ["t", "c"], full)), ("y",))


def row_softmax() -> ir.Cluster:
    full, row = T("float32", (None, 40)), T("float32", (None, 1))
    return ir.Cluster((("x", full),), (
        op("m", "reduce_max", ["x"], row, axes=[1], keep_dims=True),
        op("d", "sub", ["x", "m"], full),
        op("e", "exp", ["d"], full),
        op("z", "reduce_sum", ["e"], row, axes=[1], keep_dims=True),
        op("y", "div", ["e", "z"], full)), ("y",))


def reference(cluster_name, x, scale=None):
    if cluster_name == "softmax":
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    return np.tanh(x * np.float32(scale)) + np.float32(scale)


CASES = [("tanh", 0.5), ("tanh", 1.5), ("tanh", 2.5), ("softmax", None)]


def cases_clusters():
    return [scaled_tanh(s) if name == "tanh" else row_softmax() for name, s in CASES]


def check_runs(objects):
    for (name, scale), obj in zip(CASES, objects):
        kernel = CpuKernel(obj.path, symbol=obj.symbol)
        x = RNG.standard_normal((9, 40 if name == "softmax" else 24), dtype=np.float32)
        (y,) = kernel.run([x], threads=2)
        np.testing.assert_allclose(y, reference(name, x, scale), rtol=2e-6, atol=2e-6)


def count_compiler_runs(monkeypatch):
    runs = []
    real = cpu_compiler.run_compiler

    def counting(*args, **kwargs):
        runs.append(args)
        return real(*args, **kwargs)
    monkeypatch.setattr(cpu_compiler, "run_compiler", counting)
    return runs


def test_kernels_of_one_library_each_load_and_run_right(monkeypatch):
    sources = [generate_cpp(c).source for c in cases_clusters()]
    runs = count_compiler_runs(monkeypatch)
    before = cpu_compiler.compilations
    objects = kernel_library.compile_kernels(sources, PRELUDE, workers=1)
    assert len(runs) == 1, "four kernels, one compiler run"
    assert cpu_compiler.compilations - before == 4
    assert len({o.path for o in objects}) == 1
    assert len({o.symbol for o in objects}) == 4 and all(o.symbol for o in objects)
    check_runs(objects)
    # Each kernel's own symbols only: the plain ABI names are not exported.
    with pytest.raises(KernelLoadError, match="does not export fs_meta"):
        CpuKernel(objects[0].path)


def test_a_second_call_compiles_nothing_and_finds_the_same_kernels(monkeypatch):
    sources = [generate_cpp(c).source for c in cases_clusters()]
    first = kernel_library.compile_kernels(sources, PRELUDE, workers=1)
    runs = count_compiler_runs(monkeypatch)
    again = kernel_library.compile_kernels(list(reversed(sources)), PRELUDE, workers=1)
    assert runs == [] and again == list(reversed(first))


def test_a_kernel_that_does_not_compile_fails_alone(isolated_cache):
    good = [generate_cpp(c).source for c in cases_clusters()]
    bad = PRELUDE + "static int broken( { return undeclared_name; }\n"
    objects = kernel_library.compile_kernels(good[:2] + [bad] + good[2:], PRELUDE, workers=1)
    failed = objects.pop(2)
    assert isinstance(failed, cpu_compiler.CompileError)
    assert "undeclared_name" in str(failed) or "error" in str(failed)
    check_runs(objects)
    # Nothing of the broken kernel is cached, neither alone nor as a record.
    bad_key = cpu_compiler.object_key(bad)
    assert not [p for p in os.listdir(isolated_cache) if p.startswith(bad_key)
                and not p.endswith(".lock")]


def test_build_cpu_kernels_spreads_libraries_over_the_workers(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    clusters = cases_clusters()
    kernels = build_cpu_kernels(clusters)
    assert len({k.path for k in kernels}) == 2   # one run per worker
    check_runs(kernels)
    for k in kernels:
        np.testing.assert_equal(k.runner().meta.n_in, 1)


def test_a_damaged_library_is_compiled_again(isolated_cache):
    sources = [generate_cpp(c).source for c in cases_clusters()]
    (path,) = {o.path for o in kernel_library.compile_kernels(sources, PRELUDE, workers=1)}
    data = path.read_bytes()
    # A new file in its place: this process may still map the old one.
    damaged = path.with_suffix(".damaged")
    damaged.write_bytes(data[:-64] + bytes(64))
    os.replace(damaged, path)
    before = cpu_compiler.compilations
    objects = kernel_library.compile_kernels(sources, PRELUDE, workers=1)
    assert cpu_compiler.compilations - before == 4
    assert path.read_bytes() == data
    check_runs(objects)


def scaled_tanh_of_width(width: int, scale: float = 0.5) -> ir.Cluster:
    """scaled_tanh(scale) over rows of `width`: kernels that differ in a size only."""
    full = T("float32", (None, width))
    return ir.Cluster((("x", full),), (
        op("c", "const", [], T("float32", ()), value=scale),
        op("m", "mul", ["x", "c"], full),
        op("t", "tanh", ["m"], full),
        op("y", "add", ["t", "c"], full)), ("y",))


def test_kernels_that_differ_in_sizes_share_their_functions_in_a_library(monkeypatch):
    widths = (24, 40, 56)
    sources = [generate_cpp(scaled_tanh_of_width(w)).source for w in widths]
    names = [kernel_library.shared_names(s) for s in sources]
    assert len(names[0]) == 2 and names[0] == names[1] == names[2]   # run and shape
    library = kernel_library.library_source(PRELUDE, [(f"k{i}", s) for i, s in enumerate(sources)])
    for name in names[0]:
        assert library.count(f" {name}(const") + library.count(f" {name}(int64_t") == 1
    objects = kernel_library.compile_kernels(sources, PRELUDE, workers=1)
    assert len({o.path for o in objects}) == 1
    for w, obj in zip(widths, objects):
        kernel = CpuKernel(obj.path, symbol=obj.symbol)
        x = RNG.standard_normal((7, w), dtype=np.float32)
        (y,) = kernel.run([x], threads=2)
        np.testing.assert_allclose(y, reference("tanh", x, 0.5), rtol=2e-6, atol=2e-6)
        # Each kernel still checks its own static width.
        with pytest.raises(KernelShapeError, match="Incompatible shapes"):
            kernel.run([RNG.standard_normal((7, w + 1), dtype=np.float32)], threads=2)


def test_shared_functions_of_one_name_and_different_text_are_refused():
    a = kernel_library.SHARED_BEGIN + "fs_body_x\nstatic int f() { return 1; }\n" \
        + kernel_library.SHARED_END + "\n"
    b = a.replace("return 1", "return 2")
    with pytest.raises(ValueError, match="differ"):
        kernel_library.library_source(PRELUDE, [("k0", PRELUDE + a), ("k1", PRELUDE + b)])
    with pytest.raises(ValueError, match="differ"):
        kernel_library.first_shared_only(a + b)
    assert kernel_library.first_shared_only(a + "int g;\n" + a) == a + "int g;\n"


def test_kernels_sharing_functions_are_grouped_together():
    widths = [8 * (i + 1) for i in range(6)]
    families = [{generate_cpp(scaled_tanh_of_width(w, scale)).source for w in widths}
                for scale in (0.5, 1.5)]
    groups = kernel_library._groups(sorted(families[0] | families[1]), PRELUDE, workers=2)
    assert sorted(map(set, groups), key=min) == sorted(families, key=min)


def test_sources_without_the_prelude_and_large_ones_compile_alone():
    handwritten = "int fs_unrelated() { return 1; }\n"
    large = PRELUDE + "\n".join(f"static int unused_{i}() {{ return {i}; }}"
                                for i in range(kernel_library.MAX_BYTES // 30))
    sources = [generate_cpp(c).source for c in cases_clusters()[:2]] + [handwritten, large]
    groups = kernel_library._groups(sources, PRELUDE, workers=1)
    assert sorted(map(len, groups)) == [1, 1, 2]
    assert [handwritten] in groups and [large] in groups


def test_groups_are_balanced_and_bounded():
    sizes = [1000 * (i % 7 + 1) for i in range(100)]
    sources = [PRELUDE + f"// {i}\n" + "x" * n for i, n in enumerate(sizes)]
    groups = kernel_library._groups(sources, PRELUDE, workers=2)
    assert sorted(s for g in groups for s in g) == sorted(sources)
    assert len(groups) >= 2 and all(len(g) <= kernel_library.MAX_KERNELS for g in groups)
    loads = [sum(len(s) - len(PRELUDE) for s in g) for g in groups]
    assert max(loads) - min(loads) <= 7000 + 10


def _compile_worker(cache_dir, sources, barrier, results):
    os.environ[cache.ENV_CACHE_DIR] = cache_dir
    barrier.wait()
    objects = kernel_library.compile_kernels(sources, PRELUDE, workers=1)
    results.put([(str(o.path), o.symbol) for o in objects])


def test_two_processes_compiling_overlapping_sets(isolated_cache):
    sources = [generate_cpp(c).source for c in cases_clusters()]
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    sets = [sources[:3], sources[1:]]
    procs = [ctx.Process(target=_compile_worker,
                         args=(str(isolated_cache), s, barrier, results)) for s in sets]
    for p in procs:
        p.start()
    got = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert all(len(g) == 3 for g in got)
    # Whatever each process built, every kernel is found and runs right now.
    objects = kernel_library.compile_kernels(sources, PRELUDE, workers=1)
    check_runs(objects)
