"""Epilogues that TF's remapper fuses into a convolution or a matmul stay TF
ops (rewriters/remapper_epilogues.py): a bias add and ReLU after a Conv2D or
a MatMul run inside TF's _FusedConv2D / _FusedMatMul, so a kernel of ours
there would only add a pass over the output. What follows them still fuses,
and the results are TF's."""

import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs
from tf_fusionstitch.rewriters import grappler, remapper_epilogues
from optimize_testlib import assert_same, quiet_call, rng

LEFT = remapper_epilogues.LEFT_TO_REMAPPER


def _conv_block():
    kernel = tf.constant(rng(0).standard_normal((3, 3, 4, 8)), tf.float32)
    bias = tf.constant(rng(1).standard_normal(8), tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, 16, 16, 4], tf.float32)])
    def f(x):
        y = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, kernel, 1, "SAME"), bias))
        centred = y - tf.reduce_mean(y, axis=[1, 2], keepdims=True)
        return tf.tanh(centred) * 0.5 + 1.0
    return f


def _dense_block():
    weight = tf.constant(rng(2).standard_normal((32, 64)), tf.float32)
    bias = tf.constant(rng(3).standard_normal(64), tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, 32], tf.float32)])
    def f(x):
        h = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, weight), bias))
        return tf.nn.softmax(h * 0.1 + 1.0, axis=-1)
    return f


class LeftToRemapperTest(tf.test.TestCase):

    def _check(self, f, x, contraction_op):
        opt = fs.optimize(f)
        assert_same(self, quiet_call(opt, x), f(x), "transcendental")
        report = opt.report()
        left = {op: why for _, op, why in report.unfused_ops if why.startswith(LEFT)}
        self.assertEqual(set(left), {"BiasAdd", "Relu"}, str(report))
        self.assertIn(contraction_op, left["BiasAdd"])
        fused_ops = {op for c in report.fused_clusters for _, op in c.tf_ops}
        self.assertNotEmpty(fused_ops, str(report))          # what follows still fuses
        self.assertFalse(fused_ops & {"BiasAdd", "Relu"}, str(report))

    def test_conv_bias_relu_stays_with_the_convolution(self):
        x = tf.constant(rng(4).standard_normal((2, 16, 16, 4)), tf.float32)
        self._check(_conv_block(), x, "_FusedConv2D")

    def test_matmul_bias_relu_stays_with_the_matmul(self):
        x = tf.constant(rng(5).standard_normal((8, 32)), tf.float32)
        self._check(_dense_block(), x, "_FusedMatMul")


class FusedEpiloguesTest(tf.test.TestCase):

    def _grappled(self, f):
        concrete = f.get_concrete_function()
        outputs = [t.name for t in concrete.outputs]
        graph_def = grappler.run_grappler(concrete.graph.as_graph_def(), concrete.graph,
                                          outputs)
        return graph_def, {(t.split(":")[0], int(t.split(":")[1])) for t in outputs}

    def test_names_only_the_candidates_the_remapper_absorbs(self):
        graph_def, fetches = self._grappled(_conv_block())
        ops = {n.name: n.op for n in graph_def.node}
        candidates = {name for name, op in ops.items() if op in ("BiasAdd", "Relu", "Tanh")}
        left = remapper_epilogues.fused_epilogues(graph_def, fetches, candidates)
        self.assertEqual(sorted(ops[n] for n in left), ["BiasAdd", "Relu"])
        self.assertTrue(all(why.startswith(LEFT) for why in left.values()))

    def test_a_bias_add_read_elsewhere_is_not_taken_from_its_reader(self):
        """The remapper leaves a bias add that another op reads as it is;
        so do we (it is a candidate like any other)."""
        weight = tf.constant(np.eye(8, dtype=np.float32))

        @tf.function(input_signature=[tf.TensorSpec([4, 8], tf.float32)])
        def f(x):
            pre = tf.nn.bias_add(tf.matmul(x, weight), tf.ones([8]))
            return tf.nn.relu(pre), pre * 2.0

        graph_def, fetches = self._grappled(f)
        candidates = {n.name for n in graph_def.node if n.op in ("Relu", "Mul")}
        left = remapper_epilogues.fused_epilogues(graph_def, fetches, candidates)
        self.assertNotIn("Relu", {n.op for n in graph_def.node if n.name in left})


def _keras_blocks():
    """A small model with the epilogues the remapper knows: convolutions with
    bias, batch norm, residual add and ReLU/ReLU6, a depthwise convolution,
    dense layers with GELU and with a residual add."""
    keras = tf.keras
    tf.keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 4))
    y = keras.layers.Conv2D(8, 3, padding="same")(x)
    y = keras.layers.ReLU()(keras.layers.BatchNormalization()(y))
    z = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(y)
    y = keras.layers.ReLU(6.0)(keras.layers.Add()([y, z]))
    y = keras.layers.DepthwiseConv2D(3, padding="same", activation="relu")(y)
    y = keras.layers.GlobalAveragePooling2D()(y)
    h = keras.layers.Dense(16, activation="gelu")(y)
    h = keras.layers.Add()([keras.layers.Dense(16)(h), h])
    model = keras.Model(x, keras.layers.Dense(3)(h))
    optimizer = keras.optimizers.Adam()
    images = tf.TensorSpec([None, 8, 8, 4], tf.float32)

    @tf.function(input_signature=[images])
    def inference(images):
        return model(images, training=False)

    @tf.function(input_signature=[images, tf.TensorSpec([None], tf.int32)])
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels, logits))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
        return loss
    return inference, train_step


class OneRoundTest(tf.test.TestCase):
    """fused_epilogues runs the remapper for one round, not TF's two: the
    remapper folds a contraction's whole epilogue in one visit. If a TF
    release's second round ever folded more, these graphs would show it."""

    def test_a_second_round_folds_nothing_more(self):
        for f in _keras_blocks():
            concrete = f.get_concrete_function()
            outputs = [t.name for t in concrete.outputs]
            graph_def = grappler.run_grappler(concrete.graph.as_graph_def(), concrete.graph,
                                              outputs)
            for node in graph_def.node:
                node.device = node.device or remapper_epilogues.CPU
            keep = sorted({t.split(":")[0] for t in outputs})
            ops = {}
            for rounds in (1, 2):
                remapped = grappler.run_grappler(graph_def, None, keep, passes=("remap",),
                                                 rounds=rounds)
                ops[rounds] = sorted((n.name, n.op) for n in remapped.node)
            fused = [op for _, op in ops[1] if op in remapper_epilogues.FUSED_CONTRACTIONS]
            self.assertNotEmpty(fused, f.__name__)     # the remapper did fuse here
            self.assertEqual(ops[1], ops[2], f.__name__)


if __name__ == "__main__":
    tf.test.main()
