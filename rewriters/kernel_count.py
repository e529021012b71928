"""How many memory-intensive kernels a GraphDef launches: the paper's count
(docs/PAPERS.md, "Results and kernel counts": TF -> XLA -> FS)."""

from __future__ import annotations

from tf_fusionstitch.rewriters import op_table


def memory_intensive_kernels(graph_def) -> int:
    """One kernel per memory-intensive TF op (op_table.is_memory_intensive:
    elementwise, reduction and composite ops) and one per FusionStitch node.
    Shape-only ops (Reshape, Identity) alias their input and launch nothing;
    compute-intensive ops (MatMul, Conv) are not memory-intensive. Counts the
    graph's own nodes, which are what the fusion pass rewrites, not the bodies
    of functions it calls."""
    return sum(n.op == "FusionStitch" or op_table.is_memory_intensive(n.op)
               for n in graph_def.node)
