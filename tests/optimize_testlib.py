"""Helpers shared by test_optimize_ops.py and test_optimize_functions.py.

Inputs are fresh random values from a seeded generator; results of the
optimized function are compared with the original tf.function's under the
tolerances docs/DESIGN.md, "Numerics" documents per op class:

- integers and booleans: exact;
- one elementwise op: the result rounded once to the output type, so within
  a few ulp of the output type (float16 and bfloat16 results are computed in
  float32 and rounded once, as TensorFlow's CPU kernels do for one op);
- elementwise chains: a few ulp per op; float16/bfloat16 chains keep float32
  intermediates where TensorFlow rounds after every op, so they are looser;
- reductions: |error| <= (n + 2) * eps * sum(|x|) over the n reduced elements.
"""

from __future__ import annotations

import warnings

import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs

# float16/bfloat16 keep float32 intermediates inside a fused chain: allow for
# the input rounding TensorFlow applies after every op (condition number of
# the chain up to ~4 on the domains used here).
_ELEMENTWISE_TOL = {            # (rtol, atol) for one op / for a chain
    "float64": ((1e-13, 1e-15), (1e-12, 1e-14)),
    "float32": ((1e-6, 1e-7), (1e-5, 1e-6)),
    "float16": ((1e-3, 1e-4), (8e-3, 4e-3)),
    "bfloat16": ((8e-3, 1e-3), (6e-2, 2e-2)),
}

# Transcendental functions: TF's Eigen kernels and our vecmath are each within
# a few ulp of the exact result, so they differ by up to ~8 ulp.
_TRANSCENDENTAL_TOL = {"float64": (1e-12, 1e-14), "float32": (1e-5, 1e-6)}

EPS = {"float64": np.finfo(np.float64).eps, "float32": np.finfo(np.float32).eps,
       "float16": np.finfo(np.float16).eps, "bfloat16": 2.0 ** -7}

FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int32", "int64")


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def random(gen: np.random.Generator, shape, dtype: str, domain: str = "normal") -> tf.Tensor:
    """A random tensor of `dtype` whose values lie in `domain`."""
    shape = tuple(shape)
    if dtype == "bool":
        return tf.constant(gen.random(shape) < 0.5)
    if dtype in INTS:
        lo, hi = {"positive": (1, 20), "nonzero": (1, 20)}.get(domain, (-20, 20))
        values = gen.integers(lo, hi, size=shape)
        if domain == "nonzero":
            values = values * gen.choice([-1, 1], size=shape)
        return tf.constant(values, dtype=dtype)
    if domain == "normal":
        values = gen.standard_normal(shape) * 2.0
    elif domain == "unit":            # around 1, for multiplicative chains
        values = gen.uniform(0.5, 1.0, shape)
    elif domain == "positive":
        values = np.exp(gen.uniform(np.log(0.05), np.log(20.0), shape))
    elif domain == "log1p":
        values = gen.uniform(-0.9, 5.0, shape)
    elif domain == "nonzero":
        values = (gen.uniform(0.25, 4.0, shape)) * gen.choice([-1.0, 1.0], size=shape)
    elif domain == "halves":         # many exact .5 ties for Round, Floor, Ceil
        values = gen.integers(-12, 12, size=shape) / 2.0 + \
            np.where(gen.random(shape) < 0.5, 0.0, gen.uniform(-0.49, 0.49, shape))
    elif domain == "small":
        values = gen.uniform(-1.5, 1.5, shape)
    else:
        raise ValueError(domain)
    return tf.cast(tf.constant(values, dtype=tf.float64), dtype)


def traced_types(graph_def, graph):
    """The types the pass would see for `graph_def` (`graph`'s, or what
    Grappler made of it): TF's shape inference, seeded with the traced shapes."""
    from tf_fusionstitch.rewriters import shapes
    hints = {t.name: tf.TensorSpec(t.shape, t.dtype)
             for op in graph.get_operations() for t in op.outputs}
    return shapes.infer_types(graph_def, hints)


def to_numpy(t) -> np.ndarray:
    a = np.asarray(t.numpy() if hasattr(t, "numpy") else t)
    if a.dtype == tf.bfloat16.as_numpy_dtype or a.dtype == np.float16:
        return a.astype(np.float32)
    return a


def dtype_name(t) -> str:
    return tf.as_dtype(t.dtype).name


