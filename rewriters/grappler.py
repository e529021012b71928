"""Run TensorFlow's own Grappler passes on a traced function's GraphDef."""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2
from tensorflow.python.grappler import tf_optimizer

# TF's standard simplifications, in the order and number of rounds TF's own
# meta-optimizer runs them, so a fused region computes what TF would (some of
# them change results: with CSE first, not(a <= b) becomes a > b, False for
# NaN). None introduces ops outside the op table's reach (the remapper would,
# so it is not listed).
DEFAULT_PASSES = ("common_subgraph_elimination", "constfold", "arithmetic", "dependency")

_ROUNDS = {1: rewriter_config_pb2.RewriterConfig.ONE,
           2: rewriter_config_pb2.RewriterConfig.TWO}   # TF's default: TWO


def run_grappler(graph_def, graph, fetches: Sequence[str], passes=DEFAULT_PASSES,
                 rounds: int = 2):
    """`fetches` are the tensors and ops that must survive (outputs, side
    effects). `graph`: the tf.Graph `graph_def` came from, for its
    collections; None for a GraphDef alone. `rounds`: how many times the
    meta-optimizer runs the passes, 2 as TF does, or 1."""
    if graph is None:
        meta = meta_graph_pb2.MetaGraphDef()
        meta.graph_def.CopyFrom(graph_def)
    else:
        meta = tf.compat.v1.train.export_meta_graph(graph_def=graph_def, graph=graph)
    keep = meta.collection_def["train_op"].node_list.value
    for name in fetches:
        keep.append(name)
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.extend(passes)
    rewrite.meta_optimizer_iterations = _ROUNDS[rounds]
    rewrite.min_graph_nodes = -1  # also small graphs
    return tf_optimizer.OptimizeGraph(config, meta)
