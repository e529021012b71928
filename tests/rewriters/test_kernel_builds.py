"""The pass builds each distinct cluster once (rewriters/fusion_pass.py):
the layers of a deep model give many equal clusters, and each build
generates C++ and may wait on the compiler. A build that fails sends only
the clusters of that spec back to TF ops."""

import types

import tensorflow as tf

from optimize_testlib import traced_types
from tf_fusionstitch.options import FusionOptions
from tf_fusionstitch.rewriters import grappler
from tf_fusionstitch.rewriters.fusion_pass import one_at_a_time, run_fusion_pass


def _prepared(fn, *specs):
    concrete = tf.function(fn).get_concrete_function(*specs)
    graph = concrete.graph
    outputs = [t.name for t in concrete.outputs]
    graph_def = grappler.run_grappler(graph.as_graph_def(), graph, outputs)
    return graph_def, traced_types(graph_def, graph), \
        {(name.split(":")[0], 0) for name in outputs}


def _chains(x, y, w):
    # three equal chains (x, x @ w, y: same shape) and one of another shape
    out = [tf.tanh(t * 2.0 + 1.0) for t in (x, tf.matmul(x, w), y)]
    return out + [tf.tanh(tf.reduce_sum(x, axis=1) * 2.0 + 1.0)]


class BuildOnceTest(tf.test.TestCase):

    def _run(self, build):
        graph_def, types_, fetches = _prepared(
            _chains, tf.TensorSpec([8, 16]), tf.TensorSpec([8, 16]), tf.TensorSpec([16, 16]))
        return run_fusion_pass(graph_def, types_, fetches, one_at_a_time(build),
                               FusionOptions(pack=False))

    def test_equal_clusters_are_built_once_and_share_the_kernel(self):
        built = []

        def build(cluster):
            built.append(cluster.to_json())
            return types.SimpleNamespace(key=f"k{len(built)}", spec=cluster.to_json(),
                                         num_loops=1, buffered=(), parts=1)

        result = self._run(build)
        fused = [c for c in result.clusters if c.fused]
        self.assertLen(fused, 4, result.clusters)
        # Grappler may order one chain's operands differently: 2 or 3 specs
        self.assertLen(set(built), len(built))
        self.assertLess(len(built), len(fused))
        self.assertLen({c.kernel_key for c in fused}, len(built))

    def test_a_failed_build_sends_back_only_the_clusters_of_its_spec(self):
        def build(cluster):
            if "reduce" in cluster.to_json():
                raise RuntimeError("compiler exploded")
            return types.SimpleNamespace(key="ok", spec=cluster.to_json(),
                                         num_loops=1, buffered=(), parts=1)

        result = self._run(build)
        fused = [c for c in result.clusters if c.fused]
        failed = [c for c in result.clusters if not c.fused]
        self.assertLen(fused, 3, result.clusters)
        self.assertLen(failed, 1, result.clusters)
        self.assertIn("RuntimeError: compiler exploded", failed[0].reason)
