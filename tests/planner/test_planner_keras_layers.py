"""Exhaustive operator partitioning finds Megatron's plan on transformer blocks written the way
users write them: Keras' MultiHeadAttention and Dense layers (EinsumDense, BatchMatMulV2 on
rank-3 inputs, Einsum attention), and raw variables with `x @ w` on rank-3 inputs and the
heads split by reshape + transpose. Both hinge on the gradient of a rank-3 x rank-2 matmul,
whose weight gradient TF sums over axes `BroadcastGradientArgs` computes at run time."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

from tf_fusionstitch import planner
from tf_fusionstitch.planner import cost_model as cm
from tf_fusionstitch.planner import graph_import, op_rules

# The issue's block (batch, seq, hidden, heads, FFN) on V100s, and the reference Megatron
# test's sizes on its clusters (the small block's step is mostly per-op overhead on H200s,
# where on 4 and 8 of them no split pays for its collectives).
ISSUE = dict(b=8, s=128, h=256, heads=8, ffn=1024)
REFERENCE = dict(b=8, s=256, h=1024, heads=16, ffn=4096)


def _sgd_step(model_fn, variables):
    opt = keras.optimizers.SGD(0.01)
    opt.build(variables)

    @tf.function
    def step(x, target):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model_fn(x) - target))
        grads = tape.gradient(loss, variables)
        opt.apply_gradients(zip(grads, variables))
        return loss
    return step


def keras_block(b, s, h, heads, ffn):
    """Input layer norm (so the block's input has a gradient, as in a stack of layers), then
    a post-LN block: MultiHeadAttention, residual, LN, Dense(relu), Dense, residual, LN."""
    x_in = keras.Input((s, h))
    x = keras.layers.LayerNormalization(name="ln0")(x_in)
    a = keras.layers.MultiHeadAttention(heads, h // heads, name="mha")(x, x)
    y = keras.layers.LayerNormalization(name="ln1")(x + a)
    f = keras.layers.Dense(ffn, activation="relu", name="ffn_in")(y)
    f = keras.layers.Dense(h, name="ffn_out")(f)
    y = keras.layers.LayerNormalization(name="ln2")(y + f)
    model = keras.Model(x_in, y)
    return _sgd_step(model, model.trainable_variables)


def raw_block(b, s, h, heads, ffn):
    """The same block from raw variables: `x @ w` on (batch, seq, hidden) inputs."""
    rng = np.random.default_rng(0)

    def var(name, shape, scale=0.02):
        return tf.Variable(rng.normal(0, scale, shape).astype(np.float32), name=name)

    p = {n: var(n, (h, h)) for n in ("wq", "wk", "wv", "wo")}
    p.update({"b" + n[1]: var("b" + n[1], (h,)) for n in ("wq", "wk", "wv", "wo")})
    p.update(w1=var("w1", (h, ffn)), b1=var("b1", (ffn,)), w2=var("w2", (ffn, h)),
             b2=var("b2", (h,)))
    for n in ("ln0", "ln1", "ln2"):
        p[n + "_gamma"], p[n + "_beta"] = var(n + "_gamma", (h,)), var(n + "_beta", (h,))

    def ln(x, n):
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + 1e-6) * p[n + "_gamma"] + p[n + "_beta"]

    def split_heads(t):
        return tf.transpose(tf.reshape(t, (b, s, heads, h // heads)), (0, 2, 1, 3))

    def block(x):
        x = ln(x, "ln0")
        q, k, v = (split_heads(x @ p["w" + n] + p["b" + n]) for n in "qkv")
        probs = tf.nn.softmax(q @ tf.transpose(k, (0, 1, 3, 2)) / np.sqrt(h // heads))
        ctx = tf.reshape(tf.transpose(probs @ v, (0, 2, 1, 3)), (b, s, h))
        y = ln(x + ctx @ p["wo"] + p["bo"], "ln1")
        f = tf.nn.relu(y @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        return ln(y + f, "ln2")
    return _sgd_step(block, list(p.values()))


def _import(step, sizes):
    x = tf.random.normal((sizes["b"], sizes["s"], sizes["h"]), seed=1)
    return graph_import.from_function(step, (x, x))[0]


class KerasBlockTest(tf.test.TestCase):
    # variable name -> the axis Megatron splits (None: replicated)
    MEGATRON = {"mha/query/kernel:0": 1, "mha/key/kernel:0": 1, "mha/value/kernel:0": 1,
                "mha/query/bias:0": 0, "mha/key/bias:0": 0, "mha/value/bias:0": 0,
                "mha/attention_output/kernel:0": 0, "mha/attention_output/bias:0": None,
                "ffn_in/kernel:0": 1, "ffn_in/bias:0": 0, "ffn_out/kernel:0": 0,
                "ffn_out/bias:0": None, "ln0/gamma:0": None, "ln1/gamma:0": None,
                "ln2/beta:0": None}

    SIZES, CLUSTERS = ISSUE, ((2, "2xV100"), (4, "4xV100"), (8, "8xV100"))
    build = staticmethod(keras_block)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.graph = _import(cls.build(**cls.SIZES), cls.SIZES)

    def test_every_op_has_an_axis_rule(self):
        # Every gradient Sum's axes are decided (BroadcastGradientArgs folded from shapes).
        for op in self.graph.ops.values():
            if op.type == "Sum":
                self.assertIn("axes", op.attrs, op.name)
        self.assertEqual(op_rules.conservative_ops(self.graph), {})

    def test_exhaustive_operator_plan_is_megatrons(self):
        for t, cluster in self.CLUSTERS:
            plan = planner.search_graph(self.graph, cluster, strategy="operator",
                                        method="exhaustive")
            self.assertEqual(plan.tensor_parallel, t)
            splits = plan.variable_splits
            for name, axis in self.MEGATRON.items():
                self.assertEqual(splits[name], axis, f"{name} on {cluster}")
            # Two all-reduces of a (batch, seq, hidden) activation forward, two backward.
            self.assertEqual(plan.tp_collectives, {"all_reduce/forward": 2,
                                                   "all_reduce/backward": 2}, cluster)
            units = frozenset(u.index for u in self.graph.linkage.units
                              if all(splits.get(v) == a for v, a in u.variables))
            est = cm.CostModel(self.graph, planner.get_cluster(cluster)).evaluate(
                cm.Config(tensor_parallel=t, split_units=units))
            self.assertAllClose(est.step_time, plan.predicted_step_time, rtol=1e-12)
            activation = self.SIZES["b"] * self.SIZES["s"] * self.SIZES["h"] * 4
            self.assertEqual([c.nbytes for c in est.collectives], [activation] * 4)


class RawBlockTest(KerasBlockTest):
    MEGATRON = {"wq:0": 1, "wk:0": 1, "wv:0": 1, "bq:0": 0, "bk:0": 0, "bv:0": 0, "wo:0": 0,
                "bo:0": None, "w1:0": 1, "b1:0": 0, "w2:0": 0, "b2:0": None,
                "ln0_gamma:0": None, "ln1_gamma:0": None, "ln2_beta:0": None}
    build = staticmethod(raw_block)


class KerasBlockAtReferenceSizesTest(KerasBlockTest):
    SIZES, CLUSTERS = REFERENCE, ((2, "2xH200"), (4, "4xA100"), (8, "8xH200"))


class RawBlockAtReferenceSizesTest(RawBlockTest):
    SIZES, CLUSTERS = REFERENCE, ((2, "2xH200"), (4, "4xA100"), (8, "8xH200"))


if __name__ == "__main__":
    tf.test.main()
