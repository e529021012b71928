"""The greedy clustering's incremental cycle check (cycles.ClusterGraph)
gives the verdict of creates_cycle's walk through whole clusters, its
reference (form_clusters(cycle_walk=True)), on every merge attempt.

Random DAGs of a few hundred nodes with chains, diamonds, long skip edges
and control edges, some nodes never fusible (as a MatMul is), some merges
refused for other reasons (as a lowering failure refuses them); and traced
graphs where merges close cycles: train steps whose forward activations are
read again by their gradients, and optimizer arithmetic shared by every
update."""

import os
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from clustering_testlib import plans, recorded_results
from tf_fusionstitch.rewriters import clustering, cycles, legality
from tf_fusionstitch.rewriters.graph_view import GraphView

F32 = tf.float32


def _random_dag(gen: np.random.Generator, size: int) -> GraphView:
    """Nodes n0.. in topological order, each reading some of: the node
    before it (chains), the one two or three before (diamonds), any earlier one
    (long skip edges), and any earlier one through a control edge."""
    gd = graph_pb2.GraphDef()
    for i in range(size):
        node = gd.node.add(name=f"n{i}", op="NoOp")
        reads = set()
        if i and gen.random() < 0.8:
            reads.add(i - 1)
        if i > 3 and gen.random() < 0.3:
            reads.add(i - int(gen.integers(2, 4)))
        if i and gen.random() < 0.15:
            reads.add(int(gen.integers(0, i)))
        node.input.extend(f"n{j}" for j in sorted(reads))
        if i and gen.random() < 0.1:
            node.input.append(f"^n{int(gen.integers(0, i))}")
    return GraphView(gd, {})


def _verdicts(view: GraphView, candidates, gen: np.random.Generator):
    """grow_clusters over `view` with each merge checked by both the walk
    (which decides) and ClusterGraph: their verdicts per attempt, the
    clusters formed, and the ClusterGraph with grow_clusters' last owner and
    members."""
    graph = cycles.ClusterGraph(view)
    walked, incremental, state = [], [], {}

    def decide(merged, owner, members, fusion, producer):
        state.update(owner=owner, members=members)
        last = max(merged, key=view.position.__getitem__)
        walked.append(cycles.creates_cycle(view, set(merged), owner, members,
                                           after=view.position[last]))
        incremental.append(graph.creates_cycle(fusion, producer, owner))
        # a fifth of the legal merges refused as a failed lowering would be
        return legality.refuse("refused") if walked[-1] or gen.random() < 0.2 \
            else legality.OK

    groups = clustering.grow_clusters(view, candidates, decide, joined=graph.join)
    return walked, incremental, groups, (graph, state["owner"], state["members"])


def _misplaced(view: GraphView, graph, owner, members):
    """(cluster, consumer) pairs where ClusterGraph's exits are not the
    consumers of the cluster's members outside it, or its order puts the
    consumer's cluster first."""
    wrong = []
    for unit in set(owner.values()) | (set(view.order) - set(owner)):
        inside = set(members.get(unit, [unit]))
        exits = {c for m in inside for c in view.consumers[m]} - inside
        wrong += [(unit, c) for c in exits ^ set(graph.exits(unit))]
        wrong += [(unit, c) for c in exits
                  if graph.rank(owner.get(c, c)) <= graph.rank(unit)]
    return wrong


