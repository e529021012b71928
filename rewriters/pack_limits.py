"""What one pack may hold: a cluster's kernel size as lowering builds it,
and whether clusters packed into one kernel stay within what a kernel may
be (fusion_ir.MAX_INPUTS inputs, fusion_ir.MAX_OPS ops: lowering refuses
more) and within the bytes a pack may hold at once (packing.PACK_MAX_BYTES).

Packed clusters are unconnected: no part reads another's output, so the
pack's kernel reads the union of its parts' inputs (a tensor two parts read
is one input) and runs their ops. Lowering emits a scalar constant once per
cluster, so the sum of the parts' ops may count a shared one twice: the sum
bounds the pack's ops from above, and a pack within the limits lowers.
"""

from __future__ import annotations

import dataclasses
from typing import FrozenSet, List, Optional, Set

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor
from tf_fusionstitch.rewriters.lowering import lower_nodes
from tf_fusionstitch.rewriters.op_table import NotFusible


@dataclasses.dataclass(frozen=True)
class KernelSize:
    inputs: FrozenSet[Tensor]  # the tensors the kernel reads
    ops: int                   # its primitive ops (at most, for a pack)
    bytes: int                 # of the tensors that enter and leave it

    def plus(self, other: "KernelSize") -> "KernelSize":
        """The size of a pack of both."""
        return KernelSize(self.inputs | other.inputs, self.ops + other.ops,
                          self.bytes + other.bytes)

    def within(self, max_bytes: int) -> bool:
        """Whether a kernel of this size lowers and holds at most `max_bytes`."""
        return (len(self.inputs) <= ir.MAX_INPUTS and self.ops <= ir.MAX_OPS
                and self.bytes <= max_bytes)


def kernel_size(view: GraphView, nodes: List[str], fetches: Set[Tensor],
                boundary_bytes: int) -> Optional[KernelSize]:
    """The size of the kernel of `nodes` (which move `boundary_bytes`), or
    None when they do not lower to one cluster (nor does any pack of them)."""
    try:
        lowered = lower_nodes(view, nodes, fetches, validate=False)
    except (NotFusible, ir.SpecError):
        return None
    return KernelSize(frozenset(lowered.input_tensors), len(lowered.cluster.ops),
                      boundary_bytes)
