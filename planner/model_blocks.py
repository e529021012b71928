"""Pieces the reference training steps share (TF edge): dense and layer-norm layers, a
transformer layer's variables, and `Spec`, a model's variables with its loss.

Both `reference_models` (MLP, transformer block, BERT) and `more_models` (GPT, ResNet-style
CNN) build from these; the variables come from a factory `var(name, shape, init)`.
"""

import tensorflow as tf


def layer_norm(x, gamma, beta):
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
    return centered * tf.math.rsqrt(var + 1e-12) * gamma + beta


def dense(x, w, b):
    return tf.nn.bias_add(tf.matmul(x, w), b)


def make_encoder_layer(var, prefix, hidden, ffn):
    """One transformer layer's variables: attention (`wq`, `wk`, `wv`, `wo` and biases),
    feed-forward (`w1`, `w2`, `b1`, `b2`) and two layer norms."""
    p = {}
    for n in ("wq", "wk", "wv", "wo"):
        p[n] = var(f"{prefix}{n}", (hidden, hidden))
        p["b" + n[1]] = var(f"{prefix}b{n[1]}", (hidden,), "zeros")
    p["w1"] = var(f"{prefix}w1", (hidden, ffn))
    p["b1"] = var(f"{prefix}b1", (ffn,), "zeros")
    p["w2"] = var(f"{prefix}w2", (ffn, hidden))
    p["b2"] = var(f"{prefix}b2", (hidden,), "zeros")
    for n in ("ln1", "ln2"):
        p[n + "_gamma"] = var(f"{prefix}{n}_gamma", (hidden,), "ones")
        p[n + "_beta"] = var(f"{prefix}{n}_beta", (hidden,), "zeros")
    return p


class Spec:
    """Variables of a model plus a loss function of (params, inputs)."""

    def __init__(self, params, loss_fn, input_specs):
        self.params = params
        self.loss_fn = loss_fn
        self.input_specs = input_specs   # [(name, shape, dtype, kind)]