class RandomDagTest(tf.test.TestCase):

    def assertAgreeOnRandomDags(self, seed: int, trials: int):
        """On `trials` random DAGs: the same verdict on every attempt, and
        after the last ClusterGraph's exits and order still hold. Returns
        (attempts, cycles found)."""
        gen = np.random.default_rng(seed)
        attempts = cycles = 0
        for trial in range(trials):
            view = _random_dag(gen, int(gen.integers(200, 400)))
            # about one node in five never fusible, a wall that paths go around
            candidates = {n for n in view.order if gen.random() < 0.8}
            walked, incremental, groups, formed = _verdicts(view, candidates, gen)
            self.assertEqual(walked, incremental, f"trial {trial}")
            self.assertEqual(_misplaced(view, *formed), [], f"trial {trial}")
            self.assertGreater(max(map(len, groups)), 5)
            attempts += len(walked)
            cycles += sum(walked)
        return attempts, cycles

    def test_the_incremental_check_agrees_with_the_walk_on_every_attempt(self):
        attempts, cycles = self.assertAgreeOnRandomDags(4100, trials=12)
        # both verdicts, many times each
        self.assertGreater(cycles, 200)
        self.assertGreater(attempts - cycles, 1000)

    def test_renumbered_ranks_keep_the_order(self):
        # ranks are renumbered once they grow past LONGEST_RANK entries:
        # lowered here so that it happens in graphs this small
        renumbered = []
        real = cycles.ClusterGraph.renumber

        def counted(graph):
            renumbered.append(1)
            real(graph)
        with mock.patch.object(cycles, "LONGEST_RANK", 4), \
                mock.patch.object(cycles.ClusterGraph, "renumber", counted):
            self.assertAgreeOnRandomDags(4200, trials=4)
        self.assertGreater(len(renumbered), 5)

    def test_a_merge_that_closes_a_cycle_cannot_be_joined(self):
        # n0 -> n1 -> n2 beside n0 -> n2: n0 and n2 may not merge past n1
        gd = graph_pb2.GraphDef()
        gd.node.add(name="n0", op="NoOp")
        gd.node.add(name="n1", op="NoOp", input=["n0"])
        gd.node.add(name="n2", op="NoOp", input=["n0", "n1"])
        view = GraphView(gd, {})
        graph = cycles.ClusterGraph(view)
        owner = {"n0": "n0", "n2": "n2"}
        members = {"n0": ["n0"], "n2": ["n2"]}
        self.assertTrue(graph.creates_cycle("n2", "n0", owner))
        with self.assertRaisesRegex(ValueError, "closes a cycle"):
            graph.join("n2", "n0", owner, members)


def _train_step(x, labels, weights):
    """Two dense layers with layer norms and a residual, softmax cross
    entropy, and an Adam-like update of every weight from one step count."""
    w1, b1, w2, b2, gamma, beta = weights
    with tf.GradientTape() as tape:
        tape.watch(weights)
        h = tf.nn.relu(tf.matmul(x, w1) + b1)
        mean, var = tf.nn.moments(h, axes=[-1], keepdims=True)
        h = gamma * (h - mean) * tf.math.rsqrt(var + 1e-5) + beta + h
        logits = tf.matmul(tf.tanh(h) * h, w2) + b2
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels, logits))
    grads = tape.gradient(loss, weights)
    t = tf.cast(tf.size(x), F32) * 1e-3 + 1.0
    lr = 1e-3 * tf.sqrt(1.0 - tf.pow(0.999, t)) / (1.0 - tf.pow(0.9, t))
    return [w - lr * g / (tf.sqrt(tf.square(g) + 1e-8) + 1e-8) for w, g in zip(weights, grads)]


def _train_step_specs():
    shapes = [[16, 32], [32], [32, 10], [10], [32], [32]]
    return (tf.TensorSpec([8, 16], F32), tf.TensorSpec([8, 10], F32),
            [tf.TensorSpec(s, F32) for s in shapes])


def _residual_tower(x, w):
    """Blocks whose output adds back their input around a MatMul."""
    for _ in range(12):
        a = tf.nn.relu(x) * 0.5
        y = tf.matmul(a, w)
        x = x + tf.tanh(y) * a + tf.reduce_mean(a, axis=-1, keepdims=True)
    return x


class TracedGraphTest(tf.test.TestCase):

    def assertSamePlans(self, fn, *specs):
        """form_clusters with ClusterGraph and with the walk form the same
        clusters, and some merge on the way closes a cycle."""
        with recorded_results(cycles.ClusterGraph, "creates_cycle") as closing:
            incremental, walked = plans(fn, specs, {}, {"cycle_walk": True})
        self.assertEqual(incremental, walked)
        self.assertGreater(sum(closing), 3)      # cycles were refused
        self.assertGreater(len(closing) - sum(closing), 10)
        self.assertGreater(max(map(len, incremental)), 3)

    def test_a_train_step(self):
        self.assertSamePlans(_train_step, *_train_step_specs())

    def test_a_residual_tower(self):
        self.assertSamePlans(_residual_tower, tf.TensorSpec([4, 8], F32),
                             tf.TensorSpec([8, 8], F32))


if __name__ == "__main__":
    tf.test.main()
