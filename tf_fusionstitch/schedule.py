"""Schedule: how one cluster maps onto a grid of independent work items.

Every value of a cluster is aligned to one *iteration space*: the axes of the
cluster's largest tensors, found by unifying the dimensions that broadcasting,
reductions and size-1 reshapes tie together. All reductions of a cluster reduce
the same set of axes R (the *column* axes); the other axes are *row* axes. One
work item is one row: it runs a few *loops* over the columns, separated by the
reductions whose results the next loop needs (the block composition of
FusionStitching: a reduction and its broadcast consumers in one kernel). Values
that do not vary along the columns are computed once per row, between loops.
A column value needed in a later loop is either recomputed there (cheap ops) or
kept in a per-row buffer (expensive ops), the choice the paper makes between
thread composition and a shared-memory sub-root.

A cluster without reductions tiles its innermost axis into column chunks so
that a large elementwise cluster still spreads over many work items.

This module raises `UnsupportedCluster` for anything it cannot schedule; the
rewriter then leaves those ops to TensorFlow. No TensorFlow import here.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

from tf_fusionstitch import fusion_ir as ir

# Column chunk for clusters without reductions: big enough to amortise the
# per-item index arithmetic, small enough to balance two to dozens of threads.
ELEMENTWISE_TILE = 4096


class UnsupportedCluster(ValueError):
    """The cluster is valid IR but this schedule cannot fuse it (reason in message)."""


@dataclasses.dataclass(frozen=True)
class AxisGroup:
    """Adjacent iteration axes that every tensor either spans whole or broadcasts."""
    axes: tuple        # iteration axis ids, outer to inner
    is_col: bool


@dataclasses.dataclass
class Schedule:
    cluster: ir.Cluster
    num_axes: int                     # iteration axes 0..n-1, outer to inner
    static_extent: List[Optional[int]]
    col_axes: frozenset               # axes the reductions reduce (or the tiled axis)
    groups: List[AxisGroup]           # coalesced axes, in iteration order
    dim_axes: Dict[str, tuple]        # value -> per dim: axis id or None (size 1)
    is_col: Dict[str, bool]           # value varies along the columns
    phase: Dict[str, int]             # col value: loop index; row value: segment index
    num_loops: int
    buffered: frozenset               # col values kept in a per-row buffer
    tiled: bool                       # no reductions: the col group is chunked
    reductions: frozenset             # reduce ops that really reduce (col -> row)
    hoisted: frozenset                # col values independent of the row: computed once per call
    forward: List[Tuple[int, int]]    # (output index, input index) buffer reuse allowed
    maybe_broadcast: List[Tuple[int, int]]  # (input index, axis): dynamic dim that may be 1

    def axes_of(self, value: str) -> frozenset:
        return frozenset(a for a in self.dim_axes[value] if a is not None)

    def row_groups(self) -> List[AxisGroup]:
        return [g for g in self.groups if not g.is_col]

    def col_groups(self) -> List[AxisGroup]:
        return [g for g in self.groups if g.is_col]


class _UnionFind:
    def __init__(self):
        self.parent: dict = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def _unify_dims(cluster: ir.Cluster) -> Tuple[Dict[str, list], Dict[str, set]]:
    """Union-find over (value, dim) pairs; returns per value the class of each dim.

    Dimensions of static extent 1 take part in nothing (they broadcast).
    """
    types = cluster.types()
    uf = _UnionFind()
    reduced_dims: Dict[str, set] = {}

    def live(value, d):
        return types[value].shape[d] != 1

    for name, t in cluster.inputs:
        for d in range(t.rank):
            if live(name, d):
                uf.find((name, d))
    for op in cluster.ops:
        out = op.type
        for d in range(out.rank):
            if live(op.name, d):
                uf.find((op.name, d))
        if op.prim in ir.REDUCE:
            src = op.inputs[0]
            axes = ir.reduced_axes(op, types[src].rank)
            reduced_dims[op.name] = {d for d in axes if live(src, d)}
            kept = [d for d in range(types[src].rank) if d not in axes]
            for j, d in enumerate(kept):
                od = d if op.attr("keep_dims") else j
                if live(src, d):
                    uf.union((op.name, od), (src, d))
        elif op.prim == "transpose":
            src = op.inputs[0]
            for d, p in enumerate(op.attr("perm")):
                if live(src, p):
                    uf.union((src, p), (op.name, d))
        elif op.prim == "reshape":
            src = op.inputs[0]
            a = [d for d in range(types[src].rank) if live(src, d)]
            b = [d for d in range(out.rank) if live(op.name, d)]
            if len(a) != len(b):
                raise UnsupportedCluster(f"reshape {op.name} changes the non-unit dimensions")
            for da, db in zip(a, b):
                uf.union((src, da), (op.name, db))
        else:  # elementwise with right-aligned broadcasting
            for src in op.inputs:
                st = types[src]
                for d in range(st.rank):
                    od = out.rank - st.rank + d
                    if live(src, d) and live(op.name, od):
                        uf.union((src, d), (op.name, od))

    dims: Dict[str, list] = {}
    for name, t in types.items():
        dims[name] = [uf.find((name, d)) if live(name, d) else None for d in range(t.rank)]
    reduced_classes = {n: {uf.find((op_in, d)) for d in ds}
                       for n, ds in reduced_dims.items()
                       for op_in in [cluster.op_by_name()[n].inputs[0]]}
    return dims, reduced_classes


def _merge_equivalent_axes(cluster, dims, reduced_classes):
    """Identify axis classes of equal static extent that no tensor spans together.

    Broadcasting can leave two classes for what is one axis to the user: in a
    Keras layer norm, rsqrt(var)[B,S,1] * gamma[1,1,H] gets its own H, distinct
    from the H that the mean reduces. Nothing depends on both indices, so
    iterating them as one axis computes every value once instead of H times
    and keeps such clusters legal. Reduced classes are kept as representatives.
    """
    types = cluster.types()
    extent: dict = {}
    together: dict = {}
    for name, classes in dims.items():
        present = [c for c in classes if c is not None]
        for d, c in enumerate(classes):
            if c is not None and types[name].shape[d] is not None:
                extent[c] = types[name].shape[d]
        for c in present:
            together.setdefault(c, set()).update(present)
    reduced = set().union(*reduced_classes.values()) if reduced_classes else set()
    rep = {c: c for c in together}
    members = {c: {c} for c in together}
    for c in sorted(together, key=lambda c: (c not in reduced, str(c))):
        if rep[c] != c or c not in extent:
            continue
        for other in sorted(together, key=str):
            if rep[other] != other or other == c or extent.get(other) != extent[c]:
                continue
            span = set().union(*(together[m] for m in members[c]))
            if other in span or any(m in span for m in members[other]):
                continue
            for m in members[other]:
                rep[m] = c
            members[c] |= members.pop(other)
    new_dims = {n: [None if c is None else rep[c] for c in cl] for n, cl in dims.items()}
    new_reduced = {n: {rep[c] for c in cs} for n, cs in reduced_classes.items()}
    return new_dims, new_reduced


def _order_axes(dims: Dict[str, list], transposed: bool = False) -> list:
    """A total order of the axis classes consistent with every value's layout.

    With `transposed` (the cluster has transposes), values may disagree: the
    order follows the values in `dims`' order (the largest first, outputs
    before other values of a rank) as far as each agrees with those before
    it, so the outputs are written in order and the other tensors are read
    through their own strides."""
    succ: dict = {}
    indeg: dict = {}
    first_seen: dict = {}
    for name, classes in dims.items():
        present = [c for c in classes if c is not None]
        if len(set(present)) != len(present):
            raise UnsupportedCluster(f"value {name} uses one axis twice")
        for c in present:
            first_seen.setdefault(c, len(first_seen))
            succ.setdefault(c, set())
            indeg.setdefault(c, 0)
        edges = [(a, b) for a, b in zip(present, present[1:]) if b not in succ[a]]
        if transposed and any(_reaches(succ, b, a) for a, b in edges):
            continue   # a layout the order so far contradicts: read by strides
        for a, b in edges:
            succ[a].add(b)
            indeg[b] += 1
    # Kahn's algorithm, ties broken by the largest values' order (first seen).
    ready = sorted((c for c in indeg if indeg[c] == 0), key=first_seen.get)
    order = []
    while ready:
        c = ready.pop(0)
        order.append(c)
        for b in sorted(succ[c], key=first_seen.get):
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
        ready.sort(key=first_seen.get)
    if len(order) != len(indeg):
        raise UnsupportedCluster("tensors in the cluster disagree on the order of their axes "
                                 "(a transposed layout)")
    return order


def _reaches(succ: dict, start, goal) -> bool:
    """Is `goal` reachable from `start` along `succ`? (a worklist)"""
    stack, seen = [start], set()
    while stack:
        c = stack.pop()
        if c == goal:
            return True
        if c not in seen:
            seen.add(c)
            stack.extend(succ.get(c, ()))
    return False


def _static_extents(cluster: ir.Cluster, dim_axes: Dict[str, tuple], n: int) -> list:
    types = cluster.types()
    ext: List[Optional[int]] = [None] * n
    for name, axes in dim_axes.items():
        for d, a in enumerate(axes):
            e = types[name].shape[d]
            if a is not None and e is not None:
                if ext[a] is not None and ext[a] != e:
                    raise UnsupportedCluster(f"axis extents {ext[a]} and {e} conflict")
                ext[a] = e
    return ext


def _largest_values_first(cluster: ir.Cluster) -> List[str]:
    """Value names, highest rank first (outputs before other values of a rank):
    the widest tensors set the order of the axes."""
    types = cluster.types()
    names = list(dict.fromkeys(list(cluster.outputs) + [op.name for op in reversed(cluster.ops)]
                               + [n for n, _ in cluster.inputs]))
    return sorted(names, key=lambda v: -types[v].rank)


def build_schedule(cluster: ir.Cluster) -> Schedule:
    if any(op.prim in ir.SCATTER for op in cluster.ops):
        raise UnsupportedCluster("segment sums have a kernel of their own (codegen/scatter.py), "
                                 "on the CPU only")
    types = cluster.types()
    raw_dims, reduced_classes = _unify_dims(cluster)
    ordered_names = _largest_values_first(cluster)
    merged_dims, merged_reduced = _merge_equivalent_axes(cluster, raw_dims, reduced_classes)
    transposed = any(op.prim in ir.MOVE for op in cluster.ops)
    try:
        order = _order_axes({n: merged_dims[n] for n in ordered_names}, transposed)
        raw_dims, reduced_classes = merged_dims, merged_reduced
    except UnsupportedCluster:
        order = _order_axes({n: raw_dims[n] for n in ordered_names}, transposed)
    index = {c: i for i, c in enumerate(order)}
    dim_axes = {n: tuple(None if c is None else index[c] for c in cl) for n, cl in raw_dims.items()}
    n = len(order)
    static_extent = _static_extents(cluster, dim_axes, n)

    reduce_sets = {frozenset(index[c] for c in cs) for cs in reduced_classes.values() if cs}
    if len(reduce_sets) > 1:
        raise UnsupportedCluster("reductions over different axes in one cluster")
    tiled = not reduce_sets
    if transposed and not tiled:
        raise UnsupportedCluster("a transpose in a cluster that reduces (transposes fuse "
                                 "with elementwise ops only)")
    axes_of = {v: frozenset(a for a in dim_axes[v] if a is not None) for v in types}
    maybe = _maybe_broadcast(cluster, dim_axes, static_extent)
    pinned = frozenset(a for _, a in maybe)
    _check_outputs_follow_their_inputs(cluster, dim_axes, static_extent, maybe)
    if reduce_sets and pinned & next(iter(reduce_sets)):
        # Broadcasting commutes with elementwise ops, not with a reduction over
        # the broadcast axis: softmax(x[?]) * y[2] with x of size 1 at run time
        # must reduce over 1 element, then broadcast.
        raise UnsupportedCluster("a dimension unknown at optimization time may broadcast at "
                                 "run time along an axis the cluster reduces")

    if tiled:
        all_axes = frozenset(range(n))
        for o in cluster.outputs:
            if axes_of[o] != all_axes:
                raise UnsupportedCluster(f"output {o} is broadcast along the cluster's other "
                                         "outputs (it would be written many times)")
        groups = _coalesce(cluster, dim_axes, list(range(n)), frozenset(), pinned)
        if groups:
            col_axes = frozenset(groups[-1].axes)
            groups[-1] = AxisGroup(groups[-1].axes, True)
        else:
            col_axes = frozenset()
    else:
        col_axes = next(iter(reduce_sets))
        row_axes = frozenset(range(n)) - col_axes
        for o in cluster.outputs:
            ax = axes_of[o]
            if ax != row_axes and ax != row_axes | col_axes:
                raise UnsupportedCluster(f"output {o} spans neither all row axes nor all axes")
        groups = _coalesce(cluster, dim_axes, list(range(n)), col_axes, pinned)

    is_col = {v: bool(axes_of[v] & col_axes) for v in types}
    # A reduce over size-1 dimensions only is elementwise (an identity).
    reductions = frozenset(name for name, cs in reduced_classes.items() if cs)
    phase, num_loops = _assign_phases(cluster, is_col, reductions)
    hoisted = _hoistable(cluster, axes_of, frozenset(range(n)) - col_axes, is_col, reductions)
    buffered = _choose_buffers(cluster, is_col, phase, reductions) - hoisted
    forward = [(j, i) for j, i in
               _forwardable(cluster, types, axes_of, is_col, phase, num_loops, n, dim_axes)
               if not any(k == i for k, _ in maybe)]
    return Schedule(cluster, n, static_extent, col_axes, groups, dim_axes, is_col, phase,
                    num_loops, buffered, tiled, reductions, hoisted, forward, maybe)


def _maybe_broadcast(cluster, dim_axes, static_extent) -> List[Tuple[int, int]]:
    """Input dimensions unknown at optimization time that may be 1 at run time
    while the axis is larger, as TF's broadcasting allows: the axis has another
    source (a static extent, or another input's dimension not proven equal:
    cluster.equal_dims). They get a run-time stride (0 when broadcast)
    instead of an assumption."""
    sources: Dict[int, set] = {}
    class_of = {m: k for k, cls in enumerate(cluster.equal_dims) for m in cls}
    for name, _ in cluster.inputs:
        for d, a in enumerate(dim_axes[name]):
            if a is not None:
                sources.setdefault(a, set()).add(class_of.get((name, d), (name, d)))
    out = []
    for i, (name, t) in enumerate(cluster.inputs):
        for d, a in enumerate(dim_axes[name]):
            if a is not None and t.shape[d] is None and (
                    static_extent[a] is not None or len(sources[a]) > 1):
                out.append((i, a))
    return out


def _check_outputs_follow_their_inputs(cluster, dim_axes, static_extent, maybe) -> None:
    """An output's dynamic dimension on a maybe-broadcast axis has the run-time
    extent of the inputs it depends on. If it does not depend on every source of
    that axis (x*2 beside x*2 + y[3], with x of size 1 at run time), the iteration
    extent could be larger than the output: refuse rather than broadcast it."""
    if not maybe:
        return
    inputs = [n for n, _ in cluster.inputs]
    pinned = {a for _, a in maybe}
    sources = {a: {i for i, n in enumerate(inputs) if a in dim_axes[n]} for a in pinned}
    # The indices of the inputs each value depends on, in the ops' (topological)
    # order: a loop, not a recursion, so long chains do not hit Python's limit.
    cone = {n: frozenset({i}) for i, n in enumerate(inputs)}
    for op in cluster.ops:
        cone[op.name] = frozenset().union(*(cone[i] for i in op.inputs))

    types = cluster.types()
    for o in cluster.outputs:
        for d, a in enumerate(dim_axes[o]):
            if a in pinned and types[o].shape[d] is None and (
                    static_extent[a] is not None or not sources[a] <= cone[o]):
                raise UnsupportedCluster(f"output {o} may be smaller than the iteration space "
                                         "when a dynamic dimension broadcasts at run time")


def _coalesce(cluster, dim_axes, order, col_axes, pinned=frozenset()) -> List[AxisGroup]:
    """Merge adjacent axes of the same kind that every tensor spans alike;
    `pinned` axes (run-time broadcast possible) stay alone."""
    layouts = [[a for a in axes if a is not None] for axes in dim_axes.values()]
    presence = [frozenset(layout) for layout in layouts]
    groups: List[AxisGroup] = []
    for a in order:
        kind = a in col_axes
        if groups and groups[-1].is_col == kind and a not in pinned \
                and groups[-1].axes[-1] not in pinned:
            prev = groups[-1].axes[-1]
            if all((a in p) == (prev in p) for p in presence) and all(
                    _next_to(layout, prev, a) for layout, p in zip(layouts, presence)
                    if prev in p):
                groups[-1] = AxisGroup(groups[-1].axes + (a,), kind)
                continue
        groups.append(AxisGroup((a,), kind))
    return groups


def _next_to(layout: list, prev, a) -> bool:
    """Does axis `a` follow `prev` directly in this layout? (a transpose can
    move axes apart that are adjacent in the iteration order)"""
    i = layout.index(prev) + 1
    return i < len(layout) and layout[i] == a


def _assign_phases(cluster: ir.Cluster, is_col: Dict[str, bool],
                   reductions: frozenset) -> Tuple[Dict[str, int], int]:
    """Col value -> loop index; row value -> row segment (0 before the first loop,
    k after loop k-1). A reduction whose input is in loop k yields a row value of
    segment k+1; a col value can run in the first loop after its row inputs exist."""
    phase: Dict[str, int] = {name: 0 for name, _ in cluster.inputs}
    num_loops = 0
    for op in cluster.ops:
        ins = [phase[i] for i in op.inputs]
        if op.name in reductions:
            phase[op.name] = phase[op.inputs[0]] + 1
            num_loops = max(num_loops, phase[op.inputs[0]] + 1)
        else:
            phase[op.name] = max(ins, default=0)
            if is_col[op.name]:
                num_loops = max(num_loops, phase[op.name] + 1)
    return phase, max(num_loops, 1)


def _hoistable(cluster, axes_of, row_axes, is_col, reductions) -> frozenset:
    """Col values that vary along no row axis and depend on no row value (a
    batch norm's scale * rsqrt(var + eps), say): computed once per call into a
    column buffer instead of once per element."""
    if not row_axes:
        return frozenset()
    ops = cluster.op_by_name()
    inputs = {n for n, _ in cluster.inputs}
    free = set()  # values with no row dependence
    for op in cluster.ops:
        if op.name in reductions or axes_of[op.name] & row_axes:
            continue
        if all(i in free or (i in inputs and not axes_of[i] & row_axes) for i in op.inputs):
            free.add(op.name)
    consumers_outside = set()
    for op in cluster.ops:
        if op.name not in free:
            consumers_outside.update(i for i in op.inputs if i in free)
    # Keep the frontier that the row loops read, when it varies along the columns.
    return frozenset(v for v in consumers_outside if is_col[v] and ops[v].prim != "const")


def _choose_buffers(cluster, is_col, phase, reductions) -> frozenset:
    """Col values used in a later loop: buffer those whose recomputation would
    repeat an expensive op; recompute light ones (reloading inputs from cache)."""
    ops = cluster.op_by_name()
    late = set()
    for op in cluster.ops:
        if op.name in reductions or not is_col[op.name]:
            continue  # a reduction accumulates in its input's own loop
        late.update(i for i in op.inputs if i in ops and is_col[i] and phase[i] < phase[op.name])
    buffered = set()

    def expensive_cone(v):
        """Does recomputing `v` repeat an expensive op? A walk up its col
        producers that stops at buffered values (a worklist: chains are
        as long as the cluster)."""
        stack, seen = [v], set()
        while stack:
            u = stack.pop()
            if u not in ops or u in buffered or u in seen or not is_col[u]:
                continue
            seen.add(u)
            if ops[u].prim in ir.EXPENSIVE:
                return True
            stack.extend(ops[u].inputs)
        return False

    position = {name: i for i, name in enumerate(ops)}
    for v in sorted(late, key=position.__getitem__):
        if expensive_cone(v):
            buffered.add(v)
    return frozenset(buffered)


def _layout(axes: tuple) -> tuple:
    """A value's iteration axes in its memory order (outer to inner)."""
    return tuple(a for a in axes if a is not None)


def _forwardable(cluster, types, axes_of, is_col, phase, num_loops, n,
                 dim_axes) -> List[Tuple[int, int]]:
    """An input buffer may become an output when both span every axis in the
    same memory order with the same dtype and the output is written in the last loop: by then every read of
    that input element has happened (reads precede the store in each iteration,
    and work items touch disjoint rows)."""
    full = frozenset(range(n))
    pairs = []
    for j, o in enumerate(cluster.outputs):
        if axes_of[o] != full or not is_col[o] or phase[o] != num_loops - 1:
            continue
        for i, (name, t) in enumerate(cluster.inputs):
            if axes_of[name] == full and t.dtype == types[o].dtype \
                    and _layout(dim_axes[name]) == _layout(dim_axes[o]):
                pairs.append((j, i))
    return pairs
