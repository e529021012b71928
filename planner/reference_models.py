"""Reference training steps built from sizes: an MLP, a transformer block, BERT (TF edge).

Each model is written once against a variable factory and can be built two ways:
`build_eager` creates real variables (random weights) and returns a tf.function training
step with example inputs, for execution and for `planner.search`; `build_graph_ir` builds the
same step in graph mode, where variables are VarHandleOp nodes and nothing is allocated, so
BERT-large's IR costs seconds, not gigabytes.

Every step is forward + backward (GradientTape) + Adam (`ResourceApplyAdam`, slots `m`, `v`).
Weights are named as in the papers (`wq`, `wk`, `wv`, `wo`, `w1`, `w2` per layer).

`einsum_block` is a transformer block written in another style (einsum, per-head rank-3
weights, SGD), which unlike the reference block takes any batch size, so it runs in
micro-batches.
"""

import math

import numpy as np
import tensorflow as tf

from tf_fusionstitch.planner import graph_import, more_models
from tf_fusionstitch.planner.model_blocks import Spec, dense, layer_norm, make_encoder_layer

MODELS = ("mlp", "transformer_block", "bert_large", "bert_base", "bert")

DEFAULT_SIZES = {
    "mlp": dict(batch=64, sizes=(256, 512, 512, 256)),
    "transformer_block": dict(batch=8, seq=128, hidden=512, heads=8, ffn=2048, layers=1),
    # BERT-large: 24 layers, hidden 1024, 16 heads, FFN 4096, vocab 30522, pre-training with
    # 20 masked positions per 128-token sequence (NVIDIA's phase-1 setting).
    "bert_large": dict(batch=256, seq=128, hidden=1024, heads=16, ffn=4096, layers=24,
                       vocab=30522, predictions=20),
    "bert_base": dict(batch=256, seq=128, hidden=768, heads=12, ffn=3072, layers=12,
                      vocab=30522, predictions=20),
    "bert": dict(batch=8, seq=32, hidden=64, heads=4, ffn=256, layers=2, vocab=100,
                 predictions=4),
}
# GPT decoders and a ResNet-style CNN are in their own module.
DEFAULT_SIZES.update(more_models.SIZES)
MODELS = MODELS + tuple(more_models.SIZES)


def sizes_for(model, **overrides):
    if model not in DEFAULT_SIZES:
        raise ValueError(f"unknown reference model {model!r}; known: {', '.join(MODELS)}")
    sizes = dict(DEFAULT_SIZES[model])
    unknown = set(overrides) - set(sizes)
    if unknown:
        raise ValueError(f"model {model!r} has no size(s) {sorted(unknown)}; it takes "
                         f"{sorted(sizes)}")
    sizes.update({k: v for k, v in overrides.items() if v is not None})
    return sizes


# -- model code (graph or eager, depending on the factory) --------------------------------------

def _encoder_layer(x, p, batch, seq, hidden, heads):
    """Post-LN BERT layer on x of shape (batch*seq, hidden)."""
    dh = hidden // heads

    def split_heads(t):
        return tf.transpose(tf.reshape(t, [batch, seq, heads, dh]), [0, 2, 1, 3])

    q = split_heads(dense(x, p["wq"], p["bq"]))
    k = split_heads(dense(x, p["wk"], p["bk"]))
    v = split_heads(dense(x, p["wv"], p["bv"]))
    scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(dh))
    ctx = tf.matmul(tf.nn.softmax(scores), v)
    ctx = tf.reshape(tf.transpose(ctx, [0, 2, 1, 3]), [batch * seq, hidden])
    x = layer_norm(x + dense(ctx, p["wo"], p["bo"]), p["ln1_gamma"], p["ln1_beta"])
    f = dense(tf.nn.gelu(dense(x, p["w1"], p["b1"])), p["w2"], p["b2"])
    return layer_norm(x + f, p["ln2_gamma"], p["ln2_beta"])


def _mlp(var, batch, sizes):
    params = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"w{i}"] = var(f"layer{i}/w", (a, b))
        params[f"b{i}"] = var(f"layer{i}/b", (b,), "zeros")
    n = len(sizes) - 1

    def loss_fn(p, x, y):
        h = x
        for i in range(n):
            h = dense(h, p[f"w{i}"], p[f"b{i}"])
            if i < n - 1:
                h = tf.nn.relu(h)
        return tf.reduce_mean(tf.square(h - y))

    return Spec(params, loss_fn, [("x", (batch, sizes[0]), tf.float32, "normal"),
                                   ("y", (batch, sizes[-1]), tf.float32, "normal")])


