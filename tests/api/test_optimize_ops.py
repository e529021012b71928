"""Every op of the op table through `tf_fusionstitch.optimize`, against TensorFlow.

Each op runs alone (min_cluster_ops=1, so one op is a cluster) for every dtype
TensorFlow's CPU kernels accept, and in a chain of 2-3 ops with NumPy
broadcasting ([N,1,C] with [H,1]). Each test asserts that the op was fused
(the report shows a fused cluster containing it) and that the results match
TensorFlow's within the per-op-class tolerances of docs/DESIGN.md, "Numerics" (see
optimize_testlib.py). Several independent clusters go into one function, so
their kernels compile in parallel; shapes are shared so the session cache is.
"""

import numpy as np
import tensorflow as tf

from optimize_testlib import (FLOATS, INTS, assert_reduction_close, assert_same,
                              fused_clusters_with, fusion_stitch_nodes, optimize_and_run,
                              random, rng, to_numpy)
from tf_fusionstitch.rewriters import op_table

raw = tf.raw_ops

SHAPE = (3, 5, 7)
N, H, C = 3, 5, 7

_TRANSCENDENTAL = {"Exp", "Log", "Log1p", "Expm1", "Tanh", "Sigmoid", "Elu", "Selu",
                   "Softplus", "Erf", "Erfc", "Sin", "Cos", "Rsqrt", "Sqrt"}

# op type -> (callable on one tensor, input domain, dtypes TF's CPU kernels accept
# that we expect to be fused)
UNARY = {
    "Neg": (lambda x: raw.Neg(x=x), "normal", FLOATS + INTS),
    "Abs": (lambda x: raw.Abs(x=x), "normal", FLOATS + INTS),
    "Exp": (lambda x: raw.Exp(x=x), "normal", FLOATS),
    "Log": (lambda x: raw.Log(x=x), "positive", FLOATS),
    "Log1p": (lambda x: raw.Log1p(x=x), "log1p", FLOATS),
    "Expm1": (lambda x: raw.Expm1(x=x), "normal", FLOATS),
    "Sqrt": (lambda x: raw.Sqrt(x=x), "positive", FLOATS),
    "Rsqrt": (lambda x: raw.Rsqrt(x=x), "positive", FLOATS),
    "Square": (lambda x: raw.Square(x=x), "normal", FLOATS + INTS),
    "Reciprocal": (lambda x: raw.Reciprocal(x=x), "nonzero", FLOATS),
    "Tanh": (lambda x: raw.Tanh(x=x), "normal", FLOATS),
    "Sigmoid": (lambda x: raw.Sigmoid(x=x), "normal", FLOATS),
    "Relu": (lambda x: raw.Relu(features=x), "normal", FLOATS + INTS),
    "Relu6": (lambda x: raw.Relu6(features=x * 4), "normal", FLOATS),
    "Elu": (lambda x: raw.Elu(features=x), "normal", FLOATS),
    "Selu": (lambda x: raw.Selu(features=x), "normal", FLOATS),
    "Softplus": (lambda x: raw.Softplus(features=x), "normal", FLOATS),
    "Erf": (lambda x: raw.Erf(x=x), "normal", FLOATS),
    "Erfc": (lambda x: raw.Erfc(x=x), "normal", FLOATS),
    "Sin": (lambda x: raw.Sin(x=x), "normal", FLOATS),
    "Cos": (lambda x: raw.Cos(x=x), "normal", FLOATS),
    "Floor": (lambda x: raw.Floor(x=x), "halves", FLOATS),
    "Ceil": (lambda x: raw.Ceil(x=x), "halves", FLOATS),
    "Round": (lambda x: raw.Round(x=x), "halves", FLOATS),
    "Sign": (lambda x: raw.Sign(x=x), "normal", FLOATS + INTS),
    "IsFinite": (lambda x: raw.IsFinite(x=x), "special", FLOATS),
    "IsNan": (lambda x: raw.IsNan(x=x), "special", FLOATS),
    "LogicalNot": (lambda x: raw.LogicalNot(x=x), "bool", ("bool",)),
}
# Relu6's lambda scales by 4 so that both clamps are hit; the Mul is a second op.

BINARY = {
    # op type -> (callable, x domain, y domain, fused dtypes, dtypes left to TF)
    "Add": (lambda x, y: raw.Add(x=x, y=y), "normal", "normal", FLOATS + INTS, ()),
    "AddV2": (lambda x, y: raw.AddV2(x=x, y=y), "normal", "normal", FLOATS + INTS, ()),
    "Sub": (lambda x, y: raw.Sub(x=x, y=y), "normal", "normal", FLOATS + INTS, ()),
    "Mul": (lambda x, y: raw.Mul(x=x, y=y), "normal", "normal", FLOATS + INTS, ()),
    "RealDiv": (lambda x, y: raw.RealDiv(x=x, y=y), "normal", "nonzero", FLOATS, ()),
    "Div": (lambda x, y: raw.Div(x=x, y=y), "normal", "nonzero", FLOATS, INTS),
    "DivNoNan": (lambda x, y: raw.DivNoNan(x=x, y=y), "normal", "with_zeros", FLOATS, ()),
    "Maximum": (lambda x, y: raw.Maximum(x=x, y=y), "normal", "ties", FLOATS + INTS, ()),
    "Minimum": (lambda x, y: raw.Minimum(x=x, y=y), "normal", "ties", FLOATS + INTS, ()),
    "Pow": (lambda x, y: raw.Pow(x=x, y=y), "positive", "small", FLOATS, INTS),
    "SquaredDifference": (lambda x, y: raw.SquaredDifference(x=x, y=y), "normal", "normal",
                          FLOATS + INTS, ()),
    "FloorDiv": (lambda x, y: raw.FloorDiv(x=x, y=y), "normal", "nonzero", FLOATS, INTS),
    "FloorMod": (lambda x, y: raw.FloorMod(x=x, y=y), "normal", "nonzero", FLOATS, INTS),
    "Less": (lambda x, y: raw.Less(x=x, y=y), "normal", "ties", FLOATS + INTS, ()),
    "Greater": (lambda x, y: raw.Greater(x=x, y=y), "normal", "ties", FLOATS + INTS, ()),
    "Equal": (lambda x, y: raw.Equal(x=x, y=y), "normal", "ties", FLOATS + INTS + ("bool",),
              ()),
    "NotEqual": (lambda x, y: raw.NotEqual(x=x, y=y), "normal", "ties",
                 FLOATS + INTS + ("bool",), ()),
    "LessEqual": (lambda x, y: raw.LessEqual(x=x, y=y), "normal", "ties", FLOATS + INTS, ()),
    "GreaterEqual": (lambda x, y: raw.GreaterEqual(x=x, y=y), "normal", "ties",
                     FLOATS + INTS, ()),
    "LogicalAnd": (lambda x, y: raw.LogicalAnd(x=x, y=y), "bool", "bool", ("bool",), ()),
    "LogicalOr": (lambda x, y: raw.LogicalOr(x=x, y=y), "bool", "bool", ("bool",), ()),
}

