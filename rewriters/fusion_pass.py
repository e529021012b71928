"""The fusion pass: GraphDef in, GraphDef with FusionStitch nodes out.

Find fusible nodes (op table), form clusters by one of the strategies
(strategies.py: "stitch", "xla_like", "explore"), build one kernel per
cluster, and substitute.
Any cluster whose kernel cannot be lowered, generated, compiled or registered
stays as TensorFlow ops; the reason goes to the report. A pack that does not
lower, or that the generator refuses, is split: its parts, each a cluster
before it was packed, are built apart.

The same pass then runs inside every function the graph calls (While bodies
and conditions, If/Case branches, PartitionedCall bodies, recursively:
function_bodies.py), so a recurrent layer's cell, run once per time step, is
fused too; a function that cannot be rewritten stays as it was.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import time
from typing import Callable, Dict, List, Optional, Set, Tuple

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.options import FusionOptions
from tf_fusionstitch.report import ClusterReport
from tf_fusionstitch.rewriters import (call_dims, decided_shapes, depthwise_calls,
                                       einsum_matmul,
                                       function_bodies, function_graphs, legality,
                                       loop_gradients, op_table, packing, projection_matmul,
                                       remapper_epilogues,
                                       slice_gradients, strategies, variable_updates)
from tf_fusionstitch.rewriters.clustering import fusible_nodes
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor
from tf_fusionstitch.rewriters.kernel_count import memory_intensive_kernels
from tf_fusionstitch.rewriters.lowering import LoweredCluster, lower_nodes
from tf_fusionstitch.rewriters.substitute import Replacement, substitute

@dataclasses.dataclass
class PassResult:
    graph_def: object
    tensor_map: Dict[Tensor, str]
    clusters: List[ClusterReport]
    kernels_before: int
    kernels_after: int
    compile_seconds: float
    unfused_ops: list
    exploration: str = ""          # fusion="explore": what the search did
    # The pass inside functions the graph calls (function_bodies.py): one
    # FunctionReport per reachable function, and the memory-intensive kernels
    # of those bodies, per call, before and after (kernels_before/after count
    # the graph's own nodes only). Their clusters are in `clusters` too, named
    # "function/node".
    functions: list = dataclasses.field(default_factory=list)
    body_kernels_before: int = 0
    body_kernels_after: int = 0
    # What this graph proves of the arguments of each function it calls:
    # {call node: {function: portable Facts per argument}} (call_dims.py).
    call_facts: Dict[str, Dict[str, tuple]] = dataclasses.field(default_factory=dict)
    # Memory-intensive ops of the graph's own nodes that TF's remapper folds
    # into a contraction (remapper_epilogues.py): TF runs them inside the
    # contraction's call with or without this pass, so kernels_before and
    # kernels_after count neither.
    remapper_fused: int = 0
    # Ops replaced by another TF op that computes the same (depthwise_calls.py):
    # (node, what it was, what it became).
    substitutions: list = dataclasses.field(default_factory=list)


def _worth_a_kernel(c: ir.Cluster, min_cluster_ops: int) -> bool:
    """Enough primitives to gain by fusing them; a segment sum alone gains
    too (its kernel is faster than TF's, codegen/scatter.py)."""
    prims = sum(op.prim not in ir.SHAPE_ONLY + ir.CONSTANT for op in c.ops)
    return prims >= min_cluster_ops or any(op.prim in ir.SCATTER for op in c.ops)


def _why_unfused(formed: strategies.Formed, reports: List[ClusterReport],
                 min_cluster_ops: int) -> Callable[[str], str]:
    """Why a fusible op that no kernel took stays a TF op: its kernel fell
    back, or its cluster was too small to be worth a kernel, and then the
    first reason a larger one was refused."""
    fell_back = {n: r.reason for r in reports if not r.fused for n, _ in r.tf_ops}
    size = {n: len(g) for g in formed.groups for n in g}

    def why(node: str) -> str:
        if node in fell_back:
            return f"its kernel fell back: {fell_back[node]}"
        small = (f"in a cluster of fewer than min_cluster_ops={min_cluster_ops} primitives "
                 "(shape and constant ops do not count)")
        if node in formed.refusals:
            return f"{small}; a larger kernel was refused: {formed.refusals[node]}"
        if size.get(node, 1) == 1:
            return f"{small}: no fusible neighbour, or the plan kept it apart"
        return small
    return why


def _lower_groups(view: GraphView, groups: List[List[str]], fetches: Set[Tensor],
                  min_cluster_ops: int, reports: List[ClusterReport]) -> List[LoweredCluster]:
    """The groups' clusters worth a kernel. A group that does not lower
    stays as TF ops with its reason in `reports`, unless it is a pack:
    then its parts, each a cluster before it was packed, are lowered apart."""
    lowered: List[LoweredCluster] = []
    for nodes in groups:
        try:
            lc = lower_nodes(view, nodes, fetches)
        except legality.LOWERING_ERRORS as e:
            parts = packing.pack_parts(view, nodes)
            if len(parts) > 1:
                reports.append(_split_report(nodes, len(parts), f"lowering: {e}"))
                lowered += _lower_groups(view, parts, fetches, min_cluster_ops, reports)
                continue
            # A plan priced without the cluster checks (explore) whose
            # cluster fails them: its ops stay TF ops, as any failed kernel's.
            reports.append(ClusterReport(nodes[0], [(n, view.nodes[n].op) for n in nodes],
                                         False, reason=f"lowering: {e}"))
            continue
        if _worth_a_kernel(lc.cluster, min_cluster_ops):
            lowered.append(lc)
    return lowered


def _build_groups(view: GraphView, build, lowered: List[LoweredCluster], fetches: Set[Tensor],
                  min_cluster_ops: int, reports: List[ClusterReport]) -> List[tuple]:
    """(cluster, kernel, None) or (cluster, None, reason) per cluster. A
    pack that the generator refuses (its parts' schedules, fs_meta's
    counts) is built as its parts instead; one that fails to compile, load
    or register falls back whole, as a missing, failing or hanging compiler
    or a refused cache would fail its parts the same way."""
    built, parts = [], []
    for lc, (kernel, error) in zip(lowered, _build_all(build, [lc.cluster for lc in lowered])):
        split = packing.pack_parts(view, lc.nodes) \
            if isinstance(error, legality.LOWERING_ERRORS) else [lc.nodes]
        if len(split) > 1:
            reports.append(_split_report(lc.nodes, len(split), _reason(error)))
            parts += split
        else:
            built.append((lc, kernel, error and _reason(error)))
    if parts:
        again = _lower_groups(view, parts, fetches, min_cluster_ops, reports)
        built += [(lc, kernel, error and _reason(error)) for lc, (kernel, error)
                  in zip(again, _build_all(build, [lc.cluster for lc in again]))]
    return built


def _reason(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def _split_report(nodes: List[str], parts: int, reason: str) -> ClusterReport:
    return ClusterReport(nodes[0], [], False, reason=f"pack of {parts} parts split: {reason}",
                         split=parts)


def _build_all(build, clusters: List[ir.Cluster]) -> List[tuple]:
    """(kernel, None) or (None, the exception) per cluster. Equal clusters (the
    layers of a deep model) are built once, all in one call of `build`, which
    may compile several in one compiler run (kernels.build_cpu_kernels)."""
    distinct: Dict[str, ir.Cluster] = {}
    for c in clusters:
        distinct.setdefault(c.to_json(), c)
    specs = list(distinct)
    try:
        results = list(build([distinct[spec] for spec in specs])) if specs else []
        if len(results) != len(specs):
            raise RuntimeError(f"the build gave {len(results)} results for "
                               f"{len(specs)} clusters")
    except Exception as e:  # noqa: BLE001  (every cluster falls back to TF ops)
        results = [e] * len(specs)
    outcome = {spec: (None, r) if isinstance(r, Exception) else (r, None)
               for spec, r in zip(specs, results)}
    return [outcome[c.to_json()] for c in clusters]


def one_at_a_time(build_one: Callable[[ir.Cluster], object]):
    """A `build` for run_fusion_pass from a function that builds one cluster
    (or raises): the clusters are built on a thread per CPU, the largest
    first, so one long compilation does not run alone at the end."""
    def build(clusters: List[ir.Cluster]) -> list:
        workers = max(1, min(len(clusters), os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            order = sorted(range(len(clusters)), key=lambda i: -len(clusters[i].ops))
            futures = {i: pool.submit(build_one, clusters[i]) for i in order}
            results = []
            for i in range(len(clusters)):
                try:
                    results.append(futures[i].result())
                except Exception as e:  # noqa: BLE001  (that cluster falls back)
                    results.append(e)
        return results
    return build


def run_fusion_pass(graph_def, types, fetches: Set[Tensor],
                    build: Callable[[List[ir.Cluster]], list],
                    options: FusionOptions = FusionOptions(),
                    costs: Optional[Dict] = None, costs_source: str = "builtin",
                    input_equalities: Optional[decided_shapes.InputEqualities] = None,
                    variable_types: Optional[Dict[Tensor, ir.TensorType]] = None,
                    call_sizes: Optional[Dict[Tuple[str, int], int]] = None
                    ) -> PassResult:
    """`build(clusters)` returns, per cluster, an object with .key/.spec/
    .num_loops/.buffered/.parts (kernels.CompiledKernel) made runnable, or the
    exception that stopped that cluster (one_at_a_time makes one from a
    function that builds a single cluster or raises). `options`: the
    strategy (options.fusion) and its settings; `costs`: fusion="explore"'s
    delta evaluator's costs (cpu_cost_model.py; BUILTIN if None) and
    `costs_source` where they came from, for the report; `input_equalities`:
    equal input sizes the pass may assume in the graph's own nodes
    (decided_shapes.py), and where it reports those it relied on;
    `variable_types`: what the graph's resource inputs hold (a captured
    variable's value type), for the functions that read them: a restored
    SavedModel function reads its variables in a body the graph calls;
    `call_sizes`: the sizes of the graph's inputs' unknown axes
    ((Placeholder, axis) -> size) in the call that traced it, which
    explore's plan guard prices plans at."""
    strategy = strategies.STRATEGIES[options.fusion]
    substitutions = []
    if options.depthwise_calls and graph_def.library.function:
        graph_def, types, substitutions = depthwise_calls.rewrite(graph_def, types,
                                                                  variable_types or {})

    before = memory_intensive_kernels(graph_def)   # the graph TF would run
    moved = None
    if graph_def.library.function:
        try:
            graph_def, types, moved = loop_gradients.sum_after_loops(graph_def, types, fetches)
        except Exception as e:  # noqa: BLE001  (never worse than not using it)
            moved = f"{type(e).__name__}: {e}"
    library = function_graphs.FunctionGraphs(graph_def.library, graph_def.versions)
    calls = call_dims.CallDims(library) if graph_def.library.function else None

    def run_pass(gd, gd_types, gd_fetches, inputs=None, arg_facts=None, loop_vars=(),
                 sizes=None):
        shapes_context = decided_shapes.Context(arg_facts, calls, tuple(loop_vars))
        context = strategies.Context(gd_fetches, options, tuple(loop_vars), costs, costs_source,
                                     call_sizes=dict(sizes or {}))
        return _fuse_graph(gd, gd_types, build, strategy, context, inputs, shapes_context)

    # A function body's inputs are its caller's values, which no guard
    # checks: only what the caller proves of them (call_facts) holds there.
    result = run_pass(graph_def, types, fetches, input_equalities, sizes=call_sizes)
    result.substitutions = substitutions
    result.kernels_before = before - result.remapper_fused
    if isinstance(moved, str):
        result.clusters.append(ClusterReport(
            "loop gradients", [], False, reason=f"weight gradients not summed after their "
                                               f"loops: {moved}"))
    if not graph_def.library.function:
        return result
    try:
        new_gd, functions, body_results = function_bodies.rewrite_function_bodies(
            result.graph_def, types, run_pass, library, result.call_facts,
            variable_types or {})
    except Exception as e:  # noqa: BLE001  (never worse than not using it)
        result.clusters.append(ClusterReport(
            "function bodies", [], False,
            reason=f"functions the graph calls not rewritten: {type(e).__name__}: {e}"))
        return result
    result.graph_def = new_gd
    result.functions = functions
    for f in functions:
        result.body_kernels_before += f.kernels_before
        result.body_kernels_after += f.kernels_after
        if f.reason:
            result.clusters.append(ClusterReport(f"function {f.name}", [], False,
                                                 reason=f.reason))
        body = body_results.get(f.name)
        if body is None or not f.rewritten:
            continue
        result.compile_seconds += body.compile_seconds
        for c in body.clusters:
            c.name = f"{f.name}/{c.name}"
            result.clusters.append(c)
    return result


def typical_extents(origins, call_sizes: Dict[Tuple[str, int], int]):
    """A tensor's extents as the traced call had them, where its unknown
    sizes are proven equal to an input's (or products of them), else
    None for that axis: `extents(t)` -> list, or None for an unknown rank."""
    def size(d) -> Optional[int]:
        if isinstance(d, int):
            return d
        if d[0] == "prod":
            sizes = [size(o) for o in d[1]]
            return None if None in sizes else d[2] * math.prod(sizes)
        return call_sizes.get(origins.input_dim(d))

    def extents(t: Tensor) -> Optional[List[Optional[int]]]:
        dims = origins.dims(t)
        return None if dims is None else [size(d) for d in dims]
    return extents


def _fuse_graph(graph_def, types, build, strategy: strategies.Strategy,
                context: strategies.Context,
                input_equalities: Optional[decided_shapes.InputEqualities],
                shapes_context: decided_shapes.Context) -> PassResult:
    """The pass over `graph_def`'s own nodes."""
    fetches, min_cluster_ops = context.fetches, context.options.min_cluster_ops
    before = memory_intensive_kernels(graph_def)  # of the graph as given, before any expansion
    graph_def, types, _ = variable_updates.fold_variable_updates(
        graph_def, types, op_table.is_memory_intensive)
    graph_def, _ = variable_updates.forward_assigned_reads(graph_def, fetches)
    analyses = decided_shapes.Analyses(shapes_context, fetches)  # shared while the graph stays
    graph_def, types = decided_shapes.fold(graph_def, types, fetches, input_equalities,
                                           shapes_context, analyses)
    assumed = input_equalities.assumed if input_equalities else set()
    if slice_gradients.candidates(graph_def):
        graph_def, types, _ = slice_gradients.concat_tiled_slice_gradients(
            graph_def, types, analyses.origins(graph_def, types, assumed),
            analyses.view(graph_def, types))
    if projection_matmul.candidates(graph_def):   # one MatMul, not a batch of them
        graph_def, types, _ = projection_matmul.rewrite(
            graph_def, types, lambda g, t: analyses.origins(g, t, assumed))
    if einsum_matmul.candidates(graph_def):   # their transposes may then fuse
        graph_def, types, _ = einsum_matmul.rewrite(
            graph_def, types, lambda g, t: analyses.origins(g, t, assumed))
    graph_def, types = strategy.prepare(graph_def, types)
    # What is proven of the graph's dynamic sizes: kernels learn which of
    # their inputs' extents are equal, and called functions their arguments'.
    origins = analyses.origins(graph_def, types, assumed)
    view = analyses.view(graph_def, types).with_dims(origins.dims)
    call_facts = {node: {fname: call_dims.portable(args) for fname, args in by_function.items()}
                  for node, by_function in origins.call_args.items()}
    context = dataclasses.replace(context, extents=typical_extents(origins, context.call_sizes))
    verdict = fusible_nodes(view, fetches)
    candidates = {n for n, why in verdict.items() if not why}
    epilogues = remapper_epilogues.fused_epilogues(graph_def, fetches, candidates)
    verdict.update(epilogues)
    candidates = {n for n, why in verdict.items() if not why}
    remapper_fused = sum(op_table.is_memory_intensive(view.nodes[n].op) for n in epilogues)
    formed = strategy.form_clusters(view, candidates, context)
    verdict.update(formed.rejected)
    reports: List[ClusterReport] = []
    lowered = _lower_groups(view, formed.groups, fetches, min_cluster_ops, reports)
    start = time.perf_counter()
    built = _build_groups(view, build, lowered, fetches, min_cluster_ops, reports)
    compile_seconds = time.perf_counter() - start

    replacements = []
    for lc, kernel, error in built:
        tf_ops = [(n, view.nodes[n].op) for n in lc.nodes]
        if kernel is None:
            reports.append(ClusterReport(lc.nodes[0], tf_ops, False, reason=error))
            continue
        replacements.append(Replacement(lc, kernel.key, kernel.spec))
        types = lc.cluster.types()
        reports.append(ClusterReport("", tf_ops, True, kernel_key=kernel.key,
                                     loops=kernel.num_loops, buffered=kernel.buffered,
                                     parts=kernel.parts,
                                     bytes_in=ir.tensor_bytes(t for _, t in lc.cluster.inputs),
                                     bytes_out=ir.tensor_bytes(
                                         types[name] for name in lc.cluster.outputs)))
    new_gd, tensor_map = substitute(view, replacements)
    fused_names = iter(n.name for n in new_gd.node if n.op == "FusionStitch")
    for r in reports:
        if r.fused:
            r.name = next(fused_names)

    after = memory_intensive_kernels(new_gd)
    fused = {n for lc, k, _ in built if k is not None for n in lc.nodes}
    why_unfused = _why_unfused(formed, reports, min_cluster_ops)
    unfused = [(n, view.nodes[n].op, why or why_unfused(n))
               for n, why in verdict.items()
               if n not in fused and op_table.is_memory_intensive(view.nodes[n].op)]
    return PassResult(new_gd, tensor_map, reports, before - remapper_fused,
                      after - remapper_fused, compile_seconds, unfused, formed.exploration,
                      call_facts=call_facts, remapper_fused=remapper_fused)

