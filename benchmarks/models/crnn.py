"""CRNN-style text-line recogniser: Conv2D + BatchNorm + ReLU + max-pool blocks,
the feature map read column by column (width is time) by an LSTM, and a dense
classifier per column. Inference returns per-column logits; the training step
is per-column softmax cross-entropy (no CTC), Adam. BatchNorm uses batch
statistics and updates its moving averages in the training step."""

from __future__ import annotations

import keras
import tensorflow as tf

from benchmarks.models import common
from benchmarks.models.conv_blocks import conv_bn_relu

REAL = dict(height=32, width=128, filters=(64, 128, 256, 256), lstm=256, classes=37)
TINY = dict(height=8, width=16, filters=(4, 8), lstm=8, classes=5)


def build(height, width, filters, lstm, classes, seed=0) -> common.ReferenceModel:
    sizes = dict(height=height, width=width, filters=filters, lstm=lstm, classes=classes)
    image = keras.Input(shape=(height, width, 1), name="image")
    x = image
    for i, f in enumerate(filters):
        x = conv_bn_relu(x, f, 1, f"block{i}")
        # halve the height every block, the width only in the first two (CRNN keeps
        # the columns many, since they become time steps)
        pool = (2, 2) if i < 2 else (2, 1)
        x = keras.layers.MaxPooling2D(pool, name=f"block{i}_pool")(x)
    h, w, c = x.shape[1:]
    columns = keras.layers.Reshape((w, h * c), name="columns")(
        keras.layers.Permute((2, 1, 3), name="width_first")(x))
    states = keras.layers.LSTM(lstm, return_sequences=True, name="lstm")(columns)
    logits = keras.layers.Dense(classes, name="classifier")(states)
    model = keras.Model(image, logits, name="crnn")

    def make_batch(seed_or_rng, batch):
        gen = common.generator(seed_or_rng)
        return common.Batch((common.normal(gen, (batch, height, width, 1)),),
                            common.token_ids(gen, (batch, w), classes))

    return common.assemble("crnn", sizes, model,
                           [tf.TensorSpec([None, height, width, 1], tf.float32)],
                           tf.TensorSpec([None, w], tf.int32), make_batch,
                           common.sparse_crossentropy, seed)
