"""How cuda_check judges an emulated GPU kernel's outputs against a reference
(TF-free, and without the tool's flags, so tests can import it)."""

import dataclasses

import numpy as np

from tf_fusionstitch import array_interpreter, patterns
from tf_fusionstitch import fusion_ir as ir

# Tolerances against the CPU kernel (relative to each output's largest
# magnitude: compare_outputs' normwise).
RTOL, ATOL = 1e-4, 1e-5


def compare_outputs(got, wanted, rtol, atol, normwise=False) -> tuple:
    """(largest error, all within tolerance). `normwise`: rtol relative to
    the output's largest magnitude rather than each element's. A spec file's
    reference is the CPU kernel, which sums in double; the GPU sums a
    column of thousands of rows in float32 (as TF's and XLA's GPU kernels
    do), and where such a sum nearly cancels a later subtraction the
    element's own magnitude is no measure of its error (BERT's bias-gradient
    clusters at 2048 rows: ours and XLA's both 2.3e-3 off on values of ~100).
    Random inputs make it worse: an AdamW update packed with batch-norm
    gradient sums divides by the root of a random "second moment", which can
    be nearly 0, and amplifies the sums' rounding; the emulated GPU sums and
    the CPU kernel's are equally accurate against float64 there, yet differ
    elementwise by 1e-3 (tests/tools/test_cuda_check_tool.py)."""
    err, ok = 0.0, len(got) == len(wanted)
    for g, w in zip(got, wanted):
        scale = np.nanmax(np.abs(np.where(np.isinf(w), 0, w)), initial=0.0) if normwise else 0.0
        e, good = patterns.max_error(g, w, rtol, atol + rtol * scale)
        err, ok = max(err, e), ok and good
    return err, ok


def _computes_in_16_bits(cluster: ir.Cluster) -> bool:
    types = [t for _, t in cluster.inputs] + [op.type for op in cluster.ops]
    return any(t.dtype in ("float16", "bfloat16") for t in types)


def float64_interpreter(cluster: ir.Cluster):
    """The spec interpreted in float64 on NumPy (array_interpreter; float32
    values and casts widened), or None where it computes in 16-bit floats,
    whose rounding the reference must keep."""
    if _computes_in_16_bits(cluster):
        return None

    def wide(t):
        return dataclasses.replace(t, dtype="float64") if t.dtype == "float32" else t
    ops = tuple(dataclasses.replace(
        op, type=wide(op.type),
        attrs=tuple((k, "float64" if v == "float32" else v) for k, v in op.attrs))
        for op in cluster.ops)
    return array_interpreter.interpret(dataclasses.replace(
        cluster, inputs=tuple((n, wide(t)) for n, t in cluster.inputs), ops=ops), np)


def widened_inputs(inputs) -> list:
    return [a.astype(np.float64) if a.dtype == np.float32 else a for a in inputs]


def _no_farther(got, exact, allowance, rtol, atol) -> bool:
    """Each output of `got` as NaN as the float64 result `exact` and no
    farther from it (largest distance over the output) than the tolerance
    relative to the output's largest magnitude plus allowance(i, far), where
    far(a) is an array's distance from output i of `exact`."""
    for i, (g, e) in enumerate(zip(got, exact)):
        g, e = np.asarray(g, np.float64), np.asarray(e, np.float64)
        nan = np.isnan(e)
        if g.shape != e.shape or not np.array_equal(np.isnan(g), nan):
            return False
        scale = np.max(np.abs(np.where(np.isinf(e), 0, e))[~nan], initial=0.0)

        def far(a):
            a = np.asarray(a, np.float64)
            with np.errstate(invalid="ignore"):   # equal infinities differ by nothing
                return np.max(np.where(a == e, 0.0, np.abs(a - e))[~nan], initial=0.0)
        if far(g) > atol + rtol * scale + allowance(i, far):
            return False
    return True


def as_close_as_cpu(got, cpu, exact, rtol, atol, factor=2.0) -> bool:
    """Each output of the emulated kernel at most `factor` times as far from
    the float64 result (largest distance over the output) as the CPU kernel's,
    plus the tolerance relative to the output's largest magnitude. Where the
    random inputs make an output ill-conditioned, both kernels are far from
    it, in different directions, and further from each other than either is
    from the truth (tests/tools/test_cuda_check_tool.py)."""
    return _no_farther(got, exact, lambda i, far: factor * far(cpu[i]), rtol, atol)


# Float32 programs whose spread bounds an ill-conditioned output (float32_spread).
SUM_ORDERS = 8


def float32_spread(cluster: ir.Cluster, inputs, rng, orders: int = SUM_ORDERS):
    """The cluster's outputs from `orders` float32 programs that differ from
    each other only in the order of their sums' terms (NumPy, shuffled by
    `rng`), or None where it computes in 16-bit floats."""
    if _computes_in_16_bits(cluster):
        return None
    run = array_interpreter.interpret(cluster, np, sum_order=rng)
    return [run(*inputs) for _ in range(orders)]


def within_float32_spread(got, exact, programs, rtol, atol) -> bool:
    """Each output of the emulated kernel no farther from the float64 result
    than the farthest of `programs` (float32_spread), plus the tolerance
    relative to the output's largest magnitude. A sum that nearly cancels,
    later divided by a random value near 0 (an optimizer's root of a random
    second moment), lands anywhere in a range that float32 rounding alone
    spans, whatever the order; the CPU kernel sums in double and does not
    show it. An error of the schedule (an index, a lost partial sum) lies far
    outside that range (tests/tools/test_cuda_check_tool.py)."""
    return _no_farther(got, exact, lambda i, far: max(far(p[i]) for p in programs),
                       rtol, atol)


def agrees_with_cpu(emulated, cpu, cluster: ir.Cluster, rows, rng, rtol=RTOL, atol=ATOL
                    ) -> tuple:
    """(largest error, all good) of an emulated GPU kernel against the CPU
    kernel of the same cluster (both runtime.cpu_kernel.CpuKernel) on random
    inputs, every dynamic dimension taking each of `rows`: normwise within
    the tolerance, or where that fails, as close to the float64
    interpretation as the CPU kernel (as_close_as_cpu) or as float32 rounding
    alone can move it (within_float32_spread)."""
    exact = float64_interpreter(cluster)
    err, ok = 0.0, True
    for n in rows:
        inputs = patterns.random_inputs(cluster, n, rng)
        wanted = cpu.run(inputs)
        got = emulated.run(inputs, threads=2, forward=True)
        e, good = compare_outputs(got, wanted, rtol, atol, normwise=True)
        if not good and exact is not None:
            best = exact(*widened_inputs(inputs))
            good = as_close_as_cpu(got, wanted, best, rtol, atol) or within_float32_spread(
                got, best, float32_spread(cluster, inputs, np.random.default_rng(n)), rtol, atol)
        err, ok = max(err, e), ok and good
    return err, ok
