"""What every zoo model shares: the built record, its optimizer, its training
head and loss, seeded weights, and the inference / train-step tf.functions.

A zoo entry (vision.py, text.py) only builds a third-party backbone from its
public constructor and says what its inputs are; this module turns it into a
`ZooModel` that tests and benchmarks optimize and compare the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from benchmarks.models.common import Batch, Seed, generator, random_weight

# The optimizers a zoo entry may name, each with the learning rate the zoo
# trains with (small enough that three steps stay near the initial weights).
OPTIMIZERS: Dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "adam": lambda: keras.optimizers.Adam(1e-3),
    "adamw": lambda: keras.optimizers.AdamW(1e-3, weight_decay=0.004),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.01, momentum=0.9),
    "rmsprop": lambda: keras.optimizers.RMSprop(1e-3),
    "adagrad": lambda: keras.optimizers.Adagrad(0.01),
    "adafactor": lambda: keras.optimizers.Adafactor(1e-3),
    "lion": lambda: keras.optimizers.Lion(1e-4),
    "nadam": lambda: keras.optimizers.Nadam(1e-3),
    "adamax": lambda: keras.optimizers.Adamax(1e-3),
}
# "float64" builds a model's float64 twin: the same weights (float32 values),
# whose training is the reference float32 rounding is measured against.
POLICIES = ("float32", "mixed_bfloat16", "float64")


@dataclasses.dataclass
class ZooModel:
    """One built zoo model. `inference(*inputs)` returns the backbone's outputs
    (batch dimension None; sequence length None too for text models);
    `train_step(*inputs, labels)` runs forward, backward and one update of
    `optimizer` and returns the loss."""

    name: str
    source: str                      # the public constructor, e.g. keras_hub.models.BertBackbone
    size: str                        # "tiny" or "real"
    config: dict                     # the constructor's arguments
    family: str                      # "vision" or "text"
    backbone: keras.Model
    model: keras.Model               # backbone + training head
    optimizer: keras.optimizers.Optimizer
    optimizer_name: str
    policy: str                      # Keras dtype policy the model was built under
    dropout: bool                    # dropout active in train steps
    input_specs: Tuple[tf.TensorSpec, ...]
    make_batch: Callable[..., Batch]  # (seed or Generator, batch, seq=None) -> Batch
    inference: tf.types.experimental.GenericFunction
    train_step: tf.types.experimental.GenericFunction


@contextlib.contextmanager
def dtype_policy(policy: str):
    """Builds layers under `policy` (keras.applications take no dtype argument)."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def randomize_weights(model: keras.Model, seed: int) -> None:
    """Seeded random values (benchmarks/models/common.random_weight) for every
    trainable weight and batch-norm moving statistic. Other non-trainable
    weights (a Normalization layer's mean, variance and count) keep their
    constructor's values: random ones would be meaningless (a negative
    variance). Values are float32 under every policy, so a float64 twin
    starts from exactly the float32 model's weights."""
    gen = np.random.default_rng(seed)
    for v in model.weights:
        moving = "moving_mean" in v.path or "moving_variance" in v.path
        if not tf.as_dtype(v.dtype).is_floating or not (v.trainable or moving):
            continue
        v.assign(random_weight(gen, v.path, v.shape).astype(np.float32).astype(v.dtype))


def token_loss(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Mean softmax cross-entropy of integer labels, in float32 under any
    16-bit policy (and in float64 for a float64 twin)."""
    if logits.dtype != tf.float64:
        logits = tf.cast(logits, tf.float32)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def finish(*, name: str, source: str, size: str, config: dict, family: str,
           backbone: keras.Model, input_names: Sequence[str],
           input_specs: Sequence[tf.TensorSpec],
           make_inputs: Callable[[np.random.Generator, int, Optional[int]], List[tf.Tensor]],
           heads: Callable[[object], List[Tuple[object, Callable]]],
           label_spec: tf.TensorSpec,
           make_labels: Callable[[np.random.Generator, List[tf.Tensor]], tf.Tensor],
           optimizer_name: str, policy: str, dropout: bool, seed: int) -> ZooModel:
    """Adds the training head, seeds the weights, builds the optimizer and
    wraps it all in `ZooModel`'s two tf.functions.

    `heads(backbone_outputs)` -> [(logits tensor, label selector)]: each head's
    symbolic logits and a function taking the batch's labels to that head's
    labels; the loss is the sum of the heads' token losses, so every weight of
    the backbone gets a gradient. `input_names` are the backbone's input keys
    (None: one tensor input), in the order of `input_specs`."""
    if optimizer_name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer_name!r}; known: {', '.join(OPTIMIZERS)}")
    inputs = backbone.input
    with dtype_policy(policy):
        head_list = heads(backbone.output)
    selectors = [select for _, select in head_list]
    model = keras.Model(inputs, [logits for logits, _ in head_list], name=f"{name}_train")
    randomize_weights(model, seed)
    optimizer = OPTIMIZERS[optimizer_name]()
    # Slots exist before tracing: a tf.function may not create variables on
    # every trace, and optimize() traces the step again.
    optimizer.build(model.trainable_variables)
    specs = tuple(input_specs)

    def as_model_input(values):
        if input_names is None:
            return values[0]
        return dict(zip(input_names, values))

    @tf.function(input_signature=list(specs))
    def inference(*values):
        return backbone(as_model_input(values), training=False)

    @tf.function(input_signature=list(specs) + [label_spec])
    def train_step(*args):
        values, labels = args[:-1], args[-1]
        with tf.GradientTape() as tape:
            outputs = model(as_model_input(values), training=True)
            outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
            loss = tf.add_n([token_loss(select(labels), logits)
                             for select, logits in zip(selectors, outputs)])
        grads = tape.gradient(loss, model.trainable_variables)
        # Weights the loss never reaches (a decoder's unused reverse
        # embedding) have no gradient; Keras' own fit skips them too.
        optimizer.apply_gradients([(g, v) for g, v in zip(grads, model.trainable_variables)
                                   if g is not None])
        return loss

    def make_batch(seed_or_gen: Seed, batch: int, seq: Optional[int] = None) -> Batch:
        gen = generator(seed_or_gen)
        values = make_inputs(gen, batch, seq)
        return Batch(tuple(values), make_labels(gen, values))

    return ZooModel(name=name, source=source, size=size, config=dict(config), family=family,
                    backbone=backbone, model=model, optimizer=optimizer,
                    optimizer_name=optimizer_name, policy=policy, dropout=dropout,
                    input_specs=specs, make_batch=make_batch, inference=inference,
                    train_step=train_step)
