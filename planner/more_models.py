"""More reference training steps for the planner's benchmarks: GPT decoders and a ResNet-style CNN.

Built from `model_blocks` against `reference_models`' variable factory, so each builds eagerly
(real weights) or in graph mode (nothing allocated); `reference_models` registers them by name.

The CNN writes each 3x3 convolution as im2col (pad, nine shifted slices, concat) followed by a
MatMul, and pools by reshape + mean; it was written so before the op table had Conv2D rules
(`conv_rules`; tests/planner/test_planner_resnet.py plans keras.applications' ResNet50 with
them). FLOPs of the MatMul form are exactly the convolution's.
"""

import math

import numpy as np
import tensorflow as tf

from tf_fusionstitch.planner.model_blocks import Spec, dense, layer_norm, make_encoder_layer

SIZES = {
    # GPT-2 XL (1.5B): 48 layers, hidden 1600, 25 heads, FFN 6400, vocab 50257, context 1024.
    "gpt2_xl": dict(batch=16, seq=1024, hidden=1600, heads=25, ffn=6400, layers=48,
                    vocab=50257),
    # A GPT-3 6.7B-shaped model (32 layers, hidden 4096, 32 heads): its fp32 weights and
    # gradients alone (54 GB) exceed a 32 GB V100, so data parallelism cannot hold it.
    "gpt_6b7": dict(batch=16, seq=1024, hidden=4096, heads=32, ffn=16384, layers=32,
                    vocab=50257),
    "gpt": dict(batch=8, seq=32, hidden=64, heads=4, ffn=256, layers=2, vocab=100),
    # ResNet-50's stages (3, 4, 6, 3 bottlenecks, widths 64..512, expansion 4), ImageNet
    # 224x224 at batch 256, with a 4x4 patchify stem in place of the 7x7 conv + max pool.
    "resnet50": dict(batch=256, image=224, blocks=(3, 4, 6, 3), widths=(64, 128, 256, 512),
                     classes=1000),
    "resnet": dict(batch=16, image=32, blocks=(1, 1), widths=(8, 16), classes=10),
}


def _causal_mask(seq):
    mask = np.triu(np.full((seq, seq), -1e9, np.float32), k=1)
    return tf.constant(mask)


def gpt(var, batch, seq, hidden, heads, ffn, layers, vocab):
    """Pre-LN causal decoder with tied input/output embeddings (GPT-2's layout)."""
    params = {"wte": var("wte", (vocab, hidden)), "wpe": var("wpe", (seq, hidden)),
              "lnf_gamma": var("lnf_gamma", (hidden,), "ones"),
              "lnf_beta": var("lnf_beta", (hidden,), "zeros")}
    for i in range(layers):
        for k, v in make_encoder_layer(var, f"h{i}/", hidden, ffn).items():
            params[f"{i}/{k}"] = v
    dh = hidden // heads

    def split_heads(t):
        return tf.transpose(tf.reshape(t, [batch, seq, heads, dh]), [0, 2, 1, 3])

    def block(x, p, mask):
        a = layer_norm(x, p["ln1_gamma"], p["ln1_beta"])
        q, k, v = (split_heads(dense(a, p[w], p[b])) for w, b in
                   (("wq", "bq"), ("wk", "bk"), ("wv", "bv")))
        scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(dh)) + mask
        ctx = tf.matmul(tf.nn.softmax(scores), v)
        ctx = tf.reshape(tf.transpose(ctx, [0, 2, 1, 3]), [batch * seq, hidden])
        x = x + dense(ctx, p["wo"], p["bo"])
        f = layer_norm(x, p["ln2_gamma"], p["ln2_beta"])
        return x + dense(tf.nn.gelu(dense(f, p["w1"], p["b1"])), p["w2"], p["b2"])

    def loss_fn(p, ids, labels):
        mask = _causal_mask(seq)
        x = tf.gather(p["wte"], ids) + p["wpe"]
        x = tf.reshape(x, [batch * seq, hidden])
        for i in range(layers):
            x = block(x, {k.split("/", 1)[1]: v for k, v in p.items()
                          if k.startswith(f"{i}/")}, mask)
        x = layer_norm(x, p["lnf_gamma"], p["lnf_beta"])
        logits = tf.matmul(x, p["wte"], transpose_b=True)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            tf.reshape(labels, [-1]), logits))

    return Spec(params, loss_fn, [("input_ids", (batch, seq), tf.int32, vocab),
                                      ("labels", (batch, seq), tf.int32, vocab)])


