"""ASR-style acoustic model (DeepSpeech2-like): a strided Conv2D + BatchNorm +
ReLU front end over (time, frequency) features, a bidirectional LSTM over time,
and a dense classifier per frame. Inference returns per-frame logits; the
training step is per-frame softmax cross-entropy (no CTC), Adam."""

from __future__ import annotations

import keras
import tensorflow as tf

from benchmarks.models import common
from benchmarks.models.conv_blocks import conv_bn_relu

REAL = dict(frames=400, features=80, filters=(32, 32), lstm=512, classes=29)
TINY = dict(frames=16, features=8, filters=(4, 4), lstm=8, classes=6)


def build(frames, features, filters, lstm, classes, seed=0) -> common.ReferenceModel:
    sizes = dict(frames=frames, features=features, filters=filters, lstm=lstm,
                 classes=classes)
    spectrogram = keras.Input(shape=(frames, features), name="features")
    x = keras.layers.Reshape((frames, features, 1), name="channels")(spectrogram)
    for i, f in enumerate(filters):
        x = conv_bn_relu(x, f, 2 if i == 0 else (1, 2), f"conv{i}")  # time stride 2 once
    t, fr, c = x.shape[1:]
    x = keras.layers.Reshape((t, fr * c), name="frames")(x)
    x = keras.layers.Bidirectional(keras.layers.LSTM(lstm, return_sequences=True),
                                   name="bilstm")(x)
    logits = keras.layers.Dense(classes, name="classifier")(x)
    model = keras.Model(spectrogram, logits, name="asr")

    def make_batch(seed_or_rng, batch):
        gen = common.generator(seed_or_rng)
        return common.Batch((common.normal(gen, (batch, frames, features)),),
                            common.token_ids(gen, (batch, t), classes))

    return common.assemble("asr", sizes, model,
                           [tf.TensorSpec([None, frames, features], tf.float32)],
                           tf.TensorSpec([None, t], tf.int32), make_batch,
                           common.sparse_crossentropy, seed)
