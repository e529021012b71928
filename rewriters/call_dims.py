"""What the functions a graph calls prove of their outputs' dimensions, and
what the caller proves of their arguments (dim_origins.py asks, per call).

A function is analysed as a GraphDef of its own (function_graphs.py) whose
arguments come with the caller's `Facts`: a component the caller knows as
one origin is one origin inside. Its return values' components, traced
back to the arguments they are proven equal to, become the call's outputs.

- PartitionedCall, StatefulPartitionedCall, a function called as an op:
  the body's return values as they are.
- If, StatelessIf, Case, StatelessCase: what every branch agrees on.
- While, StatelessWhile: a loop invariant. The loop variables start with
  what the caller proves of the loop's inputs; each round analyses the body
  under the current facts and keeps, per component, only what the body's
  results still satisfy (the join: a list with no elements agrees with
  what is pushed into it, anything else must stay the same). When a round
  changes nothing, the facts hold on entry to every iteration, by
  induction, and so on exit: they are the loop's outputs, and what its body
  and condition may take of their arguments. A loop whose facts do not
  settle within _MAX_ROUNDS proves nothing.

Keys inside `Facts` are the caller's origins; `portable` renames them so
that a function's arguments can be compared between callers and handed to
the rewrite of its body (function_bodies.py).
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from tf_fusionstitch.rewriters import function_graphs
from tf_fusionstitch.rewriters.dim_origins import BOTTOM, DimOrigins, Facts
from tf_fusionstitch.rewriters.function_graphs import FUNC_ATTRS, WHILE_OPS, FunctionGraphs

# Each round settles at least one component (BOTTOM -> a size -> unknown);
# real loops settle in two or three.
_MAX_ROUNDS = 8
# TensorFlow has no recursion; a deeper nest than this is not analysed.
_MAX_DEPTH = 8

_FIELDS = ("dims", "value", "elem_dims", "elem_value")


class CallDims:
    """Analyses the calls of one library's functions (see the module docstring)."""

    def __init__(self, functions: FunctionGraphs, depth: int = 0):
        self.functions = functions
        self._depth = depth

    def handles(self, node) -> bool:
        return node.op in FUNC_ATTRS or node.op in self.functions.fdefs

    def analyse(self, origins: DimOrigins, node, inputs) -> Tuple[Dict[str, List[Facts]],
                                                                    List[Facts]]:
        """({function name: its arguments' facts}, the outputs' facts), both in
        `origins`' terms."""
        if self._depth >= _MAX_DEPTH:
            return {}, []
        calls = function_graphs.called_functions(node, set(self.functions.fdefs))
        facts = [origins.facts(t) for t in inputs]
        if node.op in WHILE_OPS:
            body = dict((attr, name) for attr, name, _ in calls)
            invariant = self._loop(origins, node, inputs, body["body"], facts)
            return {body["body"]: invariant, body["cond"]: invariant}, invariant
        args: Dict[str, List[Facts]] = {}
        outputs = None
        for _, fname, start in calls:
            args[fname] = facts[start:]
            results = [self._pick(r) for r in
                       self._returns(origins, node, inputs[start:], fname, facts[start:])]
            outputs = results if outputs is None else \
                [_join_facts(origins, a, b) for a, b in zip(outputs, results)]
        return args, outputs or []

    def _loop(self, origins, node, inputs, body: str, facts: List[Facts]) -> List[Facts]:
        for _ in range(_MAX_ROUNDS):
            results = self._returns(origins, node, inputs, body, facts)
            joined = [_join_facts(origins, f, r) for f, r in zip(facts, results)]
            if joined == facts:
                return facts
            facts = joined
        return [Facts(elem_dtype=f.elem_dtype) for f in facts]

    def _returns(self, origins, node, inputs, fname: str, facts: Sequence[Facts]) -> List[Facts]:
        """The body's return values, their components as sets of the caller's
        keys (the arguments' components they are proven equal to)."""
        view = origins._view
        shapes = function_graphs.site_shapes(node, 0, view.types)
        start = len(shapes) - len(inputs)
        conv = self.functions.convert(fname, shapes[start:],
                                      [origins.held_type(t) for t in inputs])
        inner = DimOrigins(conv.view(), set(conv.fetches), arg_facts=dict(zip(conv.args, facts)),
                           calls=CallDims(self.functions, self._depth + 1))

        def outward(value):
            if value is None or value is BOTTOM:
                return value
            return tuple(c if c is None or c is BOTTOM or isinstance(c, int)
                         else (inner.outer_keys(c) or None) for c in value)
        results = []
        for r in conv.rets:
            known = inner.facts(r)
            results.append(Facts(*(outward(getattr(known, f)) for f in _FIELDS),
                                 known.elem_dtype))
        return results

    @staticmethod
    def _pick(facts: Facts) -> Facts:
        """One key of each set (any is proven equal)."""
        def pick(value):
            if value is None or value is BOTTOM:
                return value
            return tuple(min(c, key=repr) if isinstance(c, frozenset) else c for c in value)
        return Facts(*(pick(getattr(facts, f)) for f in _FIELDS), facts.elem_dtype)


def _join_component(origins: DimOrigins, mine, theirs):
    """A caller's component joined with a body result's (a set of keys)."""
    if isinstance(theirs, frozenset):
        if mine is BOTTOM:
            return min(theirs, key=repr)
        if mine is None or isinstance(mine, int):
            return None
        return mine if origins._find(mine) in {origins._find(k) for k in theirs} else None
    return origins.join(mine, theirs)


def _join_field(origins: DimOrigins, mine, theirs):
    if mine is BOTTOM and theirs is not None and theirs is not BOTTOM:
        return tuple(_join_component(origins, BOTTOM, c) for c in theirs)
    if theirs is BOTTOM:
        return mine
    if mine is None or theirs is None or mine is BOTTOM or len(mine) != len(theirs):
        return None
    return tuple(_join_component(origins, a, b) for a, b in zip(mine, theirs))


def _join_facts(origins: DimOrigins, mine: Facts, theirs: Facts) -> Facts:
    return Facts(*(_join_field(origins, getattr(mine, f), getattr(theirs, f)) for f in _FIELDS),
                 mine.elem_dtype or theirs.elem_dtype)


def portable(args: Sequence[Facts]) -> Tuple[Facts, ...]:
    """`args` with the caller's keys renamed ("k", 0), ("k", 1), ... in order of
    appearance: equal for callers that prove the same."""
    names: Dict[object, Tuple[str, int]] = {}

    def rename(value):
        if value is None or value is BOTTOM:
            return value
        return tuple(c if c is None or c is BOTTOM or isinstance(c, int)
                     else names.setdefault(c, ("k", len(names))) for c in value)
    return tuple(Facts(*(rename(getattr(a, f)) for f in _FIELDS), a.elem_dtype) for a in args)
