"""pattern_key (rewriters/pattern_key.py): node sets with equal keys lower to
the same cluster, so the plan search lowers each structure once. A key that
missed something lowering reads would give one set another's verdict and
score; one that differs for equal structures only costs time."""

import tensorflow as tf

from optimize_testlib import traced_types
from tf_fusionstitch.rewriters.clustering import fusible_nodes
from tf_fusionstitch.rewriters.legality import LOWERING_ERRORS
from tf_fusionstitch.rewriters.dim_origins import DimOrigins
from tf_fusionstitch.rewriters.graph_view import GraphView
from tf_fusionstitch.rewriters.lowering import lower_nodes
from tf_fusionstitch.rewriters.pattern_key import pattern_key


def _view(fn, *specs):
    """(view with dimension symbols, fetches) of fn traced at `specs`, as the pass sees it."""
    concrete = tf.function(fn).get_concrete_function(*specs)
    graph = concrete.graph
    graph_def = graph.as_graph_def()
    types = traced_types(graph_def, graph)
    fetches = {(t.op.name, t.value_index) for t in concrete.outputs}
    # outputs of a concrete function are Identity nodes of the traced values
    names = {n.name for n in graph_def.node}
    fetches = {f for f in fetches if f[0] in names}
    origins = DimOrigins(GraphView(graph_def, types), fetches)
    return GraphView(graph_def, types, dims=origins.dims), fetches


def _named(view, prefix):
    """The graph's nodes under name scope `prefix`, in topological order."""
    return [n for n in view.order if n.startswith(prefix + "/")]


def _lowered(view, nodes, fetches):
    try:
        return lower_nodes(view, nodes, fetches).cluster.to_json()
    except LOWERING_ERRORS as e:
        return f"refused: {type(e).__name__}"


def _two_layers(x, w):
    out = []
    for name in ("a", "b"):
        with tf.name_scope(name):
            h = tf.matmul(x, w)
            mean = tf.reduce_mean(h, axis=-1, keepdims=True)
            x = tf.nn.relu((h - mean) * 2.0 + 1.0)
            out.append(x)
    return out


