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

import functools
import hashlib
import inspect
import json
import pathlib
import re
import threading
import time
import warnings
from typing import List, Optional, Tuple

import tensorflow as tf

from tf_fusionstitch import (background, graph_check, kernels, measured_choice,
                             rewrite_cache, trace_names)
from tf_fusionstitch.options import FusionOptions
from tf_fusionstitch.report import Report
from tf_fusionstitch.rewriters import (cpu_cost_model, cpu_costs, decided_shapes,
                                       function_bodies, grappler, shapes)
from tf_fusionstitch.rewriters.fusion_pass import run_fusion_pass
from tf_fusionstitch.rewriters.graph_view import parse_input, tensor_name
from tf_fusionstitch.runtime import cache, cpu_compiler
from tf_fusionstitch.versions import Version, Versions, call_sizes

class OptimizedFunction:
    """Callable like the original; `.report()` and `.graph_def` show the rewrite."""

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
        self._traced_leaves: Optional[int] = None   # how many leaves a trace flattened
        self._background = background.BackgroundRewrite() if options.background else None

    def __call__(self, *args, **kwargs):
        if self._background is not None:
            if not self._background.pending(lambda: self.prepare(*args, **kwargs)):
                self._background = None   # ready: calls take the usual path from now on
            elif not (tf.inside_function() or _symbolic(args, kwargs)):
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
        """One call of `version`, or of the original while a measured choice
        (measured_choice.py) is timing the two or has kept the original."""
        choice = getattr(version, "choice", None)
        if choice is None or _symbolic(args, kwargs):   # inside another function: untimed
            return version.fn(*args, **kwargs)
        decided = choice.choice is not None
        contender = choice.next_contender()
        fn = version.fn if contender == measured_choice.FUSED else self._original
        if decided:
            return fn(*args, **kwargs)
        start = choice.clock()
        result = fn(*args, **kwargs)
        choice.record(contender, choice.clock() - start)
        if choice.choice is not None and version.report is not None:
            version.report.choice = choice.summary()
        return result

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

    # -- tracing -----------------------------------------------------------
    def _make_function(self, version: Version):
        """The tf.function whose traces rewrite under `version`'s assumptions."""
        calls = self._options.measured_choice
        version.choice = measured_choice.MeasuredChoice(calls) if calls else None
        if self._python_fn is None:
            def trace_concrete(*flat_args):
                return self._run_rewritten(version, self._original, list(flat_args))
            return tf.function(trace_concrete, input_signature=self._flat_signature,
                               autograph=False)

        # The wrapper takes the original's parameters, so keyword calls bind
        # as they would on the original tf.function.
        def trace(*args, **kwargs):
            concrete = self._original.get_concrete_function(*args, **kwargs)
            return self._run_rewritten(version, concrete, self._leaves(args, kwargs))
        trace.__signature__ = inspect.signature(self._python_fn)
        return tf.function(
            trace, input_signature=self._original.input_signature, autograph=False,
            reduce_retracing=bool(getattr(self._original, "_reduce_retracing", False)))

    def _arguments(self, args, kwargs) -> list:
        """The arguments in parameter order, defaults filled in and *args
        spread (so an input signature's specs line up with the first ones);
        raises TypeError where they do not bind."""
        if self._python_fn is None:
            return list(args)
        parameters = inspect.signature(self._python_fn)
        bound = parameters.bind(*args, **kwargs)
        bound.apply_defaults()
        values = []
        for name, value in bound.arguments.items():
            spread = parameters.parameters[name].kind == inspect.Parameter.VAR_POSITIONAL
            values.extend(value if spread else [value])
        return values

    def _leaves(self, args, kwargs) -> list:
        """The arguments flattened as a trace flattens them (tensors there)."""
        try:
            return tf.nest.flatten(self._arguments(args, kwargs), expand_composites=True)
        except TypeError:
            return []   # the call itself will raise TF's error

    def _call_sizes(self, args, kwargs):
        """The call's sizes per traced leaf (versions.py). With an input
        signature, an argument in a spec's place is one leaf however it is
        nested (a list TF converts to one tensor); a call that does not line
        up with the traces' leaves has no known sizes."""
        signature = None if self._python_fn is None else self._original.input_signature
        if signature is None:
            leaves = self._leaves(args, kwargs)
        else:
            try:
                values = self._arguments(args, kwargs)
                leaves = _flatten_like(list(signature), values[:len(signature)])
                leaves += tf.nest.flatten(values[len(signature):], expand_composites=True)
            except (TypeError, ValueError):
                leaves = []
        if self._traced_leaves is not None and len(leaves) != self._traced_leaves:
            leaves = [None] * self._traced_leaves
        return call_sizes(leaves)

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
            inputs = _InputSizes(graph.inputs[:n_args], feed_leaves, version)
            rewritten, output_names, report = self._rewrite(concrete, inputs)
            graph_check.check_runnable(rewritten, output_names)
            # Grappler's specialised functions and rewritten bodies are new to
            # the runtime: an imported library is not registered by the import.
            function_bodies.register_functions(rewritten)
            input_map = _input_map(concrete, n_args, feeds, rewritten)
            results = tf.graph_util.import_graph_def(
                rewritten, input_map=input_map, return_elements=output_names, name="fs")
        except Exception as e:  # noqa: BLE001  (our failure: the trace runs the original)
            reason = _one_line(e)
            report = Report.failed(self._name, _signature_text(concrete),
                                   self._options.fusion, reason,
                                   time.perf_counter() - start)
            self._record(version, report, None, set(), set())
            return self._fallback(concrete, feeds, f"the rewrite failed ({reason}); "
                                  "please report this as a tf_fusionstitch bug")
        self._record(version, report, rewritten, inputs.leaf_pairs(report.assumed_equal),
                     inputs.leaf_pairs(report.equal_sizes_wanted))
        flat, it = [], iter(results)
        for leaf in tf.nest.flatten(concrete.structured_outputs, expand_composites=True):
            flat.append(next(it) if isinstance(leaf, tf.Tensor) else leaf)
        return tf.nest.pack_sequence_as(concrete.structured_outputs, flat,
                                        expand_composites=True)

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

    def _rewrite(self, concrete, inputs: "_InputSizes"):
        start = time.perf_counter()
        compilations = cpu_compiler.compilations
        graph = concrete.graph
        graph_def = graph.as_graph_def()
        outputs = [t.name for t in concrete.outputs]
        control = [op.name for op in graph.control_outputs]
        # (dtype, shape) per tensor; TensorSpecs, 5x dearer, only if we rewrite
        known = {t.name: (t.dtype, t.shape) for op in graph.get_operations() for t in op.outputs}
        costs, costs_source = None, self._options.costs
        if self._options.fusion == "explore":
            costs, costs_source = (cpu_costs.for_this_machine() if costs_source == "calibrated"
                                   else (dict(cpu_cost_model.BUILTIN), costs_source))
        key, names = None, None
        if self._options.rewrite_cache:
            names = trace_names.TraceNames(graph_def)
            options = self._options.cache_key()
            if costs is not None:  # the plan depends on the values, not the option's name
                options["costs"] = json.dumps(costs, sort_keys=True)
            options["equal_sizes"] = inputs.classes
            key = rewrite_cache.make_key(
                names.canonical(graph_def).SerializeToString(deterministic=True), outputs,
                control,
                "\n".join(f"{name} {dtype.name} {shape}"
                          for name, (dtype, shape) in sorted(known.items())),
                options, f"{tf.__version__} {tf.version.GIT_VERSION}")
            entry = rewrite_cache.load(key, self._register,
                                       timeout=self._options.compile_timeout,
                                       restore=names.specific)
            if entry is not None:
                report = entry.report
                report.function, report.signature = self._name, _signature_text(concrete)
                report.cache_hit = True
                report.rewrite_seconds = time.perf_counter() - start
                return entry.graph_def, entry.output_names, report
        if self._options.grappler:
            graph_def = grappler.run_grappler(graph_def, graph, outputs + control)
        hints = {name: tf.TensorSpec(shape, dtype) for name, (dtype, shape) in known.items()}
        types = shapes.infer_types(graph_def, hints)
        equalities = decided_shapes.InputEqualities(inputs.allowed)
        fetches = set()
        for name in outputs:
            src, port, _ = parse_input(name)
            fetches.add((src, port))
        result = run_fusion_pass(graph_def, types, fetches, self._build, self._options,
                                 costs, costs_source, equalities)
        output_names = []
        for name in outputs:
            src, port, _ = parse_input(name)
            mapped = result.tensor_map.get((src, port), tensor_name((src, port)))
            output_names.append(mapped if ":" in mapped else mapped + ":0")
        report = Report(
            function=self._name, signature=_signature_text(concrete),
            fusion=self._options.fusion, exploration=result.exploration,
            clusters=result.clusters, kernels_before=result.kernels_before,
            kernels_after=result.kernels_after, compile_seconds=result.compile_seconds,
            compilations=cpu_compiler.compilations - compilations,
            rewrite_seconds=time.perf_counter() - start, unfused_ops=result.unfused_ops,
            assumed_equal=_pair_list(equalities.assumed),
            equal_sizes_wanted=_pair_list(equalities.wanted))
        # A plan with a fallback or a split pack may owe it to a passing
        # failure (a compiler's timeout): it is not cached.
        if key is not None and not report.fallbacks and not report.split_packs \
                and names.portable(result.graph_def):
            try:
                rewrite_cache.store(key, names.canonical(result.graph_def), output_names,
                                    report)
            except (cache.CacheError, OSError):
                pass  # a plan not cached is only a slower next trace
            report.rewrite_seconds = time.perf_counter() - start
        if report.fallbacks:
            first = report.fallbacks[0]
            warnings.warn(f"tf_fusionstitch: {len(report.fallbacks)} cluster(s) of "
                          f"{self._name} stay as TensorFlow ops (first: {first.reason}); "
                          "see .report()", RuntimeWarning, stacklevel=4)
        return result.graph_def, output_names, report

    def _build(self, clusters):
        """A registered kernel, or the exception that stopped it, per cluster;
        the missing kernels are compiled several to a compiler run."""
        from tf_fusionstitch.custom_ops import loader  # noqa: F401  (builds the op library once)
        built = kernels.build_cpu_kernels(clusters, timeout=self._options.compile_timeout)
        for i, kernel in enumerate(built):
            if not isinstance(kernel, Exception):
                try:
                    self._register(kernel)
                except Exception as e:  # noqa: BLE001  (that cluster stays TF ops)
                    built[i] = e
        return built

    @staticmethod
    def _register(kernel):
        from tf_fusionstitch.custom_ops import loader  # noqa: F401  (builds the op library once)
        loader.register_kernel(kernel.key, kernel.path, kernel.spec, kernel.symbol)


