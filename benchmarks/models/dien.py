"""DIEN-style recommender: item and category embeddings, a GRU over the user's
behaviour sequence (interest extraction), attention of the target item over the
GRU states (interest activation), and an MLP head with a sigmoid click
probability. Histories have random lengths, padded to `seq`: the GRU skips the
padding (Keras mask) and the attention gives it no weight. Inputs: history
items, history categories, target item, target category, history length.
The training step is binary cross-entropy, Adam.

Simplified from DIEN (Zhou et al., 2019): no AUGRU and no auxiliary loss; the
attention scores an MLP over [state, target, state * target, state - target]
as DIN/DIEN do."""

from __future__ import annotations

import keras
import tensorflow as tf

from benchmarks.models import common

REAL = dict(items=100000, categories=1000, embedding=18, seq=100, gru=36,
            attention=(80, 40), mlp=(200, 80))
TINY = dict(items=60, categories=8, embedding=6, seq=8, gru=12, attention=(16,), mlp=(16,))


class TargetAttention(keras.layers.Layer):
    """Softmax over the sequence of MLP scores of (state, target); returns the
    attention-weighted sum of states."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.mlp = [keras.layers.Dense(u, activation="sigmoid", name=f"score{i}")
                    for i, u in enumerate(units)]
        # no bias: softmax cancels it (its true gradient is zero, and Adam
        # would turn the gradient's rounding noise into updates)
        self.score = keras.layers.Dense(1, use_bias=False, name="score_out")
        self.supports_masking = True  # the GRU's mask is the `valid` argument here

    def compute_mask(self, inputs, previous_mask=None):
        return None  # the output has no sequence axis left

    def call(self, states, target, valid):
        target = tf.broadcast_to(target[:, None, :], tf.shape(states))
        h = tf.concat([states, target, states * target, states - target], axis=-1)
        for layer in self.mlp:
            h = layer(h)
        # padded behaviours get no weight (DIN's large negative score)
        scores = tf.where(valid, tf.squeeze(self.score(h), -1), -2.0 ** 32 + 1)
        weights = tf.nn.softmax(scores, axis=-1)
        return tf.reduce_sum(states * weights[:, :, None], axis=1)


class SequenceMask(keras.layers.Layer):
    """True for the first `length` of `seq` positions: users have histories of
    different lengths, padded to `seq`."""

    def __init__(self, seq, **kwargs):
        super().__init__(**kwargs)
        self.seq = seq

    def call(self, lengths):
        return tf.sequence_mask(lengths, self.seq)


def build(items, categories, embedding, seq, gru, attention, mlp, seed=0):
    sizes = dict(items=items, categories=categories, embedding=embedding, seq=seq, gru=gru,
                 attention=attention, mlp=mlp)
    history_items = keras.Input(shape=(seq,), dtype="int32", name="history_items")
    history_cats = keras.Input(shape=(seq,), dtype="int32", name="history_categories")
    target_item = keras.Input(shape=(), dtype="int32", name="target_item")
    target_cat = keras.Input(shape=(), dtype="int32", name="target_category")
    lengths = keras.Input(shape=(), dtype="int32", name="history_lengths")
    item_embedding = keras.layers.Embedding(items, embedding, name="item_embeddings")
    cat_embedding = keras.layers.Embedding(categories, embedding, name="category_embeddings")

    behaviours = keras.layers.Concatenate(name="behaviours")(
        [item_embedding(history_items), cat_embedding(history_cats)])
    target = keras.layers.Concatenate(name="target")(
        [item_embedding(target_item), cat_embedding(target_cat)])
    valid = SequenceMask(seq, name="valid_behaviours")(lengths)
    states = keras.layers.GRU(gru, return_sequences=True, name="interest_gru")(
        behaviours, mask=valid)
    target_state = keras.layers.Dense(gru, name="target_projection")(target)
    interest = TargetAttention(attention, name="interest_attention")(states, target_state, valid)
    h = keras.layers.Concatenate(name="features")(
        [interest, target, keras.layers.GlobalAveragePooling1D()(behaviours)])
    for i, units in enumerate(mlp):
        h = keras.layers.Dense(units, activation="relu", name=f"mlp{i}")(h)
    click = keras.layers.Dense(1, activation="sigmoid", name="click")(h)
    model = keras.Model([history_items, history_cats, target_item, target_cat, lengths],
                        click, name="dien")

    def make_batch(seed_or_rng, batch):
        gen = common.generator(seed_or_rng)
        return common.Batch(
            (common.token_ids(gen, (batch, seq), items),
             common.token_ids(gen, (batch, seq), categories),
             common.token_ids(gen, (batch,), items),
             common.token_ids(gen, (batch,), categories),
             tf.constant(gen.integers(1, seq + 1, size=batch), tf.int32)),
            tf.constant(gen.integers(0, 2, size=(batch, 1)), tf.float32))

    def loss(labels, probability):
        return tf.reduce_mean(keras.losses.binary_crossentropy(labels, probability))

    specs = [tf.TensorSpec([None, seq], tf.int32)] * 2 + [tf.TensorSpec([None], tf.int32)] * 3
    return common.assemble("dien", sizes, model, specs, tf.TensorSpec([None, 1], tf.float32),
                           make_batch, loss, seed)
