"""Installs the built wheel where a TensorFlow user already has one, and checks it works there.

In a fresh virtualenv: install a TensorFlow distribution (by default the standard `tensorflow`
wheel, not the `tensorflow-cpu` that `make` uses), then the wheel of this source tree with its
dependencies; check that still only that one distribution provides the `tensorflow` module
(`pip list`, and tf_fusionstitch's own version check), that `pip check` is clean, and run a
layernorm through `tf_fusionstitch.optimize` from outside the source tree, with an empty
kernel cache, so the FusionStitch op library is built from the installed package.

  python scripts/check_wheel_beside_tensorflow.py [--tensorflow 'tensorflow==2.21.*']
      [--venv DIR]   (default: a temporary folder, removed afterwards)

Downloads TensorFlow (~570 MB) unless pip's cache has it. Exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import runpy
import shutil
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
# What the build reads; left out: the virtualenvs, git, build outputs.
NOT_COPIED = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info",
                                    "__pycache__", "*.so", ".pytest_cache")
# The distributions of the `tensorflow` module (the module is stdlib-only: it runs here).
DISTRIBUTIONS = runpy.run_path(
    str(REPO / "tf_fusionstitch" / "tensorflow_requirement.py"))["DISTRIBUTIONS"]

SMOKE = """
import os, time
import numpy as np
import tensorflow as tf
import tf_fusionstitch as fs

print("tensorflow", tf.__version__, "from", os.path.dirname(tf.__file__))
print("tf_fusionstitch", fs.__version__, "from", os.path.dirname(fs.__file__))

@tf.function(input_signature=[tf.TensorSpec([None, 1024], tf.float32)])
def layernorm(x):
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-5)

start = time.perf_counter()
fast = fs.optimize(layernorm)
x = tf.random.normal([256, 1024], seed=1)
y = fast(x)
seconds = time.perf_counter() - start
report = fast.report()
error = float(np.max(np.abs(y.numpy() - layernorm(x).numpy())))
print(f"kernels {report.kernels_before} -> {report.kernels_after}, "
      f"{len(report.clusters)} cluster(s), max |difference| {error:.2e}, "
      f"first call (op library build included) {seconds:.1f} s")
ops = [node.op for node in fast.graph_def.node]
ops += [n.op for f in fast.graph_def.library.function for n in f.node_def]
assert "FusionStitch" in ops, ops
assert report.kernels_after < report.kernels_before, report
assert error < 1e-4, error
print("layernorm smoke test: OK")
"""


def run(command, **kwargs) -> str:
    shown = [c if "\n" not in str(c) else "<script>" for c in command]
    print("$", " ".join(str(c) for c in shown), flush=True)
    result = subprocess.run([str(c) for c in command], text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, **kwargs)
    if result.returncode != 0:
        print(result.stdout)
        raise SystemExit(f"failed (exit {result.returncode}): {command[0]} ...")
    return result.stdout


def build_wheel(work: pathlib.Path) -> pathlib.Path:
    """The wheel of a copy of the source tree (a build in the tree itself could pick up a
    stale build/ folder)."""
    source = work / "source"
    shutil.copytree(REPO, source, ignore=NOT_COPIED)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", work / "wheel", source])
    (wheel,) = (work / "wheel").glob("*.whl")
    return wheel


def check(venv: pathlib.Path, tensorflow: str, work: pathlib.Path) -> None:
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "venv", venv])
    run([python, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    run([python, "-m", "pip", "install", "-q", tensorflow])
    wheel = build_wheel(work)
    print(run([python, "-m", "pip", "install", wheel]).splitlines()[-1])

    listed = json.loads(run([python, "-m", "pip", "list", "--format=json"]))
    names = {p["name"].lower().replace("_", "-"): p["version"] for p in listed}
    print("pip list (TensorFlow, tf_fusionstitch, numpy):")
    for name in sorted(names):
        if name.startswith(("tensorflow", "tf-", "tf_", "numpy")):
            print(f"  {name:32} {names[name]}")
    print(run([python, "-m", "pip", "check"]).strip())
    wanted = re.match(r"[A-Za-z0-9_.-]+", tensorflow)[0].lower().replace("_", "-")
    others = sorted(set(names) & set(DISTRIBUTIONS) - {wanted})
    if others:
        raise SystemExit(f"pip list has a second TensorFlow distribution: {others}")

    # Outside the source tree, so the installed package is what imports.
    outside = work / "outside"
    outside.mkdir()
    provides = json.loads(run([python, "-c", "import json; from tf_fusionstitch."
                               "tensorflow_requirement import installed; "
                               "print(json.dumps(installed()))"], cwd=outside))
    print("distributions providing the tensorflow module:", provides)
    if [name for name, _ in provides] != [wanted]:
        raise SystemExit(f"expected {wanted} alone, found {provides}")

    env = dict(os.environ, TF_FUSIONSTITCH_CACHE_DIR=str(work / "cache"),
               TF_CPP_MIN_LOG_LEVEL="2")
    print(run([python, "-c", SMOKE], cwd=outside, env=env).strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tensorflow", default="tensorflow==2.21.*",
                        help="the TensorFlow requirement installed first")
    parser.add_argument("--venv", type=pathlib.Path, default=None,
                        help="where to make the virtualenv (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tf_fusionstitch-wheel-check-") as tmp:
        work = pathlib.Path(tmp)
        venv = args.venv or work / "venv"
        if venv.exists():
            raise SystemExit(f"{venv} exists; give a new folder")
        check(venv, args.tensorflow, work)
    print("OK: the wheel installs beside", args.tensorflow, "without a second TensorFlow")


if __name__ == "__main__":
    main()
