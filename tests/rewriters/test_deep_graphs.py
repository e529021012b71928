"""Graphs deeper and wider than Python's recursion limit: the rewrite walks
them with explicit stacks, so none raises RecursionError or falls back.

Each optimized call runs with Python's recursion limit a fixed number of
frames (_HEADROOM) above the caller's depth: the whole rewrite (TF's tracing
around it included) must fit in that, so a walk that recurses once per op, per
level of function nesting, or per nested loop fails here whatever the
default limit is. Results are compared with TF's on fresh random inputs
under optimize_testlib's tolerances.

Sizes: graphs of thousands of ops, but no kernel of thousands of TF ops:
the greedy clustering lowers and schedules a cluster again on every merge
it cannot decide from summaries (uniform_merge.py decides elementwise
chains of one shape), so a chain of n TF ops of other kinds fused into one
kernel costs about n^2 / 2 lowerings of one op (a 1,500-op chain spent 55 s
there, fusion="explore" more). The
long chains below are cut into kernels by MatMuls (never fused), with one
kernel of LAST_OPS TF ops at the end; an AddN of 2,000 operands, one TF
node, makes one kernel a chain of 2,000 adds.
"""

import contextlib
import functools
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs
from optimize_testlib import assert_reduction_close, assert_same, quiet_call, random, rng
from tf_fusionstitch.planner import graph_import
from tf_fusionstitch.rewriters import function_bodies, trampoline

# Frames the rewrite may use above the call. It needs about 45; a walk that
# recursed once per level of the 50-deep nests below would need 100 more,
# once per op of the long chain's last kernel 300 more.
_HEADROOM = 100

SEGMENTS, SEGMENT_OPS, LAST_OPS = 100, 50, 150   # the long chain: 5,150 elementwise ops
ADDN_TERMS, ADDN_DISTINCT = 2000, 400
SUM_TERMS, SUM_SEGMENT = 2000, 100
NEST = 50
VARIABLE_CHAIN = 300


