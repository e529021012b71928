"""keras_hub backbones, built from their constructors with random weights, with
a token-classification head (and a sentence head on a pooled output) for
training; ViT is here too, as keras_hub builds it like its text models.

"tiny" is two layers of width 32 (tests); "real" uses the published widths of
the family's smallest member, with the depth cut to a few layers (a deeper
model repeats the same layers, which the rewrite builds once) and the
vocabulary capped at 32,000 where it is larger, so that three copies of the
model and their optimizer slots (TF, XLA and tf_fusionstitch each train their
own) fit this project's 24 GB machine.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

import keras
import keras_hub
import numpy as np
import tensorflow as tf

from benchmarks.zoo import assemble

LABELS = 16          # token / sentence classes of the training head
TINY_SEQ = 16        # the sequence length tests use by default


@dataclasses.dataclass(frozen=True)
class TextEntry:
    constructor: str                 # keras_hub.models.<constructor>
    tiny: Tuple                      # constructor arguments, tiny
    real: Tuple                      # constructor arguments, real
    optimizer: str
    inputs: str = "tokens"           # a key of _INPUT_NAMES, or "images"
    policy: str = "float32"
    dropout: float = 0.0             # rate passed to the constructor (0: inactive)
    dropout_arg: str = "dropout"     # the constructor's name for it


def _tiny(**extra):
    base = dict(vocabulary_size=64, num_layers=2, hidden_dim=32, intermediate_dim=64)
    base.update(extra)
    return tuple(sorted(base.items()))


def _args(**kwargs):
    return tuple(sorted(kwargs.items()))


_BERT_BASE = dict(vocabulary_size=30522, num_layers=4, num_heads=12, hidden_dim=768,
                  intermediate_dim=3072)
_TINY_LLAMA = dict(vocabulary_size=32000, num_layers=2, num_query_heads=32,
                   num_key_value_heads=4, hidden_dim=2048, intermediate_dim=5632)

ENTRIES: Dict[str, TextEntry] = {
    "bert": TextEntry("BertBackbone", _tiny(num_heads=2, max_sequence_length=64),
                      _args(**_BERT_BASE), "adam", "tokens_segments", dropout=0.1),
    "roberta": TextEntry("RobertaBackbone", _tiny(num_heads=2, max_sequence_length=64),
                         _args(**{**_BERT_BASE, "vocabulary_size": 50265}), "adamw"),
    "distilbert": TextEntry("DistilBertBackbone", _tiny(num_heads=2, max_sequence_length=64),
                            _args(**_BERT_BASE), "rmsprop"),
    "albert": TextEntry("AlbertBackbone",
                        _tiny(num_heads=2, embedding_dim=16, max_sequence_length=64),
                        _args(**{**_BERT_BASE, "vocabulary_size": 30000,
                                 "embedding_dim": 128}), "adagrad", "tokens_segments"),
    "deberta_v3": TextEntry("DebertaV3Backbone",
                            _tiny(num_heads=2, max_sequence_length=64, bucket_size=16),
                            _args(**{**_BERT_BASE, "vocabulary_size": 32000}), "adamax"),
    "electra": TextEntry("ElectraBackbone",
                         _args(vocab_size=64, num_layers=2, num_heads=2, hidden_dim=32,
                               embedding_dim=16, intermediate_dim=64, max_sequence_length=64),
                         _args(vocab_size=30522, num_layers=4, num_heads=4, hidden_dim=256,
                               embedding_dim=128, intermediate_dim=1024),
                         "sgd_momentum", "tokens_segments"),
    "gpt2": TextEntry("GPT2Backbone", _tiny(num_heads=2, max_sequence_length=64),
                      _args(**{**_BERT_BASE, "vocabulary_size": 32000}), "adamw",
                      dropout=0.1),
    "opt": TextEntry("OPTBackbone", _tiny(num_heads=2, max_sequence_length=64),
                     _args(**{**_BERT_BASE, "vocabulary_size": 32000}), "nadam"),
    "t5": TextEntry("T5Backbone", _tiny(num_heads=2),
                    _args(vocabulary_size=32128, num_layers=4, num_heads=8, hidden_dim=512,
                          intermediate_dim=2048, key_value_dim=64), "adafactor", "seq2seq"),
    "vit": TextEntry("ViTBackbone",
                     _args(image_shape=(16, 16, 3), patch_size=4, num_layers=2, num_heads=2,
                           hidden_dim=32, mlp_dim=64),
                     _args(image_shape=(224, 224, 3), patch_size=16, num_layers=4,
                           num_heads=12, hidden_dim=768, mlp_dim=3072),
                     "adam", "images", dropout_arg="dropout_rate"),
    "llama": TextEntry("LlamaBackbone", _tiny(num_query_heads=4, num_key_value_heads=2),
                       _args(**_TINY_LLAMA), "adamw"),
    "mistral": TextEntry("MistralBackbone",
                         _tiny(num_query_heads=4, num_key_value_heads=2, sliding_window=8),
                         _args(**{**_TINY_LLAMA, "num_query_heads": 16,
                                  "sliding_window": 4096}), "lion"),
    "gemma": TextEntry("GemmaBackbone",
                       _tiny(num_query_heads=4, num_key_value_heads=1, head_dim=8),
                       _args(vocabulary_size=32000, num_layers=2, num_query_heads=8,
                             num_key_value_heads=1, hidden_dim=2048, intermediate_dim=16384,
                             head_dim=256), "sgd_momentum", policy="mixed_bfloat16"),
    "qwen2": TextEntry("Qwen2Backbone", _tiny(num_query_heads=4, num_key_value_heads=2),
                       _args(vocabulary_size=32000, num_layers=4, num_query_heads=14,
                             num_key_value_heads=2, hidden_dim=896, intermediate_dim=4864),
                       "adafactor"),
    "phi3": TextEntry("Phi3Backbone", _tiny(num_query_heads=4, num_key_value_heads=4),
                      _args(vocabulary_size=32064, num_layers=1, num_query_heads=32,
                            num_key_value_heads=32, hidden_dim=3072, intermediate_dim=8192),
                      "nadam"),
}

# Models outside the zoo (zoo.EXTRA_NAMES): not in CI, run on demand to try the tool
# on architectures it was not checked on while it was built. "real" is the family's
# smallest published width with the depth cut.
EXTRA: Dict[str, TextEntry] = {
    "bart": TextEntry("BartBackbone", _tiny(num_heads=2, max_sequence_length=64),
                      _args(**{**_BERT_BASE, "vocabulary_size": 32000, "num_layers": 2,
                               "max_sequence_length": 1024}), "adam", "seq2seq"),
    "bloom": TextEntry("BloomBackbone", _tiny(num_heads=2),
                       _args(vocabulary_size=32000, num_layers=4, num_heads=16, hidden_dim=1024,
                             intermediate_dim=4096), "sgd_momentum"),
    "falcon": TextEntry("FalconBackbone", _tiny(num_attention_heads=2),
                        _args(vocabulary_size=32000, num_layers=2, num_attention_heads=32,
                              hidden_dim=2048, intermediate_dim=8192), "adamw",
                        dropout_arg="attention_dropout_rate"),
    "gpt_neox": TextEntry("GPTNeoXBackbone", _tiny(num_heads=2, max_sequence_length=64),
                          _args(vocabulary_size=32000, num_layers=4, num_heads=8, hidden_dim=512,
                                intermediate_dim=2048, max_sequence_length=2048), "rmsprop"),
    "qwen3": TextEntry("Qwen3Backbone",
                       _tiny(num_query_heads=4, num_key_value_heads=2, head_dim=8),
                       _args(vocabulary_size=32000, num_layers=4, num_query_heads=16,
                             num_key_value_heads=8, head_dim=128, hidden_dim=1024,
                             intermediate_dim=3072), "lion"),
    "roformer_v2": TextEntry("RoformerV2Backbone", _tiny(num_heads=2, head_size=16),
                             _args(**{**_BERT_BASE, "vocabulary_size": 32000,
                                      "head_size": 64}), "adam", "tokens_segments_unmasked"),
    "xlnet": TextEntry("XLNetBackbone", _tiny(num_heads=2),
                       _args(**{**_BERT_BASE, "vocabulary_size": 32000}), "adagrad",
                       "tokens_segments"),
    "esm2": TextEntry("ESM2Backbone", _tiny(num_heads=2, max_sequence_length=64),
                      _args(vocabulary_size=33, num_layers=6, num_heads=20, hidden_dim=320,
                            intermediate_dim=1280, max_sequence_length=1026), "nadam",
                      "tokens_unmasked"),
    "deit": TextEntry("DeiTBackbone",
                      _args(image_shape=(16, 16, 3), patch_size=4, num_layers=2, num_heads=2,
                            hidden_dim=32, intermediate_dim=64),
                      _args(image_shape=(224, 224, 3), patch_size=16, num_layers=4, num_heads=3,
                            hidden_dim=192, intermediate_dim=768), "adam", "images",
                      dropout_arg="dropout_rate"),
    "dinov2": TextEntry("DINOV2Backbone",
                        _args(image_shape=(28, 28, 3), patch_size=14, num_layers=2, num_heads=2,
                              hidden_dim=32, intermediate_dim=64,
                              position_embedding_shape=(28, 28)),
                        _args(image_shape=(224, 224, 3), patch_size=14, num_layers=4,
                              num_heads=6, hidden_dim=384, intermediate_dim=1536,
                              position_embedding_shape=(224, 224)), "adamw", "images",
                        dropout_arg="dropout_rate"),
}


def _padding_mask(gen: np.random.Generator, batch: int, seq: int) -> tf.Tensor:
    """Right padding: each row keeps between half and all of its positions."""
    lengths = gen.integers((seq + 1) // 2, seq + 1, size=batch)
    return tf.constant(np.arange(seq)[None, :] < lengths[:, None], tf.int32)


def _inputs(entry: TextEntry, config: dict):
    vocab = config.get("vocabulary_size", config.get("vocab_size"))

    def tokens(gen, batch, seq):
        return tf.constant(gen.integers(0, vocab, (batch, seq)), tf.int32)

    def make_inputs(gen: np.random.Generator, batch: int, seq: Optional[int] = None):
        seq = seq or TINY_SEQ
        if entry.inputs == "images":
            return [tf.constant(gen.standard_normal((batch,) + tuple(config["image_shape"])),
                                tf.float32)]
        if entry.inputs == "seq2seq":
            target = max(2, seq // 2)
            return [tokens(gen, batch, seq), _padding_mask(gen, batch, seq),
                    tokens(gen, batch, target), _padding_mask(gen, batch, target)]
        values = [tokens(gen, batch, seq), _padding_mask(gen, batch, seq)]
        if entry.inputs.startswith("tokens_segments"):
            split = gen.integers(1, seq + 1, size=batch)
            values.insert(1, tf.constant(np.arange(seq)[None, :] >= split[:, None], tf.int32))
        return values[:len(_INPUT_NAMES[entry.inputs])]
    return make_inputs


_INPUT_NAMES = {
    "tokens": ("token_ids", "padding_mask"),
    "tokens_unmasked": ("token_ids",),
    "tokens_segments": ("token_ids", "segment_ids", "padding_mask"),
    "tokens_segments_unmasked": ("token_ids", "segment_ids"),
    "seq2seq": ("encoder_token_ids", "encoder_padding_mask", "decoder_token_ids",
                "decoder_padding_mask"),
}


def _heads(entry: TextEntry):
    """[(logits, labels -> this head's labels)] over the backbone's outputs."""
    def heads(outputs):
        if entry.inputs == "images":        # the class token
            return [(keras.layers.Dense(LABELS, name="class_head")(outputs[:, 0, :]),
                     lambda labels: labels)]
        if isinstance(outputs, dict):
            main = outputs.get("sequence_output", outputs.get("decoder_sequence_output"))
        else:
            main = outputs
        result = [(keras.layers.Dense(LABELS, name="token_head")(main), lambda labels: labels)]
        if isinstance(outputs, dict) and "pooled_output" in outputs:
            result.append((keras.layers.Dense(LABELS, name="sentence_head")(
                outputs["pooled_output"]), lambda labels: labels[:, 0]))
        return result
    return heads


def _labels(entry: TextEntry):
    def make_labels(gen: np.random.Generator, values):
        if entry.inputs == "images":
            return tf.constant(gen.integers(0, LABELS, values[0].shape[0]), tf.int32)
        target = values[2] if entry.inputs == "seq2seq" else values[0]
        return tf.constant(gen.integers(0, LABELS, tuple(target.shape)), tf.int32)
    return make_labels


def build(name: str, size: str, seed: int, policy: str = None) -> assemble.ZooModel:
    entry = ENTRIES.get(name) or EXTRA[name]
    policy = policy or entry.policy
    config = dict(entry.tiny if size == "tiny" else entry.real)
    config[entry.dropout_arg] = entry.dropout
    config["dtype"] = policy
    keras.utils.set_random_seed(seed)
    backbone = getattr(keras_hub.models, entry.constructor)(**config)
    if entry.inputs == "images":   # one tensor, or a dict of one (DINOV2)
        names = tuple(backbone.input) if isinstance(backbone.input, dict) else None
        specs = [tf.TensorSpec((None,) + tuple(config["image_shape"]), tf.float32)]
        label_spec = tf.TensorSpec([None], tf.int32)
    else:
        names = _INPUT_NAMES[entry.inputs]
        specs = [tf.TensorSpec([None, None], tf.int32) for _ in names]
        label_spec = tf.TensorSpec([None, None], tf.int32)
    return assemble.finish(
        name=name, source=f"keras_hub.models.{entry.constructor}", size=size, config=config,
        family="vision" if entry.inputs == "images" else "text", backbone=backbone, input_names=names, input_specs=specs,
        make_inputs=_inputs(entry, config), heads=_heads(entry), label_spec=label_spec,
        make_labels=_labels(entry), optimizer_name=entry.optimizer, policy=policy,
        dropout=entry.dropout > 0, seed=seed)
