"""The fusion pass inside functions the graph calls: While/StatelessWhile bodies
and conditions, If/StatelessIf/Case branches, PartitionedCall and
StatefulPartitionedCall bodies, and, recursively, the functions those call.

A recurrent layer (Keras GRU/LSTM on CPU) runs its cell as a `While` whose body
is a FunctionDef in graph_def.library, and its gradient as a second `While`;
every elementwise op of the cell runs once per time step as its own kernel,
which fusion at the graph's top level never sees. Each reachable function is converted to a
GraphDef (one Placeholder per argument, shaped from its call sites), typed by
TF's shape inference (rewriters/shapes.py), rewritten by the same fusion pass
with its return values and control outputs as fetches, and converted back to a
FunctionDef with the same signature, attributes, argument and resource
attributes and control outputs.

A rewritten function gets a new name (the old one plus a hash of the new
definition), and so does every function that calls one, up to the graph's own
call nodes, whose attributes are updated: the original definitions may
already be registered under their names in the eager context (the original
tf.function ran), and TensorFlow refuses a second, different definition under
a name it knows. The originals stay in the library.

Input shapes of a function: a While's `output_shapes` (the loop's shape
invariants) for its body and condition, else the types of the caller's inputs;
a function called from several places gets, per argument, the dimensions all
its call sites agree on. Callers are processed before their callees, so a
callee's shapes come from its callers' bodies.

Any failure for one function (conversion, shape inference, the pass, the
check of the result) leaves that function as it was, with the reason in the
report; the rest still rewrite.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Callable, Dict, List, Optional, Set

import tensorflow as tf
from tensorflow.core.framework import function_pb2, graph_pb2
from tensorflow.python.eager import context

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters.function_graphs import (  # noqa: F401  (called_functions: API)
    FUNC_ATTRS, WHILE_OPS, FunctionGraphs, Shape, called_functions, find_op_def,
    handle_types, merge_handles, merge_shapes, num_args, site_shapes)
from tf_fusionstitch.rewriters.graph_view import Tensor, parse_input
from tf_fusionstitch.rewriters import trampoline
from tf_fusionstitch.rewriters.kernel_count import memory_intensive_kernels

@dataclasses.dataclass
class FunctionReport:
    """What the pass did inside one function the graph calls."""
    name: str                       # the function's original name
    new_name: str = ""              # its name in the rewritten library ('' if unchanged)
    kernels_before: int = 0         # memory-intensive kernels of the body, per call
    kernels_after: int = 0
    fused_clusters: int = 0
    reason: str = ""                # why it stayed as it was, when it did (a failure)

    @property
    def rewritten(self) -> bool:
        return bool(self.new_name)


# run_pass(body graph_def, types, fetches, arg_facts=, loop_vars=) -> PassResult
# (fusion_pass.py)
RunPass = Callable[[object, Dict[Tensor, Optional[ir.TensorType]], Set[Tensor]], object]


def graph_def_to_function(gd, original, tensor_map: Dict[Tensor, str], names: Dict[str, str]):
    """The FunctionDef of rewritten body `gd`: `original`'s signature, attributes,
    argument attributes, resource ids and control outputs, with return values
    and control outputs mapped through the fusion pass's `tensor_map`."""
    args = {a.name for a in original.signature.input_arg}
    signatures = {f.signature.name: f.signature for f in gd.library.function}
    nodes = {n.name: n for n in gd.node if n.name not in args}
    out_names: Dict[str, List[str]] = {}

    def nested(flat: str) -> str:
        src, port, ctrl = parse_input(flat)
        if ctrl:
            return "^" + src
        if src in args:
            if port != 0:
                raise ValueError(f"argument {src} has one output, {flat!r} is read")
            return src
        if src not in out_names:
            node = nodes.get(src)
            if node is None:
                raise ValueError(f"{flat!r} names no node of the function")
            op_def = find_op_def(node.op, signatures)
            out_names[src] = [f"{arg.name}:{i}" for arg in op_def.output_arg
                              for i in range(num_args(arg, node))]
        outs = out_names[src]
        if port >= len(outs):
            raise ValueError(f"{flat!r}: {src} has {len(outs)} outputs")
        return f"{src}:{outs[port]}"

    fdef = function_pb2.FunctionDef()
    fdef.signature.CopyFrom(original.signature)
    for key in original.attr:
        fdef.attr[key].CopyFrom(original.attr[key])
    for k in original.arg_attr:
        fdef.arg_attr[k].CopyFrom(original.arg_attr[k])
    for k, v in original.resource_arg_unique_id.items():
        fdef.resource_arg_unique_id[k] = v
    for node in gd.node:
        if node.name in args:
            continue
        new = fdef.node_def.add()
        new.CopyFrom(node)
        del new.input[:]
        new.input.extend(nested(s) for s in node.input)
    for out, value in original.ret.items():
        src, port, _ = parse_input(names[value])
        mapped = tensor_map.get((src, port))
        fdef.ret[out] = nested(mapped) if mapped is not None else nested(names[value])
    for key, node_name in original.control_ret.items():
        if node_name not in nodes:
            mapped = tensor_map.get((node_name, 0))
            if mapped is None:
                raise ValueError(f"control output {node_name} was fused away")
            node_name = parse_input(mapped)[0]
        fdef.control_ret[key] = node_name
    return fdef


