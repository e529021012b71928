"""`LocalCluster`: TensorFlow worker processes on 127.0.0.1 that plans run on over gRPC.

Each worker is a `tf.distribute.Server` (job "worker", task i) in a process of its own with
`devices_per_worker` CPU devices; this process joins the cluster as job "chief" through
`tf.config.experimental_connect_to_cluster`, after which ops placed on
`/job:worker/replica:0/task:i/device:CPU:k` run in worker i. The planner's device names for a
cluster of several nodes are exactly those, so placed plans (`parallel.PlacedStep`) run here
unchanged. Tensor parallel plans need DTensor in every process of the mesh: for them the
cluster starts a `dtensor_clients.ClientGroup` beside the workers, one client per worker
with the worker's device count. Workers and clients are stopped when the cluster is closed
(context manager), at exit, and by themselves when the process that started them dies.

Connecting changes this process's TensorFlow context for good: create the model's variables
after `local_cluster(...)`, and keep one cluster per process (TensorFlow has no public way
to disconnect).

Run as a program, this module is a worker: `python -m tf_fusionstitch.planner.local_workers
CLUSTER_JSON TASK DEVICES`.
"""

import atexit
import json
import subprocess
import sys
import time

import tensorflow as tf

from tf_fusionstitch.planner import cluster as cluster_lib
from tf_fusionstitch.planner import dtensor_clients, localhost, loopback_calibration


class LocalCluster(localhost.Stoppable):
    """W worker processes of D CPU devices each; `spec` is the `ClusterSpec` plans are
    searched and placed for: its link between workers is measured on this machine
    (`loopback_calibration`, cached), its devices' figures are `cpu_cluster`'s."""

    def __init__(self, workers=2, devices_per_worker=1):
        for name, value in (("workers", workers), ("devices_per_worker", devices_per_worker)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"local_cluster: {name} must be a positive integer, got "
                                 f"{value!r}")
        if workers < 2:
            # One node of CPU devices is named as this process's own (/job:localhost).
            raise ValueError("local_cluster needs at least 2 workers; for the devices of "
                             "this process use cluster='NxCPU'")
        self.spec = cluster_lib.cpu_cluster(devices_per_worker, nodes=workers,
                                            name=f"local-{workers}x{devices_per_worker}xCPU")
        ports = [localhost.free_port() for _ in range(workers + 1)]
        self.cluster_def = {"chief": [f"127.0.0.1:{ports[0]}"],
                            "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}
        self.clients = None    # DTensor clients, started for the first mesh plan
        self.processes = [subprocess.Popen(
            [sys.executable, "-m", __name__, json.dumps(self.cluster_def), str(i),
             str(devices_per_worker)]) for i in range(workers)]
        atexit.register(self.close)
        try:
            tf.config.experimental_connect_to_cluster(
                tf.train.ClusterSpec(self.cluster_def), job_name="chief", task_index=0)
            self._wait_for_devices(workers * devices_per_worker)
            self.spec = loopback_calibration.measured_spec(self.spec)
        except Exception:
            self.close()
            raise

    def _wait_for_devices(self, count, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            remote = [d for d in tf.config.list_logical_devices("CPU")
                      if "/job:worker/" in d.name]
            if len(remote) >= count:
                return
            dead = [p.pid for p in self.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"local_cluster: {len(remote)} of {count} worker devices "
                                   f"came up (workers exited: {dead})")
            time.sleep(0.5)

    def dtensor_clients(self):
        """The cluster's DTensor clients (`dtensor_clients.ClientGroup`), one per worker with
        the worker's devices, started on first use: tensor parallel plans run on them."""
        if self.clients is None:
            self.clients = dtensor_clients.ClientGroup(self.spec.nodes,
                                                       self.spec.devices_per_node)
        return self.clients

    def close(self):
        """Stops the workers and DTensor clients (idempotent)."""
        if self.clients is not None:
            self.clients.close()
        localhost.stop(self.processes)


def serve(cluster_json, task, devices):
    """A worker: serves its task until killed or until the process that started it dies."""
    localhost.exit_with_parent()
    # Registers the FusionStitch op and its resolver here, so a fused step's kernels placed
    # on this worker are built from their nodes' checked specs (tf_fusionstitch.spec_kernels).
    import tf_fusionstitch  # noqa: F401
    config = tf.compat.v1.ConfigProto(device_count={"CPU": devices})
    server = tf.distribute.Server(tf.train.ClusterSpec(json.loads(cluster_json)),
                                  job_name="worker", task_index=task, config=config)
    server.join()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