_EXACT_BINARY = {"Less", "Greater", "Equal", "NotEqual", "LessEqual", "GreaterEqual",
                 "LogicalAnd", "LogicalOr", "Maximum", "Minimum", "FloorDiv"}


def _input(gen, shape, dtype, domain, like=None):
    """Random input; 'special' sprinkles NaN/Inf, 'ties' copies values of `like`,
    'with_zeros' puts zeros in."""
    if domain == "special":
        x = to_numpy(random(gen, shape, "float64", "normal")).astype(np.float64)
        pick = gen.random(shape)
        x[pick < 0.15] = np.nan
        x[(pick >= 0.15) & (pick < 0.25)] = np.inf
        x[(pick >= 0.25) & (pick < 0.35)] = -np.inf
        return tf.cast(tf.constant(x), dtype)
    if domain == "bool":
        return random(gen, shape, "bool")
    if domain in ("ties", "with_zeros"):
        base = random(gen, shape, dtype, "nonzero" if domain == "with_zeros" else "normal")
        pick = tf.constant(gen.random(shape) < 0.3)
        other = tf.zeros_like(base) if domain == "with_zeros" else tf.broadcast_to(like, shape)
        return tf.where(pick, other, base)
    if domain in ("small", "nonzero", "positive") and dtype in INTS:
        return random(gen, shape, dtype, "positive" if domain != "nonzero" else "nonzero")
    if dtype in INTS:
        return random(gen, shape, dtype, "normal")
    return random(gen, shape, dtype, domain)


class OptimizeOpsTest(tf.test.TestCase):
    """One op per cluster, for every dtype."""

    def _check_fused(self, opt, op_type, count, msg=""):
        clusters = fused_clusters_with(opt, op_type)
        self.assertLen(clusters, count, f"{op_type}: expected {count} fused clusters with it "
                                        f"{msg}\n{opt.report()}")

    # -- unary ---------------------------------------------------------------
    def _unary_alone(self, op_type, seed):
        fn, domain, dtypes = UNARY[op_type]
        gen = rng(seed)
        xs = [_input(gen, SHAPE, d, domain) for d in dtypes]
        f = tf.function(lambda *xs: [fn(x) for x in xs])
        opt, expected, actual = optimize_and_run(f, *xs)
        self._check_fused(opt, op_type, len(dtypes))
        kind = "transcendental" if op_type in _TRANSCENDENTAL else "op"
        if op_type == "Relu6":
            kind = "chain"  # x * 4 then Relu6
        for d, a, e in zip(dtypes, actual, expected):
            assert_same(self, a, e, kind, msg=f"{op_type} {d}")

    def _run_chains(self, op_type, chains, kind_of):
        """chains: [(dtype, g, args)]; all run in one function (one cluster each,
        compiled in parallel); each must be fused whole into one kernel."""
        flat = [t for _, _, args in chains for t in args]

        @tf.function
        def f(*flat):
            out, k = [], 0
            for _, g, args in chains:
                out.append(g(*flat[k:k + len(args)]))
                k += len(args)
            return out

        opt, expected, actual = optimize_and_run(f, *flat)
        self._check_fused(opt, op_type, len(chains), "in chains")
        self.assertEqual(len(fusion_stitch_nodes(opt.graph_def)), len(chains),
                         str(opt.report()))
        self.assertEqual(opt.report().kernels_after, len(chains), str(opt.report()))
        for (d, _, _), a, e in zip(chains, actual, expected):
            assert_same(self, a, e, kind_of(d), msg=f"{op_type} chain {d}")

    def _unary_chain(self, op_type, seed):
        """op(a * b) * c with a: [N,1,C], b: [H,1], c: [C] (LogicalNot: and/or)."""
        fn, domain, dtypes = UNARY[op_type]
        gen = rng(seed)
        chains = []
        for d in [t for t in dtypes if t in ("float32", "float16", "int64", "bool")]:
            a = _input(gen, (N, 1, C), d, domain)
            if d == "bool":
                b, c = random(gen, (H, 1), "bool"), random(gen, (C,), "bool")
                g = lambda a, b, c: tf.logical_or(fn(tf.logical_and(a, b)), c)
            elif domain == "halves":
                b, c = _input(gen, (H, 1), d, "halves"), random(gen, (C,), d)
                g = lambda a, b, c: fn(a + b) - c
            else:
                b = random(gen, (H, 1), d, "unit" if d not in INTS else "positive")
                if op_type in ("IsFinite", "IsNan"):
                    c = random(gen, (C,), "bool")
                    g = lambda a, b, c: tf.logical_or(fn(a * b), c)
                else:
                    c = random(gen, (C,), d)  # (+ c would let Grappler fold a Neg)
                    g = lambda a, b, c: fn(a * b) * c
            chains.append((d, g, (a, b, c)))
        self._run_chains(op_type, chains, lambda d: "transcendental" if (
            op_type in _TRANSCENDENTAL and d == "float32") else "chain")

    # -- binary --------------------------------------------------------------
    def _binary_alone(self, op_type, seed):
        fn, dx, dy, fused, unfused = BINARY[op_type]
        gen = rng(seed)
        dtypes = fused + unfused
        pairs = []
        for d in dtypes:
            x = _input(gen, SHAPE, d, dx)
            pairs += [x, _input(gen, SHAPE, d, dy, like=x)]
        f = tf.function(lambda *xy: [fn(xy[i], xy[i + 1]) for i in range(0, len(xy), 2)])
        opt, expected, actual = optimize_and_run(f, *pairs)
        self._check_fused(opt, op_type, len(fused))
        kind = "exact" if op_type in _EXACT_BINARY else (
            "transcendental" if op_type == "Pow" else "op")
        for d, a, e in zip(dtypes, actual, expected):
            if op_type == "SquaredDifference" and d in ("float16", "bfloat16"):
                # TF rounds x - y to half before squaring; we square the float difference
                assert_same(self, a, e, "chain", msg=f"{op_type} {d}")
                continue
            assert_same(self, a, e, kind, msg=f"{op_type} {d}")
        if unfused:  # integer division-like ops stay TF ops (and are still correct)
            left = [n for n in opt.graph_def.node if n.op == op_type]
            self.assertLen(left, len(unfused), str(opt.report()))

    def _binary_chain(self, op_type, seed):
        """op(a * s, b) then a third op, with a: [N,1,C], s: [C], b: [H,1]."""
        fn, dx, dy, fused, _ = BINARY[op_type]
        gen = rng(seed)
        chains = []
        for d in [t for t in fused if t in ("float32", "float16", "int32", "bool")]:
            if d == "float16" and op_type in _EXACT_BINARY and op_type not in (
                    "Maximum", "Minimum"):
                continue  # a comparison after float16 arithmetic is ulp-sensitive
            a = _input(gen, (N, 1, C), d, dx)
            if d == "bool":
                s = random(gen, (C,), "bool")
                b = random(gen, (H, 1), "bool")
                g = lambda a, s, b: tf.logical_and(fn(tf.logical_or(a, s), b), s)
                args = (a, s, b)
            else:
                s = random(gen, (C,), d, "unit" if d not in INTS else "positive")
                b = _input(gen, (H, 1), d, dy if dy != "ties" else "normal")
                out_bool = op_type in ("Less", "Greater", "Equal", "NotEqual", "LessEqual",
                                       "GreaterEqual")
                if out_bool:  # (Grappler would fold a LogicalNot into the comparison)
                    g = lambda a, s, b, m: tf.logical_and(fn(a * s, b), m)
                    args = (a, s, b, random(gen, (C,), "bool"))
                else:
                    g = lambda a, s, b: fn(a * s, b) - s
                    args = (a, s, b)
            chains.append((d, g, args))
        self._run_chains(op_type, chains, lambda d: "transcendental" if (
            op_type == "Pow" and d == "float32") else "chain")


