"""Packs always lower: packing.py and explore.py's remote fusion start a new
pack where one would pass a kernel's limits (fusion_ir.MAX_INPUTS,
fusion_ir.MAX_OPS), and a pack that fails anyway is built as its parts.
Results stay TF's."""

import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs
from optimize_testlib import quiet_call, random, rng
from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import kernels
from tf_fusionstitch.codegen import shape_fn
from tf_fusionstitch.rewriters import explore, packing
from tf_fusionstitch.rewriters.graph_view import GraphView
from tf_fusionstitch.rewriters.lowering import lower_nodes
from tf_fusionstitch.schedule import UnsupportedCluster


def _chains(count: int, length: int, shared_input: bool):
    """A graph of `count` chains of `length` Tanh ops, nothing between them:
    each reads an input of its own, or all read one. (view, the chains as
    clusters, the fetched chain ends.)"""
    gd = tf.compat.v1.GraphDef()
    types = {}
    for c in range(count):
        if c == 0 or not shared_input:
            src = gd.node.add(name=f"x{c}", op="Placeholder").name
            types[(src, 0)] = ir.TensorType("float32", (4,))
        prev = src
        for k in range(length):
            prev = gd.node.add(name=f"c{c}_t{k}", op="Tanh", input=[prev]).name
            types[(prev, 0)] = ir.TensorType("float32", (4,))
    view = GraphView(gd, types)
    groups = [[f"c{c}_t{k}" for k in range(length)] for c in range(count)]
    fetches = {(g[-1], 0) for g in groups}
    return view, groups, fetches


class _Limits:
    """Within the block, kernels take at most `inputs` inputs and `ops` ops
    (explore's search is too slow for packs of hundreds of kernels in a test)."""

    def __init__(self, inputs: int, ops: int):
        self.limits = inputs, ops

    def __enter__(self):
        self.saved = ir.MAX_INPUTS, ir.MAX_OPS
        ir.MAX_INPUTS, ir.MAX_OPS = self.limits

    def __exit__(self, *exc):
        ir.MAX_INPUTS, ir.MAX_OPS = self.saved


