"""fusion="xla_like": XLA's GPU fusion rules, so plans can be compared in one tool.

FusionStitching (docs/PAPERS.md, "FusionStitching") measures itself against XLA, whose
fusion keeps an intermediate only in the registers of the thread that made
it. This pass forms clusters by XLA's rules; they go through the same
lowering, schedule and codegen as stitch's, so the two plans differ only in
where the kernel boundaries are:

- loop fusion: elementwise, broadcast and shape ops fuse into their consumer;
- input fusion: a reduction's producers fuse into it, but nothing in a fusion
  reads a reduced value: the broadcast-subtract of a softmax or a layernorm
  starts a new fusion (stitch keeps it in the reduction's kernel);
- a fusion grows only by fusing a producer into its consumer, so it has one
  root. A fused producer whose value is also read elsewhere becomes an extra
  output (XLA's producer-consumer multi-output fusion); independent ops are
  never packed into one kernel (no sibling or horizontal fusion);
- as for stitch: no cycle, and the schedule must accept the cluster.

XLA duplicates a cheap producer into each of its consumers; clusters here are
disjoint, so a producer joins its first consumer (in topological order) and
the others read its output. XLA fuses HLO, not TF ops: Softmax and LogSoftmax
are first expanded into the ops tf2xla lowers them to.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, types_pb2

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters import cycles, legality, op_table
from tf_fusionstitch.rewriters.clustering import grow_clusters
from tf_fusionstitch.rewriters.graph_view import GraphView, Tensor, parse_input
from tf_fusionstitch.rewriters.lowering import lower_nodes

# Expanded in float32/float64 only: in half precision the separate TF ops would
# round after every step where TF's Softmax kernel does not.
_EXPANDED_DTYPES = (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE)


# -- expansion of composite ops, as tf2xla does before XLA fuses -------------

def expand_softmax(graph_def, types: Dict[Tensor, Optional[ir.TensorType]]):
    """(GraphDef, types) with each float32/float64 Softmax and LogSoftmax
    replaced by Max, Sub, Exp, Sum and then RealDiv (or Log, Sub): tf2xla's
    lowering, so their reductions can end fusions. The last op keeps the
    original name, so readers, control edges and fetches are unchanged."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    del out.node[:]
    types = dict(types)
    taken = {n.name for n in graph_def.node}
    for node in graph_def.node:
        if node.op in ("Softmax", "LogSoftmax") and node.attr["T"].type in _EXPANDED_DTYPES:
            _expand_one(node, out, types, taken)
        else:
            out.node.add().CopyFrom(node)
    return out, types


def _expand_one(node, out, types, taken: Set[str]) -> None:
    x = node.input[0]
    control = [s for s in node.input[1:] if s.startswith("^")]
    src, port, _ = parse_input(x)
    full = types.get((src, port))
    row = None if full is None else ir.TensorType(full.dtype, full.shape[:-1] + (1,))

    def add(op: str, inputs: List[str], t, suffix: str = "") -> str:
        name = node.name
        if suffix:
            name = f"{node.name}/xla_{suffix}"
            while name in taken:
                name += "_"
            taken.add(name)
        new = out.node.add()
        new.name, new.op, new.device = name, op, node.device
        new.input.extend(inputs)
        if op == "Const":
            new.attr["dtype"].type = types_pb2.DT_INT32
            new.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.array([-1], np.int32)))
        else:
            new.attr["T"].CopyFrom(node.attr["T"])
        if op in ("Max", "Sum"):
            new.attr["Tidx"].type = types_pb2.DT_INT32
            new.attr["keep_dims"].b = True
        types[(name, 0)] = t
        return name

    last_axis = add("Const", control, ir.TensorType("int32", (1,)), "axis")
    peak = add("Max", [x, last_axis] + control, row, "max")
    shifted = add("Sub", [x, peak], full, "sub")
    exp = add("Exp", [shifted], full, "exp")
    total = add("Sum", [exp, last_axis], row, "sum")
    if node.op == "Softmax":
        add("RealDiv", [exp, total], full)
    else:
        add("Sub", [shifted, add("Log", [total], row, "log")], full)


# -- legality ----------------------------------------------------------------

def fusion_decision(view: GraphView, nodes: List[str], owner: Dict[str, str],
                    members: Dict[str, List[str]], fetches: Set[Tensor]) -> legality.Decision:
    """Whether `nodes` (a producer fusion joined to its consumer's) may be one
    fusion under XLA's rules."""
    # the consumer being visited is the last of `nodes` (grow_clusters)
    last = max(view.position[n] for n in nodes)
    return legality.first_refusal(
        lambda: legality.single_root(view, nodes),
        lambda: legality.acyclic(cycles.creates_cycle(view, set(nodes), owner, members,
                                                      after=last)),
        lambda: legality.lowered(view, nodes, fetches, legality.no_reduction_read))


def unfusible_alone(view: GraphView, candidates: Set[str], fetches: Set[Tensor]) -> Dict[str, str]:
    """Candidates that are already more than one XLA fusion by themselves: a
    composite op that reads its own reduction (not expanded above, e.g. a
    float16 Softmax). They stay TF ops."""
    rejected = {}
    for name in candidates:
        if op_table.OP_TABLE[view.nodes[name].op].kind != op_table.COMPOSITE:
            continue
        decision = legality.no_reduction_read(lower_nodes(view, [name], fetches).cluster)
        if not decision:
            rejected[name] = f"fusion='xla_like' would split this op: {decision.reason}"
    return rejected


# -- the pass ----------------------------------------------------------------

def form_clusters(view: GraphView, candidates: Set[str], fetches: Set[Tensor],
                  refusals: Optional[legality.Refusals] = None) -> List[List[str]]:
    """Visit consumers in topological order and fuse each producer's fusion
    into the consumer's whenever fusion_decision allows it; `refusals`
    hears why a merge was refused."""
    return grow_clusters(view, candidates, lambda merged, owner, members, *_: fusion_decision(
        view, merged, owner, members, fetches), refusals=refusals)
