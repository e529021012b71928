"""Comparing a zoo model's optimized functions with TF's, against a measured
noise floor.

Two float32 programs that compute the same function in different orders
differ, and a deep model's training amplifies such differences: Adam-family
optimizers turn a near-zero gradient's rounding into an lr-sized step, and a
batch norm over few values is ill-conditioned. No fixed tolerance is honest
for thirty models, so each result's distance from TF's is compared with the
distances of *references*, other correct implementations of the same model on
the same inputs; the largest of them is the noise floor:

- XLA (`jit_compile=True` of the same traced function), for models without
  active dropout (XLA draws dropout masks with another algorithm). XLA alone
  is not enough: it sums many reductions in TF's order, so it matches TF
  exactly on their variables while tf_fusionstitch's blocked sums round
  differently (measured: XLA 0, tf_fusionstitch up to 2.8e-5 on a layer norm's
  scale under Adam);
- for models with active dropout, in XLA's place, TF itself from weights one
  float32 rounding apart (each element moved to a neighbouring float32 at
  random): how far TF's own training moves when its weights round the other
  way. Training a small batch-norm CNN with dropout under RMSprop is chaotic:
  on EfficientNetB0 the third step's loss moves by 1.4e-4 so, where the
  float64 twin happened to land 6e-6 from TF's and tf_fusionstitch 1.9e-4;
- the model's twin with the same float32 weights, batches and dropout masks:
  float64 for float32 models (how far TF's float32 result is from exact
  arithmetic: a plan as accurate as TF's lands within about twice that of TF),
  float32 for models under mixed_bfloat16 (tf_fusionstitch keeps float32
  between the ops of a kernel where TF rounds every op to bfloat16, a
  documented difference, so the budget is how far TF's bfloat16 result is
  from float32). The twin alone is not enough either: TF's remapper fuses a
  convolution's bias and ReLU into oneDNN's kernel, one rounding fewer than
  any unfused plan, so on VGG16 TF is 100x closer to the float64 twin than
  XLA and tf_fusionstitch are (3.4e-5 against 3.9e-3 and 3.6e-3).

tf_fusionstitch passes where its distance from TF is at most NOISE_FACTOR
times the floor.

Non-smooth steps. A train step through max pooling (or ReLU) is not smooth:
where a window's two largest inputs are closer than float32 rounding, which of
them takes the gradient depends on how a program rounds. At tiny sizes such
near-ties occur. Xception's (71x71, batch 4, seed 5) block13_pool has a window
whose two largest inputs are 6.0e-7 apart in float64, while a float32 element
there is 1.3e-6 (TF) and 7.6e-7 (tf_fusionstitch) from float64. TF and the twin
route the gradient to one input, tf_fusionstitch to the other, and every
earlier gradient moves by about 1.4e-3 (normwise): 37 variables 500-2800x past
the smooth floor. TF itself, from weights one rounding apart, crossed that
kink in 3 of 6 seeds (the step-1 loss 2.20689 where TF has 2.20689440), and
landed up to 0.11 from its own run. XLA and the twin share TF's side by
chance, so they measure only the smooth noise. Where a plan misses their
floor, the zoo test measures TF's: ROUNDING_APART_RUNS runs from weights one
rounding apart join the references. A smooth step's runs stay near the floor,
so a wrong kernel still fails there (PerturbedPlanTest's kernels off by 1e-5
fail with those runs among the references). A kink's runs show the spread any
float32 program may land in.

Updates are compared as they are; a sign-based optimizer (Lion) turns one
element's rounding-level gradient difference into a 2 lr step, which on a
bfloat16 model's 32-element norm scale moves the normwise distance by 0.35,
beyond what the references bound, so the zoo trains its bfloat16 models with
continuous updates (benchmarks/zoo/).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Dict, List, Sequence

import numpy as np
import tensorflow as tf

from tf_fusionstitch.rewriters import remapper_epilogues

# Measured on the zoo at tiny sizes (tests/models/test_zoo.py): a correct plan's
# distance from TF is up to 3.5x the floor; 8x leaves room for that spread,
# while one fused kernel off by a relative 1e-5 moves some variable of a
# well-conditioned model 2-100x past it (the perturbation test), and a wrong
# kernel by orders of magnitude more.
NOISE_FACTOR = 8.0
# Below this normwise distance any difference passes (references and TF can
# agree exactly).
FLOOR = 1e-7
STEPS = 3


@dataclasses.dataclass
class Trained:
    """What a run of STEPS train steps from the initial weights gave."""
    losses: List[float]
    values: List[np.ndarray]        # every model variable after the steps


def snapshot(variables) -> List[np.ndarray]:
    return [np.array(v.numpy()) for v in variables]


def restore(variables, values) -> None:
    for v, value in zip(variables, values):
        v.assign(value)


def train_batches(model, seed: int, batch: int = 4, seq: int = 12):
    gen = np.random.default_rng(seed)
    return [model.make_batch(gen, batch, seq if model.family == "text" else None)
            for _ in range(STEPS)]


def run_steps(step, model, batches) -> Trained:
    losses = [float(step(*b.inputs, b.labels)) for b in batches]
    return Trained(losses, snapshot(model.model.variables))


@contextlib.contextmanager
def float32_dropout_masks():
    """While a float64 twin traces, its dropout draws each mask as the float32
    model does (Keras draws a mask in its input's dtype, and a float64 uniform
    is not the float32 one): same seeds, same float32 mask, applied in float64."""
    from keras.src import backend
    real = backend.random.dropout

    def dropout(inputs, rate, noise_shape=None, seed=None):
        if inputs.dtype != tf.float64:
            return real(inputs, rate, noise_shape=noise_shape, seed=seed)
        mask = real(tf.ones(tf.shape(inputs), tf.float32), rate, noise_shape=noise_shape,
                    seed=seed)
        return inputs * tf.cast(mask, tf.float64)
    backend.random.dropout = dropout
    try:
        yield
    finally:
        backend.random.dropout = real


def twin_policy(model) -> str:
    return "float32" if model.policy == "mixed_bfloat16" else "float64"


def build_twin(model, name: str, seed: int):
    """Zoo model `name`'s twin (built with `seed`, so its weights are
    `model`'s float32 values) under twin_policy(model)."""
    from benchmarks import zoo
    policy = twin_policy(model)
    twin = zoo.build(name, model.size, seed=seed, policy=policy)
    pairs = list(zip(model.model.variables, twin.model.variables))
    for a, b in pairs:   # (layers and seed generators are numbered per process)
        same = (tuple(a.shape) == tuple(b.shape)
                and re.sub(r"_\d+", "", a.path) == re.sub(r"_\d+", "", b.path))
        if len(pairs) != len(twin.model.variables) or not same:
            raise AssertionError(f"the {policy} twin of {name} differs: {a.path} / {b.path}")
    return twin


