"""Writes the fusion specs the rewriter makes for a small BERT-style encoder.

The JSON files beside this script are its output: every distinct cluster of
an inference call and of a train step (forward, backward, Keras Adam) of the
demo's encoder (tf_fusionstitch/tools/demo.py; 2 layers, hidden 64, 4 heads,
FFN 256, sequence 32, dynamic batch). tests/gpu/test_gpu_clusters.py compiles
them for CUDA and emulates them without TensorFlow. Regenerate with

  python tests/gpu_clusters/collect_bert.py

(needs TensorFlow; replaces bert_*.json, named by a hash of their content).
"""

import hashlib
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs
import tf_fusionstitch.kernels as kernels
from tf_fusionstitch.tools.demo import build_encoder, randomize

OUT = pathlib.Path(__file__).parent
SEQ, HIDDEN, HEADS, LAYERS, FFN = 32, 64, 4, 2, 256


def main():
    for old in OUT.glob("bert_*.json"):
        old.unlink()
    seen = {}
    build = kernels.build_cpu_kernels

    def recording(clusters, *args, **kwargs):  # every cluster optimize() compiles
        for cluster in clusters:
            text = cluster.to_json()
            if text not in seen:  # named by content, whatever order they build in
                seen[text] = "bert_" + hashlib.sha256(text.encode()).hexdigest()[:10]
                (OUT / f"{seen[text]}.json").write_text(text)
        return build(clusters, *args, **kwargs)
    kernels.build_cpu_kernels = recording

    model = build_encoder(SEQ, HIDDEN, HEADS, LAYERS, FFN)
    randomize(model, np.random.default_rng(0))
    spec = [tf.TensorSpec([None, SEQ, HIDDEN], tf.float32)]

    @tf.function(input_signature=spec)
    def infer(x):
        return model(x)

    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)

    @tf.function(input_signature=spec)
    def train_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    x = np.random.default_rng(1).standard_normal((2, SEQ, HIDDEN)).astype(np.float32)
    fs.optimize(infer)(x)
    fs.optimize(train_step)(x)
    print(f"{len(seen)} clusters written to {OUT}")


if __name__ == "__main__":
    main()
