"""`optimize`: a tf.function in, the same function with fused kernels out.

Each trace of the returned function traces the original (same input
signature rules as tf.function), runs Grappler's standard passes and the
fusion pass on its GraphDef, and imports the result into the new function's
graph with the original arguments and captured variables mapped in. Variables
are mapped by handle, so reads see later assignments and assignments still
happen in their original order (the GraphDef keeps its control edges).
Python runs only at trace time, except for a look at the arguments' sizes
where a version of the function assumes some of them equal (versions.py);
each call runs one TensorFlow function.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import pathlib
import re
import threading
import time
import warnings
from typing import List, Optional

from tf_fusionstitch import tensorflow_requirement

# Before TensorFlow loads: an unsupported or missing one fails here, saying what to install.
tensorflow_requirement.check()

import tensorflow as tf

from tf_fusionstitch import background, call_config, graph_check, measured_choice, \
    tensorboard_graph, trace_rewrite
from tf_fusionstitch.call_arguments import CallArguments, symbolic
from tf_fusionstitch.options import FusionOptions
from tf_fusionstitch.report import Report
from tf_fusionstitch.versions import Version, Versions


class OptimizedFunction(tf.__internal__.tracking.Trackable):
    """Callable like the original; `.report()` and `.graph_def` show the rewrite.

    Trackable so that `tf.saved_model.save` of a tf.Module holding one saves
    it: as its `__call__`, the version that assumes nothing about input sizes
    (the object loads back callable, its FusionStitch nodes built from their
    specs, tf_fusionstitch/spec_kernels.py)."""

    def __init__(self, fn, options: FusionOptions):
        self._original = fn
        self._options = options
        self._lock = threading.Lock()
        self._reports: List[Report] = []
        self._graph_def = None
        self._graph_defs = []
        if isinstance(fn, tf.types.experimental.ConcreteFunction):
            arg_specs = fn.structured_input_signature[0]
            self._flat_signature = [s for s in tf.nest.flatten(arg_specs, expand_composites=True)
                                    if isinstance(s, tf.TensorSpec)]
            self._python_fn = None
            name = getattr(fn, "name", "concrete_function")
        else:
            self._python_fn = fn.python_function
            name = getattr(fn, "__name__", "function")
            functools.update_wrapper(self, fn.python_function)
        self._name = name if isinstance(name, str) else name.decode()
        self._versions = Versions(self._make_function)
        self._arguments = CallArguments(
            self._python_fn, None if self._python_fn is None else fn.input_signature)
        self._traced_leaves: Optional[int] = None   # how many leaves a trace flattened
        self._background = background.BackgroundRewrite() if options.background else None
        # fusion="explore": XLA's rule plan of the same function, a contender
        # of each version's first calls (options.measured_plans).
        self._rules = OptimizedFunction(fn, dataclasses.replace(
            options, fusion="xla_like", measured_choice=0, measured_plans=0,
            background=False)) if options.fusion == "explore" and options.measured_plans else None

    def __call__(self, *args, **kwargs):
        if self._background is not None:
            if not self._background.pending(lambda: self.prepare(*args, **kwargs)):
                self._background = None   # ready: calls take the usual path from now on
            elif not (tf.inside_function() or symbolic(args, kwargs)):
                return self._original(*args, **kwargs)
            else:
                self._background.wait()   # an outer trace: build it with the optimized version
        if not self._options.specialize:
            return self._run(self._versions.generic, args, kwargs)
        version = self._versions.ready()
        if version is not None:
            return self._run(version, args, kwargs)
        sizes = self._call_sizes(args, kwargs)
        version = self._versions.pick(sizes)
        result = self._run(version, args, kwargs)
        self._versions.settle(version, sizes)
        return result

    def _run(self, version: Version, args, kwargs):
        """One call of `version`, or of another contender (the original, XLA's
        rule plan) while a measured choice (measured_choice.py) is timing
        them or has kept that one."""
        choice = getattr(version, "choice", None)
        if choice is None or symbolic(args, kwargs):   # inside another function: untimed
            return self._call_rewritten(version, args, kwargs)
        decided = choice.choice is not None
        contender = choice.next_contender()
        fn = {measured_choice.ORIGINAL: self._original,
              measured_choice.XLA_RULES: self._rules}.get(contender) or (
            lambda *a, **k: self._call_rewritten(version, a, k))
        if decided:
            return fn(*args, **kwargs)
        start = choice.clock()
        result = fn(*args, **kwargs)
        choice.record(contender, choice.clock() - start)
        if choice.choice is not None and version.report is not None:
            version.report.choice = choice.summary()
        return result

    @staticmethod
    def _call_rewritten(version: Version, args, kwargs):
        with call_config.rewritten_calls():   # TF's meta-optimizer: one round
            return version.fn(*args, **kwargs)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        if getattr(save_type, "value", save_type) != "savedmodel":
            return {}   # no state of its own: the original's variables are the module's
        return {"__call__": self._versions.generic.fn}

    def wait(self, timeout: Optional[float] = None) -> bool:
        """With optimize(..., background=True): waits until the rewrite the
        first call started has finished, so that calls run the optimized
        function; False if `timeout` seconds passed first. True at once
        when no rewrite is running (or background is off)."""
        return True if self._background is None else self._background.wait(timeout)

    def get_concrete_function(self, *args, **kwargs):
        """The concrete function of the version that assumes nothing about
        input sizes, so it is right for any arguments its signature takes."""
        return self._versions.generic.fn.get_concrete_function(*args, **kwargs)

    def prepare(self, *args, **kwargs) -> Optional[Report]:
        """Traces (rewrites) the version a call with these arguments would run,
        without running it, and returns the report of its latest trace (whose
        `failure` says why, when that trace could not be rewritten and runs
        the original)."""
        if self._rules is not None:   # a contender of the first calls: ready too
            self._rules.prepare(*args, **kwargs)
        if not self._options.specialize:
            version = self._versions.generic
            version.fn.get_concrete_function(*args, **kwargs)
            return version.report
        sizes = self._call_sizes(args, kwargs)
        version = self._versions.ready() or self._versions.pick(sizes)
        version.fn.get_concrete_function(*args, **kwargs)
        self._versions.settle(version, sizes)
        return version.report

    @property
    def graph_def(self):
        """The optimized GraphDef of the latest trace (None before the first call)."""
        return self._graph_def

    def report(self) -> Optional[Report]:
        """The latest trace's report (print it); `reports()` gives every trace's."""
        return self._reports[-1] if self._reports else None

    def reports(self) -> List[Report]:
        return list(self._reports)

    def export_clusters(self, directory) -> List[pathlib.Path]:
        """Writes the fusion spec of every FusionStitch kernel of every trace
        so far to `directory` as JSON (one file per distinct cluster, named
        by the function and a hash of the spec), for
        `python -m tf_fusionstitch.tools.cuda_check --clusters=...`.
        Returns the paths, in order of first appearance."""
        out_dir = pathlib.Path(directory)
        out_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            graph_defs = list(self._graph_defs)
        paths, seen = [], set()
        for graph_def in graph_defs:
            for node in graph_def.node:
                if node.op != "FusionStitch" or node.attr["spec"].s in seen:
                    continue
                spec = node.attr["spec"].s
                seen.add(spec)
                digest = hashlib.sha256(spec).hexdigest()[:10]
                path = out_dir / f"{_file_stem(self._name)}_{digest}.json"
                path.write_bytes(spec)
                paths.append(path)
        return paths

    def write_tensorboard(self, logdir) -> List[pathlib.Path]:
        """Writes the latest trace's optimized graph to `logdir` for
        TensorBoard's graph view (`tensorboard --logdir=...`), each fused
        kernel a name scope holding its FusionStitch node and the TF ops it
        replaced (tensorboard_graph.py). Returns the event files there."""
        with self._lock:
            graph_def = self._graph_def
        return tensorboard_graph.write(graph_def, self.report(), logdir)

    # -- tracing -----------------------------------------------------------
    def _make_function(self, version: Version):
        """The tf.function whose traces rewrite under `version`'s assumptions."""
        contenders = [measured_choice.FUSED]
        if self._rules is not None:
            contenders.append(measured_choice.XLA_RULES)
        if self._options.measured_choice:
            contenders.append(measured_choice.ORIGINAL)
        calls = max(self._options.measured_choice,
                    self._options.measured_plans if self._rules is not None else 0)
        version.choice = measured_choice.MeasuredChoice(calls, contenders=contenders) \
            if len(contenders) > 1 else None
        if self._python_fn is None:
            def trace_concrete(*flat_args):
                return self._run_rewritten(version, self._original, list(flat_args))
            return tf.function(trace_concrete, input_signature=self._flat_signature,
                               autograph=False)

        # The wrapper takes the original's parameters, so keyword calls bind
        # as they would on the original tf.function.
        def trace(*args, **kwargs):
            concrete = self._original.get_concrete_function(*args, **kwargs)
            return self._run_rewritten(version, concrete, self._arguments.leaves(args, kwargs))
        trace.__signature__ = inspect.signature(self._python_fn)
        return tf.function(
            trace, input_signature=self._original.input_signature, autograph=False,
            reduce_retracing=bool(getattr(self._original, "_reduce_retracing", False)))

    def _call_sizes(self, args, kwargs):
        return self._arguments.sizes(args, kwargs, self._traced_leaves)

    def _run_rewritten(self, version: Version, concrete, leaves):
        feeds, feed_leaves = [], []
        for position, x in enumerate(leaves):
            if isinstance(x, tf.Variable):
                x = x.handle
            if isinstance(x, tf.Tensor):
                # Eager values (a variable's handle, a tensor default) are
                # captured into this graph; import_graph_def needs graph tensors.
                feeds.append(x if tf.is_symbolic_tensor(x) else tf.identity(x))
                feed_leaves.append(position)
        self._traced_leaves = len(leaves)
        graph = concrete.graph
        n_args = len(graph.inputs) - len(concrete.captured_inputs)
        if len(feeds) != n_args:
            return self._fallback(concrete, feeds, "could not match the call's arguments "
                                  f"({len(feeds)}) to the traced inputs ({n_args})")
        start = time.perf_counter()
        try:
            inputs = trace_rewrite.InputSizes(graph.inputs[:n_args], feed_leaves, version)
            rewritten, output_names, report = trace_rewrite.rewrite(
                concrete, inputs, self._options, self._name)
            outputs = trace_rewrite.import_plan(concrete, n_args, feeds, rewritten, output_names)
        except Exception as e:  # noqa: BLE001  (our failure: the trace runs the original)
            reason = trace_rewrite.one_line(e)
            report = Report.failed(self._name, trace_rewrite.signature_text(concrete),
                                   self._options.fusion, reason,
                                   time.perf_counter() - start)
            self._record(version, report, None, set(), set())
            return self._fallback(concrete, feeds, f"the rewrite failed ({reason}); "
                                  "please report this as a tf_fusionstitch bug")
        self._record(version, report, rewritten, inputs.leaf_pairs(report.assumed_equal),
                     inputs.leaf_pairs(report.equal_sizes_wanted))
        if getattr(version, "choice", None) is not None:
            why = measured_choice.untimeable(graph_check.op_types(rewritten))
            if why:
                version.choice, report.choice = None, why
        return outputs

    def _record(self, version: Version, report: Report, rewritten, assumed, wanted) -> None:
        """Keeps one trace's report (and its GraphDef, when it was rewritten)."""
        self._versions.traced(version, assumed, wanted)
        version.report = report
        with self._lock:
            self._reports.append(report)
            if rewritten is not None:
                self._graph_def = rewritten
                self._graph_defs.append(rewritten)

    def _fallback(self, concrete, feeds, reason):
        warnings.warn(f"tf_fusionstitch: {self._name} runs unoptimized: {reason}",
                      RuntimeWarning, stacklevel=3)
        return concrete(*feeds)