def assert_same(case: tf.test.TestCase, actual, expected, kind: str = "chain",
                msg: str = "", rtol: float = None, atol: float = None) -> None:
    """Compares one result of the optimized function with TF's.

    kind: 'op' (one elementwise op), 'chain', 'transcendental' (one or a few
    transcendental ops), or 'exact'. Integers and booleans are always exact.
    """
    case.assertEqual(actual.dtype, expected.dtype, msg)
    case.assertEqual(tuple(actual.shape), tuple(expected.shape), msg)
    dtype = dtype_name(expected)
    a, e = to_numpy(actual), to_numpy(expected)
    if dtype not in FLOATS or kind == "exact":
        np.testing.assert_array_equal(a, e, err_msg=msg)
        return
    if rtol is None:
        if kind == "transcendental" and dtype in _TRANSCENDENTAL_TOL:
            rtol, atol = _TRANSCENDENTAL_TOL[dtype]
        else:
            rtol, atol = _ELEMENTWISE_TOL[dtype][0 if kind == "op" else 1]
    # NaN where TF has NaN; Inf with its sign where TF has Inf.
    np.testing.assert_array_equal(np.isnan(a), np.isnan(e), err_msg=f"NaN positions: {msg}")
    inf = np.isinf(e)
    np.testing.assert_array_equal(a[inf], e[inf], err_msg=f"Inf values: {msg}")
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=msg)


# How much farther from the exact result than TF's an optimized result may land
# (normwise): a contraction rewritten as another op sums in another order, and
# which order rounds better depends on the machine's kernel (AVX-512 or AVX2).
ACCURACY_FACTOR = 4.0


def assert_as_accurate_as_tf(case: tf.test.TestCase, actual, expected, exact,
                             msg: str = "", factor: float = ACCURACY_FACTOR) -> None:
    """One result of the optimized function no farther (normwise) from `exact`
    (the same function computed in float64, or in float32 for 16-bit inputs)
    than `factor` times TF's `expected`, or than one rounding of its dtype:
    for ill-conditioned results (a sum that cancels), where rtol against TF's
    result measures TF's rounding, not a mistake. NaN and Inf where TF has them."""
    case.assertEqual(actual.dtype, expected.dtype, msg)
    case.assertEqual(tuple(actual.shape), tuple(expected.shape), msg)
    a, e = to_numpy(actual).astype(np.float64), to_numpy(expected).astype(np.float64)
    x = to_numpy(exact).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(e), err_msg=f"NaN positions: {msg}")
    inf = np.isinf(e)
    np.testing.assert_array_equal(a[inf], e[inf], err_msg=f"Inf values: {msg}")
    finite = np.isfinite(x)
    scale = max(float(np.linalg.norm(x[finite])), np.finfo(np.float64).tiny)
    d_fs = float(np.linalg.norm((a - x)[finite])) / scale
    d_tf = float(np.linalg.norm((e - x)[finite])) / scale
    allowed = max(factor * d_tf, float(EPS[dtype_name(expected)]))
    case.assertLessEqual(d_fs, allowed, f"{msg}: {d_fs:.3g} from the exact result (normwise), "
                                        f"TF {d_tf:.3g}; allowed {allowed:.3g}")


def assert_reduction_close(case, actual, expected, x, axes, kind: str, keepdims: bool,
                           msg: str = "") -> None:
    """Reductions: exact for integers, booleans, max and min; a sum-of-magnitudes
    bound for sums and means; a relative bound of n ulp for products."""
    case.assertEqual(actual.dtype, expected.dtype, msg)
    case.assertEqual(tuple(actual.shape), tuple(expected.shape), msg)
    dtype = dtype_name(expected)
    a, e = to_numpy(actual), to_numpy(expected)
    if dtype not in FLOATS or kind in ("max", "min"):
        np.testing.assert_array_equal(a, e, err_msg=msg)
        return
    xa = to_numpy(x).astype(np.float64)
    axes = tuple(range(xa.ndim)) if axes is None else tuple(np.atleast_1d(axes) % max(xa.ndim, 1))
    n = int(np.prod([xa.shape[i] for i in axes])) if axes else 1
    eps = EPS[dtype]
    if kind in ("sum", "mean"):
        bound = (n + 2) * eps * np.sum(np.abs(xa), axis=axes, keepdims=keepdims)
        if kind == "mean":
            bound = bound / max(n, 1)
    else:  # prod
        bound = (n + 2) * eps * np.abs(np.prod(xa, axis=axes, keepdims=keepdims))
    bound = np.broadcast_to(bound, e.shape).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(e), err_msg=msg)
    err = np.abs(a.astype(np.float64) - e.astype(np.float64))
    # the result is also rounded once to its type
    bound = bound + eps * np.abs(e.astype(np.float64)) + np.finfo(np.float32).tiny
    bad = ~(err <= bound) & ~np.isnan(e)
    case.assertFalse(bad.any(), f"{msg}: reduction error {err[bad][:5]} exceeds bound "
                                f"{bound[bad][:5]} (fused {a[bad][:5]}, TF {e[bad][:5]})")