def check_function(fdef, library) -> None:
    """Builds a graph from the rewritten FunctionDef, as TF will when it runs
    it: every node's inputs resolve and shape inference accepts it."""
    from tensorflow.python.framework import function_def_to_graph
    g = tf.Graph()
    with g.as_default():
        lib = graph_pb2.GraphDef()
        lib.library.CopyFrom(library)
        tf.graph_util.import_graph_def(lib, name="")
        function_def_to_graph.function_def_to_graph(fdef)


def _digest(fdef) -> str:
    return hashlib.sha256(fdef.SerializeToString(deterministic=True)).hexdigest()[:10]


def rewrite_function_bodies(graph_def, types, run_pass: RunPass, functions: FunctionGraphs,
                            call_facts: Dict[str, Dict[str, tuple]],
                            input_handles: Optional[Dict[Tensor, ir.TensorType]] = None):
    """Runs `run_pass` inside every function `graph_def` calls. Returns (new
    GraphDef, [FunctionReport], {function name: PassResult} of the rewritten
    functions). `types` are the graph's own tensor types; `functions`
    converts the library's functions; `call_facts` is what the graph proves
    of each call's arguments (PassResult.call_facts), which the pass inside
    may take as given; `input_handles` what the graph's own resource inputs
    hold (captured variables), where known."""
    from tf_fusionstitch.rewriters.graph_view import GraphView

    library = graph_def.library
    fdefs = {f.signature.name: f for f in library.function}
    names = set(fdefs)
    reports: Dict[str, FunctionReport] = {}
    results: Dict[str, object] = {}
    new_defs: Dict[str, function_pb2.FunctionDef] = {}
    seen: Dict[str, tuple] = {}           # function -> (shapes, handles, facts) it was processed for
    rets: Dict[str, list] = {}            # function -> handle type of each return value
    callees: Dict[str, List[str]] = {}
    order: List[str] = []

    # walk and process call each other once per level of function nesting:
    # generators run by trampoline.run, each `yield` a call (see there), so
    # the nesting's depth is not limited by Python's recursion limit.
    def walk(caller, gd, gd_types, arg_handles, gd_call_facts):
        """Processes every function `gd` calls, in its topological order (a
        call's outputs may hold lists a later call reads); returns the
        handle types of gd's tensors."""
        view_order = GraphView(gd, gd_types).order
        nodes = {n.name: n for n in gd.node}
        call_handles: Dict[str, list] = {}
        # A function called from several nodes of this graph gets the
        # dimensions (and facts) all those calls agree on (calls from other
        # graphs found later with others keep it as it was: `process`).
        shapes_of: Dict[str, List[Shape]] = {}
        facts_of: Dict[str, Optional[tuple]] = {}
        for name in view_order:
            for _, fname, start in called_functions(nodes[name], names):
                if fname in fdefs:
                    shapes = site_shapes(nodes[name], start, gd_types)
                    known = shapes_of.get(fname)
                    shapes_of[fname] = shapes if known is None or len(known) != len(shapes) \
                        else [merge_shapes(a, b) for a, b in zip(known, shapes)]
                    facts = gd_call_facts.get(name, {}).get(fname)
                    facts_of[fname] = facts if facts_of.get(fname, facts) == facts else None
        handles = handle_types(gd, view_order, gd_types, arg_handles, call_handles)
        for name in view_order:
            node = nodes[name]
            calls = [c for c in called_functions(node, names) if c[1] in fdefs]
            if not calls:
                continue
            handles = handle_types(gd, view_order, gd_types, arg_handles, call_handles)
            data = [parse_input(s)[:2] for s in node.input if not s.startswith("^")]
            outs = None
            for attr, fname, start in calls:
                callees.setdefault(caller, []).append(fname)
                in_handles = [handles.get(t) for t in data[start:]]
                shapes = site_shapes(node, start, gd_types)
                if len(shapes_of[fname]) == len(shapes):
                    shapes = shapes_of[fname]
                ret = yield process(fname, shapes, in_handles, facts_of[fname],
                                    node.op in WHILE_OPS and attr == "body",
                                    f"{caller or 'the graph'}/{name}")
                if attr in ("cond",):
                    continue
                if node.op in WHILE_OPS and ret is not None:
                    changed = [k for k, (a, b) in enumerate(zip(in_handles, ret))
                               if a is not None and a != b]
                    if changed and attr == "body":
                        # The body's reads were typed by what the loop holds on
                        # entry; if an iteration can change it, keep the original.
                        _revert(fname, f"not rewritten: loop variable {changed[0]} holds "
                                "values of another shape after an iteration")
                    ret = [merge_handles(a, b) if a is not None else b
                           for a, b in zip(in_handles, ret)]
                if outs is None:
                    outs = ret
                elif ret is not None:   # branches: what they all agree on
                    outs = [a if a == b else None for a, b in zip(outs, ret)]
            if outs:
                call_handles[name] = outs
        return handle_types(gd, view_order, gd_types, arg_handles, call_handles)

    def _revert(fname, reason):
        new_defs.pop(fname, None)
        r = reports[fname]
        r.reason = reason
        r.kernels_after, r.fused_clusters = r.kernels_before, 0

    def process(fname, shapes, in_handles, facts, loop_body, where):
        fdef = fdefs[fname]
        n = len(fdef.signature.input_arg)
        if len(shapes) != n or len(in_handles) != n or (facts is not None and len(facts) != n):
            reports.setdefault(fname, FunctionReport(fname)).reason = (
                f"not converted: {where} passes {len(shapes)} inputs, it takes {n}")
            return None
        if fname in seen:
            if seen[fname] != (shapes, in_handles, facts, loop_body) and fname in new_defs:
                # Another call with other shapes or facts: keep the original for all.
                _revert(fname, f"not rewritten: {where} calls it with other input shapes")
            return rets.get(fname)
        seen[fname] = (shapes, in_handles, facts, loop_body)
        order.append(fname)
        report = reports.setdefault(fname, FunctionReport(fname))
        try:
            conv = functions.convert(fname, shapes, in_handles)
        except Exception as e:  # noqa: BLE001  (any failure: the function stays)
            report.reason = f"not converted: {type(e).__name__}: {e}"
            return None
        body, body_types = conv.graph_def, conv.types
        report.kernels_before = report.kernels_after = memory_intensive_kernels(body)
        result = None
        try:
            arg_facts = None if facts is None else dict(zip(conv.args, facts))
            result = run_pass(body, body_types, set(conv.fetches), arg_facts=arg_facts,
                              loop_vars=tuple(zip(conv.args, conv.rets)) if loop_body
                              else ())
            results[fname] = result
        except Exception as e:  # noqa: BLE001
            report.reason = f"not rewritten: {type(e).__name__}: {e}"
        arg_handles = {(a, 0): h for a, h in zip(conv.args, in_handles) if h is not None}
        try:
            handles = yield walk(fname, body, body_types, arg_handles,
                                 result.call_facts if result is not None else {})
        except Exception as e:  # noqa: BLE001
            report.reason = f"not converted: {type(e).__name__}: {e}"
            return None
        rets[fname] = [handles.get(t) for t in conv.rets]
        if result is None:
            return rets[fname]
        n_fused = sum(n.op == "FusionStitch" for n in result.graph_def.node)
        if n_fused == 0:
            return rets[fname]
        try:
            new = graph_def_to_function(result.graph_def, fdef, result.tensor_map, conv.names)
            check_function(new, library)
        except Exception as e:  # noqa: BLE001
            report.reason = f"not rewritten: {type(e).__name__}: {e}"
            return rets[fname]
        new_defs[fname] = new
        report.kernels_after = memory_intensive_kernels(result.graph_def)
        report.fused_clusters = n_fused
        return rets[fname]

    trampoline.run(walk("", graph_def, types, dict(input_handles or {}), call_facts))

    if not new_defs:
        return graph_def, list(reports.values()), results

    # Rename rewritten functions and, transitively, their callers, callees first.
    order = _callees_first(order, callees)
    renamed: Dict[str, str] = {}
    for fname in order:
        fdef = new_defs.get(fname)
        refs = {c for c in callees.get(fname, []) if c in renamed}
        if fdef is None and not refs:
            continue
        if fdef is None:
            fdef = function_pb2.FunctionDef()
            fdef.CopyFrom(fdefs[fname])
        for node in fdef.node_def:
            _rename_calls(node, renamed, names)
        new_name = f"{fname}_fs{_digest(fdef)}"
        fdef.signature.name = new_name
        new_defs[fname] = fdef
        renamed[fname] = new_name
        reports.setdefault(fname, FunctionReport(fname)).new_name = new_name

    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        _rename_calls(node, renamed, names)
    existing = set(names)
    for fname in order:
        if fname in renamed and renamed[fname] not in existing:
            out.library.function.add().CopyFrom(new_defs[fname])
            existing.add(renamed[fname])
    register_functions(out)
    return out, list(reports.values()), results


