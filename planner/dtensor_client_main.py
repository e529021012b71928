"""A DTensor client of `dtensor_clients.ClientGroup`, run as a program:
`python -m tf_fusionstitch.planner.dtensor_client_main SOCKET_FD DEVICES`, with DTensor's
environment saying which client of how many it is.

It joins the other clients (`dtensor.initialize_accelerator_system`: one mesh of every
client's `DEVICES` logical CPUs over gRPC), then answers the parent's requests in order until
the socket closes:

- ("build", key, plan, wire): builds `parallel.MeshStep` of the plan for the step
  `_Step.wire()` describes; the same code as a mesh of one process's devices runs.
- ("call", key, arguments): runs one step; its outputs (NumPy values).
- ("read", key): the distributed variables' values, in the step's variable order.
- ("shard_shapes", key): the shapes of this client's shards of each variable.

Each answer is ("ok", result) or ("error", traceback).
"""

import os
import sys
import traceback
from multiprocessing import connection

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from tensorflow.experimental import dtensor  # noqa: E402

from tf_fusionstitch.planner import localhost, parallel  # noqa: E402


class Requests:
    """The parent's requests: the steps built so far, by key."""

    def __init__(self):
        self.steps = {}

    def build(self, key, plan, wire):
        self.steps[key] = parallel.MeshStep.in_client(plan, wire)

    def call(self, key, arguments):
        outputs = self.steps[key].run_flat([tf.constant(a) for a in arguments])
        return [t.numpy() for t in outputs]

    def read(self, key):
        return [t.numpy() for t in self.steps[key].variable_values()]

    def shard_shapes(self, key):
        return self.steps[key].shard_shapes()


def serve(fd, devices):
    localhost.exit_with_parent()
    conn = connection.Connection(fd)
    dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=devices)
    requests = Requests()
    while True:
        try:
            name, *arguments = conn.recv()
        except EOFError:   # the group was closed
            return
        try:
            answer = ("ok", getattr(requests, name)(*arguments))
        except Exception:  # noqa: BLE001 - the parent reports it, with the traceback
            answer = ("error", traceback.format_exc())
        conn.send(answer)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
