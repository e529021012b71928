"""An optimized function's graph for TensorBoard's graph view, kernels as name scopes.

The plan's GraphDef is written as it runs, but each fused kernel's
FusionStitch node moves into a name scope `<scope of its ops>/fused_kernel_<k>`
(k numbers the report's fused kernels, as its HTML page does), beside one
node per TF op it replaced (same name and op type, no inputs: they show what
the kernel computes; the kernel's edges are the FusionStitch node's). The
written graph is for reading only.
"""

from __future__ import annotations

import pathlib
from typing import Dict, List

import tensorflow as tf

from tf_fusionstitch.report_html import kernel_scope


def display_graph(graph_def, report):
    """A copy of `graph_def` with each of `report`'s fused kernels as a name scope."""
    shown = tf.compat.v1.GraphDef()
    shown.CopyFrom(graph_def)
    taken = {node.name for node in shown.node}
    renamed: Dict[str, str] = {}
    added: List[tuple] = []
    for k, cluster in enumerate(report.fused_clusters):
        if cluster.name not in taken:      # a kernel inside a function the graph calls
            continue
        scope = kernel_scope([name for name, _ in cluster.tf_ops] or [cluster.name])
        prefix = f"{scope}/fused_kernel_{k}" if scope else f"fused_kernel_{k}"
        while any(n.startswith(prefix + "/") for n in taken):
            prefix += "_"
        renamed[cluster.name] = f"{prefix}/FusionStitch"
        for name, op in cluster.tf_ops:
            inside = name.startswith(scope + "/") if scope else True
            added.append((f"{prefix}/{name[len(scope) + 1:] if inside and scope else name}",
                          op))
    for node in shown.node:
        node.name = renamed.get(node.name, node.name)
        for i, name in enumerate(node.input):
            control = name.startswith("^")
            source, colon, port = name.lstrip("^").partition(":")
            if source in renamed:
                node.input[i] = ("^" if control else "") + renamed[source] + colon + port
    for name, op in added:
        node = shown.node.add()
        node.name, node.op = name, op
    return shown


def write(graph_def, report, logdir) -> List[pathlib.Path]:
    """Writes the display graph as a TensorBoard graph summary under
    `logdir`; returns the event files there."""
    if graph_def is None or report is None:
        raise ValueError("nothing to write yet: call the optimized function first")
    if report.failure:
        raise ValueError(f"the latest trace runs the original function: {report.failure}")
    logdir = pathlib.Path(logdir)
    writer = tf.summary.create_file_writer(str(logdir))
    with writer.as_default():
        tf.summary.graph(display_graph(graph_def, report))
    writer.flush()
    writer.close()
    return sorted(logdir.glob("events.out.tfevents.*"))
