"""Transformer encoder-decoder (seq2seq): encoder self-attention, decoder causal
self-attention and cross-attention over the encoder's output, teacher forcing;
source rows have random lengths, their padding masked in both attentions.
Inference returns the decoder's vocabulary logits; the training step is softmax
cross-entropy against the target sequence shifted by one, Adam."""

from __future__ import annotations

import keras
import tensorflow as tf

from benchmarks.models import common
from benchmarks.models.transformer_layers import (PaddingMask, PositionalEmbedding,
                                                  decoder_layer, encoder_layer,
                                                  padded_token_ids)

REAL = dict(layers=6, hidden=512, heads=8, ffn=2048, src_seq=128, tgt_seq=128, vocab=32000)
TINY = dict(layers=1, hidden=32, heads=4, ffn=64, src_seq=12, tgt_seq=10, vocab=40)


def build(layers, hidden, heads, ffn, src_seq, tgt_seq, vocab, seed=0) -> common.ReferenceModel:
    sizes = dict(layers=layers, hidden=hidden, heads=heads, ffn=ffn, src_seq=src_seq,
                 tgt_seq=tgt_seq, vocab=vocab)
    src = keras.Input(shape=(src_seq,), dtype="int32", name="source_ids")
    tgt = keras.Input(shape=(tgt_seq,), dtype="int32", name="target_ids")
    memory = PositionalEmbedding(vocab, src_seq, hidden, name="source_embeddings")(src)
    src_mask = PaddingMask(name="source_mask")(src)
    for i in range(layers):
        memory = encoder_layer(memory, src_mask, hidden, heads, ffn, f"encoder{i}")
    x = PositionalEmbedding(vocab, tgt_seq, hidden, name="target_embeddings")(tgt)
    for i in range(layers):
        x = decoder_layer(x, memory, src_mask, hidden, heads, ffn, f"decoder{i}")
    logits = keras.layers.Dense(vocab, name="logits")(x)
    model = keras.Model([src, tgt], logits, name="transformer")

    def make_batch(seed_or_rng, batch):
        gen = common.generator(seed_or_rng)
        target = common.token_ids(gen, (batch, tgt_seq + 1), vocab)
        # decoder input: the target without its last token; labels: without its first
        return common.Batch((padded_token_ids(gen, batch, src_seq, vocab), target[:, :-1]),
                            target[:, 1:])

    specs = [tf.TensorSpec([None, src_seq], tf.int32), tf.TensorSpec([None, tgt_seq], tf.int32)]
    return common.assemble("transformer", sizes, model, specs, specs[1], make_batch,
                           common.sparse_crossentropy, seed)
