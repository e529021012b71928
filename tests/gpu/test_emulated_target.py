"""optimize(fn, target="cuda-emulated"): every cluster runs its CUDA schedule,
emulated in C++ (codegen/gpu_printer.print_emulation), inside the same CPU op,
so the GPU's index math, barriers and warp shuffles run on whole functions
against TF. Each GPU mapping has a function here (thread, warp and block per
row); what the GPU target has no kernel for stays TF ops with a named reason;
a graph's emulated kernels are rebuilt as emulated kernels from their specs
(a SavedModel, a cached rewrite). tests/models/test_zoo.py runs zoo models
this way."""

import tensorflow as tf

import tf_fusionstitch as fs
from optimize_testlib import assert_same, fusion_stitch_nodes, quiet_call, random, rng
from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import kernels, spec_kernels
from tf_fusionstitch.codegen import generate
from tf_fusionstitch.gpu.choice import plan_gpu
from tf_fusionstitch.schedule import UnsupportedCluster

EMULATED = "cuda-emulated"


def _layernorm(x):
    mean = tf.reduce_mean(x, -1, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-5)


def _mappings(opt) -> set:
    """The GPU mapping kind of each FusionStitch node's kernel."""
    kinds = set()
    for node in fusion_stitch_nodes(opt.graph_def):
        cluster = ir.Cluster.from_json(node.attr["spec"].s.decode())
        kinds.add(plan_gpu(generate.gpu_schedule(cluster)).mapping.kind)
    return kinds


class EmulatedTargetTest(tf.test.TestCase):

    def test_each_mapping_matches_tf(self):
        gen = rng(7100)
        # widths: 8 (a thread per row), 96 (a warp per row), 2500 (a block per row)
        for width, kind in ((8, "thread"), (96, "warp"), (2500, "block")):
            x = random(gen, (3, 37, width), "float32")
            b = random(gen, (width,), "float32")
            f = tf.function(lambda x, b: (tf.nn.softmax(_layernorm(x) * 2.0 + b),
                                          tf.reduce_sum(tf.exp(x - b), -1)))
            opt = fs.optimize(f, target=EMULATED, rewrite_cache=False)
            got, want = quiet_call(opt, x, b), f(x, b)
            for g, w in zip(got, want):
                assert_same(self, g, w, "transcendental", f"width {width}")
            report = opt.report()
            self.assertEqual((report.target, report.fallbacks), (EMULATED, []))
            self.assertIn(f"target={EMULATED}", str(report))
            self.assertEqual(_mappings(opt), {kind}, f"width {width}")
            # a second batch size runs the same kernels
            x2 = random(gen, (5, 3, width), "float32")
            for g, w in zip(quiet_call(opt, x2, b), f(x2, b)):
                assert_same(self, g, w, "transcendental", f"width {width}, batch 5")

    def test_the_nodes_run_emulated_kernels_that_their_specs_rebuild(self):
        f = tf.function(lambda x: tf.nn.relu(x * 2.0) + tf.reduce_max(x, -1, keepdims=True))
        x = random(rng(7101), (4, 300), "float32")
        cpu = fs.optimize(f, rewrite_cache=False)
        emulated = fs.optimize(f, target=EMULATED, rewrite_cache=False)
        assert_same(self, quiet_call(emulated, x), f(x))
        quiet_call(cpu, x)
        pairs = spec_kernels.graph_specs(emulated.graph_def)
        self.assertLen(pairs, 1)
        (spec, key), = pairs
        self.assertEqual(kernels.target_of(spec, key), EMULATED)
        # the same spec, another target, another key: neither runs the other's kernel
        self.assertEqual(spec_kernels.graph_specs(cpu.graph_def), [(spec, kernels.kernel_key(spec))])
        self.assertNotEqual(kernels.kernel_key(spec), key)
        (rebuilt,) = spec_kernels.rebuild(pairs, timeout=120)
        self.assertEqual(rebuilt.key, key)
        self.assertRegex(rebuilt.source, r"for \(int tid = 0; tid < \d+; \+\+tid\)")
        with self.assertRaisesRegex(ir.SpecError, "for any target"):
            spec_kernels.checked_cluster(spec, key[:-1] + ("0" if key[-1] != "0" else "1"))

    def test_segment_sums_stay_tf_ops_with_the_reason(self):
        table = tf.Variable(random(rng(7102), (50, 16), "float32"))
        ids = tf.constant([[1, 4, 4], [7, 1, 0]])

        @tf.function
        def grad(scale):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(tf.gather(table, ids) * scale))
            g = tape.gradient(loss, table)
            return tf.math.unsorted_segment_sum(g.values * 2.0, g.indices, 50)

        opt = fs.optimize(grad, target=EMULATED, rewrite_cache=False)
        with self.assertWarnsRegex(RuntimeWarning, "segment sums have no GPU kernel yet"):
            got = opt(tf.constant(1.5))
        assert_same(self, got, grad(tf.constant(1.5)))
        reasons = [c.reason for c in opt.report().fallbacks]
        self.assertNotEmpty(reasons, str(opt.report()))
        for reason in reasons:
            self.assertIn("segment sums have no GPU kernel yet", reason)


class GpuScheduleTest(tf.test.TestCase):
    """What the GPU target refuses (TF-free)."""

    def test_parts_in_different_iteration_spaces_are_refused(self):
        c = ir.Cluster(inputs=(("a", ir.TensorType("float32", (None, 8))),
                               ("b", ir.TensorType("float32", (5, 7)))),
                       ops=(ir.make_op("t0", "reduce_sum", ("a",),
                                       ir.TensorType("float32", (None,)), axes=[1],
                                       keep_dims=False),
                            ir.make_op("t1", "neg", ("b",), ir.TensorType("float32", (5, 7)))),
                       outputs=("t0", "t1"))
        for generator in (generate.generate_gpu_emulation, generate.generate_cuda):
            with self.assertRaises(UnsupportedCluster):
                generator(c)


if __name__ == "__main__":
    tf.test.main()
