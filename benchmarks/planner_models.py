"""Real models for the planner: keras_hub backbones and keras.applications ResNet50 train
steps, built from their constructors in graph mode and imported into the planner IR.

Used by benchmarks/planner.py (its real cases) and by the planner tests (BERT-large's
published pre-training throughput). Importing this module imports no TensorFlow; building
a model does.
"""

# Each is built in graph mode (tf.Graph, variables as VarHandleOp nodes, nothing allocated) at
# full depth, width and the stated global batch and sequence, so the IR is the model's own
# and needs no scaling. Text backbones train a 16-class token head (no pretraining head), SGD;
# ResNet50 trains its 1000-class head, SGD with momentum. Dropout 0, as in the planner tests.
LABELS = 16
_SMALL_ENCODER = dict(vocabulary_size=64, num_layers=2, num_heads=4, hidden_dim=32,
                      intermediate_dim=64, max_sequence_length=64, dropout=0.0)
REAL_MODELS = {
    # BERT-large (Devlin et al.): 24 layers, hidden 1024, 16 heads, FFN 4096, vocab 30522.
    "hub_bert_large": dict(
        constructor="BertBackbone", segments=True, batch=256, seq=128,
        args=dict(vocabulary_size=30522, num_layers=24, num_heads=16, hidden_dim=1024,
                  intermediate_dim=4096, max_sequence_length=512, dropout=0.0),
        small=_SMALL_ENCODER),
    # GPT-2 XL (1.5B): 48 layers, hidden 1600, 25 heads, FFN 6400, vocab 50257, context 1024.
    "hub_gpt2_xl": dict(
        constructor="GPT2Backbone", segments=False, batch=16, seq=1024,
        args=dict(vocabulary_size=50257, num_layers=48, num_heads=25, hidden_dim=1600,
                  intermediate_dim=6400, max_sequence_length=1024, dropout=0.0),
        small=_SMALL_ENCODER),
    # Llama-2 7B's shape: 32 layers, hidden 4096, 32 query and key/value heads, SwiGLU 11008.
    "hub_llama2_7b": dict(
        constructor="LlamaBackbone", segments=False, batch=16, seq=1024,
        args=dict(vocabulary_size=32000, num_layers=32, num_query_heads=32,
                  num_key_value_heads=32, hidden_dim=4096, intermediate_dim=11008),
        small=dict(vocabulary_size=64, num_layers=2, num_query_heads=4, num_key_value_heads=4,
                   hidden_dim=32, intermediate_dim=64)),
    "keras_resnet50": dict(batch=256, image=224, classes=1000, small_image=32, small_batch=8),
}
REAL_SMALL_BATCH, REAL_SMALL_SEQ = 8, 16
def _text_step_graph(spec, small):
    import keras
    import keras_hub
    import tensorflow as tf
    batch, seq = (REAL_SMALL_BATCH, REAL_SMALL_SEQ) if small else (spec["batch"], spec["seq"])
    args = spec["small" if small else "args"]
    names = ["token_ids", "padding_mask"] + (["segment_ids"] if spec["segments"] else [])
    graph = tf.Graph()
    with graph.as_default():
        backbone = getattr(keras_hub.models, spec["constructor"])(**args)
        head = keras.layers.Dense(LABELS, name="token_head")
        head.build((batch, seq, args["hidden_dim"]))
        # BERT's pooler and Llama's output embedding feed no loss here: no gradient, no update.
        variables = [v for v in backbone.trainable_variables + head.trainable_variables
                     if not v.path.startswith(("pooled_dense", "token_embedding/reverse"))]
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(variables)
        first = len(graph.get_operations())
        inputs = [tf.compat.v1.placeholder(tf.int32, (batch, seq), name=n)
                  for n in names + ["labels"]]
        with tf.GradientTape() as tape:
            out = backbone(dict(zip(names, inputs[:-1])), training=True)
            out = out["sequence_output"] if isinstance(out, dict) else out
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                inputs[-1], head(out)))
        grads = tape.gradient(loss, [v.value for v in variables])
        optimizer.apply_gradients(zip(grads, variables))
    return graph, inputs, loss, graph.get_operations()[first:]


