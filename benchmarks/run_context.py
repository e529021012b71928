"""What the benchmark scripts share about a run: the machine and the commit
measured, the load while it ran, a fresh kernel cache per row, one-line
error text, and ONNX Runtime as a contender."""

import logging
import os
import pathlib
import platform
import re
import statistics
import subprocess
import threading

import numpy as np
import tensorflow as tf

import results_md

from tf_fusionstitch.runtime import cache as fs_cache

_REPO = pathlib.Path(__file__).resolve().parents[1]


def one_line(exc):
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return re.sub(r"\s+", " ", text[0] if text else type(exc).__name__)[:300]


def fresh_cache_dir(root, label):
    path = pathlib.Path(root) / label
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)
    os.environ[fs_cache.ENV_CACHE_DIR] = str(path)
    return path


def source_state():
    """The commit measured, and whether tracked files had uncommitted changes."""
    def git(*args):  # porcelain lines start with a space: strip only line ends
        return subprocess.run(["git", *args], cwd=_REPO, capture_output=True,
                              text=True, timeout=30).stdout.rstrip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = [l[3:] for l in git("status", "--porcelain", "--untracked-files=no")
                 .splitlines() if l.strip()]
    except (OSError, subprocess.SubprocessError):
        return "commit unknown"
    if not commit:
        return "commit unknown"
    return f"commit {commit}" + (f" with uncommitted changes to {', '.join(dirty)}"
                                 if dirty else "")


class LoadSampler:
    """The 1-minute load average every `period` seconds while the run lasts (this process
    included: its own TF threads keep about one runnable thread per core)."""

    def __init__(self, period=15.0):
        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)

    def _run(self, period):
        while not self._stop.wait(period):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def text(self):
        if not self.samples:
            return "load not sampled during the run"
        return (f"1-min load during the run (this process included) median "
                f"{statistics.median(self.samples):.1f}, max {max(self.samples):.1f}")


def machine_line(load):
    return (f"{results_md.cpu_model()}, {os.cpu_count()} cores; TF {tf.__version__}, numpy "
            f"{np.__version__}, Python {platform.python_version()}; load average {load:.2f} "
            f"before the run")


def ort_session_contender(onnx_bytes, arrays):
    """(callable, None) running an ONNX model in ONNX Runtime on `arrays`, or
    (None, reason) if it does not load or its first run fails."""
    try:
        import onnxruntime as ort
        sess = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
        feeds = {i.name: a for i, a in zip(sess.get_inputs(), arrays)}
        sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001  (an ORT failure is a note, not a crash)
        return None, one_line(e)
    return (lambda: sess.run(None, feeds)[0]), None


def ort_contender(fn, arrays):
    """(callable, None) running the tf2onnx conversion in ONNX Runtime, or (None, reason)."""
    try:
        import onnxruntime as ort
        import tf2onnx
        logging.getLogger("tf2onnx").setLevel(logging.CRITICAL)  # failures are recorded
        sig = [tf.TensorSpec(a.shape, tf.as_dtype(a.dtype), name=f"in{i}")
               for i, a in enumerate(arrays)]
        model, _ = tf2onnx.convert.from_function(tf.function(fn, input_signature=sig),
                                                 input_signature=sig)
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        feeds = {i.name: a for i, a in zip(sess.get_inputs(), arrays)}
        sess.run(None, feeds)   # a model that converts may still fail to run
    except Exception as e:  # conversion of e.g. Erfc fails in tf2onnx 1.17
        return None, one_line(e)
    return (lambda: sess.run(None, feeds)[0]), None
