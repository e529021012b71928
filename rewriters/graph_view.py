"""A read-only view of a GraphDef: edges both ways, topological order, types.

Input strings follow GraphDef conventions: `node`, `node:port`, `^node` (a
control edge). Tensor types (dtype and static shape) come from TensorFlow's
shape inference, supplied by the caller as `types[(node, port)]`.
"""

from __future__ import annotations

import copy
from typing import Callable, Dict, List, Optional, Set, Tuple

from tf_fusionstitch import fusion_ir as ir

Tensor = Tuple[str, int]


def parse_input(s: str) -> Tuple[str, int, bool]:
    """'^a' -> ('a', -1, True); 'a:2' -> ('a', 2, False); 'a' -> ('a', 0, False)."""
    if s.startswith("^"):
        return s[1:], -1, True
    name, _, port = s.rpartition(":")
    if name and port.isdigit():
        return name, int(port), False
    return s, 0, False


def fresh_name(base: str, taken: set) -> str:
    """`base`, or `base` with underscores appended, not in `taken` (which it joins)."""
    name = base
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def edited_copy(graph_def, names, edit):
    """A copy of `graph_def` in which `edit(new, node, out, taken)` changes the
    copy `new` of each node named in `names` (and may add nodes to `out`,
    naming them outside `taken`)."""
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    del out.node[:]
    taken: Set[str] = {n.name for n in graph_def.node}
    for node in graph_def.node:
        new = out.node.add()
        new.CopyFrom(node)
        if node.name in names:
            edit(new, node, out, taken)
    return out


def tensor_name(t: Tensor) -> str:
    return t[0] if t[1] == 0 else f"{t[0]}:{t[1]}"


class GraphView:
    def __init__(self, graph_def, types: Dict[Tensor, Optional[ir.TensorType]],
                 dims: Optional[Callable[[Tensor], Optional[list]]] = None):
        """`dims(t)`: per dimension of `t`, a symbol (dim_origins.py) that is the
        same for dimensions proven equal whenever the graph runs, or None
        if nothing is proven; lowering tells a kernel which dynamic extents
        are equal (fusion_ir.Cluster.equal_dims)."""
        self.graph_def = graph_def
        self.nodes = {n.name: n for n in graph_def.node}
        self.types = types
        self.dims = dims
        self.num_outputs = {name: 1 for name in self.nodes}
        for (name, port) in types:
            if name in self.num_outputs:
                self.num_outputs[name] = max(self.num_outputs[name], port + 1)
        self.data_inputs: Dict[str, List[Tensor]] = {}
        self.control_inputs: Dict[str, List[str]] = {}
        self.consumers: Dict[str, set] = {name: set() for name in self.nodes}
        self.data_consumers: Dict[Tensor, List[str]] = {}
        for n in graph_def.node:
            data, ctrl = [], []
            for s in n.input:
                src, port, is_ctrl = parse_input(s)
                if src not in self.nodes:
                    raise ValueError(f"node {n.name} reads {s!r}, which is not in the graph")
                if is_ctrl:
                    ctrl.append(src)
                else:
                    data.append((src, port))
                    self.data_consumers.setdefault((src, port), []).append(n.name)
                self.consumers[src].add(n.name)
            self.data_inputs[n.name] = data
            self.control_inputs[n.name] = ctrl
        self.order = self._topological_order()
        self.position = {name: i for i, name in enumerate(self.order)}
        # Facts derived from one node and memoised by their users (a view is
        # read-only): lowering.py keeps Const values here.
        self.memo: Dict[object, object] = {}

    def with_dims(self, dims: Optional[Callable[[Tensor], Optional[list]]]) -> "GraphView":
        """This view with `dims` (see __init__) and a memo of its own (memoised
        facts may read dims); the graph's structure is shared, not rebuilt."""
        other = copy.copy(self)
        other.dims = dims
        other.memo = {}
        return other

    def _topological_order(self) -> List[str]:
        indeg = {name: 0 for name in self.nodes}
        for name in self.nodes:
            for src in {s for s, _ in self.data_inputs[name]} | set(self.control_inputs[name]):
                indeg[name] += 1
        # Count distinct producers only once per consumer, as above.
        ready = [n.name for n in self.graph_def.node if indeg[n.name] == 0]
        order = []
        while ready:
            name = ready.pop()
            order.append(name)
            for c in sorted(self.consumers[name], key=lambda x: x):
                indeg[c] -= 1
                if indeg[c] == 0:
                    ready.append(c)
        if len(order) != len(self.nodes):
            raise ValueError("graph has a cycle outside control-flow frames; not rewritten")
        return order

    def type_of(self, t: Tensor) -> Optional[ir.TensorType]:
        return self.types.get(t)

    def tensor_bytes(self, t: Tensor, dynamic_extent: int) -> int:
        """Bytes of `t`, a dimension unknown at trace time counted as
        `dynamic_extent` (0 for a tensor of unknown type)."""
        tt = self.types.get(t)
        if tt is None:
            return 0
        count = 1
        for d in tt.shape:
            count *= dynamic_extent if d is None else d
        return count * ir.DTYPE_BYTES.get(tt.dtype, 4)
