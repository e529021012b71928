"""Traced graphs as the greedy clustering sees them, and the plans it forms
on them under different options: for tests that compare a shortcut of
form_clusters with its reference."""

import contextlib
import os
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from optimize_testlib import traced_types
from tf_fusionstitch.rewriters.clustering import form_clusters, fusible_nodes
from tf_fusionstitch.rewriters.dim_origins import DimOrigins
from tf_fusionstitch.rewriters.graph_view import GraphView


def traced_view(fn, *specs):
    """(view with dimension symbols, fetches) of fn traced at `specs`, as the pass sees it."""
    concrete = tf.function(fn).get_concrete_function(*specs)
    graph_def = concrete.graph.as_graph_def()
    types = traced_types(graph_def, concrete.graph)
    names = {n.name for n in graph_def.node}
    fetches = {(t.op.name, t.value_index) for t in concrete.outputs if t.op.name in names}
    origins = DimOrigins(GraphView(graph_def, types), fetches)
    return GraphView(graph_def, types, dims=origins.dims), fetches


def plans(fn, specs, *options):
    """The clusters form_clusters(**each of `options`) forms on fn traced at
    `specs`, each a sorted list of sorted node lists, each from a view of its
    own (the views remember verdicts)."""
    formed = []
    for kwargs in options:
        view, fetches = traced_view(fn, *specs)
        verdict = fusible_nodes(view, fetches)
        candidates = {n for n, why in verdict.items() if not why}
        groups = form_clusters(view, candidates, fetches, **kwargs)
        formed.append(sorted(sorted(g) for g in groups))
    return formed


@contextlib.contextmanager
def recorded_results(cls, method: str):
    """Patches `cls.method` to append each result it returns to the list
    this yields (a shortcut's verdicts, counted by the test)."""
    results = []
    real = getattr(cls, method)

    def recorded(self, *args):
        results.append(real(self, *args))
        return results[-1]
    with mock.patch.object(cls, method, recorded):
        yield results
