"""Which axes of a step's tensors run along the batch, for cutting it into micro-batches.
TF-free.

A tensor of a step traced on a piece of the batch has its batch axes where its shape
differs from the same tensor's in the whole batch's trace. A fused kernel's output
(FusionStitch) has no counterpart to compare by name, since the two traces' plans may
group other ops under one node name, so its axes follow from its inputs' through the
kernel's own primitives (its spec): elementwise ops keep them (broadcasting aligns shapes
on the right), reductions drop those they reduce, transposes permute them, and fused
reshapes only add or remove extents of 1 (removing a batch axis of extent 1, in pieces of
one example, is the batch's sum); a segment sum replaces its data's rows by the segments.
None where that cannot be told.
"""

from tf_fusionstitch import fusion_ir

_ELEMENTWISE = frozenset(fusion_ir.UNARY + fusion_ir.BINARY + fusion_ir.TERNARY
                         + ("broadcast_to",))


class BatchAxes:
    """`shapes(tensor)`: (its shape in the piece's trace, in the whole batch's), each None
    where that trace lacks it; `fused(node)`: (spec JSON, data input tensor names) of a
    FusionStitch node, else None."""

    def __init__(self, shapes, fused):
        self._shapes, self._fused = shapes, fused
        self._kernels = {}    # node -> {value: frozenset of axes, or None}
        self._outputs = {}    # node -> its spec's output values

    def of(self, tensor):
        """The batch axes of `tensor` (a frozenset), or None when they cannot be told."""
        node, port = tensor.rsplit(":", 1)
        fused = self._fused(node)
        if fused is None:
            piece, whole = self._shapes(tensor)
            if whole is None or piece is None or len(piece) != len(whole):
                return frozenset() if whole is None else None
            return frozenset(a for a, (p, w) in enumerate(zip(piece, whole)) if p != w)
        values = self.kernel_values(node)
        return values[self._outputs[node][int(port)]]

    def kernel_values(self, node):
        """{value of FusionStitch `node`'s spec: its batch axes or None}. Kernels reading
        other kernels are resolved first, with a worklist (chains may be long)."""
        stack = [node]
        while stack:
            name = stack[-1]
            if name in self._kernels:
                stack.pop()
                continue
            spec, inputs = self._fused(name)
            waiting = [n for n in (t.rsplit(":", 1)[0] for t in inputs)
                       if n not in self._kernels and self._fused(n) is not None]
            if waiting:
                stack.extend(waiting)
                continue
            cluster = fusion_ir.Cluster.from_json(spec)
            self._outputs[name] = cluster.outputs
            self._kernels[name] = _propagate(cluster, [self.of(t) for t in inputs])
            stack.pop()
        return self._kernels[node]


def _propagate(cluster, input_axes):
    """{value: batch axes or None} of `cluster` given its inputs' batch axes."""
    types = cluster.types()
    axes = {name: a for (name, _), a in zip(cluster.inputs, input_axes)}
    for op in cluster.ops:
        operands = [axes[i] for i in op.inputs]
        rank = len(op.type.shape)
        if None in operands:
            axes[op.name] = None
        elif op.prim == "const":
            axes[op.name] = frozenset()
        elif op.prim in _ELEMENTWISE:
            axes[op.name] = frozenset(a + rank - len(types[i].shape)
                                      for i, x in zip(op.inputs, operands) for a in x)
        elif op.prim in fusion_ir.REDUCE:
            source = types[op.inputs[0]]
            reduced = set(fusion_ir.reduced_axes(op, len(source.shape)))
            keep = op.attr("keep_dims")
            axes[op.name] = frozenset(a if keep else a - sum(r < a for r in reduced)
                                      for a in operands[0] if a not in reduced)
        elif op.prim == "transpose":
            perm = op.attr("perm")
            axes[op.name] = frozenset(d for d, p in enumerate(perm) if p in operands[0])
        elif op.prim == "reshape":
            axes[op.name] = _reshaped(types[op.inputs[0]].shape, op.type.shape, operands[0])
        elif op.prim == "segment_sum":   # the data's rows become segments
            axes[op.name] = frozenset(a for a in operands[0] if a != 0)
        else:   # whatever this module does not know
            axes[op.name] = None
    return axes


def _reshaped(source, target, batch):
    """A fused reshape's batch axes: it only adds or removes extents of 1, so the others
    keep their order. A batch axis of extent 1 (pieces of one example) that it removes is
    the batch's reduction, as a sum over one example is."""
    out, j = set(), 0
    for i, extent in enumerate(source):
        if extent == 1 and not (j < len(target) and target[j] == 1):
            continue   # removed
        while j < len(target) and target[j] != extent:
            if target[j] != 1:
                return None   # not a reshape the fusion pass makes
            j += 1   # an extent of 1 added
        if j == len(target):
            return None
        if i in batch:
            out.add(j)
        j += 1
    return frozenset(out)
