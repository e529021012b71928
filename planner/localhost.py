"""What the planner's localhost worker processes share, TF-free: a free port on 127.0.0.1,
stopping a group of them, and a child's exit when the process that started it dies (so no
worker outlives a test run that crashed or was killed)."""

import os
import socket
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exit_with_parent():
    """Ends this process as soon as its parent dies (it is then re-parented), from a daemon
    thread: a worker blocked in a server loop or a collective never looks itself."""
    parent = os.getppid()

    def watch_parent():
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()


def stop(processes):
    """Kills those of `processes` still running and waits for all of them."""
    for process in processes:
        if process.poll() is None:
            process.kill()
    for process in processes:
        process.wait()


class Stoppable:
    """A group of worker processes as a context manager: leaving it calls the subclass's
    `close()`."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