def _transformer(var, batch, seq, hidden, heads, ffn, layers):
    # An input layer norm (BERT's embedding norm) makes the block's input gradient needed,
    # as it is inside a deep model; TF would otherwise prune it.
    params = {"in_gamma": var("input_ln_gamma", (hidden,), "ones"),
              "in_beta": var("input_ln_beta", (hidden,), "zeros")}
    for i in range(layers):
        prefix = "" if layers == 1 else f"layer{i}/"
        for k, v in make_encoder_layer(var, prefix, hidden, ffn).items():
            params[f"{i}/{k}"] = v

    def loss_fn(p, x, y):
        h = layer_norm(tf.reshape(x, [batch * seq, hidden]), p["in_gamma"], p["in_beta"])
        for i in range(layers):
            layer = {k.split("/", 1)[1]: v for k, v in p.items() if k.startswith(f"{i}/")}
            h = _encoder_layer(h, layer, batch, seq, hidden, heads)
        return tf.reduce_mean(tf.square(h - tf.reshape(y, [batch * seq, hidden])))

    shape = (batch, seq, hidden)
    return Spec(params, loss_fn, [("x", shape, tf.float32, "normal"),
                                   ("y", shape, tf.float32, "normal")])


def _bert(var, batch, seq, hidden, heads, ffn, layers, vocab, predictions):
    params = {"word": var("embeddings/word", (vocab, hidden)),
              "position": var("embeddings/position", (512, hidden)),
              "type": var("embeddings/token_type", (2, hidden)),
              "emb_gamma": var("embeddings/ln_gamma", (hidden,), "ones"),
              "emb_beta": var("embeddings/ln_beta", (hidden,), "zeros"),
              "mlm_w": var("mlm/transform_w", (hidden, hidden)),
              "mlm_b": var("mlm/transform_b", (hidden,), "zeros"),
              "mlm_gamma": var("mlm/ln_gamma", (hidden,), "ones"),
              "mlm_beta": var("mlm/ln_beta", (hidden,), "zeros"),
              "mlm_bias": var("mlm/output_bias", (vocab,), "zeros"),
              "pool_w": var("pooler/w", (hidden, hidden)),
              "pool_b": var("pooler/b", (hidden,), "zeros"),
              "nsp_w": var("nsp/w", (hidden, 2)),
              "nsp_b": var("nsp/b", (2,), "zeros")}
    for i in range(layers):
        for k, v in make_encoder_layer(var, f"layer{i}/", hidden, ffn).items():
            params[f"{i}/{k}"] = v

    def loss_fn(p, ids, types, positions, labels, nsp):
        x = tf.gather(p["word"], ids) + tf.gather(p["type"], types) + p["position"][:seq]
        x = layer_norm(tf.reshape(x, [batch * seq, hidden]), p["emb_gamma"], p["emb_beta"])
        for i in range(layers):
            layer = {k.split("/", 1)[1]: v for k, v in p.items() if k.startswith(f"{i}/")}
            x = _encoder_layer(x, layer, batch, seq, hidden, heads)
        flat = tf.reshape(positions + tf.range(batch)[:, None] * seq, [-1])
        t = tf.nn.gelu(dense(tf.gather(x, flat), p["mlm_w"], p["mlm_b"]))
        t = layer_norm(t, p["mlm_gamma"], p["mlm_beta"])
        logits = tf.nn.bias_add(tf.matmul(t, p["word"], transpose_b=True), p["mlm_bias"])
        mlm = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            tf.reshape(labels, [-1]), logits))
        first = tf.reshape(x, [batch, seq, hidden])[:, 0]
        pooled = tf.tanh(dense(first, p["pool_w"], p["pool_b"]))
        nsp_loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            nsp, dense(pooled, p["nsp_w"], p["nsp_b"])))
        return mlm + nsp_loss

    return Spec(params, loss_fn, [("input_ids", (batch, seq), tf.int32, vocab),
                                   ("token_type_ids", (batch, seq), tf.int32, 2),
                                   ("masked_positions", (batch, predictions), tf.int32, seq),
                                   ("masked_ids", (batch, predictions), tf.int32, vocab),
                                   ("nsp_labels", (batch,), tf.int32, 2)])


def _spec(model, var, sizes):
    if model in more_models.BUILDERS:
        return more_models.BUILDERS[model](var, **sizes)
    if model == "mlp":
        return _mlp(var, **sizes)
    if model == "transformer_block":
        return _transformer(var, **sizes)
    return _bert(var, **sizes)


def _train_step(spec, slots, lr=1e-3):
    """Forward, backward and Adam update of every variable; returns the loss."""
    names = list(spec.params)

    def step(*inputs):
        with tf.GradientTape() as tape:
            loss = spec.loss_fn(spec.params, *inputs)
        grads = tape.gradient(loss, [spec.params[n] for n in names])
        for n, g in zip(names, grads):
            m, v = slots[n]
            tf.raw_ops.ResourceApplyAdam(
                var=spec.params[n].handle, m=m.handle, v=v.handle, beta1_power=0.9,
                beta2_power=0.999, lr=lr, beta1=0.9, beta2=0.999, epsilon=1e-8,
                grad=tf.convert_to_tensor(g))
        return loss

    return step