def _add_op_tests(table, alone, chain):
    for i, op_type in enumerate(table):
        setattr(OptimizeOpsTest, f"test_{op_type}_alone",
                lambda self, op=op_type, s=i: getattr(self, alone)(op, 1000 + s))
        setattr(OptimizeOpsTest, f"test_{op_type}_chain",
                lambda self, op=op_type, s=i: getattr(self, chain)(op, 2000 + s))


_add_op_tests(UNARY, "_unary_alone", "_unary_chain")
_add_op_tests(BINARY, "_binary_alone", "_binary_chain")


# Backward ops: op type -> (callable on (gradient-like, operand), operand
# domain). TF does not broadcast them; each lowers to several primitives in the
# arithmetic order of TF's kernel, so one op is compared as one op.
GRADIENTS = {
    "ReluGrad": (lambda g, x: raw.ReluGrad(gradients=g, features=x), "normal"),
    "Relu6Grad": (lambda g, x: raw.Relu6Grad(gradients=g, features=x * 4), "normal"),
    "LeakyReluGrad": (lambda g, x: raw.LeakyReluGrad(gradients=g, features=x, alpha=0.3),
                      "normal"),
    "EluGrad": (lambda g, y: raw.EluGrad(gradients=g, outputs=y), "normal"),
    "SeluGrad": (lambda g, y: raw.SeluGrad(gradients=g, outputs=y), "normal"),
    "SoftplusGrad": (lambda g, x: raw.SoftplusGrad(gradients=g, features=x), "normal"),
    "TanhGrad": (lambda dy, y: raw.TanhGrad(y=y, dy=dy), "small"),
    "SigmoidGrad": (lambda dy, y: raw.SigmoidGrad(y=y, dy=dy), "unit"),
    "SqrtGrad": (lambda dy, y: raw.SqrtGrad(y=y, dy=dy), "positive"),
    "RsqrtGrad": (lambda dy, y: raw.RsqrtGrad(y=y, dy=dy), "positive"),
    "ReciprocalGrad": (lambda dy, y: raw.ReciprocalGrad(y=y, dy=dy), "nonzero"),
    "LeakyRelu": (lambda g, x: raw.LeakyRelu(features=x * g, alpha=0.3), "normal"),
}
_GRAD_SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -2.0, 3.0])


class OptimizeGradientOpsTest(tf.test.TestCase):
    """Backward ops alone (every float dtype, zeros/Inf/NaN in both operands)
    and as autodiff emits them in a training step."""

    def _alone(self, op_type, seed):
        fn, domain = GRADIENTS[op_type]
        gen = rng(seed)
        args = []
        for d in FLOATS:
            g = to_numpy(random(gen, SHAPE, "float64", "normal")).astype(np.float64)
            x = to_numpy(random(gen, SHAPE, "float64", domain)).astype(np.float64)
            # special values in the first row of each operand, crossed
            g[0, 0, :] = _GRAD_SPECIAL[:C]
            x[0, 1, :] = _GRAD_SPECIAL[:C]
            g[0, 1, :] = 0.0
            args += [tf.cast(tf.constant(g), d), tf.cast(tf.constant(x), d)]
        f = tf.function(lambda *gx: [fn(gx[i], gx[i + 1]) for i in range(0, len(gx), 2)])
        opt, expected, actual = optimize_and_run(f, *args)
        self.assertLen(fused_clusters_with(opt, op_type), len(FLOATS), str(opt.report()))
        kind = "transcendental" if op_type == "SoftplusGrad" else "op"
        for d, a, e in zip(FLOATS, actual, expected):
            an, en = to_numpy(a), to_numpy(e)
            np.testing.assert_array_equal(np.isnan(an), np.isnan(en), err_msg=f"NaN {op_type} {d}")
            exact = ~np.isnan(en) & (np.isinf(en) | (en == 0))
            np.testing.assert_array_equal(an[exact], en[exact], err_msg=f"{op_type} {d}")
            nan = tf.math.is_nan(e)  # same places in both (checked above)
            assert_same(self, tf.where(nan, tf.zeros_like(a), a), tf.where(nan, tf.zeros_like(e), e),
                        kind if d in ("float32", "float64") else "chain", msg=f"{op_type} {d}")

    def test_training_step_backward_ops_fuse_and_match(self):
        """A dense net with relu, elu, selu, tanh, sigmoid, softplus and a
        biased layer: its gradients come from the backward ops above and
        BiasAddGrad; one fused training step equals TF's."""
        gen = rng(4321)
        w = [tf.Variable(random(gen, (16, 16), "float32", "small") / 4) for _ in range(6)]
        b = tf.Variable(random(gen, (16,), "float32", "small"))
        acts = [tf.nn.relu, tf.nn.elu, tf.nn.selu, tf.tanh, tf.sigmoid, tf.nn.softplus]

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                h = tf.nn.bias_add(x, b)
                for wi, act in zip(w, acts):
                    h = act(tf.matmul(h, wi))
                loss = tf.reduce_sum(tf.nn.relu6(h * 3.0))
            return [loss] + tape.gradient(loss, w + [b])

        x = random(gen, (32, 16), "float32", "normal")
        opt, expected, actual = optimize_and_run(step, x)
        fused = {op for c in opt.report().fused_clusters for _, op in c.tf_ops}
        # (TF differentiates softplus as dy * sigmoid(x), not with SoftplusGrad)
        for op_type in ("ReluGrad", "EluGrad", "SeluGrad", "TanhGrad", "SigmoidGrad",
                        "Relu6Grad", "BiasAddGrad"):
            self.assertIn(op_type, fused, str(opt.report()))
        for a, e in zip(actual, expected):
            assert_same(self, a, e, "transcendental")

    def test_bias_add_grad_nchw_and_nhwc(self):
        gen = rng(77)
        g4 = random(gen, (2, 3, 5, 4), "float32")
        f = tf.function(lambda g: [raw.BiasAddGrad(out_backprop=g, data_format="NHWC"),
                                   raw.BiasAddGrad(out_backprop=g, data_format="NCHW")])
        opt, expected, actual = optimize_and_run(f, g4)
        self.assertLen(fused_clusters_with(opt, "BiasAddGrad"), 2, str(opt.report()))
        for a, e, axes in zip(actual, expected, [(0, 1, 2), (0, 2, 3)]):
            assert_reduction_close(self, a, e, g4, axes, "sum", False, msg=f"BiasAddGrad {axes}")


