"""The delta evaluator's costs (cpu_cost_model.py, which names them and
holds the builtin ones) measured on the machine the rewrite runs on.

A short calibration run (a few seconds) measures, with TensorFlow's own CPU
kernels in the process's thread configuration, each time a median less the
call's own overhead (launch, bandwidth and cache speed-up: the median of three
such measurements):

- "launch": what one more op costs, from a chain of 257 x * y ops over 4096
  elements (16 KiB: their memory time is negligible) against one;
- "bandwidth": bytes per second of x * y over 8M elements (32 MiB per tensor,
  beyond any L3 cache);
- "cache_speedup": how much faster a kernel re-reads a row it has just read
  (it is in the core's cache) than it reads DRAM, within [1, 64]: one
  core's bandwidth of numpy's x * y over tensors well inside its L2
  (no TF op: TF's per-op overhead at that size would hide the cache's
  speed), times the usable cores (each thread re-reads its own rows from its
  own core's cache), over "bandwidth";
- "compute": per primitive of fusion_ir.EXPENSIVE, seconds per element when
  the op is compute-bound here: over 1M elements, an op that takes longer
  than a cheap op of the same arity (same bytes) is limited by its
  arithmetic; one that does not is memory-bound and gets no compute cost;
- "row_cache_bytes": half of the per-core L2 cache, read from sysfs;
- "stream_bandwidth": bytes/s of the 7 ops after the first of a chain of 8
  such x * y (each writes into the buffer of the one before: no fresh
  pages), the chain's time less the single op's;
- "matmul_flops": flop/s of TF's float32 512 x 512 x 512 MatMul;
- "cores": the cores the process may use (read, not measured);
- "plan_error": the plan model's (plan_time.py) largest relative error
  predicting TF's own time for plan_checks.py's graphs with these costs,
  at most MAX_PLAN_ERROR ("parallel_grain" stays the builtin one).

The result is cached per machine (CPU model, usable cores, TensorFlow
version) in the kernel cache directory, so the calibration runs once per
machine. `python -m tf_fusionstitch.tools.calibrate` shows (or redoes) it.
Anything that fails here leaves BUILTIN in use: a plan priced with the
builtin costs is still a correct plan.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
import time
import warnings
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.rewriters.cpu_cost_model import (BUILTIN, LAUNCH_OP_ELEMENTS,
                                                       CalibrationError, usable_cores, validate)
from tf_fusionstitch.rewriters import plan_checks
from tf_fusionstitch.runtime import cache

CALIBRATION_VERSION = "3"
_SUFFIX = ".cpu-costs.json"

# One TF function per primitive of fusion_ir.EXPENSIVE (inputs in [0.5, 1.5));
# the binary ones read a second tensor as their elementwise baseline x * y does.
_UNARY_OPS: Dict[str, Callable] = {
    "exp": tf.exp, "log": tf.math.log, "log1p": tf.math.log1p, "expm1": tf.math.expm1,
    "tanh": tf.tanh, "sigmoid": tf.sigmoid, "elu": tf.nn.elu, "selu": tf.nn.selu,
    "softplus": tf.nn.softplus, "erf": tf.math.erf, "erfc": tf.math.erfc, "sin": tf.sin,
    "cos": tf.cos, "reciprocal": tf.math.reciprocal, "rsqrt": tf.math.rsqrt, "sqrt": tf.sqrt,
}
_BINARY_OPS: Dict[str, Callable] = {"pow": tf.pow, "div": tf.math.truediv}
assert set(_UNARY_OPS) | set(_BINARY_OPS) == set(ir.EXPENSIVE)

# Cache re-reads at most this many times as fast as DRAM (a bound on what a
# busy machine's measurement can claim).
MAX_CACHE_SPEEDUP = 64.0

# The plan model's error is at most this: beyond it, the plan guard keeps
# a rule plan whatever explore predicts (plan_guard.py).
MAX_PLAN_ERROR = 0.5

# An op counts as compute-bound when it takes this much longer than a cheap
# op over the same bytes (below it, timing noise on a shared machine).
_COMPUTE_BOUND_MARGIN = 1.15


def for_this_machine() -> Tuple[Dict, str]:
    """(costs, where they came from): the calibrated costs, measured on first
    use and then read from the cache; BUILTIN (with a warning) when
    calibration fails. A process that saw it fail does not measure again."""
    global _failure
    if _failure is None:
        try:
            path = cache.get_or_build(_key(), _SUFFIX, lambda tmp: tmp.write_text(
                json.dumps(_measured_record(), indent=1, sort_keys=True)))
            return validate(json.loads(path.read_text())["costs"]), "calibrated"
        except (cache.CacheError, CalibrationError, OSError, ValueError, KeyError,
                tf.errors.OpError) as e:
            _failure = f"{type(e).__name__}: {e}"
    warnings.warn(f"tf_fusionstitch: CPU cost calibration failed ({_failure}); "
                  "fusion='explore' prices plans with the builtin costs",
                  RuntimeWarning, stacklevel=2)
    return dict(BUILTIN), "builtin, calibration failed"


# Why calibration failed in this process, if it did.
_failure: Optional[str] = None


def cached_record() -> Optional[Dict]:
    """This machine's cached calibration (costs, machine, seconds it took), or None."""
    data = cache.read_verified(_key(), _SUFFIX)
    return None if data is None else json.loads(data)