def _input_map(concrete, n_args: int, feeds, rewritten) -> dict:
    """The rewritten graph's inputs mapped to this trace's tensors: the
    arguments, and captures that the rewrite still reads. A captured eager
    constant appears in the traced GraphDef as a Const that Grappler may fold
    away (and import_graph_def refuses a mapping to a node that is gone); it
    carries its value, so nothing is lost."""
    graph = concrete.graph
    present = {node.name for node in rewritten.node}
    input_map = {t.name: f for t, f in zip(graph.inputs[:n_args], feeds)}
    for placeholder, captured in zip(graph.inputs[n_args:], concrete.captured_inputs):
        if placeholder.op.name in present:
            input_map[placeholder.name] = tf.identity(captured)
    return input_map


def _one_line(exc: BaseException) -> str:
    """An exception as one line for a report: its type and first line, shortened."""
    text = str(exc).strip().splitlines()
    first = re.sub(r"\s+", " ", text[0]) if text else ""
    return f"{type(exc).__name__}: {first}"[:500]


class _InputSizes:
    """A trace's view of its version: the graph's inputs' unknown sizes,
    named (Placeholder, axis) in the rewrite and (leaf, axis) in versions.py."""

    def __init__(self, graph_inputs, feed_leaves: List[int], version: Version):
        self._leaf_of = {t.op.name: leaf for t, leaf in zip(graph_inputs, feed_leaves)}
        self._name_of = {leaf: name for name, leaf in self._leaf_of.items()}
        unknown = [(leaf, axis) for t, leaf in zip(graph_inputs, feed_leaves)
                   if t.shape.rank is not None
                   for axis, size in enumerate(t.shape) if size is None]
        # Classes of input sizes (Placeholder, axis) this trace may take as equal.
        self.classes = [[(self._name_of[leaf], axis) for leaf, axis in group]
                        for group in version.equal_classes(unknown)]
        self._class_of = {d: i for i, group in enumerate(self.classes) for d in group}

    def allowed(self, pair) -> bool:
        a, b = (self._class_of.get(tuple(d)) for d in pair)
        return a is not None and a == b

    def leaf_pairs(self, pairs) -> set:
        """(name, axis, name, axis) pairs as versions.py's sorted leaf pairs;
        pairs naming something other than an argument (a capture) are left out."""
        out = set()
        for a_name, a_axis, b_name, b_axis in pairs:
            if a_name in self._leaf_of and b_name in self._leaf_of:
                a, b = (self._leaf_of[a_name], a_axis), (self._leaf_of[b_name], b_axis)
                out.add((min(a, b), max(a, b)))
        return out