for _i, _op in enumerate(GRADIENTS):
    setattr(OptimizeGradientOpsTest, f"test_{_op}_alone",
            lambda self, op=_op, s=_i: self._alone(op, 3000 + s))


# Cast: (source, destination) pairs; each pair is its own cluster.
CASTS = [
    ("float32", "int32"), ("float32", "int64"), ("float32", "bool"), ("float32", "float16"),
    ("float32", "bfloat16"), ("float32", "float64"), ("float64", "float32"),
    ("float64", "float16"), ("float16", "float32"), ("bfloat16", "float32"),
    ("float16", "int32"), ("bfloat16", "int32"), ("int32", "float32"), ("int64", "float32"),
    ("int32", "float16"), ("int32", "bfloat16"), ("int32", "int64"), ("int64", "int32"),
    ("int32", "bool"), ("bool", "float32"), ("bool", "int32"), ("bool", "float16"),
    ("float16", "bfloat16"), ("bfloat16", "float16"), ("float16", "bool"),
]


class OptimizeCastTest(tf.test.TestCase):

    def _inputs(self, gen, shape):
        xs = []
        for src, dst in CASTS:
            if src == "bool":
                xs.append(random(gen, shape, "bool"))
            elif src in INTS:
                scale = 1 << 40 if (src, dst) == ("int64", "int32") else 1
                xs.append(tf.constant(gen.integers(-300, 300, size=shape) * scale, dtype=src))
            else:
                v = gen.standard_normal(shape) * 100.0
                v[gen.random(shape) < 0.2] = 0.0
                v[gen.random(shape) < 0.1] = -0.0
                xs.append(tf.cast(tf.constant(v), src))
        return xs

    def test_cast_alone(self):
        gen = rng(3000)
        xs = self._inputs(gen, SHAPE)
        f = tf.function(lambda *xs: [tf.cast(x, dst) for x, (_, dst) in zip(xs, CASTS)])
        opt, expected, actual = optimize_and_run(f, *xs)
        self.assertLen(fused_clusters_with(opt, "Cast"), len(CASTS), str(opt.report()))
        for (src, dst), a, e in zip(CASTS, actual, expected):
            assert_same(self, a, e, "exact", msg=f"Cast {src}->{dst}")

    def test_cast_of_a_computed_16_bit_value_rounds_it_first(self):
        """TF stores a float16/bfloat16 result in its type before a Cast reads
        it; a fused kernel keeps it in float32, so the cast must round first.
        One op before the cast rounds once in both, so results are exact:
        the float32 value, int32 truncation, and bool (products that underflow
        the 16-bit type are zero there)."""
        gen = rng(3100)
        for d, tiny in (("float16", 1e-4), ("bfloat16", 1e-30)):
            v = gen.uniform(-40, 40, (64, 33))
            v[gen.random(v.shape) < 0.3] = tiny
            x = tf.cast(tf.constant(v), d)
            f = tf.function(lambda x, d=d, tiny=tiny: [
                tf.cast(x * tf.constant(1.37, d), "float32"),
                tf.cast(x * tf.constant(1.37, d), "int32"),
                tf.cast(x * tf.constant(1.37, d), "float64"),
                tf.cast(x * tf.constant(tiny, d), "bool")])
            opt, expected, actual = optimize_and_run(f, x)
            self.assertNotEmpty(fusion_stitch_nodes(opt.graph_def), str(opt.report()))
            for a, e, to in zip(actual, expected, ("float32", "int32", "float64", "bool")):
                assert_same(self, a, e, "exact", msg=f"{d} -> {to}")

    def test_cast_chain(self):
        """Cast between arithmetic ops, broadcasting [N,1,C] with [H,1]."""
        gen = rng(3001)
        a = random(gen, (N, 1, C), "float32")
        b = random(gen, (H, 1), "float32")
        i = tf.constant(gen.integers(-5, 5, size=(C,)), tf.int32)

        @tf.function
        def f(a, b, i):
            p = a * b
            h = tf.cast(p, tf.float16)                          # round to half
            j = tf.cast(tf.cast(h, tf.float32) * 3.0, tf.int32) + i   # truncate, add ints
            k = tf.cast(tf.cast(j, tf.bfloat16), tf.float32)    # round to bfloat16
            return k + tf.cast(j > 0, tf.float32), tf.cast(tf.cast(p, tf.bfloat16) * 2, tf.float32)

        opt, expected, actual = optimize_and_run(f, a, b, i)
        self.assertNotEmpty(fused_clusters_with(opt, "Cast"), str(opt.report()))
        self.assertEqual(len(fusion_stitch_nodes(opt.graph_def)), 1, str(opt.report()))
        assert_same(self, actual[0], expected[0], "exact", msg="cast chain")
        assert_same(self, actual[1], expected[1], "exact", msg="bfloat16 product")


