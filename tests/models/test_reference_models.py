"""`tf_fusionstitch.optimize` on the reference models (benchmarks/models/) at tiny
sizes: BERT-style encoder, Transformer seq2seq, DIEN-style recommender, CRNN, ASR.

For every model: the optimized inference matches TF on fresh random inputs at
two batch sizes, three optimized Adam training steps give TF's losses and
variables from identical initial weights, and the rewrite fused something and
fell back nowhere.

Tolerances (float32, docs/DESIGN.md, "Numerics"), for these tiny sizes:
- inference outputs and losses: the whole-function tolerance of
  test_optimize_functions.test_train_step (optimize_testlib's transcendental
  chains: rtol 1e-5, atol 1e-6), elementwise. Layernorm and softmax rows have
  at most 64 terms here, so their (n + 8) eps bound is below 1e-5; at real
  sizes (hidden 768) it is ~1e-4 (BERT-base differs by 4.9e-6 on O(1) values,
  past this tolerance and within that bound);
- BatchNorm moving statistics: rtol 1e-5, atol 1e-6, elementwise;
- trained weights: each variable's update over the three steps (final minus
  initial value), normwise: |du_fused - du_TF|_2 <= 1e-4 |du_TF|_2. Adam divides
  every gradient element by its running RMS, so an element whose gradient
  cancels (over the batch or across steps) turns a rounding difference of
  reordered float32 sums into a relative update difference of any size, up to
  the learning rate; such elements are isolated, so the normwise error stays at
  3e-6..3e-5 here (gradients themselves agree to a few 1e-6), while one wrong
  element moves it by ~lr / |du| ~ 1e-2 and a wrong kernel by O(1). Longer
  reductions at real sizes raise it (CRNN's first conv, 8192 terms: 1.3e-4).
"""

import inspect

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import tf_fusionstitch as fs
from optimize_testlib import (assert_same, assert_train_steps_match, fusion_stitch_nodes,
                              quiet_call)

from benchmarks import models  # the repository root (pyproject.toml's pytest pythonpath)

_SEED = 11


class ReferenceModelTest(tf.test.TestCase, parameterized.TestCase):

    def _assert_fused_without_fallbacks(self, opt):
        report = opt.report()
        self.assertNotEmpty(report.fused_clusters, str(report))
        self.assertNotEmpty(fusion_stitch_nodes(opt.graph_def), str(report))
        self.assertEmpty(report.fallbacks, str(report))

    @parameterized.named_parameters((name, name) for name in models.MODELS)
    def test_inference_matches_tf(self, name):
        model = models.build(name, "tiny", seed=_SEED)
        opt = fs.optimize(model.inference)
        gen = np.random.default_rng(_SEED)
        for batch_size in (3, 5):  # a new batch size reuses the trace and kernels
            batch = model.make_batch(gen, batch_size)
            expected = tf.nest.flatten(model.inference(*batch.inputs))
            actual = tf.nest.flatten(quiet_call(opt, *batch.inputs))
            self.assertLen(actual, len(expected))
            for a, e in zip(actual, expected):
                self.assertGreater(float(tf.reduce_max(tf.abs(e))), 0.0, "trivial output")
                assert_same(self, a, e, "transcendental", msg=f"{name} batch {batch_size}")
        self.assertLen(opt.reports(), 1)
        self._assert_fused_without_fallbacks(opt)

    @parameterized.named_parameters((name, name) for name in models.MODELS)
    def test_train_steps_match_tf(self, name):
        reference = models.build(name, "tiny", seed=_SEED)
        fused = models.build(name, "tiny", seed=_SEED)
        opt = fs.optimize(fused.train_step)
        assert_train_steps_match(self, reference, fused, opt, np.random.default_rng(_SEED + 1),
                                 name=name)
        self._assert_fused_without_fallbacks(opt)


class RegistryTest(tf.test.TestCase):

    def test_real_sizes_fit_each_builder(self):
        for module in models.MODELS.values():
            inspect.signature(module.build).bind(**module.REAL)
            inspect.signature(module.build).bind(**module.TINY)

    def test_unknown_names_and_sizes_fail_with_the_known_ones(self):
        with self.assertRaisesRegex(ValueError, "known: bert"):
            models.build("resnet")
        with self.assertRaisesRegex(ValueError, "it takes"):
            models.build("bert", "tiny", depth=3)

    def test_batches_are_fresh_and_random(self):
        model = models.build("crnn", "tiny", seed=0)
        gen = np.random.default_rng(0)
        first, second = model.make_batch(gen, 2), model.make_batch(gen, 2)
        self.assertNotAllClose(first.inputs[0], second.inputs[0])
        self.assertGreater(float(tf.math.reduce_std(first.inputs[0])), 0.5)
