"""Keras 3 models: `fit`, `evaluate`, `predict` and the `*_on_batch` calls
run fused step functions.

    model.compile(optimizer="adam", loss=..., metrics=[...])
    tf_fusionstitch.keras.optimize(model)
    model.fit(...)                        # fused train and test steps
    tf_fusionstitch.keras.report(model)   # {"train": [Report, ...], "test": ..., "predict": ...}

Keras' TensorFlow backend builds each of its functions around one step on a
batch (`train_step`, `test_step`, `predict_step`, which a subclass may
override): a tf.function over that step, inside a loop over Keras' iterator
that runs `steps_per_execution` steps per call. `optimize` replaces the step
the model calls with `tf_fusionstitch.optimize` of it, so Keras keeps its
iterator, its loop, callbacks and metrics, and each step it runs is the fused
function, called from Keras' own tf.function. Everything a step computes goes
through the rewrite: the forward and backward pass, the loss, the optimizer's
update and the metrics' updates.

Keras drops its functions when the model is (re)compiled and builds them
again on the next call; the model stays optimized: each rebuild takes a
fresh fused step (traced against the new optimizer, loss and metrics).
A re-compile with `jit_compile=True` or `run_eagerly=True` runs Keras' own
steps, with a warning, until the model is compiled without them.
"""

from __future__ import annotations

import dataclasses

import warnings
from typing import Dict, List

from tf_fusionstitch import api
from tf_fusionstitch.options import FusionOptions

import tensorflow as tf   # after api, which checks the TensorFlow requirement first

# kind -> (the step method, Keras' builder of the function that calls it, that function)
STEPS = {
    "train": ("train_step", "make_train_function", "train_function"),
    "test": ("test_step", "make_test_function", "test_function"),
    "predict": ("predict_step", "make_predict_function", "predict_function"),
}
# fs.optimize's options that act on calls made outside any tf.function.
UNTIMED_OPTIONS = ("background", "measured_choice", "measured_plans")
# Where a model keeps its fusion state (an attribute Keras neither tracks nor saves).
_STATE = "_tf_fusionstitch_keras"


class ModelFusion:
    """One model's fused steps: the methods `optimize` replaced and, per kind,
    the fused step Keras' current function calls (None: the original step)."""

    def __init__(self, model, options: FusionOptions):
        self.options = options
        self.original_steps = {kind: getattr(model, step) for kind, (step, _, _) in STEPS.items()}
        self.original_makes = {kind: getattr(model, make) for kind, (_, make, _) in STEPS.items()}
        # Methods the user had set on the instance itself, which restore() puts back.
        self.instance_methods = {name: vars(model)[name] for names in STEPS.values()
                                 for name in names[:2] if name in vars(model)}
        self.current: Dict[str, object] = {kind: None for kind in STEPS}
        self.fused: Dict[str, List[api.OptimizedFunction]] = {kind: [] for kind in STEPS}

    def install(self, model) -> None:
        for kind, (step, make, function) in STEPS.items():
            setattr(model, step, self._step(kind))
            setattr(model, make, self._make(model, kind))
            # A function Keras built before (a fit before optimize) calls the original step.
            setattr(model, function, None)

    def _step(self, kind: str):
        original = self.original_steps[kind]

        def step(data):
            fused = self.current[kind]
            return original(data) if fused is None else fused(data)
        step.__name__ = original.__name__
        return step

    def _make(self, model, kind: str):
        make_keras_function = self.original_makes[kind]
        function = STEPS[kind][2]

        def make(force=False):
            if getattr(model, function) is not None and not force:
                return getattr(model, function)
            self.current[kind] = self._fused_step(model, kind)
            return make_keras_function(force=force)
        return make

    def _fused_step(self, model, kind: str):
        """A fresh fused step for the function Keras is about to build, or
        None (the original step) where the model's compile rules fusion out
        or the wrapping fails."""
        refusal = compile_refusal(model)
        if not refusal and model.distribute_strategy.num_replicas_in_sync > 1:
            refusal = ("steps that run on several replicas of a tf.distribute strategy are "
                       "not supported yet")
        if refusal:
            warnings.warn(f"tf_fusionstitch: {model.name}'s {kind} step runs unoptimized: "
                          f"{refusal}", RuntimeWarning, stacklevel=4)
            return None
        try:
            step = tf.function(self.original_steps[kind], reduce_retracing=True,
                               autograph=False)
            fused = api.OptimizedFunction(step, self.options)
        except Exception as e:  # noqa: BLE001  (our failure: Keras' own step runs)
            warnings.warn(f"tf_fusionstitch: {model.name}'s {kind} step runs unoptimized: "
                          f"could not wrap it ({type(e).__name__}: {e}); please report this "
                          "as a tf_fusionstitch bug", RuntimeWarning, stacklevel=4)
            return None
        self.fused[kind].append(fused)
        return fused