def _file_stem(name: str) -> str:
    """A function name as a safe file-name part."""
    return re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")[:40] or "function"


def optimize(fn, **options) -> OptimizedFunction:
    """Returns `fn` with its memory-intensive ops fused into generated kernels.

    `fn` is a `tf.function` (with or without an input signature) or a
    ConcreteFunction. Options: min_cluster_ops (int, default 2), grappler
    (bool, default True), compile_timeout (seconds, default 120), fusion
    ("stitch", the default; "xla_like": XLA's fusion rules, to compare;
    "explore": plan exploration, rewriters/explore.py), explore_k (candidate
    patterns per op, default 3) and explore_beam (beam width, default 3),
    both for fusion="explore" only, as is costs ("calibrated", the default:
    the plan's costs measured on this machine once, then cached; or
    "builtin"; rewriters/cpu_costs.py) and explore_guard (bool, default True:
    keep a rule plan, stitch's or XLA's, where the plan model cannot tell the
    explored plan is faster, rewriters/plan_guard.py) and measured_plans (int,
    default 8: the first calls time the explored plan against XLA's rule plan,
    N calls each, rounded up to whole cycles, and keep the faster; 0: off);
    pack (bool, default True; fusion="stitch" or "explore"): kernels that no
    path connects share one launch;
    rewrite_cache (bool, default True): reuse the rewrite of an identical
    traced graph (same options, TensorFlow and tf_fusionstitch code) from the
    disk cache, tf_fusionstitch/rewrite_cache.py; measured_choice (int,
    default 0: keep the faster of fused and original by timing the first
    calls, tf_fusionstitch/measured_choice.py); background (bool, default
    False): the first calls run the original function while the rewrite
    compiles on a thread, tf_fusionstitch/background.py.
    """
    if not isinstance(fn, (tf.types.experimental.GenericFunction,
                           tf.types.experimental.ConcreteFunction)):
        hint = (" Wrap it first: tf_fusionstitch.optimize(tf.function(f))."
                if callable(fn) else "")
        raise TypeError(f"optimize() takes a tf.function or a ConcreteFunction, got "
                        f"{type(fn).__name__}.{hint}")
    if getattr(fn, "_jit_compile", None):
        raise ValueError("optimize() got a tf.function with jit_compile=True; XLA would "
                         "compile it as a whole. Pass the function without jit_compile.")
    return OptimizedFunction(fn, FusionOptions.from_call(**options))
