"""keras.applications CNNs, built from their public constructors with random
weights (`weights=None`) and their own classification top (logits).

A model's graph is the architecture's whatever the input size, so "tiny" is a
small input (and the smallest width multiplier where the constructor has one):
the graph tests see is the one users run. Tiny inputs are 64x64 (the constructor's
minimum where it is more: 75 for InceptionV3, 71 for Xception), not the 32x32 most constructors accept: at 32x32
the last stage's batch norms see one position per image, and a train step's
batch statistics over a few values are too ill-conditioned to compare two
float32 programs. "real" is the architecture's published input size and width.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from benchmarks.zoo import assemble

CLASSES = 10


@dataclasses.dataclass(frozen=True)
class VisionEntry:
    constructor: str                 # keras.applications.<constructor>
    tiny_image: int                  # input side at tiny size
    real_image: int                  # the published input side
    optimizer: str
    tiny_args: Tuple = ()            # extra constructor arguments at tiny size (width)
    args: Tuple = ()                 # constructor arguments at both sizes
    policy: str = "float32"
    # True where the architecture drops activations in training and the
    # constructor has no argument to stop it (EfficientNets' stochastic depth).
    dropout: bool = False
    pixels: str = "normal"           # "0-255" for models that rescale their input themselves


ENTRIES: Dict[str, VisionEntry] = {
    "mobilenet": VisionEntry("MobileNet", 64, 224, "sgd_momentum",
                             tiny_args=(("alpha", 0.25),), args=(("dropout", 0.0),)),
    "mobilenet_v2": VisionEntry("MobileNetV2", 64, 224, "rmsprop",
                                tiny_args=(("alpha", 0.35),)),
    "mobilenet_v3_small": VisionEntry("MobileNetV3Small", 64, 224, "adamax",
                                      args=(("dropout_rate", 0.0),), pixels="0-255"),
    "mobilenet_v3_large": VisionEntry("MobileNetV3Large", 64, 224, "adam",
                                      args=(("dropout_rate", 0.0),), pixels="0-255",
                                      policy="mixed_bfloat16"),
    "resnet50": VisionEntry("ResNet50", 64, 224, "adam"),
    "resnet50_v2": VisionEntry("ResNet50V2", 64, 224, "sgd_momentum"),
    "efficientnet_b0": VisionEntry("EfficientNetB0", 64, 224, "rmsprop", dropout=True,
                                   pixels="0-255"),
    "efficientnet_v2_b0": VisionEntry("EfficientNetV2B0", 64, 224, "nadam", dropout=True,
                                      pixels="0-255"),
    "densenet121": VisionEntry("DenseNet121", 64, 224, "adam"),
    "convnext_tiny": VisionEntry("ConvNeXtTiny", 64, 224, "adamw", pixels="0-255"),
    "inception_v3": VisionEntry("InceptionV3", 75, 299, "sgd_momentum"),
    "xception": VisionEntry("Xception", 71, 299, "adagrad"),
    "nasnet_mobile": VisionEntry("NASNetMobile", 64, 224, "rmsprop"),
    "vgg16": VisionEntry("VGG16", 64, 224, "sgd_momentum"),
    "vgg19": VisionEntry("VGG19", 64, 224, "lion"),
}

# Models outside the zoo (zoo.EXTRA_NAMES): not in CI, run on demand to try the tool
# on architectures it was not checked on while it was built.
EXTRA: Dict[str, VisionEntry] = {
    "inception_resnet_v2": VisionEntry("InceptionResNetV2", 75, 299, "adam"),
    "mobilenet_v3_minimalistic": VisionEntry(
        "MobileNetV3Small", 64, 224, "adagrad",
        args=(("dropout_rate", 0.0), ("minimalistic", True)), pixels="0-255"),
    "efficientnet_v2_s": VisionEntry("EfficientNetV2S", 64, 384, "adamw", dropout=True,
                                     pixels="0-255"),
}


def _images(entry: VisionEntry, side: int):
    def make_inputs(gen: np.random.Generator, batch: int, seq: Optional[int] = None):
        shape = (batch, side, side, 3)
        values = (gen.uniform(0.0, 255.0, shape) if entry.pixels == "0-255"
                  else gen.standard_normal(shape))
        return [tf.constant(values, tf.float32)]
    return make_inputs


def build(name: str, size: str, seed: int, policy: str = None) -> assemble.ZooModel:
    entry = ENTRIES.get(name) or EXTRA[name]
    policy = policy or entry.policy
    side = entry.tiny_image if size == "tiny" else entry.real_image
    config = dict(entry.args)
    if size == "tiny":
        config.update(entry.tiny_args)
    config.update(weights=None, input_shape=(side, side, 3), classes=CLASSES,
                  classifier_activation=None)
    keras.utils.set_random_seed(seed)
    with assemble.dtype_policy(policy):
        backbone = getattr(keras.applications, entry.constructor)(**config)
    return assemble.finish(
        name=name, source=f"keras.applications.{entry.constructor}", size=size, config=config,
        family="vision", backbone=backbone, input_names=None,
        input_specs=[tf.TensorSpec([None, side, side, 3], tf.float32)],
        make_inputs=_images(entry, side),
        heads=lambda logits: [(logits, lambda labels: labels)],
        label_spec=tf.TensorSpec([None], tf.int32),
        make_labels=lambda gen, values: tf.constant(
            gen.integers(0, CLASSES, values[0].shape[0]), tf.int32),
        optimizer_name=entry.optimizer, policy=policy, dropout=entry.dropout, seed=seed)
