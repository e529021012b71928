"""Demo: optimize a small BERT-style encoder and compare it with TensorFlow.

Builds a transformer encoder from Keras layers with random weights (no downloads),
wraps its forward pass in a tf.function with a dynamic batch dimension, runs
`tf_fusionstitch.optimize` on it, and prints the report (one line per kernel;
--details: every op), the largest difference from TensorFlow's result at two
batch sizes, and the median speed-up on this machine.

  python -m tf_fusionstitch.tools.demo --batch=8 --seq=128 --hidden=256 --html=report.html
"""

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf
import keras

import tf_fusionstitch as fs

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 8, "Batch size of the timed calls.")
flags.DEFINE_integer("seq", 128, "Sequence length.")
flags.DEFINE_integer("hidden", 256, "Hidden size.")
flags.DEFINE_integer("heads", 4, "Attention heads (must divide --hidden).")
flags.DEFINE_integer("layers", 2, "Transformer layers.")
flags.DEFINE_integer("ffn", 0, "Feed-forward size; 0 means 4 * hidden.")
flags.DEFINE_integer("repeats", 20, "Timed calls per variant; the median is reported.")
flags.DEFINE_integer("seed", 0, "Seed for weights and inputs.")
flags.DEFINE_bool("details", False, "Print every op of every kernel instead of one line each.")
flags.DEFINE_string("html", "", "Also write the report as a self-contained page here.")


def build_encoder(seq, hidden, heads, layers, ffn):
    """A post-LN BERT encoder stack: attention, add & norm, GELU feed-forward, add & norm."""
    x = inputs = keras.Input(shape=(seq, hidden), name="embeddings")
    x = keras.layers.LayerNormalization(epsilon=1e-12, name="embeddings_ln")(x)
    for i in range(layers):
        attn = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=hidden // heads,
                                               name=f"layer{i}_attention")(x, x)
        x = keras.layers.LayerNormalization(epsilon=1e-12, name=f"layer{i}_attention_ln")(
            x + attn)
        h = keras.layers.Dense(ffn, activation="gelu", name=f"layer{i}_intermediate")(x)
        h = keras.layers.Dense(hidden, name=f"layer{i}_output")(h)
        x = keras.layers.LayerNormalization(epsilon=1e-12, name=f"layer{i}_output_ln")(x + h)
    return keras.Model(inputs, x, name="encoder")


def randomize(model, rng):
    """Random weights everywhere, so biases and norm parameters are not trivial."""
    for v in model.weights:
        shape = tuple(v.shape)
        if len(shape) >= 2:  # kernels: fan-in scaled
            value = rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1]))
        elif "gamma" in v.path:
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            value = 0.1 * rng.standard_normal(shape)
        v.assign(value.astype(np.float32))


def median_ms(fn, x, repeats):
    fn(x)  # warm up (traces, compiles, faults pages in)
    fn(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(x)  # eager CPU execution returns when the work is done; no .numpy() copy
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main(argv):
    del argv
    if FLAGS.hidden % FLAGS.heads:
        raise app.UsageError(f"--heads={FLAGS.heads} must divide --hidden={FLAGS.hidden}")
    rng = np.random.default_rng(FLAGS.seed)
    model = build_encoder(FLAGS.seq, FLAGS.hidden, FLAGS.heads, FLAGS.layers,
                          FLAGS.ffn or 4 * FLAGS.hidden)
    randomize(model, rng)

    @tf.function(input_signature=[tf.TensorSpec([None, FLAGS.seq, FLAGS.hidden], tf.float32)])
    def encoder(embeddings):
        return model(embeddings, training=False)

    print(f"encoder: {FLAGS.layers} layers, hidden {FLAGS.hidden}, {FLAGS.heads} heads, "
          f"seq {FLAGS.seq}, {model.count_params():,} parameters")
    fast = fs.optimize(encoder)

    def fresh(batch):
        return tf.constant(rng.standard_normal((batch, FLAGS.seq, FLAGS.hidden),
                                               dtype=np.float32))

    t0 = time.perf_counter()
    fast(fresh(FLAGS.batch))  # the first call traces, rewrites and compiles
    print(f"first call (trace, rewrite, compile): {time.perf_counter() - t0:.1f} s\n")
    report = fast.report()
    print(report.details() if FLAGS.details else report)
    if FLAGS.html:
        report.save_html(FLAGS.html)
        print(f"wrote {FLAGS.html}")
    print()

    for batch in (FLAGS.batch, max(1, FLAGS.batch // 2) + 1):
        x = fresh(batch)
        want, got = encoder(x).numpy(), fast(x).numpy()
        print(f"batch {batch}: max |fs - TF| = {np.max(np.abs(got - want)):.3g} "
              f"(max |TF| = {np.max(np.abs(want)):.3g})")

    x = fresh(FLAGS.batch)
    tf_ms = median_ms(encoder, x, FLAGS.repeats)
    fs_ms = median_ms(fast, x, FLAGS.repeats)
    print(f"\nmedian of {FLAGS.repeats} calls at batch {FLAGS.batch} on {os.cpu_count()} "
          f"cores: TF {tf_ms:.2f} ms, tf_fusionstitch {fs_ms:.2f} ms, "
          f"speed-up {tf_ms / fs_ms:.2f}x")


if __name__ == "__main__":
    app.run(main)