def recalibrate() -> Dict:
    """Measures again and replaces this machine's cached calibration."""
    record = _measured_record()
    store(record)
    return record


def store(record: Dict) -> None:
    """Makes `record` (as cached_record gives it) this machine's cached
    calibration in the current cache directory."""
    validate(record["costs"])
    cache.write_verified(_key(), _SUFFIX, json.dumps(record, indent=1, sort_keys=True).encode())


def _key() -> str:
    return cache.content_key("cpu-costs", CALIBRATION_VERSION, machine())


def machine() -> str:
    """What the costs depend on: CPU model, usable cores, TF version and threads."""
    model = "unknown CPU"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = usable_cores()
    threads = (tf.config.threading.get_intra_op_parallelism_threads(),
               tf.config.threading.get_inter_op_parallelism_threads())
    return f"{model}; {cores} cores; TF {tf.__version__}; threads {threads}"


def calibrate() -> Dict:
    """Measures the costs on this machine (about two seconds); see the module
    doc. Every time is a median, less the same function's time on a small
    input (the call's own overhead); the memory costs are the medians of
    three such measurements, as a shared machine's load comes and goes."""
    one, chain8, chain257 = _chain(_mul, 1), _chain(_mul, 8), _chain(_mul, 257)
    x, y = _inputs(LAUNCH_OP_ELEMENTS)      # 16 KiB: memory time all but negligible
    big, big_ones = _inputs(1 << 23)        # 32 MiB per tensor: beyond any L3
    l2 = l2_cache_bytes()
    runs = []
    for _ in range(3):
        core_cache = _core_cache_bandwidth(l2 or 512 * 1024)  # first: see its doc
        call = _median(one, x, y)
        launch = (_median(chain257, x, y) - call) / 256
        single = _median(one, big, big_ones, rounds=9)
        bandwidth = 12 * (1 << 23) / (single - call)
        stream = 7 * 12 * (1 << 23) / (_median(chain8, big, big_ones, rounds=9) - single)
        runs.append((call, launch, bandwidth, stream, core_cache))
    call, launch, bandwidth, stream, core_cache = (statistics.median(r) for r in zip(*runs))
    _check("launch", launch, 1e-8, 1e-3)
    _check("bandwidth", bandwidth, 1e8, 1e13)
    _check("streaming bandwidth", stream, 1e8, 1e13)
    _check("one core's cache bandwidth", core_cache, 1e8, 1e13)
    cache_speedup = usable_cores() * core_cache / bandwidth
    matmul_flops = 2 * _MATRIX ** 3 / (_median(_single(tf.matmul, 2), *_matrices()) - call)
    _check("matmul flop rate", matmul_flops, 1e8, 1e15)
    costs = dict(BUILTIN, launch=launch, bandwidth=bandwidth,
                 cache_speedup=min(max(cache_speedup, 1.0), MAX_CACHE_SPEEDUP),
                 compute=_compute_costs(call), cores=usable_cores(), stream_bandwidth=stream,
                 matmul_flops=matmul_flops)
    if l2:
        costs["row_cache_bytes"] = l2 // 2
    return validate(costs)


