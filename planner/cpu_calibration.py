"""A cluster spec for N logical CPU devices measured on this machine, cached (TF edge).

`cluster.cpu_cluster` prices NxCPU plans with assumed figures. `measured_cluster(n)` gives
the same spec with this machine's: a float32 matrix product's FLOP/s and an elementwise
op's memory bandwidth on one device alone (the devices share the cores: `shared_cores`),
the cost of one more small op in a chain of dependent ones (`op_overhead`), and the latency and
bandwidth of an all-reduce between the n devices under DTensor (the collective DTensor's
SPMD expansion inserts), fitted to the ring formula from a tiny and a large reduction, and
of a send between two devices in a placed graph (a pipeline's, much cheaper: the tensor is
handed over in memory). The
figures are cached per machine (`cpu_costs.machine()`: CPU model, usable cores, TF version
and threads) and device count in the kernel cache directory, as the fusion cost calibration
is; `measure` measures again.
"""

import dataclasses
import json
import time

import tensorflow as tf
from tensorflow.experimental import dtensor

from tf_fusionstitch.planner import cluster as cluster_lib
from tf_fusionstitch.planner import parallel, timing
from tf_fusionstitch.rewriters import cpu_costs
from tf_fusionstitch.runtime import cache

CALIBRATION_VERSION = "4"
_SUFFIX = ".cpu-cluster.json"
FIELDS = ("flops", "memory_bandwidth", "op_overhead", "intra_bandwidth", "intra_latency",
          "send_bandwidth", "send_latency")


def _matmul_flops(size=512, chain=4):
    x = tf.random.normal([size, size]) / size ** 0.5

    @tf.function
    def products(a):
        for _ in range(chain):
            a = tf.matmul(a, x)
        return a

    with tf.device("CPU:0"):
        return 2 * size ** 3 * chain / timing.median_seconds(products, x)


def _memory_bandwidth(elements=1 << 24):
    x = tf.ones([elements])
    scale = tf.function(lambda a: a * 1.5)
    with tf.device("CPU:0"):
        return 2 * 4 * elements / timing.median_seconds(scale, x)   # read and write float32


def _op_overhead(flops, ops=200, rows=16, width=64):
    """Seconds one more op adds to a chain of dependent small matrix products (`rows` x
    `width` by `width` x `width`: tensors like a small model's, which a scalar op is not),
    less its FLOPs at `flops`."""
    weight = tf.random.normal([width, width]) / width ** 0.5

    def chain(length):
        @tf.function
        def run(a):
            for _ in range(length):
                a = tf.matmul(a, weight)
            return a
        return run

    x = tf.random.normal([rows, width])
    with tf.device("CPU:0"):
        one, many = timing.median_seconds(chain(1), x), timing.median_seconds(chain(ops), x)
    return max((many - one) / (ops - 1) - 2 * rows * width * width / flops, 0.0)


def _all_reduce(devices, small=1, large=1 << 20):
    """(bandwidth, latency) of an all-reduce over `devices` DTensor devices, from the ring
    formula 2 (n-1) latency + 2 (n-1) / n bytes / bandwidth, over a function that keeps its
    shards as they are (its call costs subtracted)."""
    mesh = dtensor.create_mesh([("batch", devices)],
                               devices=[f"CPU:{i}" for i in range(devices)])
    sharded = dtensor.Layout(["batch", dtensor.UNSHARDED], mesh)
    reduce = tf.function(lambda a: tf.reduce_sum(a, axis=0))
    keep = tf.function(lambda a: a * 2.0)

    def seconds(elements):
        x = dtensor.call_with_layout(tf.ones, sharded, shape=[devices, elements])
        return timing.median_seconds(reduce, x) - timing.median_seconds(keep, x)

    n = devices
    t_small, t_large = timing.two_sizes(seconds, small, large, "an all-reduce")
    latency = max(t_small, 0.0) / (2 * (n - 1))
    extra = t_large - t_small
    bandwidth = 2 * (n - 1) / n * 4 * (large - small) / extra
    return bandwidth, latency


def measure(devices):
    """This machine's figures for `devices` logical CPUs (TensorFlow must be able to have
    that many: see `parallel.use_cpu_devices`), and caches them."""
    if devices < 2:
        raise ValueError(f"a measured CPU cluster needs at least 2 devices, got {devices}")
    parallel.use_cpu_devices(devices)
    start = time.perf_counter()
    bandwidth, latency = _all_reduce(devices)
    send_bandwidth, send_latency = timing.send_figures("CPU:0", "CPU:1")
    flops = _matmul_flops()
    figures = dict(flops=flops, memory_bandwidth=_memory_bandwidth(),
                   op_overhead=_op_overhead(flops), intra_bandwidth=bandwidth,
                   intra_latency=latency, send_bandwidth=send_bandwidth,
                   send_latency=send_latency)
    record = dict(figures=figures, machine=cpu_costs.machine(), devices=devices,
                  seconds=round(time.perf_counter() - start, 1))
    _spec(devices, figures)   # refuses impossible figures before they are cached
    cache.write_verified(_key(devices), _SUFFIX,
                         json.dumps(record, indent=1, sort_keys=True).encode())
    return record


def cached_record(devices):
    """The cached measurement for `devices` logical CPUs on this machine, or None."""
    data = cache.read_verified(_key(devices), _SUFFIX)
    return None if data is None else json.loads(data)


def measured_cluster(devices):
    """`devices` logical CPUs of this process with this machine's measured figures
    (measured now if none are cached). Named `NxCPU-measured`."""
    record = cached_record(devices) or measure(devices)
    return _spec(devices, record["figures"])


def _spec(devices, figures):
    base = cluster_lib.cpu_cluster(devices, name=f"{devices}xCPU-measured")
    return dataclasses.replace(base, **{k: figures[k] for k in FIELDS})


def _key(devices):
    return cache.content_key("cpu-cluster", CALIBRATION_VERSION, cpu_costs.machine(),
                             str(devices))
