"""What every reference model shares: the built-model record, seeded weights,
and the inference / training-step tf.functions around a Keras model.

A model module only describes its layers and its inputs; this module turns
that into `ReferenceModel`, so every model is optimized and compared the
same way by tests and benchmarks.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence, Tuple, Union

import keras
import numpy as np
import tensorflow as tf

Seed = Union[int, np.random.Generator]


@dataclasses.dataclass(frozen=True)
class Batch:
    inputs: Tuple[tf.Tensor, ...]      # the model's inputs, in call order
    labels: tf.Tensor                  # what the loss compares the outputs with


@dataclasses.dataclass
class ReferenceModel:
    """One built model. `inference(*inputs)` returns the model's outputs;
    `train_step(*inputs, labels)` runs forward, backward and one Adam update and
    returns the loss. Both take a dynamic batch dimension."""

    name: str
    sizes: dict
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    make_batch: Callable[[Seed, int], Batch]
    inference: tf.types.experimental.GenericFunction
    train_step: tf.types.experimental.GenericFunction


def generator(seed: Seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def random_weight(gen: np.random.Generator, path: str, shape) -> np.ndarray:
    """A seeded random value for the weight at `path`: fan-in scaled kernels,
    embeddings of spread 0.5, norm scales near one, moving variances in
    [0.5, 1.5], and small nonzero biases, offsets and moving means."""
    shape = tuple(shape)
    if "moving_variance" in path:
        return gen.uniform(0.5, 1.5, shape)
    if "embeddings" in path:
        return 0.5 * gen.standard_normal(shape)
    if len(shape) >= 2:                    # kernels: fan-in scaled, as Glorot-like inits are
        return gen.standard_normal(shape) / np.sqrt(np.prod(shape[:-1]))
    if "gamma" in path or path.endswith("/scale"):   # LayerNorm / RMSNorm scales
        return 1.0 + 0.1 * gen.standard_normal(shape)
    return 0.1 * gen.standard_normal(shape)          # biases, beta, moving_mean


def randomize_weights(model: keras.Model, seed: int) -> None:
    """Seeded random values for every weight, from NumPy (not Keras' initializers),
    so two builds with one seed are identical and no bias, norm parameter or
    moving statistic is trivially zero or one."""
    gen = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(random_weight(gen, v.path, v.shape).astype(v.dtype))


def assemble(name: str, sizes: dict, model: keras.Model, input_specs: Sequence[tf.TensorSpec],
             label_spec: tf.TensorSpec, make_batch: Callable[[Seed, int], Batch],
             loss_fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], seed: int,
             inference_model: keras.Model = None,
             learning_rate: float = 1e-3) -> ReferenceModel:
    """Seeds the weights and wraps `model` in its inference and training functions.

    loss_fn(labels, outputs) -> scalar loss. `inference_model` (default `model`)
    shares `model`'s layers and is what inference returns, e.g. an encoder
    without the training head."""
    randomize_weights(model, seed)
    optimizer = keras.optimizers.Adam(learning_rate=learning_rate)
    # Slots exist before tracing: a tf.function may not create variables on
    # every trace, and optimize() traces the step again.
    optimizer.build(model.trainable_variables)
    input_specs = list(input_specs)
    inference_model = inference_model or model

    def call(m, inputs, training):
        return m(list(inputs) if len(inputs) > 1 else inputs[0], training=training)

    @tf.function(input_signature=input_specs)
    def inference(*inputs):
        return call(inference_model, inputs, training=False)

    @tf.function(input_signature=input_specs + [label_spec])
    def train_step(*args):
        inputs, labels = args[:-1], args[-1]
        with tf.GradientTape() as tape:
            outputs = call(model, inputs, training=True)
            loss = loss_fn(labels, outputs)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return ReferenceModel(name, dict(sizes), model, optimizer, make_batch, inference,
                          train_step)


def sparse_crossentropy(labels, logits):
    """Mean softmax cross-entropy of integer labels over every position."""
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def token_ids(gen: np.random.Generator, shape, vocab: int) -> tf.Tensor:
    return tf.constant(gen.integers(0, vocab, size=shape), tf.int32)


def normal(gen: np.random.Generator, shape) -> tf.Tensor:
    return tf.constant(gen.standard_normal(shape), tf.float32)
