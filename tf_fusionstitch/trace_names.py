"""The names a trace makes up, and a form of a GraphDef without them.

Two traces of the same Python function give the same GraphDef but for names
TensorFlow numbers process-wide: the functions of its library (a tf.cond's
branches, `cond_true_9221`) and the gradient overrides of tf.custom_gradient
(`_gradient_op_type: "CustomGradient-8254"`). The rewrite cache keys a trace
by its *canonical* form, where those are numbered by first use instead, so a
new tf.function of the same step (or the same step in another process) finds
the rewrite of an earlier one; the entry is stored in canonical form too and
given this trace's names back when it is loaded.

Two more kinds of made-up names appear where a traced function calls another
tf.function that captures a value (a variable): the calling trace captures
that value in turn as a Placeholder named by a process-wide counter
(`.../depthwise_conv_1/81266`, its `_user_specified_name` the same number;
Keras' grouped convolution does this), and a function called under a
gradient tape names the eager runtime's forward and backward functions in
string attributes (`forward_function_name`). Both are numbered by first use
too.

Functions Grappler or the rewrite derive from a traced one keep its name as a
prefix (`cond_true_9221_tfg_region_specialized_...`, `..._fs<digest>`), so
they are renamed with it. A rewritten graph with a function of any other name
is `portable() == False`: it is not cached, as its name could mean another
function in another process.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional

GRADIENT_ATTR = "_gradient_op_type"
_CANONICAL_FUNCTION = "fs_traced_function_{}"
_CANONICAL_GRADIENT = "fs_traced_gradient_{}"
_CANONICAL_CAPTURE = "fs_traced_capture_{}"
_CANONICAL_CALL = "fs_traced_call_{}"
# A FunctionDef's attributes that hold a function's name as a string.
CALL_NAME_ATTRS = ("backward_function_name", "forward_function_name")
_USER_NAME_ATTR = "_user_specified_name"


class TraceNames:
    """This trace's made-up names and their canonical forms."""

    def __init__(self, graph_def):
        self._functions: Dict[str, str] = {}   # traced name -> canonical
        self._gradients: Dict[str, str] = {}
        library = {f.signature.name: f for f in graph_def.library.function}
        pending: List[str] = []

        def use_function(name: str) -> None:
            if name in library and name not in self._functions:
                self._functions[name] = _CANONICAL_FUNCTION.format(len(self._functions))
                pending.append(name)

        def visit(nodes) -> None:
            for node in nodes:
                use_function(node.op)
                for key in sorted(node.attr):
                    value = node.attr[key]
                    if key == GRADIENT_ATTR and value.s and value.s not in self._gradients:
                        self._gradients[value.s] = \
                            _CANONICAL_GRADIENT.format(len(self._gradients)).encode()
                    for name in _function_names(value):
                        use_function(name)

        visit(graph_def.node)
        while pending or len(self._functions) < len(library):
            if not pending:   # never called: by name, the best order there is
                use_function(min(n for n in library if n not in self._functions))
            visit(library[pending.pop(0)].node_def)
        self._calls: Dict[bytes, bytes] = {}
        for name in self._functions:   # in canonical order
            for key in CALL_NAME_ATTRS:
                value = library[name].attr[key].s if key in library[name].attr else b""
                if value and value not in self._calls:
                    self._calls[value] = _CANONICAL_CALL.format(len(self._calls)).encode()
        self._captures: Dict[str, str] = {}
        taken = {node.name for node in graph_def.node}
        for node in graph_def.node:
            if _numbered_capture(node):
                scope = node.name.rpartition("/")[0]
                canonical = _CANONICAL_CAPTURE.format(len(self._captures))
                canonical = f"{scope}/{canonical}" if scope else canonical
                if canonical not in taken:   # never onto a name the graph uses
                    self._captures[node.name] = canonical
        self._back = {v: k for k, v in self._functions.items()}
        self._gradients_back = {v: k for k, v in self._gradients.items()}
        self._calls_back = {v: k for k, v in self._calls.items()}
        self._captures_back = {v: k for k, v in self._captures.items()}

    def canonical(self, graph_def):
        """A copy of `graph_def` (this trace's, or rewritten from it) in canonical names."""
        return _renamed(graph_def, self._functions, self._gradients, self._calls,
                        self._captures)

    def specific(self, graph_def):
        """A copy of a canonical `graph_def` in this trace's names."""
        return _renamed(graph_def, self._back, self._gradients_back, self._calls_back,
                        self._captures_back)

    def canonical_tensor(self, tensor: str) -> str:
        """A tensor name ('node:port') of this trace in canonical form."""
        node, sep, port = tensor.partition(":")
        return self._captures.get(node, node) + sep + port

    def portable(self, graph_def) -> bool:
        """Whether every function of `graph_def`'s library is a traced one or
        derived from one (so its canonical form names nothing process-wide)."""
        return all(_base(f.signature.name, self._functions) is not None
                   for f in graph_def.library.function)