class PatternKeyTest(tf.test.TestCase):

    def test_layers_of_the_same_structure_share_a_key_and_a_lowering(self):
        view, fetches = _view(_two_layers, tf.TensorSpec([None, 8]), tf.TensorSpec([8, 8]))
        a = [n for n in _named(view, "a") if view.nodes[n].op != "MatMul"]
        b = [n for n in _named(view, "b") if view.nodes[n].op != "MatMul"]
        self.assertEqual([view.nodes[n].op for n in a], [view.nodes[n].op for n in b])
        self.assertEqual(pattern_key(view, a, fetches), pattern_key(view, b, fetches))
        self.assertEqual(_lowered(view, a, fetches), _lowered(view, b, fetches))

    def _differ(self, fn_a, fn_b, *specs):
        """Keys of the non-Const ops of `fn_a` and `fn_b` (one scope each)."""
        def both(*args):
            with tf.name_scope("a"):
                ra = fn_a(*args)
            with tf.name_scope("b"):
                rb = fn_b(*args)
            return ra, rb
        view, fetches = _view(both, *specs)
        keys = [pattern_key(view, [n for n in _named(view, s)
                                   if view.nodes[n].op not in ("Const", "Identity")], fetches)
                for s in ("a", "b")]
        self.assertNotEqual(keys[0], keys[1])

    def test_what_lowering_reads_is_in_the_key(self):
        spec = tf.TensorSpec([4, 8])
        # an attribute (the output types are the same)
        self._differ(lambda x, y: tf.nn.leaky_relu(x * y, alpha=0.2),
                     lambda x, y: tf.nn.leaky_relu(x * y, alpha=0.3), spec, spec)
        # an inlined scalar's value
        self._differ(lambda x, y: tf.exp(x * 2.0), lambda x, y: tf.exp(x * 3.0), spec, spec)
        # the same tensor read twice, or two tensors
        self._differ(lambda x, y: tf.exp(x) + x, lambda x, y: tf.exp(x) + y, spec, spec)
        # a shape
        self._differ(lambda x, y: tf.exp(x) + 1.0, lambda x, y: tf.exp(y) + 1.0,
                     spec, tf.TensorSpec([4, 4]))

    def test_an_output_used_outside_the_set_is_in_the_key(self):
        def f(x):
            with tf.name_scope("a"):
                a_mul = x * 2.0
                a = tf.exp(a_mul)
            with tf.name_scope("b"):
                b = tf.exp(x * 2.0)
            with tf.name_scope("c"):
                c = tf.exp(x * 2.0)
            with tf.name_scope("d"):
                tf.exp(x * 2.0)  # read by nothing: no output leaves
            return a + 1.0, a_mul + 1.0, b + 1.0, c
        view, fetches = _view(f, tf.TensorSpec([4, 8]))
        sets = {s: [n for n in _named(view, s) if view.nodes[n].op in ("Mul", "Exp")]
                for s in "abcd"}
        keys = {s: pattern_key(view, nodes, fetches) for s, nodes in sets.items()}
        self.assertNotEqual(keys["a"], keys["b"])  # a's Mul leaves it too
        self.assertEqual(keys["b"], keys["c"])     # read outside, or fetched: it leaves
        self.assertNotEqual(keys["c"], keys["d"])
        self.assertNotEqual(_lowered(view, sets["a"], fetches),
                            _lowered(view, sets["b"], fetches))

    def test_unknown_extents_proven_equal_or_not_are_in_the_key(self):
        def f(x, y, z):
            with tf.name_scope("a"):
                a = tf.exp(x) + x       # one tensor: its batch equals itself
            with tf.name_scope("b"):
                b = tf.exp(x) + y       # y's batch is x's only if the run says so
            with tf.name_scope("c"):
                c = tf.exp(x) + tf.reshape(z, tf.shape(x))   # z reshaped to x's shape
            return a, b, c
        spec = tf.TensorSpec([None, 8])
        view, fetches = _view(f, spec, spec, tf.TensorSpec([None]))
        keys = {s: pattern_key(view, [n for n in _named(view, s) if view.nodes[n].op in
                                      ("Exp", "AddV2")], fetches) for s in "abc"}
        self.assertNotEqual(keys["a"], keys["b"])
        self.assertNotEqual(keys["b"], keys["c"])  # c's operand has x's symbols

    def test_equal_keys_lower_equally_across_a_model(self):
        """Every connected set of up to four fusible ops of a small model with
        a dynamic batch: sets that share a key lower to the same cluster (or
        are all refused), and the model's repetition gives shared keys."""
        def model(x, w1, w2, bias):
            h = x
            for w in (w1, w2, w1):
                h = tf.matmul(h, w) + bias
                mean = tf.reduce_mean(h, axis=-1, keepdims=True)
                var = tf.reduce_mean(tf.square(h - mean), axis=-1, keepdims=True)
                h = tf.nn.gelu((h - mean) * tf.math.rsqrt(var + 1e-5), approximate=True)
            return tf.reduce_sum(h * h, axis=0), tf.nn.softmax(h)
        view, fetches = _view(model, tf.TensorSpec([None, 16]), tf.TensorSpec([16, 16]),
                              tf.TensorSpec([16, 16]), tf.TensorSpec([16]))
        candidates = {n for n, why in fusible_nodes(view, fetches).items() if not why}
        sets, frontier = set(), [frozenset([n]) for n in candidates]
        while frontier:
            grown = []
            for s in frontier:
                if s in sets:
                    continue
                sets.add(s)
                if len(s) < 4:
                    grown += [s | {c} for n in s for c in view.consumers[n]
                              if c in candidates and c not in s]
            frontier = grown
        groups = {}
        for s in sets:
            groups.setdefault(pattern_key(view, s, fetches), []).append(s)
        shared = [g for g in groups.values() if len(g) > 1]
        self.assertGreater(len(shared), 20)
        for group in shared:
            lowered = {_lowered(view, sorted(s, key=view.position.get), fetches) for s in group}
            self.assertLen(lowered, 1, sorted(sorted(s) for s in group)[:2])
        self.assertTrue(any(not _lowered(view, sorted(g[0]), fetches).startswith("refused")
                            for g in shared))
