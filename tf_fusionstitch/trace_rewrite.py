"""The rewrite of one trace: the traced GraphDef to a plan, and the plan into the trace.

`rewrite` looks the trace up in the rewrite cache, else runs Grappler's
standard passes and the fusion pass (compiling and registering the kernels it
asks for) and reports what it did. `import_plan` checks that the plan can run
and imports it into the trace being built, with the trace's arguments and the
captures the plan still reads mapped in. api.OptimizedFunction decides when a
trace is rewritten and what runs when this fails.
"""

from __future__ import annotations

import json
import re
import time
import warnings
from typing import List, Tuple

import tensorflow as tf
from tensorflow.python.eager import context

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import graph_check, kernels, rewrite_cache, trace_names
from tf_fusionstitch.options import FusionOptions
from tf_fusionstitch.report import PlanGraph, Report
from tf_fusionstitch.rewriters import (cpu_cost_model, cpu_costs, decided_shapes,
                                       function_bodies, optimized_traces)
from tf_fusionstitch.rewriters.fusion_pass import run_fusion_pass
from tf_fusionstitch.rewriters.graph_view import parse_input, tensor_name
from tf_fusionstitch.runtime import cache, cpu_compiler, gc_pause
from tf_fusionstitch.versions import Version


class InputSizes:
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
        # (Placeholder, axis) -> its size in the call that made the version:
        # explore's plan guard prices plans at these sizes.
        self.first_sizes = {(self._name_of[leaf], axis): version.first_size(leaf, axis)
                            for leaf, axis in unknown
                            if version.first_size(leaf, axis) is not None}
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


def rewrite(concrete, inputs: InputSizes, options: FusionOptions, name: str):
    """(GraphDef, output tensor names, Report) of the plan for one trace."""
    with gc_pause.paused():
        return _rewrite(concrete, inputs, options, name)


