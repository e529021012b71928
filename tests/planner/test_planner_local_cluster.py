"""`planner.local_cluster(workers=2)`: data and pipeline plans (and a fused step's data
plan) run on two TensorFlow worker processes over localhost gRPC, operator (tensor parallel) plans, and data plans of a step
that takes only its global batch, on its two multi-client DTensor clients, with the single-device losses and variables; the cluster's spec has the
loopback link measured on this machine.

Joining a cluster changes a process's TensorFlow context for good, so the checks run in a
fresh Python process (this file run as a program); its workers stop when it closes the
cluster, and by themselves if it dies.
"""

import os
import subprocess
import sys

import parallelize_testlib as lib  # configures the logical devices first

import tensorflow as tf

from tf_fusionstitch import planner
from tf_fusionstitch.planner import dtensor_clients, loopback_calibration

_DONE = "local cluster checks passed"


def check_on_two_workers():
    with planner.local_cluster(workers=2, devices_per_worker=1) as cluster:
        case = lib.ParallelStepCase()
        # Plans are priced with the loopback link measured here (and cached), not assumed.
        figures = loopback_calibration.cached_record()["figures"]
        case.assertEqual(cluster.spec.name, "local-2x1xCPU-measured")
        case.assertEqual(cluster.spec.inter_bandwidth, figures["inter_bandwidth"])
        case.assertEqual(cluster.spec.inter_latency, figures["inter_latency"])
        case.assertBetween(figures["inter_bandwidth"], 1e7, 1e12)   # bytes/s
        case.assertBetween(figures["inter_latency"], 0.0, 0.05)     # seconds
        print(f"loopback: {figures['inter_bandwidth'] / 1e9:.2f} GB/s, "
              f"{figures['inter_latency'] * 1e6:.0f} us")
        for strategy in ("data", "pipeline"):
            parallel = case.check_strategy("einsum", strategy, cluster=cluster)
            tasks = {tf.DeviceSpec.from_string(op.device).task
                     for op in case.ops_run(parallel, "einsum") if op.device}
            case.assertEqual(tasks, {0, 1})
        # A fused step's kernels run on the workers too: each builds them from the nodes'
        # checked specs (the workers import tf_fusionstitch, which registers the op).
        parallel = case.check_strategy("einsum", "data", fuse=True, cluster=cluster)
        tasks = {tf.DeviceSpec.from_string(op.device).task
                 for op in case.ops_run(parallel, "einsum") if op.type == "FusionStitch"}
        case.assertEqual(tasks, {0, 1})
        for model in ("reference", "einsum"):
            case.check_strategy(model, "operator", cluster=cluster)
        # The reference block reshapes to its global batch, so it does not run in placed
        # pieces: its data plan runs as one SPMD program on the DTensor clients.
        case.check_strategy("reference", "data", cluster=cluster)
        clients = cluster.clients.processes
        case.assertLen(clients, 2)
        # A client's error stops every client (the others may wait in a collective) and
        # comes back with its traceback.
        with case.assertRaisesRegex(dtensor_clients.ClientError,
                                    r"client \d failed(?s:.*)KeyError: .no such step"):
            cluster.clients.request("call", "no such step", [])
        case.assertTrue(all(p.poll() is not None for p in clients), "a client outlived an error")
    workers = cluster.processes + clients
    case.assertTrue(all(p.poll() is not None for p in workers), "a worker outlived close()")
    print(_DONE)


def _text(output) -> str:
    """A timed-out run's captured output (bytes, or None when it wrote nothing)."""
    return (output or b"").decode(errors="replace") if not isinstance(output, str) else output


class LocalClusterTest(tf.test.TestCase):

    def test_data_pipeline_and_operator_plans_on_two_workers(self):
        here = os.path.dirname(os.path.abspath(__file__))
        tests = os.path.dirname(here)   # where parallelize_testlib is
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [tests] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        # -u: unbuffered, so a run killed at the timeout still shows the steps that passed
        try:
            result = subprocess.run([sys.executable, "-u", os.path.abspath(__file__)],
                                    capture_output=True, text=True, timeout=300, env=env)
        except subprocess.TimeoutExpired as e:
            self.fail("the checks took over 300 s (the last line of their output is the "
                      f"last step that passed):\n{_text(e.stdout)[-3000:]}\n"
                      f"{_text(e.stderr)[-3000:]}")
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        self.assertIn(_DONE, result.stdout)
        print(result.stdout)

    def test_bad_sizes(self):
        with self.assertRaisesRegex(ValueError, "at least 2 workers"):
            planner.local_cluster(workers=1)
        with self.assertRaisesRegex(ValueError, "devices_per_worker must be a positive"):
            planner.local_cluster(workers=2, devices_per_worker=0)


if __name__ == "__main__":
    check_on_two_workers()
