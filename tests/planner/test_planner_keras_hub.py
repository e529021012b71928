"""keras_hub's BERT, GPT-2 and Llama backbones (two layers, built from their constructors with random
weights, as benchmarks/zoo/text.py builds them): exhaustive operator partitioning on 8xV100
splits every layer as Megatron does, with two all-reduces per layer forward and two backward.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import keras_hub
import tensorflow as tf

from tf_fusionstitch import planner
from tf_fusionstitch.planner import cost_model as cm
from tf_fusionstitch.planner import graph_import, op_rules

B, S, H, HEADS, FFN, VOCAB, LAYERS, LABELS = 8, 128, 256, 8, 1024, 512, 2, 16
# layer-relative variable -> the axis Megatron splits it on
MEGATRON = {"query/kernel": 1, "key/kernel": 1, "value/kernel": 1, "query/bias": 0,
            "key/bias": 0, "value/bias": 0, "attention_output/kernel": 0,
            "feedforward_intermediate_dense/kernel": 1,
            "feedforward_intermediate_dense/bias": 0, "feedforward_output_dense/kernel": 0}


# Llama: no biases, a SwiGLU feed-forward (gate and intermediate both column-parallel).
LLAMA_MEGATRON = {"query/kernel": 1, "key/kernel": 1, "value/kernel": 1,
                  "attention_output/kernel": 0, "feedforward_gate_dense/kernel": 1,
                  "feedforward_intermediate_dense/kernel": 1,
                  "feedforward_output_dense/kernel": 0}


def backbone_step(constructor, segments, **sizes):
    """An SGD train step of the backbone and a token-classification head."""
    keras.utils.set_random_seed(0)
    sizes = sizes or dict(num_heads=HEADS, max_sequence_length=S, dropout=0.0)
    backbone = getattr(keras_hub.models, constructor)(
        vocabulary_size=VOCAB, num_layers=LAYERS, hidden_dim=H, intermediate_dim=FFN, **sizes)
    head = keras.layers.Dense(LABELS, name="token_head")
    head.build((B, S, H))
    names = ["token_ids", "padding_mask"] + (["segment_ids"] if segments else [])
    # BERT's pooler and Llama's output embedding feed no loss here: no gradient, no update.
    variables = [v for v in backbone.trainable_variables + head.trainable_variables
                 if not v.path.startswith(("pooled_dense", "token_embedding/reverse"))]
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(variables)

    @tf.function
    def step(*args):
        values, labels = args[:-1], args[-1]
        with tf.GradientTape() as tape:
            out = backbone(dict(zip(names, values)), training=True)
            out = out["sequence_output"] if isinstance(out, dict) else out
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels, head(out)))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    tokens = tf.random.stateless_uniform((B, S), (1, 2), 0, VOCAB, tf.int32)
    inputs = [tokens, tf.ones((B, S), tf.int32)] + ([tf.zeros((B, S), tf.int32)]
                                                    if segments else [])
    labels = tf.random.stateless_uniform((B, S), (3, 4), 0, LABELS, tf.int32)
    return graph_import.from_function(step, inputs + [labels])[0]


class BackboneTest(tf.test.TestCase):
    CLUSTER = "8xV100"

    def _check(self, graph, attention, megatron=None):
        self.assertEqual(op_rules.conservative_ops(graph), {})
        plan = planner.search_graph(graph, self.CLUSTER, strategy="operator",
                                    method="exhaustive")
        self.assertEqual(plan.tensor_parallel, 8)
        expected = {}
        for i in range(LAYERS):
            for name, axis in (megatron or MEGATRON).items():
                prefix = f"transformer_layer_{i}/"
                if not name.startswith("feedforward"):
                    prefix += attention + "/"
                expected[prefix + name + ":0"] = axis
        splits = plan.variable_splits
        for name, axis in expected.items():
            self.assertEqual(splits[name], axis, name)
        # Nothing else is split (embeddings, layer norms, output biases, the head).
        self.assertEqual({n: a for n, a in splits.items() if a is not None}, expected)
        self.assertEqual(plan.tp_collectives, {"all_reduce/forward": 2 * LAYERS,
                                               "all_reduce/backward": 2 * LAYERS})
        # The plan's price is Megatron's, and it beats one device's work on each device.
        model = cm.CostModel(graph, planner.get_cluster(self.CLUSTER))
        units = frozenset(u.index for u in graph.linkage.units
                          if all(splits.get(v) == a for v, a in u.variables))
        megatron = model.evaluate(cm.Config(tensor_parallel=8, split_units=units))
        self.assertAllClose(megatron.step_time, plan.predicted_step_time, rtol=1e-12)
        self.assertEqual([c.nbytes for c in megatron.collectives], [B * S * H * 4] * 8)
        unsplit = model.evaluate(cm.Config(tensor_parallel=8))
        self.assertLess(megatron.step_time, unsplit.step_time)

    def test_bert_backbone_is_megatron(self):
        self._check(backbone_step("BertBackbone", segments=True), "self_attention_layer")

    def test_gpt2_backbone_is_megatron(self):
        self._check(backbone_step("GPT2Backbone", segments=False), "self_attention")

    def test_llama_backbone_is_megatron(self):
        # Rotary embeddings, RMS norms, SwiGLU; as many key/value heads as query heads.
        graph = backbone_step("LlamaBackbone", segments=False, num_query_heads=HEADS,
                              num_key_value_heads=HEADS)
        self._check(graph, "self_attention", LLAMA_MEGATRON)


if __name__ == "__main__":
    tf.test.main()
