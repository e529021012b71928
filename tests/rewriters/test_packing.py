"""Kernel packing (rewriters/packing.py): kernels that no path connects share
one FusionStitch launch; results stay TF's on fresh random inputs."""

import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs
from tf_fusionstitch import fusion_ir as ir
from optimize_testlib import fusion_stitch_nodes, quiet_call, random, rng
from tf_fusionstitch.rewriters import packing
from tf_fusionstitch.rewriters.graph_view import GraphView


def _acyclic(edges) -> bool:
    succ, indeg = {}, {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
        indeg[b] = indeg.get(b, 0) + 1
        indeg.setdefault(a, 0)
    ready = [n for n, d in indeg.items() if d == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for m in succ.get(n, ()):
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    return seen == len(indeg)


def _random_clusters(view, gen):
    """Singletons, with some Tanh nodes merged into a Tanh consumer's cluster
    where the clustering stays acyclic (as the strategies leave it)."""
    owner = {n: n for n in view.order}
    for name in view.order:
        for c in sorted(view.consumers[name]):
            if view.nodes[name].op == view.nodes[c].op == "Tanh" and gen.random() < 0.5:
                trial = {n: (owner[c] if o == owner[name] else o) for n, o in owner.items()}
                groups = {}
                for n, o in trial.items():
                    groups.setdefault(o, []).append(n)
                if _acyclic(_quotient_edges(view, list(groups.values()))):
                    owner = trial
    groups = {}
    for n in view.order:
        groups.setdefault(owner[n], []).append(n)
    return [g for g in groups.values() if view.nodes[g[0]].op == "Tanh"]


def _quotient_edges(view, groups):
    owner = {n: i for i, g in enumerate(groups) for n in g}
    return {(owner.get(n, n), owner.get(c, c)) for n in view.nodes
            for c in view.consumers[n] if owner.get(n, n) != owner.get(c, c)}


def _fused_sets(opt):
    """Per FusionStitch node, the TF op types it replaced."""
    return [sorted(t for _, t in c.tf_ops) for c in opt.report().fused_clusters]


class PackingTest(tf.test.TestCase):

    def _check(self, f, *args, **options):
        opt = fs.optimize(f, rewrite_cache=False, **options)
        got = quiet_call(opt, *args)
        want = f(*args)
        for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
            self.assertAllClose(g, w, rtol=1e-5, atol=1e-5)
        return opt

    def test_independent_kernels_of_different_shapes_share_a_launch(self):
        @tf.function
        def f(x, y, z):
            a = tf.tanh(x) * 2.0 + 1.0                        # [37, 19]
            b = tf.nn.softmax(y * 3.0)                         # [5, 128], a reduction
            c = tf.reduce_sum(tf.exp(z) - 1.0, axis=0)         # [7, 3] -> [3]
            return a, b, c

        gen = rng(3)
        args = [random(gen, s, "float32") for s in ((37, 19), (5, 128), (7, 3))]
        opt = self._check(f, *args)
        self.assertLen(fusion_stitch_nodes(opt.graph_def), 1)
        self.assertEqual(opt.report().kernels_after, 1)
        apart = self._check(f, *args, pack=False)
        self.assertLen(fusion_stitch_nodes(apart.graph_def), 3)

    def test_kernels_on_one_path_are_never_packed(self):
        @tf.function
        def f(x, w, y):
            a = tf.tanh(x) * 2.0                               # kernel A
            m = tf.matmul(a, w)                                # A -> matmul -> B
            b = tf.exp(m) + 1.0                                # kernel B
            c = tf.sin(y) * 3.0                                # independent of both
            return b, c

        gen = rng(4)
        args = [random(gen, (16, 8), "float32"), random(gen, (8, 4), "float32"),
                random(gen, (9,), "float32")]
        opt = self._check(f, *args)
        sets = _fused_sets(opt)
        self.assertLen(sets, 2)
        for ops in sets:  # A and B (Tanh and Exp) never in one kernel
            self.assertFalse("Tanh" in ops and "Exp" in ops, sets)

    def test_no_pack_closes_a_cycle_in_random_graphs(self):
        """Random DAGs of fusible ops (Tanh) joined by unfusible ones (MatMul),
        with some fusible neighbours already clustered: after packing, the
        graph with every pack as one node must stay acyclic, paths through
        other clusters included (a path may enter a cluster at one node and
        leave it at another)."""
        gen = np.random.default_rng(9)
        packed_somewhere = 0
        for _ in range(60):
            gd = tf.compat.v1.GraphDef()
            for i in range(36):
                node = gd.node.add(name=f"n{i}", op="Tanh" if gen.random() < 0.5 else "MatMul")
                for src in sorted(set(gen.integers(0, i, size=gen.integers(0, 3)))) if i else ():
                    node.input.append(f"n{src}")
            # Typed and fetched, so that every cluster lowers (packs are
            # sized by their lowering).
            fetched = {(f"n{i}", 0) for i in range(36)}
            view = GraphView(gd, dict.fromkeys(fetched, ir.TensorType("float32", (4, 4))))
            groups = _random_clusters(view, gen)
            packs = packing.pack_clusters(view, groups, fetched)
            packed_somewhere += len(packs) < len(groups)
            self.assertTrue(_acyclic(_quotient_edges(view, packs)), packs)
            self.assertCountEqual([n for g in packs for n in g], [n for g in groups for n in g])
        self.assertGreater(packed_somewhere, 30)

    def test_a_path_through_a_cluster_blocks_a_pack(self):
        """Found by the fuzzer: the int Cast n0 feeds a cluster at one node
        and the cluster's other node feeds the reduction n3, so n0's cluster
        and n3 must not share a launch even though no path joins their nodes
        outside clusters."""
        @tf.function
        def f(x0, x1, x2, x3):
            n0 = tf.cast(x0, tf.int32)
            n1 = tf.less_equal(x2, n0)
            n2 = tf.round(x1)
            n3 = tf.reduce_sum(n0, axis=[-3, 1, 2])
            n4 = tf.reduce_mean(x2, axis=[0, -3, -2, -1], keepdims=True)
            n5 = n4 * n0
            n7 = tf.nn.bias_add(n5, x3)
            return n1, n2, n3, tf.reduce_min(n3, axis=[]), tf.reshape(n7, [17, 1, 6, 3, 1])

        gen = rng(10)
        args = [random(gen, (17, 6, 3), "float16"), random(gen, (17, 1), "float16"),
                random(gen, (3, 17, 6, 3), "int32"), random(gen, (3,), "int32")]
        self._check(f, *args, min_cluster_ops=1)

    def test_packs_stay_under_the_byte_cap(self):
        @tf.function
        def f(x, y):
            return tf.tanh(x) * 2.0, tf.exp(y) * 3.0

        gen = rng(6)
        args = [random(gen, (64, 64), "float32"), random(gen, (64, 64), "float32")]
        old = packing.PACK_MAX_BYTES
        packing.PACK_MAX_BYTES = 3 * 64 * 64 * 4  # room for one kernel (in + out), not two
        try:
            opt = self._check(f, *args)
        finally:
            packing.PACK_MAX_BYTES = old
        self.assertLen(fusion_stitch_nodes(opt.graph_def), 2)

    def _longest_path_beside(self, side_shape):
        """A kernel on the longest path (tanh, then two matmuls, then the
        sigmoid kernel) beside an independent exp kernel of `side_shape`
        that could run any time before the end: the kernels' op types, per
        FusionStitch node."""
        @tf.function
        def f(x, w, side):
            m = tf.matmul(tf.matmul(tf.tanh(x * 2.0) + 1.0, w), w)
            return tf.sigmoid(m) * 3.0, tf.exp(side * 0.5) - 1.0

        gen = rng(13)
        args = [random(gen, (8, 8), "float32"), random(gen, (8, 8), "float32") * 0.3,
                random(gen, side_shape, "float32")]
        return _fused_sets(self._check(f, *args))

    def test_a_kernel_on_the_longest_path_waits_for_no_megabytes(self):
        # 8 MB of exp kernel in a pack with the tanh would make the matmuls,
        # and all after them, wait for it; TF runs it on the other core.
        sets = self._longest_path_beside((1024, 1024))
        self.assertLen(sets, 3, sets)
        for ops in sets:
            self.assertFalse("Exp" in ops and ("Tanh" in ops or "Sigmoid" in ops), sets)

    def test_a_kernel_on_the_longest_path_takes_small_work_along(self):
        # 512 bytes of exp kernel: a wait of nanoseconds saves a launch.
        sets = self._longest_path_beside((8, 16))
        self.assertLen(sets, 2, sets)
        self.assertTrue(any("Exp" in ops and ("Tanh" in ops or "Sigmoid" in ops)
                            for ops in sets), sets)

    def test_lone_ops_join_a_fused_kernel_launch_only(self):
        # One op alone stays TF's (nothing fuses). Beside a fused kernel it
        # joins that launch; two lone ops do not make a launch of their own,
        # and a bias add on a matmul's result stays for TF to fuse into it.
        @tf.function
        def f(x, y, z, w):
            return tf.tanh(x), tf.exp(y), tf.sin(z) * 2.0 + 1.0, tf.nn.bias_add(
                tf.matmul(x, w), y[:4])

        gen = rng(7)
        args = [random(gen, (40, 3), "float32"), random(gen, (11,), "float32"),
                random(gen, (6, 5), "float32"), random(gen, (3, 4), "float32")]
        opt = self._check(f, *args)
        (ops,) = _fused_sets(opt)
        self.assertContainsSubset({"Tanh", "Exp", "Sin"}, ops)
        self.assertNotIn("BiasAdd", ops)

        lone = self._check(tf.function(lambda x, y: (tf.tanh(x), tf.exp(y))), *args[:2])
        self.assertEmpty(fusion_stitch_nodes(lone.graph_def))

    def test_lone_siblings_share_one_loop(self):
        # Two lone ops over the same tensors (an attention's q - k and q * k)
        # run as one loop that reads them once, also where a batch broadcasts.
        @tf.function(input_signature=[tf.TensorSpec([None, 8]), tf.TensorSpec([None, 8])])
        def f(q, k):
            return q - k, k * q

        gen = rng(8)
        for rows_k in (5, 1):
            opt = self._check(f, random(gen, (5, 8), "float32"),
                              random(gen, (rows_k, 8), "float32"))
            (kernel,) = opt.report().fused_clusters
            self.assertEqual(sorted(t for _, t in kernel.tf_ops if t != "Identity"),
                             ["Mul", "Sub"])
            self.assertEqual(kernel.parts, 1)

    def test_a_loop_counter_is_not_packed_behind_the_iteration(self):
        # The next iteration reads i + 1 at once; packed with the body's
        # kernel it would wait for the whole iteration.
        @tf.function(input_signature=[tf.TensorSpec([None, 16])])
        def f(x):
            def body(i, h):
                return i + 1, tf.tanh(h * 0.5 + 1.0) * 2.0 - h
            return tf.while_loop(lambda i, h: i < 5, body, (0, x))[1]

        opt = self._check(f, random(rng(9), (3, 16), "float32"))
        kernels = [c for c in opt.report().fused_clusters
                   if "Tanh" in {t for _, t in c.tf_ops}]
        self.assertLen(kernels, 1)
        self.assertEqual(kernels[0].parts, 1, kernels[0].tf_ops)

    def test_pack_is_not_an_option_of_xla_like(self):
        f = tf.function(lambda x: tf.tanh(x) * 2.0)
        with self.assertRaisesRegex(ValueError, "pack applies to fusion='stitch' and 'explore'"):
            fs.optimize(f, fusion="xla_like", pack=True)

    def test_a_packed_train_step_matches_tf_over_steps(self):
        def make(seed):
            init = np.random.default_rng(seed)
            w1 = tf.Variable(init.standard_normal((8, 16)).astype(np.float32))
            b1 = tf.Variable(init.standard_normal(16).astype(np.float32))
            w2 = tf.Variable(init.standard_normal((16, 4)).astype(np.float32))
            opt = tf.keras.optimizers.Adam(0.01)

            @tf.function
            def step(x, y):
                with tf.GradientTape() as tape:
                    h = tf.nn.gelu(tf.matmul(x, w1) + b1)
                    loss = tf.reduce_mean(tf.square(tf.matmul(h, w2) - y))
                grads = tape.gradient(loss, [w1, b1, w2])
                opt.apply_gradients(zip(grads, [w1, b1, w2]))
                return loss
            return step, [w1, b1, w2]

        ref, ref_vars = make(0)
        got, got_vars = make(0)
        fast = fs.optimize(got, rewrite_cache=False)
        gen = rng(8)
        for _ in range(3):
            x, y = random(gen, (32, 8), "float32"), random(gen, (32, 4), "float32")
            self.assertAllClose(quiet_call(fast, x, y), ref(x, y), rtol=1e-5)
        for a, b in zip(got_vars, ref_vars):
            self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)
        packed = [c for c in fast.report().fused_clusters if c.parts > 1]
        self.assertTrue(packed, fast.report())


if __name__ == "__main__":
    tf.test.main()