def _rewrite(concrete, inputs: InputSizes, options: FusionOptions, name: str):
    start = time.perf_counter()
    compilations = cpu_compiler.compilations
    graph = concrete.graph
    graph_def = graph.as_graph_def()
    outputs = [t.name for t in concrete.outputs]
    control = [op.name for op in graph.control_outputs]
    # (dtype, shape) per tensor; TensorSpecs, 5x dearer, only if we rewrite
    known = {t.name: (t.dtype, t.shape) for op in graph.get_operations() for t in op.outputs}
    variables = captured_variable_types(concrete)
    costs, costs_source, call_sizes = None, options.costs, {}
    if options.fusion == "explore":
        costs, costs_source = (cpu_costs.for_this_machine() if costs_source == "calibrated"
                               else (dict(cpu_cost_model.BUILTIN), costs_source))
        call_sizes = inputs.first_sizes
    key, names = None, None
    if options.rewrite_cache:
        names = trace_names.TraceNames(graph_def)
        key_options = options.cache_key()
        if costs is not None:  # the plan depends on the values, not the option's name
            key_options["costs"] = json.dumps(costs, sort_keys=True)
        key_options["equal_sizes"] = inputs.classes
        if call_sizes:   # explore's plan guard prices the plans at these sizes
            key_options["call_sizes"] = sorted(call_sizes.items())
        key = rewrite_cache.make_key(
            names.canonical(graph_def).SerializeToString(deterministic=True), outputs,
            control,
            "\n".join(sorted(f"{names.canonical_tensor(tensor)} {dtype.name} {shape}"
                              for tensor, (dtype, shape) in known.items())
                       + sorted(f"{names.canonical_tensor(name)} holds {t.dtype}{list(t.shape)}"
                                for (name, _), t in variables.items())),
            key_options, f"{tf.__version__} {tf.version.GIT_VERSION}")
        entry = rewrite_cache.load(key, register_kernel, timeout=options.compile_timeout,
                                   restore=names.specific)
        if entry is not None:
            report = entry.report
            report.function, report.signature = name, signature_text(concrete)
            report.cache_hit = True
            report.graph = PlanGraph.of(entry.graph_def)
            report.rewrite_seconds = time.perf_counter() - start
            return entry.graph_def, entry.output_names, report
    hints = {tensor: tf.TensorSpec(shape, dtype) for tensor, (dtype, shape) in known.items()}
    graph_def, types = optimized_traces.optimized_and_typed(graph, graph_def, outputs + control,
                                                            hints, options.grappler)
    equalities = decided_shapes.InputEqualities(inputs.allowed)
    fetches = set()
    for tensor in outputs:
        src, port, _ = parse_input(tensor)
        fetches.add((src, port))

    def build(clusters):
        return build_kernels(clusters, options.compile_timeout, options.target)
    result = run_fusion_pass(graph_def, types, fetches, build, options, costs, costs_source,
                             equalities, variables, call_sizes)
    output_names = []
    for tensor in outputs:
        src, port, _ = parse_input(tensor)
        mapped = result.tensor_map.get((src, port), tensor_name((src, port)))
        output_names.append(mapped if ":" in mapped else mapped + ":0")
    report = Report(
        function=name, signature=signature_text(concrete),
        fusion=options.fusion, target=options.target, exploration=result.exploration,
        clusters=result.clusters, kernels_before=result.kernels_before,
        kernels_after=result.kernels_after, compile_seconds=result.compile_seconds,
        compilations=cpu_compiler.compilations - compilations,
        rewrite_seconds=time.perf_counter() - start, unfused_ops=result.unfused_ops,
        assumed_equal=_pair_list(equalities.assumed),
        equal_sizes_wanted=_pair_list(equalities.wanted), substitutions=result.substitutions,
        graph=PlanGraph.of(result.graph_def))
    # A plan with a fallback or a split pack may owe it to a passing
    # failure (a compiler's timeout): it is not cached.
    if key is not None and not report.fallbacks and not report.split_packs \
            and names.portable(result.graph_def):
        try:
            rewrite_cache.store(key, names.canonical(result.graph_def), output_names, report)
        except (cache.CacheError, OSError):
            pass  # a plan not cached is only a slower next trace
        report.rewrite_seconds = time.perf_counter() - start
    if report.fallbacks:
        first = report.fallbacks[0]
        warnings.warn(f"tf_fusionstitch: {len(report.fallbacks)} cluster(s) of "
                      f"{name} stay as TensorFlow ops (first: {first.reason}); "
                      "see .report()", RuntimeWarning, stacklevel=4)
    return result.graph_def, output_names, report


def captured_variable_types(concrete) -> dict:
    """{(Placeholder, 0): the value type it holds} for the trace's inputs that
    are captured variables' handles: the GraphDef does not say, and a function
    the trace calls (a restored SavedModel function) may read them."""
    variables = {}
    for v in concrete.variables:
        try:
            variables[id(v.handle)] = v
        except Exception:  # noqa: BLE001  (a variable without one handle: not a hint)
            continue
    out = {}
    for external, internal in concrete.graph.captures:
        v = variables.get(id(external))
        if v is not None and v.dtype.name in ir.DTYPES and v.shape.rank is not None:
            out[(internal.op.name, 0)] = ir.TensorType(v.dtype.name, tuple(v.shape.as_list()))
    return out


def build_kernels(clusters, timeout: float, target: str = kernels.CPU):
    """A registered kernel, or the exception that stopped it, per cluster;
    the missing kernels are compiled several to a compiler run."""
    from tf_fusionstitch.custom_ops import loader  # noqa: F401  (builds the op library once)
    built = kernels.build_cpu_kernels(clusters, timeout=timeout, target=target)
    for i, kernel in enumerate(built):
        if not isinstance(kernel, Exception):
            try:
                register_kernel(kernel)
            except Exception as e:  # noqa: BLE001  (that cluster stays TF ops)
                built[i] = e
    return built


def register_kernel(kernel) -> None:
    from tf_fusionstitch.custom_ops import loader  # noqa: F401  (builds the op library once)
    loader.register_kernel(kernel.key, kernel.path, kernel.spec, kernel.symbol)


