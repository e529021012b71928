"""The measured NxCPU cluster spec: this machine's figures, plausible, cached per machine and
device count (tests run in a session cache directory, see conftest)."""

import math

import parallelize_testlib as lib  # configures the logical devices first
import pytest

from tf_fusionstitch.planner import cpu_calibration

pytestmark = pytest.mark.tf


def test_measured_spec_is_plausible_and_cached(monkeypatch):
    if lib.SETUP_ERROR is not None:
        pytest.skip(lib.SETUP_ERROR)
    record = cpu_calibration.measure(lib.DEVICES)
    figures = record["figures"]
    assert set(figures) == set(cpu_calibration.FIELDS)
    # Any CPU that runs TensorFlow: more than 1 GFLOP/s and 1 GB/s, an op and a collective
    # take under a millisecond.
    assert 1e9 < figures["flops"] < 1e14, figures
    assert 1e9 < figures["memory_bandwidth"] < 1e13, figures
    assert 0 <= figures["op_overhead"] < 1e-3, figures
    assert figures["intra_bandwidth"] > 1e7 and 0 <= figures["intra_latency"] < 1e-3, figures
    assert all(math.isfinite(v) for v in figures.values()), figures

    def measure_again(devices):
        raise AssertionError("measured again although cached")

    monkeypatch.setattr(cpu_calibration, "measure", measure_again)
    spec = cpu_calibration.measured_cluster(lib.DEVICES)
    assert (spec.name, spec.num_devices, spec.device_type) == ("4xCPU-measured", 4, "CPU")
    assert spec.shared_cores
    assert {k: getattr(spec, k) for k in cpu_calibration.FIELDS} == figures
    assert cpu_calibration.cached_record(lib.DEVICES) == record
    assert cpu_calibration.cached_record(lib.DEVICES - 1) is None   # per device count


def test_fewer_than_two_devices_are_refused():
    with pytest.raises(ValueError, match="at least 2 devices"):
        cpu_calibration.measure(1)


def test_a_measurement_that_a_busy_moment_swapped_is_taken_again():
    from tf_fusionstitch.planner import timing
    times = iter([1.0, 0.5, 1.0, 2.0])   # first attempt: the large one "faster"
    assert timing.two_sizes(lambda n: next(times), 1, 1 << 20, "an all-reduce") == (1.0, 2.0)
    with pytest.raises(ValueError, match="an all-reduce of 1048576 floats .* in 2 attempts"):
        timing.two_sizes(lambda n: 1e-3, 1, 1 << 20, "an all-reduce", attempts=2)
