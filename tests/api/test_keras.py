"""`tf_fusionstitch.keras.optimize(model)`: Keras' fit, evaluate, predict and
the *_on_batch calls run fused steps.

- A zoo CNN and a zoo transformer (benchmarks/zoo/, tiny): `fit` for two
  epochs with validation data gives TF's loss and metric history and final
  weights, within the noise floor the zoo's train-step test uses
  (tests/zoo_testlib.py: XLA's run of the same model and the float64 twin's,
  here both through Keras' fit); `predict` matches at two batch sizes; the
  train step's report shows fused kernels, and no report a fallback (the
  test and predict steps of VGG16 fuse nothing: TF's remapper takes every
  convolution's and matmul's bias and ReLU). VGG16, as the tiny batch-norm
  CNNs train chaotically at this batch size (after two steps, XLA's run of
  MobileNet lands up to 86% of a weight's update away from TF's), where
  VGG16's comparison sees a rounding-level difference.
- On a small model: steps_per_execution=2, the *_on_batch calls,
  re-compile (the model stays optimized, with fresh steps for the new
  optimizer), save and load, restore, and what is refused.
"""

import os
import tempfile
import warnings

import keras
import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs
import zoo_testlib as zt
from optimize_testlib import assert_same, quiet_call

from benchmarks import zoo  # the repository root (pyproject.toml's pytest pythonpath)

_SEED = 7
_EPOCHS = 2
# One train batch and one validation batch per epoch; three inputs to
# predict at batch sizes 2 (a full batch, then a partial one) and 3.
_BATCH, _VALIDATION = 4, 2
_PREDICT, _PREDICT_BATCHES = 3, (2, 3)


def _compile(model, optimizer_name, dtype="float32", **kwargs):
    model.compile(optimizer=zoo.OPTIMIZERS[optimizer_name](),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype=dtype),
                  metrics=[keras.metrics.SparseCategoricalAccuracy()], **kwargs)


def _fit(model, data):
    """History (every logged value per epoch) and final weights of one fit."""
    (x, y), (val_x, val_y), _ = data
    history = model.fit(x, y, batch_size=_BATCH, epochs=_EPOCHS, shuffle=False,
                        validation_data=(val_x, val_y), verbose=0).history
    return history, zt.snapshot(model.variables)


def _predict(model, x):
    """Predictions at two batch sizes."""
    return [model.predict(x, batch_size=b, verbose=0) for b in _PREDICT_BATCHES]


def _data(model):
    """(train, validation) pairs of one batch each, and inputs to predict."""
    gen = np.random.default_rng(_SEED)
    train, val, test = (model.make_batch(gen, n) for n in (_BATCH, _VALIDATION, _PREDICT))
    as_x = lambda b: b.inputs[0].numpy()   # noqa: E731  (one image input)
    return (as_x(train), train.labels.numpy()), (as_x(val), val.labels.numpy()), as_x(test)


class ZooFitTest(tf.test.TestCase):
    """The issue's must-show: fit, evaluate (validation) and predict of zoo
    models, fused, against TF with XLA and the float64 twin as the noise
    floor. Models without dropout, so XLA draws no masks of its own."""

    def _check(self, name):
        built = zoo.build(name, "tiny", seed=_SEED)
        self.assertFalse(built.dropout, "the XLA reference needs a model without dropout")
        model, data = built.model, _data(built)
        twin = zt.build_twin(built, name, _SEED).model
        initial = zt.snapshot(model.variables)
        runs, predictions = {}, {}
        for run in ("tf", "xla", "fused"):
            zt.restore(model.variables, initial)
            _compile(model, built.optimizer_name, jit_compile=run == "xla")
            if run == "fused":
                fs.keras.optimize(model)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", RuntimeWarning)
                predictions[run] = _predict(model, data[2])
                runs[run] = _fit(model, data)
            if run == "fused":
                ours = [str(w.message) for w in caught if "tf_fusionstitch" in str(w.message)]
                self.assertEqual(ours, [], "the fused run warned")
        _compile(twin, built.optimizer_name, dtype="float64")
        with zt.without_grappler():
            predictions["twin"] = _predict(twin, data[2])
            runs["twin"] = _fit(twin, data)

        refs = ("xla", "twin")
        for i, batch in enumerate(_PREDICT_BATCHES):
            self.assertEqual(zt.mismatched_outputs(
                [predictions["tf"][i]], [[predictions[r][i]] for r in refs],
                [predictions["fused"][i]]), [], f"predict at batch size {batch}")
        history = {run: h for run, (h, _) in runs.items()}
        self.assertEqual(set(history["fused"]), set(history["tf"]))
        as_trained = lambda run, key: zt.Trained(history[run][key], runs[run][1])  # noqa: E731
        for key in history["tf"]:
            self.assertEqual(zt.mismatched_losses(
                as_trained("tf", key), [as_trained(r, key) for r in refs],
                as_trained("fused", key), rounded_to=np.float32), [], f"history of {key}")
        self.assertEqual(zt.mismatched_updates(
            model.variables, initial, as_trained("tf", "loss"),
            [as_trained(r, "loss") for r in refs], as_trained("fused", "loss")), [],
            "weights after fit")

        reports = fs.keras.report(model)
        for kind in ("train", "test", "predict"):
            self.assertNotEmpty(reports[kind], f"no {kind} step was traced")
            for report in reports[kind]:
                self.assertEqual(report.failure, "", f"{kind}: the rewrite failed")
                self.assertEqual(zt.unnamed_fallbacks([report], {}), [], kind)
            self.assertEmpty(zt.unexplained_unfused(reports[kind][-1]),
                             f"{kind}: nothing fused\n{reports[kind][-1]}")
        self.assertNotEmpty(reports["train"][-1].fused_clusters, "train: nothing fused")

    def test_a_zoo_cnn(self):
        self._check("vgg16")

    def test_a_zoo_transformer(self):
        self._check("vit")


