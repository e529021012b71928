"""A loop's weight gradients summed once after it (rewriters/loop_gradients.py):
gradients stay TF's on fresh random inputs, for loops of several steps and of
none, at batches of 1 and 3; sums the body reads stay in the loop.

The weight gradients are then sums over steps and rows taken in another
order than TF's (a matrix product's blocks instead of time steps), so they
are compared with a float64 computation of the same function: no further
from it than TF's float32 result is, norm-wise (the reduction contract)."""

import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs
from optimize_testlib import assert_same, quiet_call, random, rng

_TOL = dict(rtol=2e-5, atol=2e-6)


def _rnn(step, dtype=tf.float32):
    """The gradient of a loss over a recurrent loop h' = step(h, x_t, w, u, b)
    with respect to its weights, inputs and initial state."""
    specs = [tf.TensorSpec(s, dtype) for s in ([None, None, 5], [None, 4], [5, 4], [4, 4], [4])]

    @tf.function(input_signature=specs)
    def grads(xs, h0, w, u, b):
        with tf.GradientTape() as tape:
            tape.watch([xs, h0, w, u, b])
            steps = tf.shape(xs)[0]
            ta = tf.TensorArray(dtype, size=steps).unstack(xs)

            def body(i, h):
                return i + 1, step(h, ta.read(i), w, u, b)
            _, h = tf.while_loop(lambda i, h: i < steps, body, (0, h0))
            loss = tf.reduce_sum(tf.tanh(h) * h)
        return tape.gradient(loss, [xs, h0, w, u, b])
    return grads


def _cell(h, x, w, u, b):
    return tf.tanh(tf.nn.bias_add(tf.matmul(x, w) + tf.matmul(h, u), b))


def _moved(opt):
    return [n.name for n in opt.graph_def.node if "/fs_sum_" in n.name
            and n.op in ("MatMul", "Sum")]


class LoopGradientsTest(tf.test.TestCase):

    def _check(self, step, steps_and_batches):
        grads, exact = _rnn(step), _rnn(step, tf.float64)
        opt = fs.optimize(grads)
        gen = rng(3)
        w, u, b = (random(gen, s, "float32", "small") for s in ((5, 4), (4, 4), (4,)))
        for steps, batch in steps_and_batches:
            xs = random(gen, (steps, batch, 5), "float32")
            h0 = random(gen, (batch, 4), "float32")
            args = (xs, h0, w, u, b)
            wide = exact(*(tf.cast(a, tf.float64) for a in args))
            for got, want, ref, what in zip(quiet_call(opt, *args), grads(*args), wide,
                                            ("xs", "h0", "w", "u", "b")):
                msg = f"d{what}, {steps} steps, batch {batch}"
                if what in ("xs", "h0"):    # computed per step, as TF does
                    assert_same(self, got, want, msg=msg, **_TOL)
                    continue
                ref = ref.numpy()
                ours, tfs = (np.linalg.norm(np.float64(t) - ref) for t in (got, want))
                self.assertLessEqual(ours, 2 * tfs + 1e-7 * np.linalg.norm(ref), msg)
        return opt

    def test_kernel_and_bias_gradients_are_summed_after_the_loop(self):
        opt = self._check(_cell, [(6, 3), (6, 1), (0, 3)])
        # dW, dU (one product each) and db (one sum) are taken after the loop.
        self.assertLen(_moved(opt), 3, [n.name for n in opt.graph_def.node])

    def test_a_sum_the_body_reads_stays_in_the_loop(self):
        """A running sum that the step itself reads is no gradient accumulator:
        here the loop's state depends on an accumulated product."""
        @tf.function(input_signature=[tf.TensorSpec([None, None, 5]), tf.TensorSpec([5, 4])])
        def f(xs, w):
            steps = tf.shape(xs)[0]
            ta = tf.TensorArray(tf.float32, size=steps).unstack(xs)

            def body(i, acc, h):
                x = ta.read(i)
                acc = acc + tf.matmul(x, tf.tanh(tf.matmul(x, w)), transpose_a=True)
                return i + 1, acc, h + tf.reduce_sum(acc)
            _, acc, h = tf.while_loop(lambda i, acc, h: i < steps, body,
                                      (0, tf.zeros([5, 4]), 0.0))
            return acc, h

        opt = fs.optimize(f)
        gen = rng(4)
        for steps in (3, 0):
            xs, w = random(gen, (steps, 2, 5), "float32"), random(gen, (5, 4), "float32")
            for got, want in zip(quiet_call(opt, xs, w), f(xs, w)):
                assert_same(self, got, want, msg=f"{steps} steps", **_TOL)
        self.assertEmpty(_moved(opt))


if __name__ == "__main__":
    tf.test.main()
