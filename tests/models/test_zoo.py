"""`tf_fusionstitch.optimize` on the model zoo (benchmarks/zoo/): third-party
keras.applications CNNs and keras_hub backbones at tiny sizes.

For every model, with the default options:
- inference at two batch sizes (and two sequence lengths for text models)
  matches TF;
- three optimized train steps from the same initial weights give TF's losses
  and weight updates;
both within the noise floor of two references, XLA (where it draws the same
dropout masks; for dropout models TF from weights one float32 rounding apart)
and the model's more precise twin (float64, or float32 for mixed_bfloat16
models): tests/zoo_testlib.py says why both and how much. The floor is the
largest reference's, so it only grows with references: the twin is measured
first and XLA only where a comparison misses the twin's floor, the verdict
both give at a fraction of the cost (XLA's compile is a quarter of a large
CNN's test). Where a plan's train steps miss that floor, TF's own runs from
weights one rounding apart join the references, since a step through max
pooling is not smooth where a window's two largest inputs are within
rounding (zoo_testlib: non-smooth steps);
- nothing raised, no trace fell back to the original function, no cluster
  fell back except those KNOWN_FALLBACKS names with their reason, and the
  rewrite fused something;
- the train step imports into the distributed planner's IR with an axis rule
  for every op that binds an axis (tests/planner/test_planner_import_coverage.py
  checks the models that exercise each of the importer's features).

For the models CUDA_EMULATED lists, inference and the train steps also run
with target="cuda-emulated": every kernel is its cluster's CUDA schedule
(index math, barriers, warp shuffles) emulated in C++ inside the same op,
against the same references. A subset, to keep `make test` under 30 minutes:
every text model and the CNNs of each kind of block (inverted residuals,
squeeze-and-excitation, residual, separable and plain convolutions).

For every model, every cluster the GPU target's rewrite builds (inference and
train step; rewritten without running for the models outside CUDA_EMULATED)
compiles with NVRTC for sm_80 and sm_90, without spills, and its emulated CUDA
schedule agrees with its CPU kernel, as `cuda_check --clusters` checks
exported specs, except where tests/cuda_clusters_testlib.py names the cause
(KNOWN_SPILLS, KNOWN_MISMATCHES). Each
distinct cluster is checked once per session, by the first model that has it.

The comparison catches a plan that is slightly wrong: one fused op of a train
step off by a relative 1e-5 fails it (PerturbedPlanTest).

With TF_FUSIONSTITCH_ZOO_EXTRA=1, ZooTest also checks the models outside the zoo
(zoo.EXTRA_NAMES: more keras_hub backbones and keras.applications CNNs), on demand:
  TF_FUSIONSTITCH_ZOO_EXTRA=1 .venv/bin/python -m pytest tests/models/test_zoo.py \
      -k "ZooTest and (falcon or deit)"
"""

import contextlib
import dataclasses
import json
import os
import warnings
from typing import Optional

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import tf_fusionstitch as fs
from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import trace_rewrite
from tf_fusionstitch.planner import op_rules
import cuda_clusters_testlib as ctl
import planner_zoo
import zoo_testlib as zt

from benchmarks import zoo  # the repository root (pyproject.toml's pytest pythonpath)

_SEED = 5
CHECKED = zoo.NAMES + (zoo.EXTRA_NAMES if os.environ.get("TF_FUSIONSTITCH_ZOO_EXTRA") == "1"
                       else ())
# {reason text: why the fallback is expected}. Empty: no cluster of any zoo
# model may stay as TF ops.
KNOWN_FALLBACKS = {}
# TF runs from weights one rounding apart that measure a non-smooth step's
# floor. On Xception's, 3 of 6 seeds crossed the max-pool kink a plan crossed.
ROUNDING_APART_RUNS = 8
CUDA_EMULATED = {"mobilenet_v2", "efficientnet_b0", "resnet50_v2", "xception", "vgg16",
                 *zoo.text.ENTRIES}
KNOWN_CUDA_FALLBACKS = {
    "segment sums have no GPU kernel yet": "an embedding's sparse gradient summed per "
                                           "row (codegen/scatter.py has only a CPU kernel)",
}


