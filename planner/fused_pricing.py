"""What each op moves and launches once memory-intensive ops run fused. TF-free.

Unfused, every elementwise op, reduction and view reads its inputs from memory, writes its
output back and pays a launch. A fusing compiler (tf_fusionstitch's stitched kernels, XLA
on GPUs) runs each connected cluster of such ops as one kernel: only the tensors that enter
the cluster from outside are read, only those that leave it are written, and the cluster
launches once. This module finds those clusters and charges their traffic and launch to
their ops, so that the cost model's per-op sums price fused kernels.

Clusters form within one placement (the forward pass apart from the backward pass and the
update, whose arithmetic fuses with the variable writes it feeds; never across a pipeline
stage) and follow producer -> consumer edges between fusible ops of one epoch: an op's
epoch counts the kernels (products, convolutions, ...) on its longest path from the inputs,
so no cluster feeds a product that feeds the cluster back. Two rules:
  "stitch": a reduction fuses with the ops that read it (tf_fusionstitch's stitched
            kernels keep the reduced row on chip);
  "xla":    a reduction also ends an epoch (XLA's loop and input fusions): its readers
            form later clusters and read the reduced tensor from memory.
Matrix products, convolutions, gathers and the optimizers' fused ResourceApply* kernels stay
one op each, priced as before.
"""

import dataclasses

from tf_fusionstitch.planner import op_rules

RULES = ("none", "stitch", "xla")

# Views and data movement a fused kernel folds into its indexing.
_VIEWS = frozenset("Identity Snapshot Reshape Squeeze ExpandDims StopGradient Transpose".split())
# Variable writes that end a fused optimizer update: the kernel writes the variable, and
# the add/sub forms read it once more.
_ASSIGNS = {"AssignVariableOp": 1, "AssignAddVariableOp": 2, "AssignSubVariableOp": 2}
_FUSED_SINGLE = frozenset("BiasAdd BiasAddGrad Softmax LogSoftmax".split())


def fusible(op_type):
    """Whether a fusing compiler puts this op into a memory-intensive cluster."""
    return (op_rules.is_elementwise(op_type) or op_rules.is_reduction(op_type)
            or op_rules.is_generator(op_type) or op_type in _VIEWS or op_type in _ASSIGNS
            or op_type in _FUSED_SINGLE)


@dataclasses.dataclass(frozen=True)
class FusedCost:
    """One op's share of its cluster: bytes it reads from or writes to memory, and
    whether it pays the cluster's one launch."""
    bytes: float
    launches: bool


class _Clusters:
    """Union-find over op names."""

    def __init__(self):
        self.parent = {}

    def find(self, name):
        root = name
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while name != root:   # path compression, iteratively: no recursion on long chains
            self.parent[name], name = root, self.parent.get(name, name)
        return root

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def _fusible_producers(op, tensors, member, place):
    """The fusible ops of `op`'s placement whose outputs `op` reads."""
    return [p for p in (tensors[n].producer for n in op.inputs)
            if p in member and place[p] == place[op.name]]


def _epochs(ops, tensors, member, rule):
    """{op name: epoch}: the most kernels that must finish before it on any path, counting
    ops that are not fusible and not free (products, convolutions, gathers), and under the
    xla rule reductions too. Ops fuse only within an epoch, so no cluster reaches itself
    through an op outside it (a kernel cannot wait for its own output), and under the xla
    rule no kernel both makes a reduction and reads it."""
    epoch = {}
    for name, op in ops.items():   # topological order
        after = 0
        for n in op.inputs:
            p = tensors[n].producer
            if p not in epoch:
                continue
            barrier = (p not in member and not op_rules.is_free(ops[p].type)) or (
                rule == "xla" and op_rules.is_reduction(ops[p].type))
            after = max(after, epoch[p] + barrier)
        epoch[name] = after
    return epoch


def fused_costs(graph, place, rule="stitch"):
    """{op name: FusedCost} for every fusible op of `graph`.

    place: {op name: a hashable placement} (pass and pipeline stage): ops fuse only with
    ops of the same placement. Ops not in the result keep their own bytes and launch.
    """
    if rule not in RULES or rule == "none":
        raise ValueError(f"unknown fusion rule {rule!r}; use 'stitch' or 'xla'")
    ops, tensors = graph.ops, graph.tensors
    member = {name for name, op in ops.items() if fusible(op.type)}
    epoch = _epochs(ops, tensors, member, rule)
    clusters = _Clusters()
    for name in member:
        for p in _fusible_producers(ops[name], tensors, member, place):
            if epoch[p] == epoch[name]:
                clusters.union(p, name)
    root = {name: clusters.find(name) for name in member}
    # A cluster of views alone (a reshape between two matmuls) stays what it was: free.
    working = {r for name, r in root.items() if not op_rules.is_free(ops[name].type)}
    read, launched, costs = set(), set(), {}
    for name, op in ops.items():   # topological order: a cluster's first op launches it
        if name not in member:
            continue
        r = root[name]
        if r not in working:
            costs[name] = FusedCost(0.0, False)
            continue
        moved = 0.0
        for k, inp in enumerate(op.inputs):
            t = tensors[inp]
            if t.variable:
                if op.type in _ASSIGNS and k == 0:
                    moved += _ASSIGNS[op.type] * t.nbytes
                continue
            inside = t.producer in root and root[t.producer] == r
            if not inside and (r, inp) not in read:
                read.add((r, inp))
                moved += t.nbytes
        for out in op.outputs:
            consumers = tensors[out].consumers
            if not consumers or any(root.get(c) != r for c in consumers):
                moved += tensors[out].nbytes
        costs[name] = FusedCost(moved, r not in launched)
        launched.add(r)
    return costs