def register_functions(graph_def) -> None:
    """Registers with the eager runtime every function of `graph_def`'s library
    it does not know yet. A GraphDef imported inside a tf.function does not
    register its library's functions: the original trace's are known, but
    Grappler's specialised ones (a tf.cond's branches) and the rewritten ones
    must be registered, or the first call fails with "Op type not registered
    '<function>'". api.py calls this before every import."""
    ctx = context.context()
    for fdef in graph_def.library.function:
        if not ctx.has_function(fdef.signature.name):
            ctx.add_function_def(fdef)


def all_nodes(graph_def):
    """The graph's nodes and those of every function in its library: where
    FusionStitch nodes are (their kernels must be registered before a run)."""
    yield from graph_def.node
    for fdef in graph_def.library.function:
        yield from fdef.node_def


def _rename_calls(node, renamed: Dict[str, str], names: Set[str]) -> None:
    if node.op in renamed:
        node.op = renamed[node.op]
    for attr in FUNC_ATTRS.get(node.op, {}):
        if attr not in node.attr:
            continue
        value = node.attr[attr]
        if value.HasField("func"):
            if value.func.name in renamed:
                value.func.name = renamed[value.func.name]
        else:
            for f in value.list.func:
                if f.name in renamed:
                    f.name = renamed[f.name]




def _callees_first(order: List[str], callees: Dict[str, List[str]]) -> List[str]:
    """`order`'s functions, each after every function it calls (TensorFlow
    allows no recursion; a cycle would only stop the walk)."""
    out: List[str] = []
    visited: Set[str] = set()
    known = set(order)
    for root in order:
        if root in visited:
            continue
        visited.add(root)
        # A depth-first walk with an explicit stack (nesting has no bound):
        # each function with the callees it has yet to look at.
        stack = [(root, iter(callees.get(root, [])))]
        while stack:
            fname, pending = stack[-1]
            for callee in pending:
                if callee in known and callee not in visited:
                    visited.add(callee)
                    stack.append((callee, iter(callees.get(callee, []))))
                    break
            else:
                stack.pop()
                out.append(fname)
    return out
