"""Timing TensorFlow work for the planner's calibrations: the median of repeated calls,
and the figures of a send between two devices in a placed graph."""

import statistics
import time

import tensorflow as tf
from tensorflow.experimental import dtensor


def wait(value):
    """Blocks until `value` (a tensor or DTensor) is computed, on every device holding it."""
    for part in dtensor.unpack(value) if dtensor.is_dtensor(value) else [value]:
        part.numpy()


def median_seconds(fn, *args, repeats=15, warmup=3):
    for _ in range(warmup):
        wait(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        wait(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def two_sizes(seconds, small, large, what, attempts=3):
    """(seconds(small), seconds(large)), measured again (up to `attempts` times) while
    the large one does not measure slower: on a shared machine a busy moment can
    swap them. ValueError naming `what` when no attempt separates them."""
    for _ in range(attempts):
        t_small, t_large = seconds(small), seconds(large)
        if t_large > t_small:
            return t_small, t_large
    raise ValueError(f"{what} of {large} floats measured no slower than one of {small} "
                     f"({t_large:.2e} s, {t_small:.2e} s) in {attempts} attempts: too "
                     "noisy to fit")


def send_figures(first, second, small=1, large=1 << 20, hops=20, repeats=30):
    """(bandwidth, latency) of handing a float32 tensor from device `first` to `second` in
    a placed graph (a pipeline's send): a chain of ops alternating between the two devices,
    less the same chain on one device."""
    def chain(other):
        @tf.function
        def run(a):
            for _ in range(hops):
                with tf.device(first):
                    a = a + 1.0
                with tf.device(other):
                    a = a * 1.0001
            return a[:1]
        return run

    def per_send(elements):
        with tf.device(first):
            x = tf.ones([elements])
        return (median_seconds(chain(second), x, repeats=repeats)
                - median_seconds(chain(first), x, repeats=repeats)) / (2 * hops)

    t_small, t_large = two_sizes(per_send, small, large, "a send")
    return 4 * (large - small) / (t_large - t_small), max(t_small, 0.0)