def import_plan(concrete, n_args: int, feeds, rewritten, output_names):
    """Imports the plan into the trace being built and returns the trace's
    outputs, structured as the original's. Raises where the plan cannot run
    (graph_check.py) or does not import. Python's cyclic collector is paused
    as in the rewrite: the import makes a Python op per node, and the
    collections those allocations start walk every live object (Gemma's
    train step, cache warm: the import took 0.31 s, 0.07 s paused)."""
    with gc_pause.paused():
        return _import_plan(concrete, n_args, feeds, rewritten, output_names)


def _import_plan(concrete, n_args: int, feeds, rewritten, output_names):
    graph_check.check_runnable(rewritten, output_names)
    # Grappler's specialised functions and rewritten bodies are new to the
    # runtime: an imported library is not registered by the import.
    function_bodies.register_functions(rewritten)
    rewritten = _with_registered_definitions(rewritten)
    results = tf.graph_util.import_graph_def(
        rewritten, input_map=_input_map(concrete, n_args, feeds, rewritten),
        return_elements=output_names, name="fs")
    flat, it = [], iter(results)
    for leaf in tf.nest.flatten(concrete.structured_outputs, expand_composites=True):
        flat.append(next(it) if isinstance(leaf, tf.Tensor) else leaf)
    return tf.nest.pack_sequence_as(concrete.structured_outputs, flat, expand_composites=True)


def _with_registered_definitions(graph_def):
    """`graph_def` with each library function the eager runtime already knows
    in the runtime's definition. The plan's copy can differ in its details
    (a restored SavedModel function's attributes), and tf.saved_model.save
    refuses two definitions under one name; rewritten functions have new names."""
    ctx = context.context()
    known = [i for i, f in enumerate(graph_def.library.function)
             if ctx.has_function(f.signature.name)]
    if not known:
        return graph_def
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)
    for i in known:
        out.library.function[i].CopyFrom(
            ctx.get_function_def(out.library.function[i].signature.name))
    return out


def _input_map(concrete, n_args: int, feeds, rewritten) -> dict:
    """The rewritten graph's inputs mapped to this trace's tensors: the
    arguments, and captures that the rewrite still reads. A captured eager
    constant appears in the traced GraphDef as a Const that Grappler may fold
    away (and import_graph_def refuses a mapping to a node that is gone); it
    carries its value, so nothing is lost."""
    graph = concrete.graph
    present = {node.name for node in rewritten.node}
    input_map = {t.name: f for t, f in zip(graph.inputs[:n_args], feeds)}
    # The trace being built captures each value as a placeholder of its own; a
    # capture is a third of the cost of tf.identity's (which adds an op to it),
    # and a train step captures every variable's handle (NASNetMobile: 1,500).
    # Named after the traced placeholder, so that two traces of the function
    # name their captures alike (the planner places a step's ops by name).
    # import_plan runs inside the optimized tf.function's trace: a FuncGraph.
    outer = tf.compat.v1.get_default_graph()
    for placeholder, captured in zip(graph.inputs[n_args:], concrete.captured_inputs):
        if placeholder.op.name in present:
            input_map[placeholder.name] = outer.capture(captured, name=placeholder.op.name)
    return input_map


def one_line(exc: BaseException) -> str:
    """An exception as one line for a report: its type and first line, shortened."""
    text = str(exc).strip().splitlines()
    first = re.sub(r"\s+", " ", text[0]) if text else ""
    return f"{type(exc).__name__}: {first}"[:500]


def signature_text(concrete) -> str:
    specs = [f"{t.dtype.name}{t.shape}" for t in concrete.graph.inputs
             if t.dtype != tf.resource]
    return "(" + ", ".join(specs) + ")"


def _pair_list(pairs) -> List[Tuple[str, int, str, int]]:
    return sorted((a[0], a[1], b[0], b[1]) for a, b in pairs)