def _small_model(seed=_SEED, **compile_args):
    """A small compiled model (a Dense with GELU, a layer norm, a Dense
    head); two calls with one seed give identical weights."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="gelu")(inputs)
    hidden = keras.layers.LayerNormalization()(hidden)
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    model.compile(**{"optimizer": keras.optimizers.SGD(0.05, momentum=0.9),
                     "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     "metrics": [keras.metrics.SparseCategoricalAccuracy()],
                     **compile_args})
    return model


def _small_data(n, seed=_SEED):
    gen = np.random.default_rng(seed)
    return gen.standard_normal((n, 8)).astype(np.float32), gen.integers(0, 3, n)


class KerasCallsTest(tf.test.TestCase):
    """Each Keras entry point on a small model, against the same model
    un-optimized (SGD, a few steps: TF's results within the numerics
    tolerances, tests/optimize_testlib.py)."""

    def _assert_same_values(self, got, want, what):
        got, want = tf.nest.flatten(got), tf.nest.flatten(want)
        self.assertLen(got, len(want), what)
        for g, w in zip(got, want):
            assert_same(self, tf.constant(g), tf.constant(w), "transcendental", msg=what)

    def _assert_same_fit(self, fused, reference, fit_args):
        want = reference.fit(**fit_args, verbose=0).history
        got = quiet_call(fused.fit, **fit_args, verbose=0).history
        self.assertEqual(set(got), set(want))
        for key in want:
            self._assert_same_values(got[key], want[key], f"history of {key}")
        for f, r in zip(fused.weights, reference.weights):
            self._assert_same_values(f.numpy(), r.numpy(), f"{r.path} after fit")

    def _assert_fused(self, model, kinds):
        reports = fs.keras.report(model)
        for kind in kinds:
            self.assertNotEmpty(reports[kind], f"Keras' {kind} function did not call the "
                                "fused step")
            self.assertEqual(reports[kind][-1].failure, "", kind)
            self.assertNotEmpty(reports[kind][-1].fused_clusters, f"{kind}: nothing fused")

    def test_steps_per_execution(self):
        # 3 batches: one execution of two steps, then one of the last step alone.
        x, y = _small_data(12)
        val_x, val_y = _small_data(5, seed=_SEED + 1)
        fused, reference = (_small_model(steps_per_execution=2) for _ in range(2))
        fs.keras.optimize(fused)
        self._assert_same_fit(fused, reference, dict(
            x=x, y=y, batch_size=4, epochs=2, shuffle=False, validation_data=(val_x, val_y)))
        self._assert_same_values(quiet_call(fused.predict, x, batch_size=4, verbose=0),
                                 reference.predict(x, batch_size=4, verbose=0), "predict")
        self._assert_fused(fused, ("train", "test", "predict"))

    def test_on_batch_calls(self):
        x, y = _small_data(6)
        fused, reference = _small_model(), _small_model()
        fs.keras.optimize(fused)
        for step in range(2):
            self._assert_same_values(quiet_call(fused.train_on_batch, x, y),
                                     reference.train_on_batch(x, y), f"train_on_batch {step}")
        self._assert_same_values(quiet_call(fused.test_on_batch, x, y),
                                 reference.test_on_batch(x, y), "test_on_batch")
        self._assert_same_values(quiet_call(fused.predict_on_batch, x),
                                 reference.predict_on_batch(x), "predict_on_batch")
        self._assert_fused(fused, ("train", "test", "predict"))

    def test_a_recompiled_model_stays_optimized(self):
        x, y = _small_data(8)
        fused, reference = _small_model(), _small_model()
        fs.keras.optimize(fused)
        fit_args = dict(x=x, y=y, batch_size=4, epochs=1, shuffle=False)
        self._assert_same_fit(fused, reference, fit_args)
        for model in (fused, reference):   # another optimizer, loss and metric
            model.compile(optimizer=keras.optimizers.RMSprop(0.01),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=[keras.metrics.SparseTopKCategoricalAccuracy(k=2)])
        traces = len(fs.keras.report(fused)["train"])
        self._assert_same_fit(fused, reference, fit_args)
        self.assertGreater(len(fs.keras.report(fused)["train"]), traces,
                           "the re-compiled model's train step was not traced again")
        latest = fs.keras.report(fused)["train"][-1]
        prefix = fused.optimizer.name + "/"   # the RMSprop update's ops
        self.assertTrue(any(name.startswith(prefix) for c in latest.fused_clusters
                            for name, _ in c.tf_ops), "the new optimizer's update is not fused")

    def test_save_and_load(self):
        x, y = _small_data(8)
        fused = _small_model()
        fs.keras.optimize(fused)
        quiet_call(fused.fit, x, y, batch_size=4, epochs=1, verbose=0)
        directory = tempfile.TemporaryDirectory()
        self.addCleanup(directory.cleanup)
        path = os.path.join(directory.name, "model.keras")
        fused.save(path)
        loaded = keras.models.load_model(path)
        self.assertEqual(fs.keras.report(loaded), {"train": [], "test": [], "predict": []},
                         "a loaded model is a new model, not optimized")
        self._assert_same_values(loaded.predict(x, verbose=0),
                                 quiet_call(fused.predict, x, verbose=0), "loaded predict")
        fs.keras.optimize(loaded)
        self._assert_same_values(quiet_call(loaded.evaluate, x, y, verbose=0),
                                 fused.evaluate(x, y, verbose=0), "loaded, optimized evaluate")
        self._assert_fused(loaded, ("test",))

    def test_restore_runs_keras_steps_again(self):
        x, y = _small_data(4)
        model = _small_model()
        fs.keras.optimize(model)
        quiet_call(model.evaluate, x, y, verbose=0)
        fs.keras.restore(model)
        self.assertEqual(fs.keras.report(model), {"train": [], "test": [], "predict": []})
        self.assertNotIn("test_step", vars(model))
        model.evaluate(x, y, verbose=0)   # Keras' own step, built again

    def test_a_step_set_on_the_instance_is_fused_and_put_back(self):
        x, y = _small_data(4)
        model, reference = _small_model(), _small_model()
        keras_step, traced = model.test_step, []

        def test_step(data):
            traced.append(data)
            return keras_step(data)
        model.test_step = test_step
        fs.keras.optimize(model, fusion="xla_like")
        fs.keras.optimize(model)   # again: its options replace the first call's
        self._assert_same_values(quiet_call(model.evaluate, x, y, verbose=0),
                                 reference.evaluate(x, y, verbose=0), "evaluate")
        self.assertNotEmpty(traced, "the fused step did not trace the instance's step")
        self.assertEqual([r.fusion for r in fs.keras.report(model)["test"]], ["stitch"])
        fs.keras.restore(model)
        self.assertIs(vars(model)["test_step"], test_step)

    def test_refusals_name_the_fix(self):
        with self.assertRaisesRegex(ValueError, r"jit_compile=False"):
            fs.keras.optimize(_small_model(jit_compile=True))
        with self.assertRaisesRegex(ValueError, r"run_eagerly=False"):
            fs.keras.optimize(_small_model(run_eagerly=True))
        keras.utils.set_random_seed(0)
        uncompiled = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        with self.assertRaisesRegex(ValueError, r"model.compile"):
            fs.keras.optimize(uncompiled)
        with self.assertRaisesRegex(TypeError, r"keras.Model"):
            fs.keras.optimize(tf.function(lambda x: x))
        with self.assertRaisesRegex(ValueError, r"fusion"):
            fs.keras.optimize(_small_model(), fusion="nonsense")
        for option in ({"background": True}, {"measured_choice": 3},
                       {"fusion": "explore", "measured_plans": 3}):
            with self.assertRaisesRegex(ValueError, f"leave {list(option)[-1]} out"):
                fs.keras.optimize(_small_model(), **option)
        fs.keras.optimize(_small_model(), fusion="explore")   # its default is off here

    def test_a_recompile_with_jit_compile_runs_keras_steps_with_a_warning(self):
        x, y = _small_data(4)
        model, reference = _small_model(), _small_model(jit_compile=True)
        fs.keras.optimize(model)
        model.compile(optimizer="sgd", loss=reference.loss, jit_compile=True)
        reference.compile(optimizer="sgd", loss=reference.loss, jit_compile=True)
        with self.assertWarnsRegex(RuntimeWarning, r"unoptimized.*jit_compile=False"):
            got = model.evaluate(x, y, verbose=0)
        self._assert_same_values(got, reference.evaluate(x, y, verbose=0), "evaluate")
        self.assertEqual(fs.keras.report(model)["test"], [])

    def test_its_own_failure_leaves_keras_steps_with_a_warning(self):
        x, y = _small_data(4)
        model, reference = _small_model(), _small_model()
        original = fs.api.OptimizedFunction

        def broken(*args, **kwargs):
            raise RuntimeError("a bug in tf_fusionstitch")
        fs.api.OptimizedFunction = broken
        self.addCleanup(setattr, fs.api, "OptimizedFunction", original)
        fs.keras.optimize(model)
        with self.assertWarnsRegex(RuntimeWarning, r"unoptimized.*a bug in tf_fusionstitch"):
            got = model.evaluate(x, y, verbose=0)
        self._assert_same_values(got, reference.evaluate(x, y, verbose=0), "evaluate")


if __name__ == "__main__":
    tf.test.main()