def _flatten_like(structure, value) -> list:
    """`value` flattened to the leaves of `structure` (an input signature):
    one value per TensorSpec, a composite's components per other spec.
    Raises ValueError where the two do not line up."""
    if isinstance(structure, tf.TensorSpec):
        return [value]
    if isinstance(structure, tf.TypeSpec):
        components = tf.nest.flatten(value, expand_composites=True)
        if len(components) != len(tf.nest.flatten(structure, expand_composites=True)):
            raise ValueError("a composite argument does not match its spec")
        return components
    if isinstance(structure, dict):
        if not isinstance(value, dict) or set(value) != set(structure):
            raise ValueError("a dict argument does not match its spec")
        return [leaf for key in sorted(structure)
                for leaf in _flatten_like(structure[key], value[key])]
    if isinstance(structure, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(structure):
            raise ValueError("a sequence argument does not match its spec")
        return [leaf for s, v in zip(structure, value) for leaf in _flatten_like(s, v)]
    raise ValueError(f"an input signature entry of type {type(structure).__name__}")


def _symbolic(args, kwargs) -> bool:
    """Whether the call is being traced into another function (its time then
    says nothing about either contender)."""
    return any(isinstance(x, tf.Tensor) and tf.is_symbolic_tensor(x)
               for x in tf.nest.flatten((args, kwargs), expand_composites=True))


def _pair_list(pairs) -> List[Tuple[str, int, str, int]]:
    return sorted((a[0], a[1], b[0], b[1]) for a, b in pairs)


def _file_stem(name: str) -> str:
    """A function name as a safe file-name part."""
    return re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")[:40] or "function"


def _signature_text(concrete) -> str:
    specs = [f"{t.dtype.name}{t.shape}" for t in concrete.graph.inputs
             if t.dtype != tf.resource]
    return "(" + ", ".join(specs) + ")"


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
    "builtin"; rewriters/cpu_costs.py); pack (bool, default True; fusion="stitch"
    or "explore"): kernels that no path connects share one launch;
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
