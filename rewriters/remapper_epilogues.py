"""Contraction epilogues that TensorFlow's remapper fuses: left to it.

Grappler's remapper folds a convolution's or a matmul's bias add, activation
and residual add into the contraction's own oneDNN call (_FusedConv2D,
_FusedMatMul, ...): the epilogue then costs no pass over the output at all,
where a kernel of ours would add one (VGG16: 13 _FusedConv2D under TF, 13
bare Conv2D and 13 bias+ReLU kernels under a plan that clusters them). Which
epilogues it fuses depends on the TF build, oneDNN and the other readers of
each intermediate, so rather than restate its rules we ask it: run the
remapper alone on the graph and keep out of clusters every node it folded
into a fused contraction. The graph TF finally runs is remapped again, so
those nodes end up where the remapper put them.
"""

from __future__ import annotations

from typing import Dict, Iterable, Set

from tensorflow.core.framework import graph_pb2

from tf_fusionstitch.rewriters import grappler
from tf_fusionstitch.rewriters.graph_view import Tensor

# Ops the remapper makes of a contraction and its epilogue.
FUSED_CONTRACTIONS = frozenset({
    "_FusedConv2D", "_FusedConv3D", "_FusedDepthwiseConv2dNative", "_FusedMatMul",
    "_FusedBatchMatMulV2", "_MklFusedConv2D", "_MklFusedDepthwiseConv2dNative",
    "_MklFusedMatMul", "_MklFusedBatchMatMulV2", "_MklNativeFusedConv2D",
    "_MklNativeFusedDepthwiseConv2dNative", "_MklNativeFusedMatMul",
    "_MklNativeFusedBatchMatMulV2"})


CPU = "/device:CPU:0"
LEFT_TO_REMAPPER = "left to TF's remapper"   # how each such node's reason starts


def _source(input_name: str) -> str:
    return input_name.lstrip("^").split(":")[0]


def fused_epilogues(graph_def, fetches: Set[Tensor], candidates: Iterable[str]
                    ) -> Dict[str, str]:
    """Candidate node -> why it stays a TF op, for the candidates the
    remapper folds into a fused contraction: the node whose name the fused op
    takes (the epilogue's last op) and the nodes the remapper removed on its
    way up the inputs from there (the contraction, the bias add)."""
    keep = sorted({name for name, _ in fetches})
    placed = graph_pb2.GraphDef()
    placed.CopyFrom(graph_def)
    for node in placed.node:   # the remapper fuses only what it knows runs on a CPU
        node.device = node.device or CPU
    # One round: the remapper fuses a contraction with its whole epilogue in
    # one visit, so a second round over its own output folds nothing more
    # (tests/rewriters/test_remapper_epilogues.py checks it) and would cost
    # as much again: 0.8 s of a NASNetMobile train step's rewrite.
    remapped = grappler.run_grappler(placed, None, keep, passes=("remap",), rounds=1)
    before = {n.name: n for n in graph_def.node}
    after = {n.name for n in remapped.node}
    candidates = set(candidates)
    left: Dict[str, str] = {}
    for fused in remapped.node:
        original = before.get(fused.name)
        if fused.op not in FUSED_CONTRACTIONS or original is None or original.op == fused.op:
            continue
        why = f"{LEFT_TO_REMAPPER}, which fuses it into the contraction {fused.op}"
        stack, seen = [fused.name], set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in candidates:
                left[name] = why
            stack.extend(src for src in map(_source, before[name].input)
                         if src in before and src not in after)
    return left
