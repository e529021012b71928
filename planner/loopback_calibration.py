"""The link between `local_cluster` workers, measured on this machine and cached (TF edge).

`cluster.cpu_cluster(nodes=W)` assumes 1 GB/s and 50 us between worker processes. Here the
link is measured: a send between two workers' devices in a placed graph over localhost
gRPC (as data and pipeline plans hand tensors between workers), fitted to latency +
bytes / bandwidth from a small and a large tensor. Collectives between the cluster's
DTensor clients run slower than these sends (README: about 3x less bandwidth); measuring
them would need the clients started, which costs more than this whole measurement. The figures are cached per machine (`cpu_costs.machine()`: CPU model,
usable cores, TF version and threads) in the kernel cache directory, as `cpu_calibration`'s
are; `measure` measures again.
"""

import dataclasses
import json
import time

from tf_fusionstitch.planner import timing
from tf_fusionstitch.rewriters import cpu_costs
from tf_fusionstitch.runtime import cache

CALIBRATION_VERSION = "1"
_SUFFIX = ".loopback.json"


def measure(first, second):
    """Measures the link from device `first` to device `second` (in two worker processes
    this process has joined) and caches it: a record whose `figures` are the cluster spec's
    `inter_bandwidth` (bytes/s) and `inter_latency` (s)."""
    start = time.perf_counter()
    bandwidth, latency = timing.send_figures(first, second, hops=4, repeats=10)
    record = dict(figures=dict(inter_bandwidth=bandwidth, inter_latency=latency),
                  machine=cpu_costs.machine(), seconds=round(time.perf_counter() - start, 1))
    cache.write_verified(_key(), _SUFFIX, json.dumps(record, indent=1, sort_keys=True).encode())
    return record


def cached_record():
    """The cached measurement on this machine, or None."""
    data = cache.read_verified(_key(), _SUFFIX)
    return None if data is None else json.loads(data)


def measured_spec(spec):
    """`spec`, a local cluster's (two or more nodes), with the measured loopback link
    (measured now, between its first two workers, if none is cached); named `...-measured`."""
    record = cached_record() or measure(spec.device_name(0),
                                        spec.device_name(spec.devices_per_node))
    return dataclasses.replace(spec, name=f"{spec.name}-measured", **record["figures"])


def _key():
    return cache.content_key("loopback", CALIBRATION_VERSION, cpu_costs.machine())