def _core_cache_bandwidth(l2_bytes: int) -> float:
    """Bytes/s of one core's x * y (numpy, one thread) over three tensors
    that together take a quarter of its L2, at most 128 KiB (the rows a
    kernel re-reads are a few KiB; well inside the cache, a busy machine's
    other work disturbs the measurement least): the median call less a tiny
    call's. Measured after a short pause, as TF's pool threads spin for a
    while after an op and would share the core."""
    time.sleep(0.02)
    n = max(min(l2_bytes // 4, 128 * 1024) // 12, 1024)
    return 12 * n / max(_numpy_median(n) - _numpy_median(16), 1e-9)


def _numpy_median(n: int, seconds: float = 0.02) -> float:
    # The three tensors 64-byte aligned, as TF allocates tensors: numpy's own
    # allocations of this size are only 16-byte aligned, and on a core with
    # 64-byte vectors every misaligned access splits a cache line and runs
    # at half speed.
    padded = -(-n // 16) * 16
    buffer = np.ones(3 * padded + 16, np.float32)
    offset = (-(buffer.ctypes.data // 4)) % 16
    x, y, out = (buffer[offset + i * padded:offset + i * padded + n] for i in range(3))
    x[:] = np.random.default_rng(0).uniform(0.5, 1.5, n)
    np.multiply(x, y, out=out)  # first touch of the output's pages
    # calls per sample: each sample about seconds / 21 long, whatever n is
    start = time.perf_counter()
    np.multiply(x, y, out=out)
    reps = max(1, int(seconds / 21 / max(time.perf_counter() - start, 1e-7)))
    times = []
    for _ in range(21):
        start = time.perf_counter()
        for _ in range(reps):
            np.multiply(x, y, out=out)
        times.append((time.perf_counter() - start) / reps)
    return statistics.median(times)


def _compute_costs(call: float) -> Dict[str, float]:
    """Seconds per element of the primitives that are compute-bound here, over
    1M elements, against a cheap op of the same arity (same bytes)."""
    x, y = _inputs(1 << 20)
    compute = {}
    for table, baseline, arity in ((_UNARY_OPS, tf.negative, 1),
                                   (_BINARY_OPS, tf.multiply, 2)):
        memory_bound = _median(_single(baseline, arity), x, y) - call
        for prim, op in sorted(table.items()):
            seconds = _median(_single(op, arity), x, y) - call
            if seconds > max(memory_bound, 0.0) * _COMPUTE_BOUND_MARGIN:
                compute[prim] = seconds / (1 << 20)
    return compute


def l2_cache_bytes() -> Optional[int]:
    """Per-core L2 size from sysfs, or None where sysfs does not say."""
    base = pathlib.Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in sorted(base.glob("index*")):
            if (index / "level").read_text().strip() == "2":
                size = (index / "size").read_text().strip().upper()
                scale = {"K": 1024, "M": 1024 ** 2}.get(size[-1:], 1)
                return int(size.rstrip("KM")) * scale
    except (OSError, ValueError):
        return None
    return None


# A measurement that a busy moment spoiled (CalibrationError) is taken again,
# after a pause, this many times in all before the process gives up on it.
CALIBRATION_ATTEMPTS = 3


def measure_costs() -> Dict:
    """calibrate(), taken again after a pause when a busy moment spoiled it;
    raises CalibrationError after CALIBRATION_ATTEMPTS spoiled ones."""
    for attempt in range(1, CALIBRATION_ATTEMPTS + 1):
        try:
            with tf.init_scope():  # eager even when called while a tf.function traces
                return calibrate()
        except CalibrationError:
            if attempt == CALIBRATION_ATTEMPTS:
                raise
            time.sleep(0.5 * attempt)
    raise AssertionError("unreachable")


def _measured_record() -> Dict:
    start = time.perf_counter()
    costs = measure_costs()
    with tf.init_scope():
        checks = plan_checks.run(costs)
    costs["plan_error"] = min(plan_checks.error(checks), MAX_PLAN_ERROR)
    return {"version": CALIBRATION_VERSION, "machine": machine(),
            "seconds": round(time.perf_counter() - start, 2), "costs": validate(costs),
            "plan_checks": [dataclasses.asdict(c) for c in checks]}


def _mul(x, y):
    return x * y


def _chain(op: Callable, length: int):
    """A tf.function applying `op(x, y)` to its result `length` times. Each op
    waits for the one before, so the executor runs them one at a time; y is
    an argument (ones), so Grappler can neither fold nor merge the chain."""
    @tf.function(autograph=False)
    def chain(x, y):
        for _ in range(length):
            x = op(x, y)
        return x
    return chain


def _single(op: Callable, arity: int):
    if arity == 2:
        return tf.function(lambda x, y: op(x, y), autograph=False)
    return tf.function(lambda x, y: op(x), autograph=False)


def _median(fn, x, y, rounds: int = 21) -> float:
    fn(x, y)  # trace and warm
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn(x, y)  # eager calls return when the function has run
        times.append(time.perf_counter() - start)
    return statistics.median(times)


_MATRIX = 512


def _matrices():
    x = np.random.default_rng(0).uniform(0.5, 1.5, (_MATRIX, _MATRIX)).astype(np.float32)
    return tf.constant(x), tf.constant(x.T / _MATRIX)


def _inputs(n: int):
    x = np.random.default_rng(0).uniform(0.5, 1.5, n).astype(np.float32)
    return tf.constant(x), tf.ones([n], tf.float32)


def _check(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise CalibrationError(f"measured {name}={value:.3g}, outside [{low:g}, {high:g}]: "
                               "the machine was too busy to measure")