def _numbered_capture(node) -> bool:
    """A Placeholder TF named by its process-wide counter: the last part of its
    name is a number, and its _user_specified_name is that number."""
    last = node.name.rpartition("/")[2]
    return node.op == "Placeholder" and last.isdigit() and \
        _USER_NAME_ATTR in node.attr and node.attr[_USER_NAME_ATTR].s == last.encode()


def _base(name: str, names: Dict[str, str]) -> Optional[str]:
    """The longest key of `names` that `name` is or derives from ('<key>_...')."""
    if name in names:
        return name
    best = None
    for candidate in names:
        if name.startswith(candidate + "_") and (best is None or len(candidate) > len(best)):
            best = candidate
    return best


def _function_names(value) -> Iterator[str]:
    """The function names an AttrValue holds (func, list of funcs, nested attrs)."""
    if value.HasField("func"):
        yield value.func.name
        for key in sorted(value.func.attr):
            yield from _function_names(value.func.attr[key])
    for func in value.list.func:
        yield func.name
        for key in sorted(func.attr):
            yield from _function_names(func.attr[key])


def _renamed(graph_def, functions: Dict[str, str], gradients: Dict[bytes, bytes],
             calls: Dict[bytes, bytes], captures: Dict[str, str]):
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    cache: Dict[str, str] = {}

    def rename(name: str) -> str:
        if name not in cache:
            base = _base(name, functions)
            cache[name] = name if base is None else functions[base] + name[len(base):]
        return cache[name]

    def fix_attr(value) -> None:
        if value.HasField("func"):
            value.func.name = rename(value.func.name)
            for key in value.func.attr:
                fix_attr(value.func.attr[key])
        for func in value.list.func:
            func.name = rename(func.name)
            for key in func.attr:
                fix_attr(func.attr[key])

    def fix_nodes(nodes) -> None:
        for node in nodes:
            node.op = rename(node.op)
            for key in node.attr:
                value = node.attr[key]
                if key == GRADIENT_ATTR and value.s in gradients:
                    value.s = gradients[value.s]
                fix_attr(value)

    fix_nodes(out.node)
    if captures:
        _rename_nodes(out.node, captures)
    for fdef in out.library.function:
        fdef.signature.name = rename(fdef.signature.name)
        fix_nodes(fdef.node_def)
        for key in fdef.attr:
            fix_attr(fdef.attr[key])
            if key in CALL_NAME_ATTRS and fdef.attr[key].s in calls:
                fdef.attr[key].s = calls[fdef.attr[key].s]
    for gradient in out.library.gradient:
        gradient.function_name = rename(gradient.function_name)
        gradient.gradient_func = rename(gradient.gradient_func)
    # The library in canonical order, so equal graphs serialize alike.
    functions_sorted = sorted(out.library.function, key=lambda f: f.signature.name)
    sorted_copies = [type(f)() for f in functions_sorted]
    for copy, f in zip(sorted_copies, functions_sorted):
        copy.CopyFrom(f)
    del out.library.function[:]
    out.library.function.extend(sorted_copies)
    return out


def _rename_nodes(nodes, names: Dict[str, str]) -> None:
    """Renames the graph's nodes `names` names, with the inputs that read them
    and a renamed Placeholder's _user_specified_name (its last name part)."""
    for node in nodes:
        if node.name in names:
            new = names[node.name]
            if _USER_NAME_ATTR in node.attr:
                node.attr[_USER_NAME_ATTR].s = new.rpartition("/")[2].encode()
            node.name = new
        for i, tensor in enumerate(node.input):
            control = tensor.startswith("^")
            source, sep, port = tensor.lstrip("^").partition(":")
            if source in names:
                node.input[i] = ("^" if control else "") + names[source] + sep + port
