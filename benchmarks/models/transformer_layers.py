"""Transformer building blocks shared by the BERT encoder and the seq2seq model:
token + position embeddings, multi-head softmax attention and post-LN encoder /
decoder layers (Keras layers, GELU feed-forward)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf


class PositionalEmbedding(keras.layers.Layer):
    """Token embedding plus a learned position embedding, then layernorm (BERT)."""

    def __init__(self, vocab, seq, hidden, **kwargs):
        super().__init__(**kwargs)
        self.tokens = keras.layers.Embedding(vocab, hidden, name="token_embeddings")
        self.positions = keras.layers.Embedding(seq, hidden, name="position_embeddings")
        self.norm = keras.layers.LayerNormalization(epsilon=1e-12, name="embeddings_ln")

    def call(self, ids):
        positions = tf.range(tf.shape(ids)[-1])
        return self.norm(self.tokens(ids) + self.positions(positions))


class PaddingMask(keras.layers.Layer):
    """1.0 for tokens, 0.0 for padding (id 0), as BERT's input_mask."""

    def call(self, ids):
        return tf.cast(tf.not_equal(ids, 0), tf.float32)


def padded_token_ids(gen, batch, seq, vocab):
    """Token ids 1..vocab-1 for a random length per row, then padding (0)."""
    ids = gen.integers(1, vocab, size=(batch, seq))
    lengths = gen.integers(1, seq + 1, size=(batch, 1))
    return tf.constant(np.where(np.arange(seq) < lengths, ids, 0), tf.int32)


class Attention(keras.layers.Layer):
    """Multi-head scaled dot-product attention, as keras.layers.MultiHeadAttention
    computes it (EinsumDense projections, softmax over the keys) except that the
    key projection has no bias, as in Whisper: softmax cancels a key bias, so its
    true gradient is zero and Adam would turn the gradient's rounding noise into
    updates of up to the learning rate."""

    def __init__(self, heads, key_dim, causal=False, **kwargs):
        super().__init__(**kwargs)
        self.heads, self.key_dim, self.causal = heads, key_dim, causal

    def build(self, query_shape, value_shape=None):
        hidden = query_shape[-1]
        project = lambda name, bias: keras.layers.EinsumDense(  # noqa: E731
            "bsd,dhk->bshk", (None, self.heads, self.key_dim), name=name,
            bias_axes="hk" if bias else None)
        self.query, self.key, self.value = (project("query", True), project("key", False),
                                            project("value", True))
        self.out = keras.layers.EinsumDense("bqhk,hkd->bqd", (None, hidden), bias_axes="d",
                                            name="attention_output")

    def call(self, query, value, key_mask=None):
        q = self.query(query) * (self.key_dim ** -0.5)
        k, v = self.key(value), self.value(value)
        scores = tf.einsum("bqhk,bshk->bhqs", q, k)
        if key_mask is not None:  # padding keys: BERT's additive -10000
            scores += (1.0 - key_mask[:, None, None, :]) * -10000.0
        if self.causal:  # position i attends to positions <= i
            allowed = tf.linalg.band_part(tf.ones(tf.shape(scores)[-2:]), -1, 0)
            scores += (1.0 - allowed) * -1e9
        context = tf.einsum("bhqs,bshk->bqhk", tf.nn.softmax(scores, axis=-1), v)
        return self.out(context)


def _feed_forward(x, hidden, ffn, prefix):
    h = keras.layers.Dense(ffn, activation="gelu", name=f"{prefix}_intermediate")(x)
    return keras.layers.Dense(hidden, name=f"{prefix}_output")(h)


def _add_norm(x, y, name):
    return keras.layers.LayerNormalization(epsilon=1e-12, name=name)(x + y)


def encoder_layer(x, key_mask, hidden, heads, ffn, prefix):
    attn = Attention(heads, hidden // heads, name=f"{prefix}_attention")(x, x, key_mask)
    x = _add_norm(x, attn, f"{prefix}_attention_ln")
    return _add_norm(x, _feed_forward(x, hidden, ffn, prefix), f"{prefix}_output_ln")


def decoder_layer(x, memory, memory_mask, hidden, heads, ffn, prefix):
    """Causal self-attention, cross-attention over the encoder's output (its
    padding masked), feed-forward."""
    attn = Attention(heads, hidden // heads, causal=True, name=f"{prefix}_self_attention")(x, x)
    x = _add_norm(x, attn, f"{prefix}_self_attention_ln")
    cross = Attention(heads, hidden // heads, name=f"{prefix}_cross_attention")(
        x, memory, memory_mask)
    x = _add_norm(x, cross, f"{prefix}_cross_attention_ln")
    return _add_norm(x, _feed_forward(x, hidden, ffn, prefix), f"{prefix}_output_ln")
