"""Checks that a rewritten GraphDef can run in this process, before it is imported.

A rewrite is imported into the trace of the optimized function; TensorFlow
checks op types and function references only when that function first runs,
so a graph naming a function the runtime does not know (a Grappler-specialised
branch left out of the library, say) would fail the user's first call. These
checks make it a failure of the rewrite instead, which `optimize` turns into a
fallback to the original function (api.py).
"""

from __future__ import annotations

from typing import Iterable, Set

from tensorflow.python.eager import context
from tensorflow.python.framework import op_def_registry


class NotRunnable(ValueError):
    """The rewritten graph names an op or a function this process cannot run."""


def _func_names(attr_value) -> Iterable[str]:
    """Function names an attribute refers to (a func, or a list of funcs)."""
    if attr_value.HasField("func"):
        yield attr_value.func.name
    elif attr_value.HasField("list"):
        for f in attr_value.list.func:
            yield f.name


def _known_function(name: str, library: Set[str]) -> bool:
    return name in library or context.context().has_function(name)


def op_types(graph_def) -> Set[str]:
    """The op types of the graph's nodes and of its library's functions."""
    types = {node.op for node in graph_def.node}
    for f in graph_def.library.function:
        types.update(node.op for node in f.node_def)
    return types


def check_runnable(graph_def, outputs: Iterable[str] = ()) -> None:
    """Raises NotRunnable naming the first node (and function) whose op type
    is neither a registered op nor a function of the library or the runtime,
    whose function attribute names no known function, or an output tensor
    `outputs` names that no node produces."""
    library = {f.signature.name for f in graph_def.library.function}
    bodies = [("the graph", graph_def.node)]
    bodies += [(f"function {f.signature.name}", f.node_def) for f in graph_def.library.function]
    for where, nodes in bodies:
        for node in nodes:
            if op_def_registry.get(node.op) is None and not _known_function(node.op, library):
                raise NotRunnable(f"node {node.name} in {where} has op type {node.op!r}, "
                                  "which is neither a registered op nor a known function")
            for attr, value in node.attr.items():
                for name in _func_names(value):
                    if not _known_function(name, library):
                        raise NotRunnable(f"node {node.name} in {where} refers to function "
                                          f"{name!r} ({attr}), which the library lacks")
    names = {node.name for node in graph_def.node}
    for tensor in outputs:
        node = tensor.split(":")[0].lstrip("^")
        if node not in names:
            raise NotRunnable(f"output {tensor} names no node of the rewritten graph")