def xla_function(fn):
    """tf.function `fn` compiled whole by XLA, from the graph TF already traced:
    XLA inlines the call, so this is bitwise what `jit_compile=True` of the same
    Python function gives (checked on MobileNetV2, BERT and ResNet50 train steps
    and inference), without tracing the model's Python a second time (16 s of
    NASNetMobile's train step)."""
    traced = fn.get_concrete_function()
    return tf.function(lambda *args: traced(*args), input_signature=fn.input_signature,
                       jit_compile=True)


def one_rounding_apart(values: Sequence[np.ndarray], seed: int) -> List[np.ndarray]:
    """Each float32 element moved to a neighbouring float32, up or down at
    random: the start of perturbed_train_steps."""
    gen = np.random.default_rng(seed)
    moved = []
    for value in values:
        if value.dtype != np.float32:
            moved.append(value)
            continue
        towards = np.where(gen.random(value.shape) < 0.5, -np.inf, np.inf).astype(np.float32)
        moved.append(np.nextafter(value, towards))
    return moved


def perturbed_train_steps(model, batches, initial: Sequence[np.ndarray], seed: int) -> Trained:
    """TF's own STEPS train steps from the model's weights one float32
    rounding apart (one_rounding_apart): how far TF's training moves when
    its float32 weights are rounded the other way, the float32 counterpart
    of XLA's reference where XLA cannot serve (active dropout). Restores
    the model's optimizer slots to `initial` (model then optimizer variables)
    first; the caller restores the weights afterwards."""
    weights = list(model.model.variables)
    restore(weights + list(model.optimizer.variables), initial)
    restore(weights, one_rounding_apart(initial[:len(weights)], seed))
    return run_steps(model.train_step, model, batches)


@contextlib.contextmanager
def without_grappler():
    """TF's Grappler off while a twin's functions are first called (that is
    when TF optimizes a function's graph). The twin is a precision reference:
    Grappler's rewrites move its results by a rounding of its own precision
    (float64, or float32 for a bfloat16 model), far below the differences it
    bounds; and Grappler is most of a deep twin's first call (NASNetMobile's
    float64 train step: 13.9 s with it, 4.9 s without)."""
    key = "disable_meta_optimizer"
    before = tf.config.optimizer.get_experimental_options().get(key, False)
    tf.config.optimizer.set_experimental_options({key: True})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({key: before})


def twin_train_steps(twin, batches) -> Trained:
    """The twin's STEPS train steps, with the float32 model's dropout masks."""
    with float32_dropout_masks(), without_grappler():
        return run_steps(twin.train_step, twin, batches)


def twin_outputs(twin, inputs):
    """The twin's inference on `inputs` (flat_outputs)."""
    with without_grappler():
        return flat_outputs(twin.inference(*inputs))


def relative_distance(a: np.ndarray, b: np.ndarray, scale: float) -> float:
    diff = np.linalg.norm(a.astype(np.float64) - b.astype(np.float64))
    return float(diff / scale) if scale > 0 else (0.0 if diff == 0 else float("inf"))