def _variable_factory(rng, eager):
    def var(name, shape, init="normal", trainable=True):
        if not eager:
            value = tf.zeros(shape) if init != "ones" else tf.ones(shape)
        elif init == "zeros":
            value = np.zeros(shape, np.float32)
        elif init == "ones":
            value = np.ones(shape, np.float32)
        else:
            fan_in = shape[0] if len(shape) > 1 else 1
            value = (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)
        return tf.Variable(value, name=name, trainable=trainable)
    return var


def _slots(spec, var):
    return {n: (var(p.name.split(":")[0] + "/m", p.shape, "zeros", False),
                var(p.name.split(":")[0] + "/v", p.shape, "zeros", False))
            for n, p in spec.params.items()}


def example_inputs(spec, rng):
    out = []
    for _, shape, dtype, kind in spec.input_specs:
        if dtype == tf.float32:
            out.append(tf.constant(rng.standard_normal(shape).astype(np.float32)))
        else:
            out.append(tf.constant(rng.integers(0, kind, size=shape).astype(np.int32)))
    return out


def build_eager(model, seed=0, **sizes):
    """(tf.function train step, example inputs, {name: variable}) with random weights."""
    sizes = sizes_for(model, **sizes)
    rng = np.random.default_rng(seed)
    var = _variable_factory(rng, eager=True)
    spec = _spec(model, var, sizes)
    slots = _slots(spec, var)
    step = tf.function(_train_step(spec, slots))
    step.__name__ = model
    variables = {v.name: v for v in spec.params.values()}
    variables.update({v.name: v for pair in slots.values() for v in pair})
    return step, example_inputs(spec, rng), variables


def build_graph(model, **sizes):
    """The training step in graph mode: (tf.Graph, input names, loss name, train op name,
    the step's ops). Variables are VarHandleOp nodes; nothing is allocated."""
    sizes = sizes_for(model, **sizes)
    graph = tf.Graph()
    with graph.as_default():
        var = _variable_factory(None, eager=False)
        spec = _spec(model, var, sizes)
        slots = _slots(spec, var)
        first_step_op = len(graph.get_operations())
        inputs = [tf.compat.v1.placeholder(dtype, shape, name=name)
                  for name, shape, dtype, _ in spec.input_specs]
        loss = _train_step(spec, slots)(*inputs)
        updates = [op for op in graph.get_operations()[first_step_op:]
                   if op.type == "ResourceApplyAdam"]
        train_op = tf.group(*updates, name="train_op")
    step_ops = graph.get_operations()[first_step_op:]
    return graph, [t.name for t in inputs], loss.name, train_op.name, step_ops


def build_graph_ir(model, **sizes):
    """The IR of the model's training step, built in graph mode (no weights allocated)."""
    graph, inputs, loss, _, step_ops = build_graph(model, **sizes)
    return graph_import.from_tf_graph(graph, graph_import.variables_of_graph(graph), inputs,
                                      [loss], ops=step_ops, name=model)


def einsum_block(seed, batch=4, seq=8, hidden=16, heads=2, ffn=32, lr=0.05):
    """A pre-LN attention + FFN block written another way: rank-3 activations, einsum with
    per-head rank-3 weights, `x @ w` on rank 3, plain SGD by `assign_sub`. Returns (train
    step, example inputs, {name: variable})."""
    rng = np.random.default_rng(seed)
    dh = hidden // heads

    def var(name, shape):
        return tf.Variable((rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32),
                           name=name)

    params = [var("q_proj", (hidden, heads, dh)), var("k_proj", (hidden, heads, dh)),
              var("v_proj", (hidden, heads, dh)), var("out_proj", (heads, dh, hidden)),
              var("up", (hidden, ffn)), var("down", (ffn, hidden)),
              tf.Variable(np.ones(hidden, np.float32), name="norm_scale")]
    q, k, v, o, up, down, scale = params

    def norm(x):
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + 1e-6) * scale

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            h = norm(x)
            qh = tf.einsum("bsd,dhk->bhsk", h, q)
            kh = tf.einsum("bsd,dhk->bhsk", h, k)
            vh = tf.einsum("bsd,dhk->bhsk", h, v)
            attn = tf.nn.softmax(tf.einsum("bhsk,bhtk->bhst", qh, kh) / math.sqrt(dh))
            x = x + tf.einsum("bhsk,hkd->bsd", tf.einsum("bhst,bhtk->bhsk", attn, vh), o)
            x = x + tf.nn.relu(norm(x) @ up) @ down
            loss = tf.reduce_mean(tf.square(x - y))
        for p, g in zip(params, tape.gradient(loss, params)):
            p.assign_sub(lr * g)
        return loss

    inputs = [tf.constant(rng.standard_normal((batch, seq, hidden)).astype(np.float32))
              for _ in range(2)]
    return step, inputs, {p.name: p for p in params}