def optimize_and_run(fn, *args, min_cluster_ops: int = 1, **options):
    """(optimized, TF result, optimized result) for one call on `args`.
    Kernels are not packed unless `pack=True` is passed: these tests count
    clusters per op; tests/rewriters/test_packing.py covers packing."""
    if options.get("fusion", "stitch") != "xla_like":
        options.setdefault("pack", False)
    opt = fs.optimize(fn, min_cluster_ops=min_cluster_ops, **options)
    expected = fn(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback is a failure here
        actual = opt(*args)
    return opt, expected, actual


def fused_op_types(opt) -> set:
    return {t for c in opt.report().fused_clusters for _, t in c.tf_ops}


def fused_clusters_with(opt, op_type: str) -> list:
    return [c for c in opt.report().fused_clusters if any(t == op_type for _, t in c.tf_ops)]


def graph_ops(graph_def) -> list:
    """The op types of a GraphDef's nodes and of its library's functions' nodes."""
    ops = [n.op for n in graph_def.node]
    for f in graph_def.library.function:
        ops += [n.op for n in f.node_def]
    return ops


def fusion_stitch_nodes(graph_def) -> list:
    nodes = [n for n in graph_def.node if n.op == "FusionStitch"]
    for f in graph_def.library.function:
        nodes += [n for n in f.node_def if n.op == "FusionStitch"]
    return nodes


def quiet_call(fn, *args, **kwargs):
    """Calls `fn`, failing on any RuntimeWarning: a fallback is a failure here."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        return fn(*args, **kwargs)


# Trained weights are compared normwise: |du_fused - du_TF|_2 <= UPDATE_RTOL |du_TF|_2
# over the steps (tests/models/test_reference_models.py says why not elementwise).
UPDATE_RTOL = 1e-4


def assert_train_steps_match(case, reference, fused, opt, gen, steps: int = 3,
                             batch_size: int = 4, name: str = "") -> None:
    """`steps` optimized train steps of `fused` (a benchmarks/models model whose
    `train_step` `opt` optimizes) give `reference`'s TF losses and weight
    updates from identical initial weights; non-trainable weights (moving
    statistics) elementwise; Adam ran in every fused step."""
    initial = [w.numpy() for w in reference.model.weights]
    for r, f in zip(initial, fused.model.weights):
        np.testing.assert_array_equal(r, f.numpy(), err_msg="two builds differ")
    for step in range(steps):
        batch = reference.make_batch(gen, batch_size)
        expected = reference.train_step(*batch.inputs, batch.labels)
        actual = quiet_call(opt, *batch.inputs, batch.labels)
        assert_same(case, actual, expected, "transcendental", msg=f"{name} loss {step}")
    for r, f, before in zip(reference.model.weights, fused.model.weights, initial):
        if r.trainable:
            want, got = r.numpy() - before, f.numpy() - before
            case.assertGreater(np.linalg.norm(want), 0.0, f"{r.path} was not trained")
            error = np.linalg.norm(got - want) / np.linalg.norm(want)
            case.assertLessEqual(error, UPDATE_RTOL, f"{name}: {r.path} update differs")
        else:
            assert_same(case, tf.convert_to_tensor(f), tf.convert_to_tensor(r),
                        "transcendental", msg=r.path)
    case.assertEqual(int(fused.optimizer.iterations), steps)


def make_stateful_step(seed: int, noise: bool = False):
    """A step that reads a variable, assigns to it, reads it again, counts
    (and with `noise` draws random numbers): every stateful op must keep its
    place. Returns (step, variable, counter); the count is the last output."""
    gen = rng(seed)
    v = tf.Variable(random(gen, (4, 8), "float32"))
    count = tf.Variable(0, dtype=tf.int64)

    @tf.function(input_signature=[tf.TensorSpec([4, 8])])
    def step(x):
        before = tf.tanh(v * 2.0) + 1.0                      # read before the assignment
        v.assign_add(x * 0.5)
        after = tf.nn.relu(v.read_value() - 0.25) * 3.0      # must see the new value
        drawn = (tf.random.uniform([4, 8], seed=7) * 2.0 - 1.0,) if noise else ()
        count.assign_add(1)
        return (before, after, *(d * before for d in drawn), count.read_value())

    return step, v, count