def mismatched_updates(variables, initial, tf_run: Trained, refs: Sequence[Trained],
                       fs_run: Trained) -> List[str]:
    """Variables whose update under tf_fusionstitch is farther from TF's than
    the noise floor allows (see the module docstring), as readable lines.
    Integer variables (dropout seeds, counters) must match exactly."""
    bad = []
    ref_values = list(zip(*(r.values for r in refs)))
    for v, start, want, ref, got in zip(variables, initial, tf_run.values, ref_values,
                                        fs_run.values):
        if not tf.as_dtype(v.dtype).is_floating:
            if not np.array_equal(got, want):
                bad.append(f"{v.path}: {got} where TF has {want}")
            continue
        scale = float(np.linalg.norm(want.astype(np.float64) - start.astype(np.float64)))
        d_fs = relative_distance(got, want, scale)
        d_ref = max(relative_distance(r, want, scale) for r in ref)
        allowed = max(NOISE_FACTOR * d_ref, FLOOR)
        if not d_fs <= allowed:
            bad.append(f"{v.path}: update differs from TF's by {d_fs:.3g} (normwise, "
                       f"relative), the references' by {d_ref:.3g}; allowed {allowed:.3g}")
    return bad


def mismatched_losses(tf_run: Trained, refs: Sequence[Trained], fs_run: Trained,
                      rounded_to=None) -> List[str]:
    """Step k's loss against the reference's largest loss difference in steps
    up to k: the first is a forward pass from identical weights, the later ones
    inherit the updates' differences, which grow from step to step.
    `rounded_to` (a NumPy float type): the values were rounded to it (Keras'
    history holds float32 averages), so one rounding of it always passes: a
    reference can land on TF's very value where a difference of a tenth of
    its spacing rounds to the neighbouring one."""
    bad, noise = [], 0.0
    ref_losses = list(zip(*(r.losses for r in refs)))
    for step, (want, ref, got) in enumerate(zip(tf_run.losses, ref_losses, fs_run.losses)):
        noise = max([noise] + [abs(r - want) for r in ref])
        allowed = max(NOISE_FACTOR * noise, FLOOR * abs(want),
                      0.0 if rounded_to is None else float(np.spacing(rounded_to(want))))
        if not abs(got - want) <= allowed:
            bad.append(f"loss of step {step}: {got!r} where TF has {want!r} (references "
                       f"{list(ref)!r}; allowed difference {allowed:.3g})")
    return bad


def mismatched_outputs(tf_out: Sequence, refs: Sequence[Sequence], fs_out: Sequence
                       ) -> List[str]:
    """Outputs whose largest difference from TF's, relative to the output's
    largest magnitude, passes NOISE_FACTOR times the references'; NaN and Inf
    where TF has them."""
    bad = []
    as_array = lambda t: np.asarray(t.numpy() if hasattr(t, "numpy") else t, np.float64)  # noqa: E731
    for i, (want, got) in enumerate(zip(tf_out, fs_out)):
        want, got = as_array(want), as_array(got)
        ref_outputs = [as_array(r[i]) for r in refs]
        if want.shape != got.shape:
            bad.append(f"output {i}: shape {got.shape} where TF has {want.shape}")
            continue
        if not (np.array_equal(np.isnan(got), np.isnan(want))
                and np.array_equal(got[np.isinf(want)], want[np.isinf(want)])):
            bad.append(f"output {i}: NaN or Inf where TF has none, or the reverse")
            continue
        finite = np.isfinite(want)
        scale = float(np.max(np.abs(want[finite]), initial=0.0))
        e_fs = float(np.max(np.abs(got - want)[finite], initial=0.0)) / max(scale, 1e-30)
        e_ref = max(float(np.max(np.abs(ref - want)[finite], initial=0.0))
                    for ref in ref_outputs) / max(scale, 1e-30)
        allowed = max(NOISE_FACTOR * e_ref, FLOOR)
        if not e_fs <= allowed:
            bad.append(f"output {i}: differs from TF's by {e_fs:.3g} of its largest "
                       f"magnitude, the references by {e_ref:.3g}; allowed {allowed:.3g}")
    return bad


def flat_outputs(outputs) -> List[tf.Tensor]:
    return [t for t in tf.nest.flatten(outputs) if isinstance(t, tf.Tensor)]


def unexplained_unfused(report) -> list:
    """Where a trace fused nothing, its unfused ops that TF's remapper does
    not take into its own kernels (nothing fused is fine only where TF fuses
    everything itself); [] where the trace fused something."""
    if report.fused_clusters:
        return []
    return [u for u in report.unfused_ops
            if not u[2].startswith(remapper_epilogues.LEFT_TO_REMAPPER)]


def unnamed_fallbacks(reports, known: Dict[str, str]) -> List[str]:
    """Fallbacks (and whole-trace failures) whose reason no entry of `known`
    ({reason text: why it is expected}) names."""
    bad = []
    for report in reports:
        for cluster in report.fallbacks:
            if not any(text in cluster.reason for text in known):
                bad.append(f"{report.function}: {cluster.name}: {cluster.reason}")
    return bad