class PackSizeTest(tf.test.TestCase):
    """Packs of independent kernels at exactly a limit, and one kernel past it."""

    def _packs(self, count, length, shared_input, strategy):
        view, groups, fetches = _chains(count, length, shared_input)
        if strategy == "stitch":
            packs = packing.pack_clusters(view, groups, fetches)
        else:
            candidates = {n for g in groups for n in g}
            packs, _ = explore.form_clusters(view, candidates, fetches)
        self.assertCountEqual([n for p in packs for n in p], [n for g in groups for n in g])
        # Every pack lowers, with the cluster checks.
        return [lower_nodes(view, p, fetches).cluster for p in packs]

    def _check_inputs_limit(self, strategy):
        # Chains of 2 ops, one input each: MAX_INPUTS of them fill a pack.
        (full,) = self._packs(ir.MAX_INPUTS, 2, False, strategy)
        self.assertLen(full.inputs, ir.MAX_INPUTS)
        self.assertEqual(len(self._packs(ir.MAX_INPUTS + 1, 2, False, strategy)), 2)

    def _check_ops_limit(self, strategy, length):
        # Chains of `length` ops reading one input: MAX_OPS / length fill a pack.
        self.assertEqual(ir.MAX_OPS % length, 0)
        (full,) = self._packs(ir.MAX_OPS // length, length, True, strategy)
        self.assertLen(full.ops, ir.MAX_OPS)
        self.assertEqual(len(self._packs(ir.MAX_OPS // length + 1, length, True, strategy)), 2)

    def test_stitch(self):
        self._check_inputs_limit("stitch")
        self._check_ops_limit("stitch", 100)

    def test_explore(self):
        with _Limits(inputs=12, ops=40):
            self._check_inputs_limit("explore")
            self._check_ops_limit("explore", 4)


class MetaCountTest(tf.test.TestCase):

    def test_more_extents_than_fs_meta_allows_are_refused_before_compiling(self):
        # A pack of thousands of parts could pass fs_meta's count bound;
        # the op would refuse the kernel only after it was compiled.
        c = ir.Cluster((("x", ir.TensorType("float32", (4,))),),
                       (ir.make_op("y", "tanh", ["x"], ir.TensorType("float32", (4,))),), ("y",))
        shape_fn.format_meta(c, ir.MAX_META_COUNT, [], "extern")
        with self.assertRaisesRegex(UnsupportedCluster, "run-time extents"):
            shape_fn.format_meta(c, ir.MAX_META_COUNT + 1, [], "extern")


def _adam_step(count, shapes, seed):
    """A train step of `count` variables (shapes taken in turn) updated by
    Adam, the optimizer built before tracing; and the variables."""
    init = np.random.default_rng(seed)
    variables = [tf.Variable(init.standard_normal(shapes[i % len(shapes)]).astype(np.float32))
                 for i in range(count)]
    optimizer = tf.keras.optimizers.Adam(0.01)
    optimizer.build(variables)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(tf.square(v)) for v in variables])
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss
    return step, variables


class ManySmallUpdatesTest(tf.test.TestCase):
    """An optimizer's updates of 100 small weights: one pack of all of them
    had 800 inputs, could not be lowered, and left every op to TF."""

    def _check(self, shapes, **options):
        seed = 31
        reference, ref_vars = _adam_step(100, shapes, seed)
        step, got_vars = _adam_step(100, shapes, seed)
        fast = fs.optimize(step, rewrite_cache=False, **options)
        for _ in range(3):
            self.assertAllClose(quiet_call(fast), reference(), rtol=1e-5)
        for a, b in zip(got_vars, ref_vars):
            self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)
        report = fast.report()
        self.assertEmpty(report.fallbacks, str(report))
        self.assertEmpty(report.split_packs, str(report))
        self.assertGreater(max(c.parts for c in report.fused_clusters), 1, str(report))

        unpacked, _ = _adam_step(100, shapes, seed)
        apart = fs.optimize(unpacked, rewrite_cache=False, pack=False, **options)
        quiet_call(apart)
        self.assertLessEqual(report.kernels_after, apart.report().kernels_after)
        self.assertLess(20 * report.kernels_after, report.kernels_before, str(report))

    def test_stitch(self):
        self._check([(8,)])

    def test_explore_mixed_shapes(self):
        # the explored plan itself, not the plan guard's choice (which may
        # keep a rule plan)
        self._check([(8,), (3, 3, 16), (128,)], fusion="explore", explore_guard=False)


@tf.function
def _three_kernels(x, y, z):
    return tf.tanh(x) * 2.0 + 1.0, tf.exp(y) * 3.0, tf.sin(z) - 1.0


def _packed(cluster) -> bool:
    return len(ir.connected_parts(cluster)) > 1


class SplitPackTest(tf.test.TestCase):
    """A pack whose kernel fails for any reason is built as its parts (each
    a cluster before it was packed), with a report entry that says why."""

    def _check_split(self, reason):
        gen = rng(12)
        args = [random(gen, s, "float32") for s in ((6, 5), (7,), (3, 4))]
        fast = fs.optimize(_three_kernels, rewrite_cache=False)
        got = quiet_call(fast, *args)
        for g, w in zip(got, _three_kernels(*args)):
            self.assertAllClose(g, w, rtol=1e-5, atol=1e-6)
        report = fast.report()
        self.assertEmpty(report.fallbacks, str(report))
        (split,) = report.split_packs
        self.assertEqual(split.split, 3)
        self.assertRegex(split.reason, f"pack of 3 parts split: .*{reason}")
        self.assertLen(report.fused_clusters, 3, str(report))
        self.assertTrue(all(c.parts == 1 for c in report.fused_clusters), str(report))
        self.assertIn("[split]", str(report))

    def test_a_pack_that_does_not_lower(self):
        real = ir.Cluster.validate

        def refuse_packs(cluster):
            if _packed(cluster):
                raise ir.SpecError("packs refused by the test")
            return real(cluster)

        ir.Cluster.validate = refuse_packs
        try:
            self._check_split("lowering: packs refused by the test")
        finally:
            ir.Cluster.validate = real

    def test_a_pack_the_generator_refuses(self):
        # (A compiler that fails fails the parts too: such a pack falls back
        # whole, test_optimize_functions.FallbackTest.)
        real = kernels.build_cpu_kernels

        def refuse_packs(clusters, **kwargs):
            built = real([c for c in clusters if not _packed(c)], **kwargs)[::-1]
            return [UnsupportedCluster("packs refused by the test's generator")
                    if _packed(c) else built.pop() for c in clusters]

        kernels.build_cpu_kernels = refuse_packs
        try:
            self._check_split("UnsupportedCluster: packs refused by the test's generator")
        finally:
            kernels.build_cpu_kernels = real


if __name__ == "__main__":
    tf.test.main()
