"""BERT-style encoder: token + position embeddings, N post-LN transformer layers
(softmax attention, GELU feed-forward); rows have random lengths, the padding
(id 0) masked out of attention as BERT's input_mask does. Inference returns the
sequence output;
the training step is masked-LM-like: vocabulary logits at every position,
softmax cross-entropy against random target tokens, Adam."""

from __future__ import annotations

import keras
import tensorflow as tf

from benchmarks.models import common
from benchmarks.models.transformer_layers import (PaddingMask, PositionalEmbedding,
                                                  encoder_layer, padded_token_ids)

REAL = dict(layers=12, hidden=768, heads=12, ffn=3072, seq=128, vocab=30522)
TINY = dict(layers=2, hidden=32, heads=4, ffn=64, seq=16, vocab=50)


def build(layers, hidden, heads, ffn, seq, vocab, seed=0) -> common.ReferenceModel:
    sizes = dict(layers=layers, hidden=hidden, heads=heads, ffn=ffn, seq=seq, vocab=vocab)
    ids = keras.Input(shape=(seq,), dtype="int32", name="token_ids")
    x = PositionalEmbedding(vocab, seq, hidden, name="embeddings")(ids)
    mask = PaddingMask(name="input_mask")(ids)
    for i in range(layers):
        x = encoder_layer(x, mask, hidden, heads, ffn, f"layer{i}")
    encoder = keras.Model(ids, x, name="bert_encoder")
    # The LM head is trained but not part of inference, which returns the encoding.
    logits = keras.layers.Dense(vocab, name="lm_head")(encoder.output)
    model = keras.Model(ids, logits, name="bert")

    def make_batch(seed_or_rng, batch):
        gen = common.generator(seed_or_rng)
        return common.Batch((padded_token_ids(gen, batch, seq, vocab),),
                            common.token_ids(gen, (batch, seq), vocab))

    spec = tf.TensorSpec([None, seq], tf.int32)
    return common.assemble("bert", sizes, model, [spec], spec, make_batch,
                           common.sparse_crossentropy, seed, inference_model=encoder)