def compile_refusal(model) -> str:
    """Why the model's compile settings leave nothing to fuse ("" if none)."""
    if model.jit_compile:
        return ("it is compiled with jit_compile=True (XLA compiles the whole step; Keras' "
                "default jit_compile='auto' picks XLA where a GPU is visible); compile it "
                "with jit_compile=False")
    if model.run_eagerly:
        return ("it is compiled with run_eagerly=True (ops run one by one, there is no "
                "graph to fuse); compile it with run_eagerly=False")
    return ""


def optimize(model, **options):
    """Makes `model`'s fit, evaluate, predict, train_on_batch, test_on_batch
    and predict_on_batch run steps fused by `tf_fusionstitch.optimize`, with
    its options (`tf_fusionstitch.optimize`'s docstring) but background,
    measured_choice and measured_plans, which cannot act on a step Keras
    calls from inside its own tf.function (under fusion="explore" the
    explored plan runs, as the plan guard kept it). Call it after
    `model.compile(...)`; returns the model. A later compile keeps the model
    optimized. Calling it again replaces the options.

    Raises for the caller's mistakes only: a model that is not a compiled
    Keras 3 model on the TensorFlow backend, one compiled with
    jit_compile=True or run_eagerly=True, or a bad option. A failure of
    tf_fusionstitch's own leaves the model running Keras' steps (or one
    trace running the original step), with a warning."""
    fusion_options = FusionOptions.from_call(**options)
    if "measured_plans" not in options:   # explore's default: off where nothing is timed
        fusion_options = dataclasses.replace(fusion_options, measured_plans=0)
    for name in UNTIMED_OPTIONS:
        if getattr(fusion_options, name):
            raise ValueError(f"tf_fusionstitch.keras.optimize() does not take {name}: Keras "
                             "calls the step from inside its own tf.function, traced once, "
                             "so the step cannot run the original first or be timed there; "
                             f"leave {name} out")
    check_model(model)
    try:
        state = getattr(model, _STATE, None)
        if state is not None:
            restore(model)
        state = ModelFusion(model, fusion_options)
        state.install(model)
        setattr(model, _STATE, state)
    except Exception as e:  # noqa: BLE001  (our failure: the model keeps Keras' steps)
        warnings.warn(f"tf_fusionstitch: {getattr(model, 'name', 'the model')} runs "
                      f"unoptimized: {type(e).__name__}: {e}; please report this as a "
                      "tf_fusionstitch bug", RuntimeWarning, stacklevel=2)
    return model


def check_model(model) -> None:
    """ValueError (TypeError for a non-model) naming the fix where `model`
    cannot be optimized."""
    import keras
    if not isinstance(model, keras.Model):
        raise TypeError(f"tf_fusionstitch.keras.optimize() takes a keras.Model, got "
                        f"{type(model).__name__}")
    if keras.backend.backend() != "tensorflow":
        raise ValueError(f"tf_fusionstitch.keras.optimize() needs Keras' TensorFlow backend; "
                         f"this Keras runs on {keras.backend.backend()!r} (set KERAS_BACKEND="
                         "tensorflow before importing keras)")
    if not model.compiled:
        raise ValueError("tf_fusionstitch.keras.optimize() takes a compiled model: call "
                         "model.compile(...) first")
    refusal = compile_refusal(model)
    if refusal:
        raise ValueError(f"tf_fusionstitch.keras.optimize(): {model.name} cannot be "
                         f"optimized: {refusal}")


def restore(model) -> None:
    """Undoes `optimize`: the model runs Keras' own steps again (its functions
    are rebuilt on the next call). Nothing happens to a model never optimized."""
    state = getattr(model, _STATE, None)
    if state is None:
        return
    for step, make, function in STEPS.values():
        for name in (step, make):
            delattr(model, name)
            if name in state.instance_methods:
                setattr(model, name, state.instance_methods[name])
        setattr(model, function, None)
    delattr(model, _STATE)


def report(model) -> Dict[str, list]:
    """The reports (tf_fusionstitch's `Report`) of every trace of the model's
    fused steps so far, by kind: {"train": [...], "test": [...],
    "predict": [...]}, oldest first, across re-compiles. Empty lists for a
    model not optimized."""
    state = getattr(model, _STATE, None)
    if state is None:
        return {kind: [] for kind in STEPS}
    return {kind: [r for fused in state.fused[kind] for r in fused.reports()]
            for kind in STEPS}
