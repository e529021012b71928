"""The gradient of slices that tile an axis becomes one concatenation
(rewriters/slice_gradients.py); gradients stay TF's on fresh random inputs."""

import tensorflow as tf

import tf_fusionstitch as fs
from optimize_testlib import assert_same, quiet_call, random, rng


def _grads(slices):
    """d/dx of a loss over slices of x @ w (the gates of a recurrent cell)."""
    @tf.function(input_signature=[tf.TensorSpec([None, 9]), tf.TensorSpec([9, 9])])
    def grads(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            inner = tf.matmul(x, w)
            parts = [inner[:, a:b] for a, b in slices]
            loss = sum(tf.reduce_sum(tf.tanh(p) * float(k + 1)) for k, p in enumerate(parts))
        return tape.gradient(loss, x)
    return grads


def _ops(graph_def):
    return [n.op for n in graph_def.node]


class SliceGradientsTest(tf.test.TestCase):

    def _check(self, grads):
        opt = fs.optimize(grads)
        gen = rng(5)
        w = random(gen, (9, 9), "float32", "small")
        for batch in (4, 1):
            x = random(gen, (batch, 9), "float32")
            assert_same(self, quiet_call(opt, x, w), grads(x, w), msg=f"batch {batch}",
                        rtol=1e-5, atol=1e-6)
        return opt

    def test_slices_that_tile_an_axis_sum_as_a_concatenation(self):
        grads = _grads([(3, 7), (0, 3), (7, 9)])
        before = grads.get_concrete_function().graph.as_graph_def()
        self.assertEqual(_ops(before).count("StridedSliceGrad"), 3)
        opt = self._check(grads)
        nodes = {n.name: n.op for n in opt.graph_def.node}
        readers = {n.op for n in opt.graph_def.node
                   for s in n.input if nodes.get(s.split(":")[0].lstrip("^")) == "StridedSliceGrad"}
        self.assertEmpty(readers)   # left unread: TF does not run them
        self.assertIn("ConcatV2", nodes.values())

    def test_overlapping_slices_or_gaps_stay_sums(self):
        for slices in ([(0, 5), (3, 9)], [(0, 3), (4, 9)]):
            opt = self._check(_grads(slices))
            self.assertNotIn("ConcatV2", _ops(opt.graph_def), slices)


if __name__ == "__main__":
    tf.test.main()
