"""A loop body's recurrences: the ops each iteration must finish before the
next one can start.

A While body takes its loop variables as arguments and returns their next
values in the same order. Loop variable j *feeds* k when the value returned
for k depends on argument j. Variables that feed each other in a cycle (a
recurrent cell's state, with itself; an LSTM's h and c, together) form one
recurrence; an op lies on it when a path runs from one of its arguments
through the op to one of its returned values. TensorFlow starts an
iteration's other work (the input projection of the next step, a masked
output, an accumulator's push) as soon as that work's inputs exist, beside
the recurrence on another core, so the time of one iteration is the time of
its recurrences, and a kernel that joins a recurrence's ops with others
makes every iteration wait for the others too.

Example, a masked GRU step: the state h_next = select(mask, cell(h), h) is a
recurrence of h; the output y_next = select(mask, cell(h), y) is one of y
alone (y feeds only itself). The cell's ops lie on h's recurrence; the
output's select lies on y's, so it is not h's to wait for.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor

LoopVar = Tuple[str, Tensor]   # (the argument's node, the value returned for it)


def recurrence_ids(view: GraphView, loop_vars: Sequence[LoopVar],
                   among: Optional[Set[str]] = None) -> Dict[str, int]:
    """Node -> the recurrence it lies on (an id shared by the ops of one
    recurrence); ops on none are absent, and so are nodes not in `among`
    (when given: a strategy's candidates). Loop variables whose argument or
    returned value is not in the graph are left out."""
    present = [(arg, ret) for arg, ret in loop_vars
               if arg in view.nodes and ret[0] in view.nodes]
    if not present:
        return {}
    below = [_reachable([arg], lambda n: view.consumers[n]) for arg, _ in present]
    above = [_reachable([ret[0]], lambda n: _inputs(view, n)) for _, ret in present]
    n = len(present)
    # feeds[j]: the variables whose returned value depends on argument j.
    feeds = [{k for k in range(n) if present[k][1][0] in below[j]} for j in range(n)]
    ids: Dict[str, int] = {}
    for rid, members in enumerate(_cycles(feeds)):
        after = set().union(*(below[j] for j in members))
        before = set().union(*(above[k] for k in members))
        for node in after & before:
            if among is None or node in among:
                ids[node] = rid
    return ids


def joins_apart(recurrence: Dict[str, int], nodes: Iterable[str]) -> bool:
    """Whether `nodes` (one candidate kernel) hold ops of a recurrence
    (`recurrence`: recurrence_ids' map) beside ops not on it: what neither
    fusion strategy puts in one kernel."""
    return len({recurrence.get(n) for n in nodes}) > 1


def waited_for(view: GraphView, loop_vars: Sequence[LoopVar],
               recurrence: Dict[str, int]) -> Set[Tensor]:
    """The values the next iteration waits for, which packing.py packs
    with nothing: every returned value, and every value on a recurrence."""
    return {ret for _, ret in loop_vars} | {
        (n, port) for n in recurrence for port in range(view.num_outputs[n])}


def _inputs(view: GraphView, name: str) -> List[str]:
    return [src for src, _ in view.data_inputs[name]] + view.control_inputs[name]


def _reachable(start: Iterable[str], step) -> Set[str]:
    """`start` and every node a chain of `step`s reaches from it."""
    seen = set(start)
    stack = list(seen)
    while stack:
        for nxt in step(stack.pop()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _cycles(feeds: List[Set[int]]) -> List[List[int]]:
    """The strongly connected sets of loop variables that hold a cycle (one
    variable feeding itself counts), in order of their first variable."""
    # reach[j]: the variables j feeds through one step or more
    reach = [_reachable(feeds[j], lambda v: feeds[v]) for j in range(len(feeds))]
    groups: List[List[int]] = []
    placed: Set[int] = set()
    for j in range(len(feeds)):
        if j in placed or j not in reach[j]:
            continue
        members = [k for k in range(len(feeds)) if k in reach[j] and j in reach[k]]
        placed.update(members)
        groups.append(members)
    return groups
