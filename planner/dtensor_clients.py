"""Multi-client DTensor on 127.0.0.1: W processes, each a DTensor client of D logical CPU
devices, together one mesh of W * D devices over gRPC. TF-free (the clients import
TensorFlow, this module does not).

A DTensor mesh that spans processes needs a client in each: in TF 2.21 one client cannot
drive another process's devices (a mesh of a `local_cluster`'s remote devices fails as soon
as it runs a function: DTensor's expanded functions are not registered on the workers). So
every client runs the same program: each request the parent broadcasts (`request`), in the
same order, so that all of them issue the same collectives. Every client answers, with its
result or the traceback of its error; a client's error, its death or a timeout stops the
whole group (the others may be waiting in a collective for it).

A client is `dtensor_client_main` run as a program, told who it is by DTensor's environment
(`DTENSOR_CLIENT_ID`, `DTENSOR_NUM_CLIENTS`, `DTENSOR_JOB_NAME`, `DTENSOR_JOBS`: every
client's gRPC address) and talking to the parent over a socket pair. Clients stop when the
group is closed (context manager), at exit, when their socket closes, and when the parent
dies.
"""

import atexit
import os
import socket
import subprocess
import sys
import time
from multiprocessing import connection

from tf_fusionstitch.planner import localhost

CLIENT_PROGRAM = "tf_fusionstitch.planner.dtensor_client_main"
JOB_NAME = "worker"


class ClientError(RuntimeError):
    """A client failed (its traceback is in the message) or stopped answering; the group
    is closed."""


class ClientGroup(localhost.Stoppable):
    """`clients` DTensor client processes of `devices_per_client` logical CPUs each."""

    def __init__(self, clients, devices_per_client, timeout=300):
        self.timeout = timeout
        jobs = ",".join(f"127.0.0.1:{localhost.free_port()}" for _ in range(clients))
        self.processes, self.connections = [], []
        atexit.register(self.close)
        for client in range(clients):
            ours, theirs = socket.socketpair()
            env = dict(os.environ, DTENSOR_CLIENT_ID=str(client),
                       DTENSOR_NUM_CLIENTS=str(clients), DTENSOR_JOB_NAME=JOB_NAME,
                       DTENSOR_JOBS=jobs)
            self.processes.append(subprocess.Popen(
                [sys.executable, "-m", CLIENT_PROGRAM, str(theirs.fileno()),
                 str(devices_per_client)], env=env, pass_fds=[theirs.fileno()]))
            theirs.close()
            self.connections.append(connection.Connection(ours.detach()))

    def request(self, *message):
        """Sends `message` to every client and returns their results, in client order.

        Raises ClientError (after closing the group) when a client fails, dies or has not
        answered within the group's timeout."""
        if not self.connections:
            raise ClientError("the DTensor clients were stopped")
        for client, conn in enumerate(self.connections):
            try:
                conn.send(message)
            except OSError as e:   # its end closed: the client exited
                self.close()
                raise ClientError(f"DTensor client {client} exited before {message[0]!r}: "
                                  f"{e}") from e
        results = [None] * len(self.connections)
        waiting = dict(enumerate(self.connections))
        deadline = time.monotonic() + self.timeout
        while waiting:
            ready = connection.wait(list(waiting.values()), timeout=1)
            for client, conn in list(waiting.items()):
                if conn not in ready:
                    continue
                try:
                    status, value = conn.recv()
                except EOFError:
                    status, value = "error", "it exited"
                if status == "error":
                    self.close()
                    raise ClientError(f"DTensor client {client} failed on {message[0]!r}: "
                                      f"{value}")
                results[client] = value
                del waiting[client]
            dead = [c for c in waiting if self.processes[c].poll() is not None]
            if dead or (waiting and time.monotonic() > deadline):
                self.close()
                raise ClientError(f"DTensor clients {dead or sorted(waiting)} "
                                  f"{'exited' if dead else 'did not answer'} on "
                                  f"{message[0]!r}")
        return results

    def close(self):
        """Stops the clients (idempotent)."""
        for conn in self.connections:
            conn.close()
        self.connections = []
        localhost.stop(self.processes)