def _resnet_step_graph(spec, small):
    import keras
    import tensorflow as tf
    batch, side = (spec["small_batch"], spec["small_image"]) if small else \
        (spec["batch"], spec["image"])
    graph = tf.Graph()
    with graph.as_default():
        model = keras.applications.ResNet50(weights=None, input_shape=(side, side, 3),
                                            classes=spec["classes"])
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        optimizer.build(model.trainable_variables)
        first = len(graph.get_operations())
        inputs = [tf.compat.v1.placeholder(tf.float32, (batch, side, side, 3), name="images"),
                  tf.compat.v1.placeholder(tf.int32, (batch,), name="labels")]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                inputs[1], model(inputs[0], training=True)))
        variables = model.trainable_variables
        grads = tape.gradient(loss, [v.value for v in variables])
        optimizer.apply_gradients(zip(grads, variables))
    return graph, inputs, loss, graph.get_operations()[first:]


def real_model_ir(model, small=False):
    """The planner IR of a REAL_MODELS entry's train step (tiny sizes if `small`)."""
    from tf_fusionstitch.planner import graph_import
    spec = REAL_MODELS[model]
    build = _resnet_step_graph if model == "keras_resnet50" else _text_step_graph
    graph, inputs, loss, ops = build(spec, small)
    return graph_import.from_tf_graph(graph, graph_import.variables_of_graph(graph),
                                      [t.name for t in inputs], [loss.name], ops=ops,
                                      name=model)


# NVIDIA's published BERT-large pre-training run (DeepLearningExamples, TensorFlow BERT,
# scripts/run_pretraining_lamb.sh: phase 1, sequence 128, 20 masked positions a sequence,
# LAMB, dropout 0.1, XLA on), as keras_hub builds it: BertBackbone, a MaskedLMHead tied
# to the token embedding and a two-class next-sentence head on the pooled output.
PRETRAINING = dict(
    batch=256, seq=128, predictions=20,
    args=dict(REAL_MODELS["hub_bert_large"]["args"], dropout=0.1),
    small=dict(_SMALL_ENCODER, dropout=0.1))


def bert_pretraining_ir(small=False):
    """The planner IR of one BERT pre-training step (masked LM + next sentence, LAMB)."""
    import keras
    import keras_hub
    import tensorflow as tf
    from tf_fusionstitch.planner import graph_import
    spec = PRETRAINING
    batch, seq, preds = (REAL_SMALL_BATCH, REAL_SMALL_SEQ, 2) if small else \
        (spec["batch"], spec["seq"], spec["predictions"])
    args = spec["small" if small else "args"]
    graph = tf.Graph()
    with graph.as_default():
        backbone = keras_hub.models.BertBackbone(**args)
        masked_lm = keras_hub.layers.MaskedLMHead(
            vocabulary_size=args["vocabulary_size"], token_embedding=backbone.token_embedding,
            intermediate_activation="gelu", name="mlm_head")
        masked_lm.build((batch, seq, args["hidden_dim"]), (batch, preds))
        next_sentence = keras.layers.Dense(2, name="nsp_head")
        next_sentence.build((batch, args["hidden_dim"]))
        variables = list({id(v): v for v in backbone.trainable_variables +
                          masked_lm.trainable_variables +
                          next_sentence.trainable_variables}.values())
        optimizer = keras.optimizers.Lamb(1e-3)
        optimizer.build(variables)
        first = len(graph.get_operations())

        def placeholder(name, shape, dtype=tf.int32):
            return tf.compat.v1.placeholder(dtype, shape, name=name)

        features = {n: placeholder(n, (batch, seq))
                    for n in ("token_ids", "padding_mask", "segment_ids")}
        positions = placeholder("mask_positions", (batch, preds))
        labels = placeholder("mask_labels", (batch, preds))
        weights = placeholder("mask_weights", (batch, preds), tf.float32)
        sentence_labels = placeholder("next_sentence_labels", (batch,))
        with tf.GradientTape() as tape:
            out = backbone(features, training=True)
            token_loss = tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels, masked_lm(out["sequence_output"], mask_positions=positions))
            loss = (tf.reduce_sum(token_loss * weights) / (tf.reduce_sum(weights) + 1e-5)
                    + tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                        sentence_labels, next_sentence(out["pooled_output"]))))
        grads = tape.gradient(loss, [v.value for v in variables])
        optimizer.apply_gradients(zip(grads, variables))
    inputs = list(features.values()) + [positions, labels, weights, sentence_labels]
    return graph_import.from_tf_graph(graph, graph_import.variables_of_graph(graph),
                                      [t.name for t in inputs], [loss.name],
                                      ops=graph.get_operations()[first:],
                                      name="hub_bert_large_pretraining")