class OptimizeSelectBiasTest(tf.test.TestCase):

    def test_select_and_select_v2(self):
        gen = rng(3100)
        args = []
        for d in ("float32", "float64", "float16", "bfloat16", "int32", "int64", "bool"):
            args += [random(gen, SHAPE, "bool"), random(gen, SHAPE, d), random(gen, SHAPE, d)]
        # Select v1 with a vector condition picking whole rows.
        cv, av, bv = random(gen, (N,), "bool"), random(gen, SHAPE, "float32"), \
            random(gen, SHAPE, "float32")

        @tf.function
        def f(cv, av, bv, *args):
            out = [raw.Select(condition=cv, x=av, y=bv)]
            for k in range(0, len(args), 3):
                if k % 2:
                    out.append(raw.Select(condition=args[k], x=args[k + 1], y=args[k + 2]))
                else:
                    out.append(raw.SelectV2(condition=args[k], t=args[k + 1], e=args[k + 2]))
            return out

        opt, expected, actual = optimize_and_run(f, cv, av, bv, *args)
        n_v1 = 1 + sum(1 for k in range(0, len(args), 3) if k % 2)
        self.assertLen(fused_clusters_with(opt, "Select"), n_v1, str(opt.report()))
        self.assertLen(fused_clusters_with(opt, "SelectV2"), len(actual) - n_v1,
                       str(opt.report()))
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert_same(self, a, e, "exact", msg=f"select #{k}")

    def test_select_v2_broadcast_chain(self):
        gen = rng(3101)
        x = random(gen, (N, 1, C), "float32")
        y = random(gen, (H, 1), "float32")
        z = random(gen, (C,), "float32")

        @tf.function
        def f(x, y, z):
            return tf.where(x > y, x * y, z) + 1.0, tf.where(x > 0.0, y, 0.0)

        opt, expected, actual = optimize_and_run(f, x, y, z)
        self.assertNotEmpty(fused_clusters_with(opt, "SelectV2"), str(opt.report()))
        for a, e in zip(actual, expected):
            assert_same(self, a, e, "exact")

    def test_bias_add_nhwc_nchw(self):
        gen = rng(3200)
        args = []
        for d in ("float32", "float64", "float16", "bfloat16", "int32"):
            args += [random(gen, (2, 3, 4, 5), d), random(gen, (5,), d),
                     random(gen, (2, 5, 3, 4), d), random(gen, (5,), d)]

        @tf.function
        def f(*args):
            out = []
            for k in range(0, len(args), 4):
                out.append(tf.nn.bias_add(args[k], args[k + 1], data_format="NHWC"))
                out.append(tf.nn.bias_add(args[k + 2], args[k + 3], data_format="NCHW"))
            return out

        opt, expected, actual = optimize_and_run(f, *args)
        self.assertLen(fused_clusters_with(opt, "BiasAdd"), len(actual), str(opt.report()))
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert_same(self, a, e, "op", msg=f"bias_add #{k}")

    def test_bias_add_chain(self):
        gen = rng(3201)
        x = random(gen, (2, 5, 3, 4), "float32")
        b = random(gen, (5,), "float32")
        s = random(gen, (3, 1), "float32")

        @tf.function
        def f(x, b, s):
            return tf.nn.relu(tf.nn.bias_add(x * s, b, data_format="NCHW")), \
                tf.tanh(tf.nn.bias_add(tf.transpose(x, [0, 2, 3, 1]), b))

        opt, expected, actual = optimize_and_run(f, x, b, s)
        self.assertLen(fused_clusters_with(opt, "BiasAdd"), 2, str(opt.report()))
        assert_same(self, actual[0], expected[0], "exact")
        assert_same(self, actual[1], expected[1], "transcendental")

    def test_add_n_accumulates_like_tf(self):
        """Gradient accumulation: AddN of 2, 3 and 9 terms fuses with its
        neighbours; TF's kernel sums in groups, so the rounding may differ by
        the elementwise-chain tolerance."""
        gen = rng(3301)
        xs = [random(gen, (6, 7), dtype) for dtype in ["float32"] * 9]

        @tf.function
        def f(*xs):
            return (tf.math.add_n([xs[0], xs[1]]) * 2.0,
                    tf.exp(tf.math.add_n(list(xs[:3])) * 0.25),
                    tf.math.add_n([x * 0.5 for x in xs]) - 1.0)

        opt, expected, actual = optimize_and_run(f, *xs)
        self.assertLen(fused_clusters_with(opt, "AddN"), 3, str(opt.report()))
        assert_same(self, actual[0], expected[0], "chain")
        assert_same(self, actual[1], expected[1], "transcendental")
        assert_same(self, actual[2], expected[2], "chain")
        for dtype in ("float64", "int32"):
            a, b = random(gen, (4,), dtype), random(gen, (4,), dtype)
            opt, expected, actual = optimize_and_run(
                tf.function(lambda a, b: tf.math.add_n([a, b, a]) * 3), a, b)
            assert_same(self, actual, expected, "chain" if dtype != "int32" else "exact")


# Reductions over a [4, 5, 6] input.
AXES = {"last": [2], "neg_last": [-1], "first": [0], "middle": [1], "several": [0, 2],
        "first_two": [0, 1], "all": [0, 1, 2]}

REDUCTIONS = {
    # op type -> (raw op, kind, domain, dtypes)
    "Sum": (raw.Sum, "sum", "normal", FLOATS + INTS),
    "Mean": (raw.Mean, "mean", "normal", FLOATS + INTS),
    "Max": (raw.Max, "max", "normal", FLOATS + INTS),
    "Min": (raw.Min, "min", "normal", FLOATS + INTS),
    "Prod": (raw.Prod, "prod", "prod", FLOATS + INTS),
    "Any": (raw.Any, "any", "bool", ("bool",)),
    "All": (raw.All, "all", "sparse_bool", ("bool",)),
}


def _reduction_input(gen, shape, dtype, domain):
    if domain == "prod":
        if dtype in INTS:
            return tf.constant(gen.choice([-2, -1, 1, 1, 1, 2], size=shape), dtype)
        v = gen.uniform(0.8, 1.25, shape) * gen.choice([-1.0, 1.0], size=shape)
        return tf.cast(tf.constant(v), dtype)
    if domain == "bool":
        return tf.constant(gen.random(shape) < 0.1)   # many all-False rows
    if domain == "sparse_bool":
        return tf.constant(gen.random(shape) < 0.9)   # many all-True rows
    return random(gen, shape, dtype, domain)


