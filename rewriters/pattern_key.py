"""A name-free key of everything lower_nodes reads for a set of nodes.

Two node sets with equal keys lower to the same cluster (the same fusion IR,
up to which TF tensors it reads and replaces), so a search that checks tens
of thousands of candidate sets (explore.py) lowers and schedules each
distinct structure once: the twelve layers of an encoder and the Adam
updates of its same-shaped weights are a handful of structures.

The key mirrors lower_nodes (lowering.py) and must change with it: per
node in topological order, its op and attributes (what an op-table rule
reads of it) and output types; per data input, the producer inside the set
(its index and port) or the tensor outside it (numbered by first use, with
its type, its value when it is a Const, and its dimension symbols where an
extent is unknown, renumbered by first use: what _equal_dims reads); and
per output, whether it leaves the set (a consumer outside, or a fetch).
"""

from __future__ import annotations

import hashlib
from typing import Dict, Iterable, Set

from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor


def pattern_key(view: GraphView, nodes: Iterable[str], fetches: Set[Tensor]) -> tuple:
    members = set(nodes)
    ordered = sorted(members, key=view.position.get)
    index = {n: i for i, n in enumerate(ordered)}
    outside: Dict[Tensor, int] = {}
    symbols: Dict[object, int] = {}
    key = []
    for name in ordered:
        inputs = []
        for t in view.data_inputs[name]:
            if t[0] in index:
                inputs.append((index[t[0]], t[1]))
            elif t in outside:
                inputs.append(outside[t])
            else:
                outside[t] = len(outside)
                inputs.append((outside[t], _outside_tensor(view, t, symbols)))
        leaving = tuple(
            (name, k) in fetches or
            any(c not in members for c in view.data_consumers.get((name, k), ()))
            for k in range(view.num_outputs[name]))
        key.append((_node_key(view, name), tuple(inputs), leaving))
    return tuple(key)


def _node_key(view: GraphView, name: str) -> tuple:
    """The op, its attributes and its output types (memoised on the view)."""
    memo_key = ("pattern_key.node", name)
    found = view.memo.get(memo_key)
    if found is None:
        node = view.nodes[name]
        attrs = tuple((k, node.attr[k].SerializeToString(deterministic=True))
                      for k in sorted(node.attr))
        out_types = tuple(view.type_of((name, k)) for k in range(view.num_outputs[name]))
        found = view.memo[memo_key] = (node.op, attrs, out_types)
    return found


def _outside_tensor(view: GraphView, t: Tensor, symbols: Dict[object, int]) -> tuple:
    """What lowering reads of a tensor produced outside the set: its type,
    its producer's value when that is a Const (inlined scalars, static
    inputs), and the dimension symbols of its unknown extents, numbered by
    first use in the set."""
    memo_key = ("pattern_key.tensor", t)
    found = view.memo.get(memo_key)
    if found is None:
        tt = view.type_of(t)
        unknown = None  # symbols of the unknown extents (None where not a symbol)
        if view.dims is not None and tt is not None and None in tt.shape:
            dims = view.dims(t)
            if dims is not None and len(dims) == tt.rank:
                unknown = tuple(s if extent is None and s is not None and
                                not isinstance(s, int) else None
                                for extent, s in zip(tt.shape, dims))
                if not any(s is not None for s in unknown):
                    unknown = None
        found = view.memo[memo_key] = ((tt, _const_digest(view, t[0]), None), unknown)
    fixed, unknown = found
    if unknown is None:
        return fixed
    return fixed[:2] + (tuple(None if s is None else symbols.setdefault(s, len(symbols))
                              for s in unknown),)


def _const_digest(view: GraphView, name: str):
    """A digest of a Const node's value attribute, None for other nodes."""
    memo_key = ("pattern_key.const", name)
    found = view.memo.get(memo_key, memo_key)
    if found is memo_key:
        node = view.nodes.get(name)
        found = None
        if node is not None and node.op == "Const":
            found = hashlib.sha256(
                node.attr["value"].SerializeToString(deterministic=True)).digest()
        view.memo[memo_key] = found
    return found
