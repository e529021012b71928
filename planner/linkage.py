"""Linkage groups: tensor and variable axes whose splits are tied by the ops between them.

TF-free. Every axis of every tensor (a variable is the tensor of its handle) is a node; each
op's axis rule ties nodes (an elementwise op ties its operands' matching axes, a matmul ties
output rows to the left operand's rows and the two contracted axes to each other, the
optimizer update ties a variable to its gradient and slots). Connected components are the
linkage groups: splitting one member across devices splits all of them, on their own axes.

On a transformer block this yields Megatron's three groups without being told: the hidden
axis (through residuals, layer norms and weight gradients), the attention-heads axis
(query/key/value output columns and the attention-out input rows) and the FFN axis
(FFN-in columns and FFN-out rows).

Groups that carry variables are the decisions of operator partitioning. Groups of repeated
layers are detected by a structural signature and merged into one decision unit, so all
layers share one choice. Two groups *conflict* if one tensor has axes in both (a 1-D device
mesh cannot split a tensor twice).
"""

import dataclasses

from tf_fusionstitch.planner import op_rules


class _UnionFind:
    def __init__(self):
        self.parent = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


@dataclasses.dataclass
class Unit:
    """One operator-partitioning decision: split all its groups, or none of them."""
    index: int
    groups: tuple          # linkage group ids
    variables: tuple       # (variable name, axis) pairs the decision splits
    extents: frozenset     # every extent the groups hold (a split degree must divide them)

    @property
    def label(self):
        names = [f"{v}[{a}]" for v, a in self.variables[:4]]
        more = len(self.variables) - len(names)
        return ", ".join(names) + (f", ... (+{more})" if more > 0 else "")

    def divisible_by(self, t):
        return all(e % t == 0 and e >= t for e in self.extents)


class Linkage:
    """Result of `analyze`: groups, their conflicts, decision units and the batch groups."""

    def __init__(self, graph):
        self.graph = graph
        self.rules = {}           # op name -> AxisRule
        self.group_of = {}        # (tensor name, axis) -> group id
        self.members = {}         # group id -> [(tensor name, axis)]
        self.conflicts = set()    # frozenset({g1, g2}) that share a tensor
        self.self_conflicting_groups = set()   # groups with two axes in one tensor
        self.bad_units = set()                 # units that can never be split
        self.batch_groups = set()
        self.units = []
        self.unit_conflicts = set()

    def groups_of_tensor(self, name):
        """Group id per axis of tensor `name` (None for extent-1 axes)."""
        t = self.graph.tensors[name]
        return [self.group_of.get((name, a)) for a in range(t.rank)]

    def variable_axes(self, group):
        seen = []
        for name, axis in self.members[group]:
            var = self.graph.tensors[name].variable
            if var and (var, axis) not in seen:
                seen.append((var, axis))
        return seen

    def legal_units(self, chosen, t):
        """Indices of units that may be split now, given the already split `chosen`."""
        legal = []
        for u in self.units:
            if u.index in chosen or not u.divisible_by(t) or u.index in self.bad_units:
                continue
            if any(frozenset((u.index, c)) in self.unit_conflicts for c in chosen):
                continue
            legal.append(u.index)
        return legal

    def split_groups(self, unit_indices):
        return frozenset(g for i in unit_indices for g in self.units[i].groups)


def analyze(graph):
    """Computes the linkage groups and decision units of a finalized `ir.Graph`."""
    link = Linkage(graph)
    uf = _UnionFind()
    tensors = graph.tensors

    def node(port, op):
        kind, k = port[0]
        name = (op.inputs if kind == "i" else op.outputs)[k]
        return name, port[1]

    # Every non-trivial axis is a node.
    for name, t in tensors.items():
        for a, extent in enumerate(t.shape):
            if extent > 1:
                uf.find((name, a))
    # Handles of one variable (identities of a handle) are one variable.
    handle_of = {}
    for name, t in tensors.items():
        if t.variable:
            first = handle_of.setdefault(t.variable, name)
            for a in range(t.rank):
                if t.shape[a] > 1 and first != name:
                    uf.union((first, a), (name, a))
    for op in graph.ops.values():
        ins = [tensors[n] for n in op.inputs]
        outs = [tensors[n] for n in op.outputs]
        rule = op_rules.axis_rule(op, ins, outs)
        link.rules[op.name] = rule
        for p, q in rule.ties:
            a, b = node(p, op), node(q, op)
            # Extents may differ: a reshape ties a merged axis to its outer factor.
            if tensors[a[0]].shape[a[1]] > 1 and tensors[b[0]].shape[b[1]] > 1:
                uf.union(a, b)
    # Number groups in a stable order: first appearance over tensors.
    ids = {}
    for name, t in tensors.items():
        for a, extent in enumerate(t.shape):
            if extent > 1:
                root = uf.find((name, a))
                gid = ids.setdefault(root, len(ids))
                link.group_of[(name, a)] = gid
                link.members.setdefault(gid, []).append((name, a))
    for name, t in tensors.items():
        gs = [g for g in link.groups_of_tensor(name) if g is not None]
        if len(set(gs)) < len(gs):
            link.self_conflicting_groups.update(g for g in gs if gs.count(g) > 1)
        for i, g in enumerate(gs):
            for h in gs[i + 1:]:
                if g != h:
                    link.conflicts.add(frozenset((g, h)))
    for name in graph.inputs:
        if tensors[name].rank and (name, 0) in link.group_of:
            link.batch_groups.add(link.group_of[(name, 0)])
    _build_units(link)
    return link


def _signature(link, group):
    # Structure of a group without names: what produces each member, its shape, its axis.
    # Groups of repeated layers have equal signatures.
    graph = link.graph
    items = []
    for name, axis in link.members[group]:
        t = graph.tensors[name]
        kind = "var" if t.variable else graph.ops[t.producer].type if t.producer else "input"
        items.append((kind, t.shape, axis))
    return tuple(sorted(items))


def _build_units(link):
    by_signature = {}
    order = []
    for g in sorted(link.members):
        if g in link.batch_groups or not link.variable_axes(g):
            continue
        sig = _signature(link, g)
        if sig not in by_signature:
            by_signature[sig] = []
            order.append(sig)
        by_signature[sig].append(g)
    unit_of = {}
    for i, sig in enumerate(order):
        groups = tuple(by_signature[sig])
        variables = tuple(va for g in groups for va in link.variable_axes(g))
        extents = frozenset(link.graph.tensors[n].shape[a] for g in groups
                            for n, a in link.members[g])
        link.units.append(Unit(i, groups, variables, extents))
        for g in groups:
            unit_of[g] = i
    self_bad = set()
    for pair in link.conflicts:
        g, h = tuple(pair)
        if g in unit_of and h in unit_of:
            if unit_of[g] == unit_of[h]:
                self_bad.add(unit_of[g])
            else:
                link.unit_conflicts.add(frozenset((unit_of[g], unit_of[h])))
    # A variable split on two axes by one unit is not a legal 1-D split either.
    for u in link.units:
        names = [v for v, _ in u.variables]
        if len(set(names)) < len(names):
            self_bad.add(u.index)
        if any(g in link.self_conflicting_groups for g in u.groups):
            self_bad.add(u.index)
    link.bad_units = self_bad