class OptimizeReductionTest(tf.test.TestCase):

    def _reduce_axes(self, op_type, seed):
        """The op alone over every axis set (keep_dims alternating), float32 or bool."""
        fn, kind, domain, dtypes = REDUCTIONS[op_type]
        gen = rng(seed)
        d = dtypes[0]
        x = _reduction_input(gen, (4, 5, 6), d, domain)
        specs = [(name, axes, keep) for i, (name, axes) in enumerate(AXES.items())
                 for keep in ((False, True) if name in ("last", "several", "all")
                              else (bool(i % 2),))]

        @tf.function
        def f(x):
            return [fn(input=x, axis=tf.constant(axes, tf.int32), keep_dims=keep)
                    for _, axes, keep in specs]

        opt, expected, actual = optimize_and_run(f, x)
        self.assertLen(fused_clusters_with(opt, op_type), len(specs), str(opt.report()))
        for (name, axes, keep), a, e in zip(specs, actual, expected):
            assert_reduction_close(self, a, e, x, axes, kind, keep,
                                   msg=f"{op_type} axis={name} keep_dims={keep}")

    def _reduce_dtypes(self, op_type, seed):
        """Every other dtype, alone, over the last axis or over the first two."""
        fn, kind, domain, dtypes = REDUCTIONS[op_type]
        gen = rng(seed)
        xs = [_reduction_input(gen, (4, 5, 6), d, domain) for d in dtypes[1:]]
        specs = [([2], False), ([0, 1], True)]
        specs = [specs[(i + len(op_type)) % 2] for i in range(len(xs))]

        @tf.function
        def f(*xs):
            return [fn(input=x, axis=axes, keep_dims=keep) for x, (axes, keep) in zip(xs, specs)]

        opt, expected, actual = optimize_and_run(f, *xs)
        self.assertLen(fused_clusters_with(opt, op_type), len(actual), str(opt.report()))
        for d, x, (axes, keep), a, e in zip(dtypes[1:], xs, specs, actual, expected):
            assert_reduction_close(self, a, e, x, axes, kind, keep,
                                   msg=f"{op_type} {d} axis={axes} keep_dims={keep}")

    def _reduce_chain(self, op_type, seed):
        """reduce(a * b) then an elementwise op, a: [N,1,C] with b: [H,1]."""
        fn, kind, domain, dtypes = REDUCTIONS[op_type]
        gen = rng(seed)
        d = dtypes[0]
        for axes, keep in (([2], True), ([0, 1], False), ([1], False)):
            a = _reduction_input(gen, (N, 1, C), d, domain)
            b = _reduction_input(gen, (H, 1), d, domain)
            if d == "bool":
                f = tf.function(lambda a, b: tf.logical_not(
                    fn(input=tf.logical_or(a, b), axis=axes, keep_dims=keep)))
            else:
                f = tf.function(lambda a, b: tf.abs(fn(input=a * b, axis=axes, keep_dims=keep)))
            opt, expected, actual = optimize_and_run(f, a, b)
            self.assertLen(fused_clusters_with(opt, op_type), 1, str(opt.report()))
            self.assertEqual(len(fusion_stitch_nodes(opt.graph_def)), 1, str(opt.report()))
            x = (a * b) if d != "bool" else tf.logical_or(a, b)
            ref_kind = kind if kind not in ("any", "all") else "max"
            assert_reduction_close(self, actual, expected, x, axes, ref_kind, keep,
                                   msg=f"{op_type} chain axis={axes} keep_dims={keep}")


def _add_reduction_tests():
    for i, op_type in enumerate(REDUCTIONS):
        setattr(OptimizeReductionTest, f"test_{op_type}_axes",
                lambda self, op=op_type, s=i: self._reduce_axes(op, 4000 + s))
        setattr(OptimizeReductionTest, f"test_{op_type}_chain",
                lambda self, op=op_type, s=i: self._reduce_chain(op, 4100 + s))
        if len(REDUCTIONS[op_type][3]) > 1:
            setattr(OptimizeReductionTest, f"test_{op_type}_dtypes",
                    lambda self, op=op_type, s=i: self._reduce_dtypes(op, 4200 + s))


_add_reduction_tests()


class OptimizeCompositeTest(tf.test.TestCase):

    def test_softmax_log_softmax(self):
        gen = rng(5000)
        xs = [random(gen, (6, 33), d) for d in FLOATS]

        @tf.function
        def f(*xs):
            return [g(x) for x in xs for g in (tf.nn.softmax, tf.nn.log_softmax)]

        opt, expected, actual = optimize_and_run(f, *xs)
        self.assertLen(fused_clusters_with(opt, "Softmax"), len(FLOATS), str(opt.report()))
        self.assertLen(fused_clusters_with(opt, "LogSoftmax"), len(FLOATS), str(opt.report()))
        it = iter(zip(actual, expected))
        for d in FLOATS:
            for name in ("softmax", "log_softmax"):
                a, e = next(it)
                # exp (a few ulp) and a 33-term sum of positive terms (<= 35 eps)
                tol = {"float32": (1e-5, 1e-6), "float64": (1e-13, 1e-15),
                       "float16": (4e-3, 1e-3), "bfloat16": (3e-2, 1e-2)}[d]
                if name == "log_softmax" and d in ("float32", "float64"):
                    tol = (tol[0], 40 * np.finfo(d).eps)  # log of the sum: absolute
                assert_same(self, a, e, rtol=tol[0], atol=tol[1], msg=f"{name} {d}")

    def test_softmax_chain_broadcast(self):
        gen = rng(5001)
        a = random(gen, (N, 1, 40), "float32")
        b = random(gen, (H, 1), "float32")

        @tf.function
        def f(a, b):
            return tf.nn.softmax(a * b) * 2.0, tf.nn.log_softmax(a + b) - a

        opt, expected, actual = optimize_and_run(f, a, b)
        self.assertEqual(len(fusion_stitch_nodes(opt.graph_def)), 2, str(opt.report()))
        assert_same(self, actual[0], expected[0], rtol=1e-5, atol=1e-6)
        assert_same(self, actual[1], expected[1], rtol=1e-5, atol=1e-5)

    def _batch_norm(self, seed, data_format, dtype):
        gen = rng(seed)
        shape = (2, 3, 4, 6) if data_format == "NHWC" else (2, 6, 3, 4)
        x = random(gen, shape, dtype)
        scale, offset, mean = (random(gen, (6,), "float32") for _ in range(3))
        var = random(gen, (6,), "float32", "positive")
        return x, scale, offset, mean, var

    def test_fused_batch_norm_v3_inference(self):
        args, forms = [], []
        for i, fmt in enumerate(("NHWC", "NCHW")):
            for j, d in enumerate(("float32", "float16", "bfloat16")):
                args += self._batch_norm(5100 + 10 * i + j, fmt, d)
                forms.append((fmt, d))

        @tf.function
        def f(*args):
            out = []
            for k, (fmt, _) in enumerate(forms):
                x, s, o, m, v = args[5 * k:5 * k + 5]
                out.append(tf.compat.v1.nn.fused_batch_norm(
                    x, s, o, mean=m, variance=v, epsilon=1e-3, is_training=False,
                    data_format=fmt)[0])
            return out

        opt, expected, actual = optimize_and_run(f, *args)
        self.assertLen(fused_clusters_with(opt, "FusedBatchNormV3"), len(forms),
                       str(opt.report()))
        for (fmt, d), a, e in zip(forms, actual, expected):
            # scale * rsqrt(var + eps) then x * factor + shift: a handful of roundings
            assert_same(self, a, e, "chain", msg=f"FusedBatchNormV3 {fmt} {d}")

    def test_shape_ops_in_chain(self):
        """Reshape, ExpandDims, Squeeze, Identity, StopGradient and BroadcastTo in one cluster."""
        gen = rng(5200)
        x = random(gen, (N, C), "float32")
        y = random(gen, (H, 1), "float32")
        z = random(gen, (N, H, C, 1), "float32")

        @tf.function
        def f(x, y, z):
            e = tf.expand_dims(x, 1) * y                        # [N,H,C]
            r = tf.reshape(tf.exp(e), [N, H, C, 1]) + z         # add a size-1 dim
            s = tf.squeeze(tf.identity(tf.stop_gradient(r)), axis=[3])   # drop it
            b = tf.broadcast_to(tf.reshape(x, [N, 1, C]), [N, H, C])
            return tf.tanh(s) - b

        opt, expected, actual = optimize_and_run(f, x, y, z)
        types = {t for c in opt.report().fused_clusters for _, t in c.tf_ops}
        for op in ("ExpandDims", "Reshape", "Squeeze", "BroadcastTo", "StopGradient", "Exp",
                   "Tanh"):
            self.assertIn(op, types, str(opt.report()))
        self.assertEqual(len(fusion_stitch_nodes(opt.graph_def)), 1, str(opt.report()))
        assert_same(self, actual, expected, "transcendental")

    def test_large_rows_tiled(self):
        """Rows longer than the elementwise tile and columns over a SIMD remainder."""
        gen = rng(5300)
        x = random(gen, (3, 4099), "float32")
        y = random(gen, (4099,), "float32")
        w = random(gen, (37, 1003), "float32")
        big = random(gen, (768, 1024), "float32")   # many work items over the thread pool

        @tf.function
        def f(x, y, w, big):
            return tf.nn.relu(x * y + 1.0), tf.reduce_sum(w * w, axis=-1), \
                tf.nn.softmax(w), tf.nn.softmax(big * 0.5), tf.tanh(big) * big

        opt, expected, actual = optimize_and_run(f, x, y, w, big, min_cluster_ops=2)
        self.assertEqual(len(fusion_stitch_nodes(opt.graph_def)), 5, str(opt.report()))
        assert_same(self, actual[0], expected[0], "exact")
        assert_reduction_close(self, actual[1], expected[1], w * w, [-1], "sum", False)
        assert_same(self, actual[2], expected[2], rtol=1e-5, atol=1e-6)
        assert_same(self, actual[3], expected[3], rtol=1e-5, atol=1e-6)
        assert_same(self, actual[4], expected[4], "transcendental")