def _conv3x3(x, w, b):
    """3x3 'same' convolution of NHWC `x` as im2col + MatMul (see the module docstring)."""
    n, h, wd, c = x.shape
    padded = tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]])
    taps = [tf.slice(padded, [0, i, j, 0], [n, h, wd, c]) for i in range(3) for j in range(3)]
    cols = tf.reshape(tf.concat(taps, axis=3), [n * h * wd, 9 * c])
    return tf.reshape(dense(cols, w, b), [n, h, wd, -1])


def _conv1x1(x, w, b):
    n, h, wd, c = x.shape
    return tf.reshape(dense(tf.reshape(x, [n * h * wd, c]), w, b), [n, h, wd, -1])


def _pool2(x):
    n, h, wd, c = x.shape
    return tf.reduce_mean(tf.reshape(x, [n, h // 2, 2, wd // 2, 2, c]), axis=[2, 4])


def resnet(var, batch, image, blocks, widths, classes):
    """ResNet-50-style bottleneck network (no normalisation layers)."""
    params = {"stem_w": var("stem/w", (48, widths[0])),
              "stem_b": var("stem/b", (widths[0],), "zeros")}
    plan, cin = [], widths[0]
    for s, (count, width) in enumerate(zip(blocks, widths)):
        for k in range(count):
            pre = f"stage{s}/block{k}/"
            shapes = {"a": (cin, width), "b": (9 * width, width), "c": (width, 4 * width)}
            if k == 0:
                shapes["proj"] = (cin, 4 * width)
            for name, shape in shapes.items():
                params[pre + name + "_w"] = var(pre + name + "/w", shape)
                params[pre + name + "_b"] = var(pre + name + "/b", (shape[1],), "zeros")
            plan.append((pre, s > 0 and k == 0, k == 0))
            cin = 4 * width
    params["fc_w"] = var("fc/w", (cin, classes))
    params["fc_b"] = var("fc/b", (classes,), "zeros")

    def loss_fn(p, images, labels):
        g = image // 4     # 4x4 patches flattened to 48 channels
        x = tf.reshape(images, [batch, g, 4, g, 4, 3])
        x = tf.reshape(tf.transpose(x, [0, 1, 3, 2, 4, 5]), [batch, g, g, 48])
        x = tf.nn.relu(_conv1x1(x, p["stem_w"], p["stem_b"]))
        for pre, downsample, project in plan:
            if downsample:
                x = _pool2(x)
            y = tf.nn.relu(_conv1x1(x, p[pre + "a_w"], p[pre + "a_b"]))
            y = tf.nn.relu(_conv3x3(y, p[pre + "b_w"], p[pre + "b_b"]))
            y = _conv1x1(y, p[pre + "c_w"], p[pre + "c_b"])
            shortcut = _conv1x1(x, p[pre + "proj_w"], p[pre + "proj_b"]) if project else x
            x = tf.nn.relu(y + shortcut)
        pooled = tf.reduce_mean(x, axis=[1, 2])
        logits = dense(pooled, p["fc_w"], p["fc_b"])
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))

    return Spec(params, loss_fn, [("images", (batch, image, image, 3), tf.float32, "normal"),
                                      ("labels", (batch,), tf.int32, classes)])


BUILDERS = {"gpt2_xl": gpt, "gpt_6b7": gpt, "gpt": gpt, "resnet50": resnet, "resnet": resnet}
