"""Conv2D + BatchNorm + ReLU blocks, shared by the CRNN and ASR front ends."""

from __future__ import annotations

import keras


def conv_bn_relu(x, filters, strides, name):
    # No conv bias: BatchNorm's beta replaces it, as in the CRNN/DeepSpeech models.
    x = keras.layers.Conv2D(filters, 3, strides=strides, padding="same", use_bias=False,
                            name=f"{name}_conv")(x)
    x = keras.layers.BatchNormalization(epsilon=1e-3, name=f"{name}_bn")(x)
    return keras.layers.ReLU(name=f"{name}_relu")(x)