class OptimizeSpecialValuesTest(tf.test.TestCase):
    """NaN, Inf and -0.0 where TensorFlow defines what happens."""

    SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 3.5, -2.25,
               np.finfo(np.float32).max, np.finfo(np.float32).tiny / 4]

    def _grid(self, dtype):
        s = np.array(self.SPECIAL, np.float64)
        x, y = np.meshgrid(s, s, indexing="ij")
        return tf.cast(tf.constant(x), dtype), tf.cast(tf.constant(y), dtype)

    def _assert_bits(self, actual, expected, msg, zero_sign=True):
        a, e = to_numpy(actual), to_numpy(expected)
        np.testing.assert_array_equal(np.isnan(a), np.isnan(e), err_msg=f"NaN: {msg}")
        both = ~np.isnan(e)
        np.testing.assert_array_equal(a[both], e[both], err_msg=msg)
        if zero_sign:
            np.testing.assert_array_equal(np.signbit(a[both]), np.signbit(e[both]),
                                          err_msg=f"sign of zero: {msg}")

    def test_maximum_minimum_nan_inf_signed_zero(self):
        args = [t for d in ("float32", "float64", "float16", "bfloat16") for t in self._grid(d)]

        @tf.function
        def f(*args):
            return [g(args[k], args[k + 1]) for k in range(0, len(args), 2)
                    for g in (tf.maximum, tf.minimum)]

        opt, expected, actual = optimize_and_run(f, *args)
        self.assertLen(fused_clusters_with(opt, "Maximum"), 4, str(opt.report()))
        self.assertLen(fused_clusters_with(opt, "Minimum"), 4, str(opt.report()))
        for k, (a, e) in enumerate(zip(actual, expected)):
            # NaN propagates from either side and +-Inf are exact. The sign of
            # max(-0, +0) is not checked: TF's own answer depends on the Eigen
            # path (packet or scalar remainder), i.e. on the tensor's size.
            self._assert_bits(a, e, f"{'max' if k % 2 == 0 else 'min'} #{k // 2}",
                              zero_sign=False)

    def test_unary_special_values(self):
        # No denormal input here: TF flushes denormals (FTZ/DAZ) in its threads and
        # how a select-based kernel passes one through is not part of the contract.
        x = tf.constant(self.SPECIAL[:-1], tf.float32)
        ops = {"Relu": tf.nn.relu, "Relu6": tf.nn.relu6, "Sign": tf.sign, "Exp": tf.exp,
               "Log": tf.math.log, "Sqrt": tf.sqrt, "Abs": tf.abs, "Neg": tf.negative,
               "Tanh": tf.tanh, "Sigmoid": tf.sigmoid, "Floor": tf.floor, "Round": tf.round,
               "Elu": tf.nn.elu, "Softplus": tf.nn.softplus, "Log1p": tf.math.log1p,
               "Expm1": tf.math.expm1, "Erf": tf.math.erf, "Reciprocal": tf.math.reciprocal,
               "IsFinite": tf.math.is_finite, "IsNan": tf.math.is_nan}

        @tf.function
        def f(x):
            return [g(x) for g in ops.values()]

        opt, expected, actual = optimize_and_run(f, x)
        for op_type in ops:
            self.assertLen(fused_clusters_with(opt, op_type), 1, f"{op_type}\n{opt.report()}")
        for op_type, a, e in zip(ops, actual, expected):
            if a.dtype == tf.bool:
                assert_same(self, a, e, "exact", msg=op_type)
                continue
            an, en = to_numpy(a), to_numpy(e)
            np.testing.assert_array_equal(np.isnan(an), np.isnan(en), err_msg=op_type)
            exactish = ~np.isnan(en) & (np.isinf(en) | (en == 0))
            np.testing.assert_array_equal(an[exactish], en[exactish], err_msg=op_type)
            if op_type not in ("Relu", "Relu6"):  # TF: max(x, 0), path-dependent for -0
                np.testing.assert_array_equal(np.signbit(an[exactish]),
                                              np.signbit(en[exactish]),
                                              err_msg=f"sign of zero: {op_type}")
            assert_same(self, a, e, "transcendental", msg=op_type)

    def test_max_min_family_flush_denormal_operands_like_tf(self):
        """TF's Relu, Relu6, Maximum and Minimum use max/min instructions, which
        under its threads' denormals-are-zero give zero for a denormal operand
        (fuzz find: bfloat16 relu(min(0, -denormal)) came out as -2.9e-39)."""
        d = float(np.finfo(np.float32).tiny) / 4
        values = [d, -d, 0.0, -0.0, 1.0, -1.0, np.nan]
        fns = {"Relu": lambda x, y: tf.nn.relu(x), "Relu6": lambda x, y: tf.nn.relu6(x),
               "Maximum": tf.maximum, "Minimum": tf.minimum,
               "Relu(Minimum)": lambda x, y: tf.nn.relu(tf.minimum(y, x))}
        for dtype in ("float32", "bfloat16"):
            x, y = self._grid_of(values, dtype)

            @tf.function
            def f(x, y):
                return [g(x, y) for g in fns.values()]

            opt, expected, actual = optimize_and_run(f, x, y)
            self.assertNotEmpty(fusion_stitch_nodes(opt.graph_def), str(opt.report()))
            for name, a, e in zip(fns, actual, expected):
                # numerically equal, NaN where TF has NaN; the sign of a zero
                # result is path-dependent in TF (see above)
                self._assert_bits(a, e, f"{name} {dtype}", zero_sign=False)

    @staticmethod
    def _grid_of(values, dtype):
        # float32 from NumPy: a cast from float64 in TF would flush the denormal
        s = np.array(values, np.float32)
        x, y = np.meshgrid(s, s, indexing="ij")
        return tf.cast(tf.constant(x), dtype), tf.cast(tf.constant(y), dtype)

    def test_softplus_threshold_region(self):
        """Between exp's underflow threshold and 0, softplus is log1p(exp(x)) as in TF
        (regression: log(exp(x) + 1) was off by up to 7% near x = -13.9)."""
        x = tf.constant(np.linspace(-16.0, 20.0, 1001), tf.float32)
        f = tf.function(lambda x, xd: (tf.nn.softplus(x), tf.nn.softplus(xd)))
        opt, expected, actual = optimize_and_run(f, x, tf.cast(x, tf.float64))
        self.assertLen(fused_clusters_with(opt, "Softplus"), 2, str(opt.report()))
        for a, e in zip(actual, expected):
            assert_same(self, a, e, "transcendental", msg=f"softplus {a.dtype.name}")

    def test_max_min_reductions_with_nan_inf(self):
        gen = rng(6000)
        x = gen.standard_normal((4, 5, 6)).astype(np.float32)
        x[0, 1, 2] = np.nan
        x[1, :, 3] = np.inf
        x[2, 2, :] = -np.inf
        x[3, 4, 5] = np.nan
        x[3, 0, :] = -0.0
        x = tf.constant(x)
        specs = [([2], False), ([1], True), ([0, 2], False), ([0, 1, 2], False)]

        @tf.function
        def f(x):
            return [g(x, axis=ax, keepdims=k) for ax, k in specs
                    for g in (tf.reduce_max, tf.reduce_min, tf.reduce_sum)]

        opt, expected, actual = optimize_and_run(f, x)
        self.assertLen(fused_clusters_with(opt, "Max"), len(specs), str(opt.report()))
        it = iter(zip(actual, expected))
        for ax, k in specs:
            for kind in ("max", "min", "sum"):
                a, e = next(it)
                if kind == "sum":
                    an, en = to_numpy(a), to_numpy(e)
                    np.testing.assert_array_equal(np.isnan(an), np.isnan(en))
                    np.testing.assert_array_equal(an[np.isinf(en)], en[np.isinf(en)])
                else:
                    self._assert_bits(a, e, f"reduce_{kind} axis={ax}")

    def test_exp_log_softmax_with_inf(self):
        x = np.array([[np.inf, 1.0, 2.0, 0.5], [-np.inf, 1.0, -1.0, 0.0],
                      [np.inf, np.inf, 0.0, 1.0], [-np.inf, -np.inf, -np.inf, -np.inf],
                      [np.nan, 1.0, 2.0, 3.0], [100.0, -100.0, 88.0, 0.0]], np.float32)
        x = tf.constant(x)

        @tf.function
        def f(x):
            return (tf.nn.softmax(x), tf.nn.log_softmax(x), tf.exp(x) * 2.0,
                    tf.math.log(tf.abs(x)) + 1.0)

        opt, expected, actual = optimize_and_run(f, x)
        self.assertLen(fused_clusters_with(opt, "Softmax"), 1, str(opt.report()))
        self.assertLen(fused_clusters_with(opt, "LogSoftmax"), 1, str(opt.report()))
        # A row holding +Inf or NaN: TF's Eigen kernel (exp(x - max) / sum) gives
        # NaN for the whole row, its oneDNN kernel (the default here) NaN only there.
        # We follow the Eigen formula; compare those rows with it.
        inf_rows = (np.isposinf(x.numpy()) | np.isnan(x.numpy())).any(axis=-1)
        m = tf.reduce_max(x, -1, keepdims=True)
        eigen_softmax = tf.exp(x - m) / tf.reduce_sum(tf.exp(x - m), -1, keepdims=True)
        eigen_log_softmax = (x - m) - tf.math.log(tf.reduce_sum(tf.exp(x - m), -1,
                                                                keepdims=True))
        expected = list(expected)
        for k, ref in ((0, eigen_softmax), (1, eigen_log_softmax)):
            expected[k] = tf.where(inf_rows[:, None], ref, expected[k])
        for name, a, e in zip(("softmax", "log_softmax", "exp", "log"), actual, expected):
            assert_same(self, a, e, rtol=1e-5, atol=1e-6, msg=name)


class OpTableCoverageTest(tf.test.TestCase):

    def test_every_table_op_has_a_test(self):
        covered = set(UNARY) | set(BINARY) | set(REDUCTIONS) | set(GRADIENTS) | {
            "BiasAddGrad", "InvGrad",
            "Cast", "Select", "SelectV2", "BiasAdd", "Softmax", "LogSoftmax",
            "FusedBatchNormV3", "Identity", "Reshape", "ExpandDims", "Squeeze", "BroadcastTo",
            "StopGradient", "AddN",
            "UnsortedSegmentSum",   # test_segment_sums.py
            "Transpose"}            # test_transpose_fusion.py
        # Aliases and older versions of covered ops share their lowering.
        aliases = {"Inv", "BiasAddV1", "FusedBatchNorm", "FusedBatchNormV2"}
        missing = set(op_table.OP_TABLE) - covered - aliases
        self.assertEmpty(missing, f"op table entries without a test: {sorted(missing)}")


if __name__ == "__main__":
    tf.test.main()