def _quiet_calls(fn, calls):
    """Runs `fn` on each argument tuple, recording tf_fusionstitch's warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        results = [fn(*args) for args in calls]
    return results, [str(w.message) for w in caught if "tf_fusionstitch" in str(w.message)]


@dataclasses.dataclass
class TrainReferences:
    """TF's three train steps of a model and the references that set their
    noise floor, from the model's initial weights. A reference only raises
    the floor (the largest distance counts), so a plan within the floor of
    the cheaper ones is within that of all: the dearer ones (XLA's compile,
    a quarter of NASNetMobile's test) run only where a comparison needs them,
    and every verdict is the one all of them give."""
    variables: list
    weights: list
    initial: list
    batches: list
    tf_run: "zt.Trained"
    refs: list                       # measured so far, cheapest first
    pending: list                    # the others, callables in order of cost
    rounding_apart: Optional[list] = None   # rounding_apart_runs(), once measured

    def widen(self) -> bool:
        """Measures the next pending reference from the initial weights (and
        restores them after); False where none is left."""
        if not self.pending:
            return False
        zt.restore(self.variables, self.initial)
        self.refs.append(self.pending.pop(0)())
        zt.restore(self.variables, self.initial)
        return True


def rounding_apart_runs(model, references) -> list:
    """TF's ROUNDING_APART_RUNS runs from weights one float32 rounding apart
    (measured once per set of references; restores the initial weights
    after): the floor of a step that is not smooth at float32 noise
    (zoo_testlib's docstring)."""
    r = references
    if r.rounding_apart is None:
        r.rounding_apart = [zt.perturbed_train_steps(model, r.batches, r.initial, _SEED + 10 + k)
                            for k in range(ROUNDING_APART_RUNS)]
        zt.restore(r.variables, r.initial)
    return r.rounding_apart


def train_references(model, twin):
    """TF's run, and `twin`'s and XLA's (without active dropout; TF's from
    weights one rounding apart with it) as the noise floor, the second only
    when a comparison needs it."""
    variables = list(model.model.variables) + list(model.optimizer.variables)
    weights = list(model.model.variables)
    initial = zt.snapshot(variables)
    batches = zt.train_batches(model, _SEED + 1)
    tf_run = zt.run_steps(model.train_step, model, batches)
    zt.restore(variables, initial)
    refs = [zt.twin_train_steps(twin, batches)]
    if not model.dropout:
        def second():
            return zt.run_steps(zt.xla_function(model.train_step), model, batches)
    else:
        def second():
            return zt.perturbed_train_steps(model, batches, initial, _SEED + 2)
    return TrainReferences(variables, weights, initial, batches, tf_run, refs, [second])


def optimized_comparison(model, references, options=None):
    """Mismatch lines of three optimized train steps of `model`, from the
    initial weights, against TF's within the references' noise floor; the
    warnings; and the OptimizedFunction."""
    r = references
    zt.restore(r.variables, r.initial)
    opt = fs.optimize(model.train_step, **(options or {}))
    losses, warned = _quiet_calls(opt, [b.inputs + (b.labels,) for b in r.batches])
    fs_run = zt.Trained([float(x) for x in losses], zt.snapshot(r.weights))
    iterations = int(model.optimizer.iterations)

    def mismatched(refs):
        return (zt.mismatched_losses(r.tf_run, refs, fs_run)
                + zt.mismatched_updates(r.weights, r.initial[:len(r.weights)], r.tf_run,
                                        refs, fs_run))
    mismatches = mismatched(r.refs)
    while mismatches and r.widen():
        mismatches = mismatched(r.refs)
    if mismatches:   # is the step smooth at float32 noise? TF's own runs say
        mismatches = mismatched(r.refs + rounding_apart_runs(model, r))
        if not mismatches:
            print(f"{model.name}: within the floor of TF's runs from weights one rounding "
                  f"apart, not of the smooth references (zoo_testlib: non-smooth steps)")
    if iterations != zt.STEPS:
        mismatches.append(f"the optimizer ran {iterations} steps")
    return mismatches, warned, opt


class ZooTest(tf.test.TestCase, parameterized.TestCase):

    def _check_reports(self, opt, what, known=KNOWN_FALLBACKS):
        reports = opt.reports()
        self.assertNotEmpty(reports, f"{what}: never traced")
        for report in reports:
            self.assertEqual(report.failure, "", f"{what}: the rewrite failed")
        self.assertEqual(zt.unnamed_fallbacks(reports, known), [], what)
        self.assertEmpty(zt.unexplained_unfused(reports[-1]),
                         f"{what}: nothing fused\n{reports[-1]}")

    def _check_inference(self, model, twin, targets, optimized):
        shapes, batches = _inference_batches(model)
        want = [zt.flat_outputs(model.inference(*b)) for b in batches]
        # The twin's outputs, then XLA's where a comparison needs them (as
        # TrainReferences: the floor only grows with references).
        xla = None

        def xla_outputs(batch):
            nonlocal xla
            if xla is None:
                xla = zt.xla_function(model.inference)
            return zt.flat_outputs(xla(*batch))
        makers = [lambda batch: zt.twin_outputs(twin, batch), xla_outputs]
        refs = [[makers[0](b)] for b in batches]
        for target in targets:
            opt = optimized[target, "inference"] = fs.optimize(model.inference, target=target)
            got, warned = _quiet_calls(opt, batches)
            for shape, batch, w, r, g in zip(shapes, batches, want, refs, got):
                mismatches = zt.mismatched_outputs(w, r, zt.flat_outputs(g))
                while mismatches and len(r) < len(makers):
                    r.append(makers[len(r)](batch))
                    mismatches = zt.mismatched_outputs(w, r, zt.flat_outputs(g))
                self.assertEqual(mismatches, [], f"{target} inference at (batch, seq) {shape}")
            self._check_reports(opt, f"{target} inference", _known_fallbacks(target))
            if target == "cpu":   # the GPU target's named fallbacks warn
                self.assertEqual(warned, [], "inference warned")

    @parameterized.named_parameters((name, name) for name in CHECKED)
    def test_matches_tf(self, name):
        model = zoo.build(name, "tiny", seed=_SEED)
        twin = zt.build_twin(model, name, _SEED)
        targets = ["cpu"] + (["cuda-emulated"] if name in CUDA_EMULATED else [])
        optimized = {}   # (target, "inference" or "train step"): OptimizedFunction
        with self.subTest("inference"):
            self._check_inference(model, twin, targets, optimized)
        with self.subTest("train steps"):
            references = train_references(model, twin)
            for target in targets:
                mismatches, warned, opt = optimized_comparison(model, references,
                                                               {"target": target})
                optimized[target, "train step"] = opt
                self.assertEqual(mismatches, [], f"{target} train steps "
                                 f"({zt.twin_policy(model)} twin"
                                 + (")" if model.dropout else " and XLA)"))
                self._check_reports(opt, f"{target} train step", _known_fallbacks(target))
                if target == "cpu":
                    self.assertEqual(warned, [], "train step warned")
        with self.subTest("planner import"):
            # The planner's IR of the same train step has an axis rule for every op that
            # binds an axis (checked here, where the model is built anyway).
            graph = planner_zoo.train_step_graph(model)
            self.assertEqual(op_rules.conservative_ops(graph), {}, "ops on the conservative rule")
        with self.subTest("CUDA clusters"):
            self._check_cuda_clusters(model, optimized)

    def _check_cuda_clusters(self, model, optimized):
        """Every cluster the GPU target builds for the model's inference and
        train step compiles with NVRTC for sm_80 and sm_90 without spills
        (but those cuda_clusters_testlib.KNOWN_SPILLS names), and its emulated
        CUDA schedule agrees with its CPU kernel. A model outside
        CUDA_EMULATED is only rewritten for the GPU target here, not run; a
        cluster another model's test passed in this session is not checked
        again."""
        reason = ctl.unavailable()
        if reason:
            self.skipTest(reason)
        specs = {}
        for what in ("inference", "train step"):
            opt = optimized.get(("cuda-emulated", what))
            if opt is None:
                opt = _gpu_rewrite(model, what)
                self._check_reports(opt, f"cuda-emulated {what}", _known_fallbacks("cuda-emulated"))
            for path in opt.export_clusters(self.get_temp_dir() + "/" + what.replace(" ", "_")):
                specs.setdefault(path.read_text(), path.stem)
        record = ctl.session_record()
        clusters = record.unchecked({n: ir.Cluster.from_json(t) for t, n in specs.items()})
        failed = ctl.problems(clusters)
        record.passed({n: c for n, c in clusters.items() if n not in failed})
        self.assertEqual(failed, {}, f"{len(failed)} of {len(clusters)} clusters failed "
                         f"({len(specs)} in all):\n"
                         + "\n".join(line for lines in failed.values() for line in lines))


def _inference_batches(model):
    """The (batch, sequence length) shapes inference is checked at, and a batch of each."""
    shapes = ([(2, 12), (3, 16)] if model.family == "text" else [(2, None), (3, None)])
    gen = np.random.default_rng(_SEED)
    return shapes, [model.make_batch(gen, batch, seq).inputs for batch, seq in shapes]


def _gpu_rewrite(model, what):
    """`what` ("inference" or "train step") of `model` rewritten for the GPU
    target as the checks' calls would (same shapes), without running it."""
    if what == "inference":
        opt = fs.optimize(model.inference, target="cuda-emulated")
        for batch in _inference_batches(model)[1]:
            opt.prepare(*batch)
        return opt
    opt = fs.optimize(model.train_step, target="cuda-emulated")
    batch = zt.train_batches(model, _SEED + 1)[0]
    opt.prepare(*batch.inputs, batch.labels)
    return opt


def _known_fallbacks(target):
    return KNOWN_FALLBACKS if target == "cpu" else {**KNOWN_FALLBACKS, **KNOWN_CUDA_FALLBACKS}


def _forward_reduction(model, cluster):
    """A kernel of the forward pass that reduces (a normalization's statistics)."""
    return (any(t in ("Mean", "Sum") for _, t in cluster.tf_ops)
            and not any("gradient" in n or n.startswith(model.optimizer.name)
                        for n, _ in cluster.tf_ops))


def _optimizer_update(model, cluster):
    """A kernel of the optimizer's update of the weights (not a sparse
    gradient's segment sum)."""
    return (cluster.name.startswith(model.optimizer.name + "/")
            and not any(t == "UnsortedSegmentSum" for _, t in cluster.tf_ops))


KERNELS = {"forward reduction": _forward_reduction, "optimizer update": _optimizer_update}


@contextlib.contextmanager
def one_kernel_perturbed(model, choose, relative):
    """Rewrites multiply every float32 output of one FusionStitch kernel, the
    first the report lists that `choose(model, cluster)` accepts, by
    1 + relative. Yields the names of the kernels perturbed."""
    original = trace_rewrite.rewrite
    perturbed = []

    def rewrite(concrete, inputs, options, name):
        graph_def, outputs, report = original(concrete, inputs, options, name)
        cluster = next(c for c in report.fused_clusters if choose(model, c))
        node = next(n for n in graph_def.node if n.name == cluster.name)
        spec = json.loads(node.attr["spec"].s)
        types = {i["name"]: i["type"] for i in spec["inputs"]}
        types.update({o["name"]: o["type"] for o in spec["ops"]})
        for port, name in enumerate(spec["outputs"]):
            if types[name]["dtype"] != "float32":
                continue
            source = f"{node.name}:{port}"
            factor = graph_def.node.add(name=f"{node.name}/perturbation_{port}", op="Const")
            factor.attr["dtype"].type = tf.float32.as_datatype_enum
            factor.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(
                np.float32(1.0 + relative)))
            mul = graph_def.node.add(name=f"{node.name}/perturbed_{port}", op="Mul",
                                     input=[source, factor.name])
            mul.attr["T"].type = tf.float32.as_datatype_enum
            readers = {source} | ({node.name} if port == 0 else set())
            for n in graph_def.node:
                if n is not mul:
                    n.input[:] = [mul.name if i in readers else i for i in n.input]
        perturbed.append(node.name)
        return graph_def, outputs, report
    trace_rewrite.rewrite = rewrite
    try:
        yield perturbed
    finally:
        trace_rewrite.rewrite = original


class PerturbedPlanTest(tf.test.TestCase, parameterized.TestCase):
    """The train-step comparison is tight enough to see one fused kernel whose
    results are off by a relative 1e-5, a forward normalization's or the
    optimizer's update, on well-conditioned models. Not everywhere: a kernel
    whose outputs only scale a gradient uniformly cannot be seen (Adam's step
    does not change when its gradient is scaled), and the tiny batch-norm CNNs
    train too chaotically (their references differ from TF by 1e-4 to 1e-2)."""

    @parameterized.parameters("llama", "vit")
    def test_a_perturbed_kernel_fails_the_comparison(self, name):
        model = zoo.build(name, "tiny", seed=_SEED)
        references = train_references(model, zt.build_twin(model, name, _SEED))
        for kernel, choose in KERNELS.items():   # one set of references for both
            with self.subTest(kernel), one_kernel_perturbed(model, choose, 1e-5) as perturbed:
                mismatches, _, _ = optimized_comparison(model, references,
                                                        {"rewrite_cache": False})
                self.assertLen(perturbed, 1)
                self.assertNotEmpty(mismatches, f"perturbing {perturbed[0]} went unnoticed")


class TwinReferenceTest(tf.test.TestCase):
    """The twin alone runs without Grappler: TF's own run, XLA's and
    tf_fusionstitch's after it keep TF's default, even when the twin raised."""

    def test_grappler_is_off_only_inside(self):
        options = tf.config.optimizer.get_experimental_options
        self.assertFalse(options().get("disable_meta_optimizer", False))
        with zt.without_grappler():
            self.assertTrue(options()["disable_meta_optimizer"])
        self.assertFalse(options().get("disable_meta_optimizer", False))
        with self.assertRaises(ZeroDivisionError), zt.without_grappler():
            1 / 0
        self.assertFalse(options().get("disable_meta_optimizer", False))


class RegistryTest(tf.test.TestCase):

    def test_the_zoo_covers_what_users_bring(self):
        entries = {name: zoo.entry(name) for name in zoo.NAMES}
        self.assertGreaterEqual(len(zoo.vision.ENTRIES), 15)
        self.assertGreaterEqual(len([n for n in zoo.text.ENTRIES if n != "vit"]), 12)
        self.assertGreaterEqual(len({e.optimizer for e in entries.values()}), 6)
        self.assertGreaterEqual(sum(e.policy == "mixed_bfloat16" for e in entries.values()), 2)
        self.assertGreaterEqual(sum(bool(e.dropout) for e in entries.values()), 2)

    def test_inference_signatures_are_dynamic(self):
        for name in ("bert", "t5", "resnet50"):
            model = zoo.build(name, "tiny", seed=0)
            for spec in model.input_specs:
                self.assertIsNone(spec.shape[0], f"{name}: batch is static")
                if model.family == "text":
                    self.assertIsNone(spec.shape[1], f"{name}: sequence length is static")

    def test_unknown_names_fail_with_the_known_ones(self):
        with self.assertRaisesRegex(ValueError, "known: mobilenet"):
            zoo.build("alexnet")
        with self.assertRaisesRegex(ValueError, "size must be one of"):
            zoo.build("bert", "huge")

    def test_models_outside_the_zoo_are_named_apart(self):
        self.assertEmpty(set(zoo.EXTRA_NAMES) & set(zoo.NAMES))
        self.assertEqual(zoo.unknown_names(["falcon", "bert"]), "")
        self.assertIn("outside the zoo", zoo.unknown_names(["alexnet"]))
        self.assertEqual(zoo.entry("falcon").constructor, "FalconBackbone")

    def test_two_builds_with_one_seed_are_identical(self):
        first, second = zoo.build("gpt2", "tiny", seed=3), zoo.build("gpt2", "tiny", seed=3)
        for a, b in zip(first.model.variables, second.model.variables):
            self.assertAllEqual(a, b)


if __name__ == "__main__":
    tf.test.main()