@contextlib.contextmanager
def shallow_stack(headroom: int = _HEADROOM):
    """Python's recursion limit `headroom` frames above the current depth."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + headroom)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


# Each builder's tf.function is made (and traced) once, for every test that runs it.
_traced_once = functools.lru_cache(maxsize=None)


def _eye():
    # A MatMul by the identity: exact, and never fused, so it ends a kernel.
    return tf.constant(np.eye(64, dtype=np.float32))


@_traced_once
def long_chain():
    """5,150 elementwise ops in a row (add, mul, sub, maximum, tanh), cut into
    kernels every SEGMENT_OPS by a MatMul; the last LAST_OPS, all cheap after
    one tanh, feed a row maximum and are read again after it (the schedule
    decides whether to buffer them by walking up the whole chain)."""
    eye = _eye()

    @tf.function(input_signature=[tf.TensorSpec([8, 64], tf.float32)] * 2)
    def f(x, w):
        h = x
        for _ in range(SEGMENTS):
            for i in range(SEGMENT_OPS):
                k = i % 5
                h = (h * w if k == 0 else h + x if k == 1 else tf.tanh(h) if k == 2
                     else h - w if k == 3 else tf.maximum(h, x))
            h = tf.matmul(h, eye)
        h = tf.tanh(h)
        for i in range(LAST_OPS - 1):
            k = i % 4
            h = (h * w if k == 0 else h + x if k == 1 else h - w if k == 2
                 else tf.maximum(h, x))
        return h - tf.reduce_max(h, axis=-1, keepdims=True)
    return f


@_traced_once
def wide_sums():
    """tf.add_n over 2,000 operands (slices of one input, ADDN_DISTINCT of them
    distinct: a kernel holds at most 512 inputs) whose sum is read again after
    a row maximum, and a chain of adds summing 2,000 slices (a MatMul every
    SUM_SEGMENT of them)."""
    eye = _eye()

    @tf.function(input_signature=[tf.TensorSpec([SUM_TERMS, 8, 64], tf.float32),
                                  tf.TensorSpec([8, 64], tf.float32)])
    def f(x, w):
        xs = tf.unstack(x)
        a = tf.add_n([xs[i % ADDN_DISTINCT] for i in range(ADDN_TERMS)])
        s = xs[0]
        for i in range(1, SUM_TERMS):
            s = s + xs[i]
            if i % SUM_SEGMENT == 0:
                s = tf.matmul(s, eye)
        return a, a - tf.reduce_max(a, axis=-1, keepdims=True), s * w
    return f


@_traced_once
def nested_functions():
    """NEST tf.functions, each calling the next (nested PartitionedCalls in
    the GraphDef's library), each with elementwise work of its own."""
    spec = [tf.TensorSpec([8, 64], tf.float32)]

    def level(inner):
        def f(x):
            h = tf.tanh(x) * 0.9 + 0.1
            if inner is not None:
                h = h * inner(x)
            return tf.sigmoid(h) - 0.5 * x
        return tf.function(f, input_signature=spec)

    fn = None
    for _ in range(NEST):
        fn = level(fn)
        fn.get_concrete_function()   # traced innermost first: TF's tracing stays shallow
    return fn


@_traced_once
def nested_control_flow():
    """NEST levels of tf.cond, a tf.while_loop every fifth, each with
    elementwise work in its branch or body (If and While functions nested
    NEST deep)."""
    def nest(k, x, w):
        if k == 0:
            return tf.tanh(x * w) + 0.5 * x
        if k % 5:
            return tf.cond(tf.reduce_max(x) > -1e30,
                           lambda: tf.sigmoid(nest(k - 1, x * 0.9 + 0.1, w)) * w,
                           lambda: x - w)
        _, y = tf.while_loop(
            lambda i, y: i < 1,
            lambda i, y: (i + 1, tf.tanh(nest(k - 1, y, w)) * 0.5 + y * w),
            [tf.constant(0), x])
        return y

    @tf.function(input_signature=[tf.TensorSpec([8, 64], tf.float32)] * 2)
    def f(x, w):
        return nest(NEST, x, w) * x

    # TF's own tracing of a 50-deep nest recurses past the default limit.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20000))
    try:
        f.get_concrete_function()
    finally:
        sys.setrecursionlimit(old)
    return f


def _fusion_stitch_nodes(graph_def) -> int:
    return (sum(n.op == "FusionStitch" for n in graph_def.node)
            + sum(n.op == "FusionStitch" for f in graph_def.library.function
                  for n in f.node_def))


class DeepGraphTest(tf.test.TestCase):

    def _optimized_call(self, fn, args, fusion):
        """TF's result and the optimized one, the rewrite run on a shallow stack;
        a fallback warning fails (quiet_call)."""
        expected = fn(*args)
        opt = fs.optimize(fn, fusion=fusion, rewrite_cache=False)
        with shallow_stack():
            actual = quiet_call(opt, *args)
        report = opt.report()
        self.assertEqual(report.fallbacks, [], str(report))
        return opt, report, expected, actual

    def _check_long_chain(self, fusion):
        gen = rng(901)
        x = random(gen, (8, 64), "float32")
        w = random(gen, (8, 64), "float32", "unit")
        opt, report, expected, actual = self._optimized_call(long_chain(), (x, w), fusion)
        assert_same(self, actual, expected, msg=fusion)
        self.assertGreaterEqual(report.kernels_before, SEGMENTS * SEGMENT_OPS + LAST_OPS)
        self.assertGreaterEqual(_fusion_stitch_nodes(opt.graph_def), SEGMENTS + 1)
        self.assertGreaterEqual(max(len(c.tf_ops) for c in report.fused_clusters),
                                LAST_OPS + 1, str(report))

    def test_long_chain_stitch(self):
        self._check_long_chain("stitch")

    def test_long_chain_explore(self):
        self._check_long_chain("explore")

    def test_long_chain_xla_like(self):
        self._check_long_chain("xla_like")

    def test_long_chain_graph_import(self):
        gen = rng(902)
        args = [random(gen, (8, 64), "float32"), random(gen, (8, 64), "float32", "unit")]
        with shallow_stack():
            graph, _, _ = graph_import.from_function(long_chain(), args)
            linkage = graph.linkage
        self.assertGreaterEqual(len(graph.ops), SEGMENTS * SEGMENT_OPS + LAST_OPS)
        self.assertNotEmpty(linkage.members)

    def _check_wide_sums(self, fusion):
        gen = rng(903)
        x = random(gen, (SUM_TERMS, 8, 64), "float32")
        w = random(gen, (8, 64), "float32", "unit")
        opt, report, expected, actual = self._optimized_call(wide_sums(), (x, w), fusion)
        # The AddN's operands: each distinct slice ADDN_TERMS / ADDN_DISTINCT times.
        terms = tf.tile(x[:ADDN_DISTINCT], [ADDN_TERMS // ADDN_DISTINCT, 1, 1])
        a, a_less_max, sw = actual
        assert_reduction_close(self, a, expected[0], terms, 0, "sum", False,
                               msg=f"{fusion} add_n")
        # One subtraction of the kernel's own sum and its (exact) row maximum.
        assert_same(self, a_less_max, a - tf.reduce_max(a, axis=-1, keepdims=True), "op",
                    msg=f"{fusion} add_n less its maximum")
        assert_reduction_close(self, sw, expected[2], x * w, 0, "sum", False,
                               msg=f"{fusion} chain")
        addn = [c for c in report.fused_clusters if any(t == "AddN" for _, t in c.tf_ops)]
        self.assertLen(addn, 1, str(report))
        self.assertGreaterEqual(_fusion_stitch_nodes(opt.graph_def),
                                SUM_TERMS // SUM_SEGMENT, str(report))

    def test_wide_sums_stitch(self):
        self._check_wide_sums("stitch")

    def test_wide_sums_explore(self):
        self._check_wide_sums("explore")

    def test_wide_sums_xla_like(self):
        self._check_wide_sums("xla_like")

    def _check_nested(self, fn, args, fusion):
        opt, report, expected, actual = self._optimized_call(fn, args, fusion)
        assert_same(self, actual, expected, "transcendental", msg=fusion)
        # Every function of the nest is rewritten: each has a kernel of its own.
        self.assertGreaterEqual(_fusion_stitch_nodes(opt.graph_def), NEST, str(report))
        return report

    def _check_nested_functions(self, fusion):
        x = random(rng(904), (8, 64), "float32")
        self._check_nested(nested_functions(), (x,), fusion)

    def test_nested_functions_stitch(self):
        self._check_nested_functions("stitch")

    def test_nested_functions_explore(self):
        self._check_nested_functions("explore")

    def test_nested_functions_xla_like(self):
        self._check_nested_functions("xla_like")

    def test_nested_control_flow(self):
        """The default fusion only: the nest's 100 functions take the pass about
        10 s (each converts and analyses the functions nested below it,
        call_dims.py), and what the other strategies change is covered by the
        tests above."""
        gen = rng(905)
        args = (random(gen, (8, 64), "float32"), random(gen, (8, 64), "float32", "unit"))
        self._check_nested(nested_control_flow(), args, "stitch")


class DeepVariableChainsTest(tf.test.TestCase):
    """Chains on one variable (variable_updates.py follows them to the end)."""

    def _check(self, f, v, x, **options):
        expected = f(x)
        expected_value = v.numpy()
        v.assign(tf.zeros_like(v))
        opt = fs.optimize(f, rewrite_cache=False, **options)
        with shallow_stack():
            actual = quiet_call(opt, x)
        self.assertEqual(opt.report().fallbacks, [], str(opt.report()))
        assert_same(self, actual, expected, "transcendental")
        assert_same(self, tf.convert_to_tensor(v), tf.constant(expected_value), "transcendental")
        self.assertGreaterEqual(_fusion_stitch_nodes(opt.graph_def), 1, str(opt.report()))

    def test_reads_of_reads_just_assigned(self):
        """Each assignment stores the read that follows the one before: every
        read forwards to the first assigned value."""
        v = tf.Variable(tf.zeros([8, 64]))

        @tf.function(input_signature=[tf.TensorSpec([8, 64], tf.float32)])
        def f(x):
            v.assign(tf.tanh(x) * 0.5)
            for _ in range(VARIABLE_CHAIN):   # (read_value() would add an Identity)
                v.assign(tf.raw_ops.ReadVariableOp(resource=v.handle, dtype=tf.float32))
            return v.read_value() * 2.0 + 1.0

        self._check(f, v, random(rng(906), (8, 64), "float32"))

    def test_update_through_a_chain_of_identities(self):
        """The variable's handle reaches its update through VARIABLE_CHAIN
        Identity ops (Grappler off: it would remove them)."""
        v = tf.Variable(tf.zeros([8, 64]))

        @tf.function(input_signature=[tf.TensorSpec([8, 64], tf.float32)])
        def f(x):
            h = v.handle
            for _ in range(VARIABLE_CHAIN):
                h = tf.identity(h)
            tf.raw_ops.AssignAddVariableOp(resource=h, value=tf.tanh(x) * 0.5)
            return tf.raw_ops.ReadVariableOp(resource=h, dtype=tf.float32) * 2.0 + 1.0

        self._check(f, v, random(rng(907), (8, 64), "float32"), grappler=False)


class IterativeWalksTest(tf.test.TestCase):
    """The walks over function nesting, on nests far deeper than any limit."""

    DEPTH = 20000

    def test_trampoline_runs_nested_calls_as_recursion_would(self):
        def depth(n):    # the recursive form: n + depth(n - 1), and a raise at the bottom
            if n == 0:
                raise KeyError("bottom")
            try:
                below = yield depth(n - 1)
            except KeyError:
                if n < 3:
                    raise    # through the two innermost callers, caught by the third
                below = 0
            return n + below

        with shallow_stack():
            self.assertEqual(trampoline.run(depth(self.DEPTH)),
                             sum(range(3, self.DEPTH + 1)))
            with self.assertRaisesRegex(KeyError, "bottom"):
                trampoline.run(depth(2))

    def test_callees_before_their_callers(self):
        names = [f"f{i}" for i in range(self.DEPTH)]
        callees = {a: [b, "elsewhere"] for a, b in zip(names, names[1:])}
        with shallow_stack():
            order = function_bodies._callees_first(names, callees)
        self.assertEqual(order, names[::-1])


if __name__ == "__main__":
    tf.test.main()
