"""Random clusters: the emulated CUDA schedule against the CPU kernel.

Both kernels come from the same spec and share the C++ math functions, so
they differ only in the order reductions add: clusters without reductions
must agree bit for bit, others within a tolerance of that order. The random
clusters mix row reductions (sum, mean, max, min), per-row and per-column
operands, several outputs, static widths on both sides of the warp/block
threshold and run-time widths. The seeds are fixed. TF-free.
"""

import numpy as np
import pytest

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.gpu import build as gpu_build
from tf_fusionstitch.kernels import build_cpu_kernel
from tf_fusionstitch.runtime.cpu_kernel import CpuKernel
from tf_fusionstitch.schedule import UnsupportedCluster, build_schedule

T, op = ir.TensorType, ir.make_op
N = None
WIDTHS = (0, 1, 3, 33, 100, 1030, 2500, None)
UNARY = ("neg", "abs", "tanh", "sigmoid", "relu", "square")
BINARY = ("add", "sub", "mul", "maximum", "minimum")
REDUCE = ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min")
# What a value spans: every element, one per row, or one per column.
_KIND_OF_PAIR = {frozenset({"full"}): "full", frozenset({"row"}): "row",
                 frozenset({"col"}): "col"}


def random_cluster(seed):
    """The first cluster drawn from `seed` that the schedule fuses."""
    for attempt in range(100):
        drawn = _draw(np.random.default_rng([seed, attempt]))
        if drawn is None:
            continue
        try:
            build_schedule(drawn[0])
        except UnsupportedCluster:
            continue  # e.g. an output spanning only the columns
        return drawn
    raise AssertionError(f"seed {seed}: no fusible cluster in 100 draws")


def _draw(rng):
    width = WIDTHS[rng.integers(len(WIDTHS))]
    dtype = ("float32", "float64")[rng.integers(2)]
    shapes = {"full": (N, width), "row": (N, 1), "col": (width,)}
    inputs = [("x", T(dtype, shapes["full"]))]
    kinds = {"x": "full"}
    if rng.random() < 0.6:
        inputs.append(("v", T(dtype, shapes["col"])))
        kinds["v"] = "col"
    if rng.random() < 0.4:
        inputs.append(("s", T(dtype, shapes["row"])))
        kinds["s"] = "row"
    ops = []
    if rng.random() < 0.35:  # softmax-like motif: an expensive value used across a reduction
        e = T(dtype, shapes["full"])
        ops += [op("m0", ("tanh", "sigmoid")[rng.integers(2)], ["x"], e),
                op("m1", REDUCE[rng.integers(len(REDUCE))], ["m0"], T(dtype, shapes["row"]),
                   axes=[1], keep_dims=True),
                op("m2", BINARY[rng.integers(len(BINARY))], ["m0", "m1"], e)]
        kinds.update(m0="full", m1="row", m2="full")
    for i in range(int(rng.integers(2, 9))):
        names = list(kinds)
        full = [n for n in names if kinds[n] == "full"]
        r = rng.random()
        if r < 0.2 and full:
            src = full[rng.integers(len(full))]
            kind, prim = "row", REDUCE[rng.integers(len(REDUCE))]
            ops.append(op(f"o{i}", prim, [src], T(dtype, shapes["row"]), axes=[1],
                          keep_dims=True))
        elif r < 0.55:
            src = names[-1] if rng.random() < 0.5 else names[rng.integers(len(names))]
            kind = kinds[src]
            ops.append(op(f"o{i}", UNARY[rng.integers(len(UNARY))], [src],
                          T(dtype, shapes[kind])))
        else:
            a, b = (names[j] for j in rng.integers(len(names), size=2))
            if rng.random() < 0.6:  # chains: a reduction's result meets its row again
                a = names[-1]
            kind = _KIND_OF_PAIR.get(frozenset({kinds[a], kinds[b]}), "full")
            ops.append(op(f"o{i}", BINARY[rng.integers(len(BINARY))], [a, b],
                          T(dtype, shapes[kind])))
        kinds[f"o{i}"] = kind
    has_reduce = any(o.prim in REDUCE for o in ops) and width != 1  # 1 column: no reduction
    allowed = ("full", "row") if has_reduce else ("full",)
    candidates = [o.name for o in ops if kinds[o.name] in allowed]
    if not candidates:
        return None
    outputs = {candidates[-1]} | {c for c in candidates if rng.random() < 0.3}
    return ir.Cluster(tuple(inputs), tuple(ops), tuple(sorted(outputs))), width, has_reduce


def inputs_for(cluster, rows, width, rng):
    w = width if width is not None else 37
    out = []
    for _, t in cluster.inputs:
        shape = tuple(rows if i == 0 and t.rank == 2 else (w if d is None else d)
                      for i, d in enumerate(t.shape))
        if t.rank == 1:
            shape = (w,)
        out.append((rng.standard_normal(shape) * 2).astype(t.dtype))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_emulated_cuda_schedule_agrees_with_the_cpu_kernel(seed):
    cluster, width, has_reduce = random_cluster(seed)
    cpu = build_cpu_kernel(cluster).runner()
    gpu = CpuKernel(gpu_build.build_emulation(cluster, reverse_threads=bool(seed % 2)))
    rng = np.random.default_rng(1000 + seed)
    tol = 1e-5 if cluster.inputs[0][1].dtype == "float32" else 1e-12
    for rows in (0, 1, 19):
        inputs = inputs_for(cluster, rows, width, rng)
        for want, got in zip(cpu.run(inputs), gpu.run(inputs, threads=2, forward=True)):
            if has_reduce:
                scale = max(1.0, float(np.abs(want).max(initial=0)))
                np.testing.assert_allclose(got, want, rtol=tol * 10, atol=tol * scale * 10)
            else:
                np.testing.assert_array_equal(got, want)
