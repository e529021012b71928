"""The first call of an optimized train step against TensorFlow's own first call.

  python benchmarks/first_call.py --models=mobilenet_v2,bert --sizes=tiny,real
  python benchmarks/first_call.py --models=mobilenet_v2 --sizes=tiny --profile=/tmp/prof
  python benchmarks/first_call.py --models=all --sizes=real --background=false

Each (model, size) runs in a fresh process (imports, op registry and Python
caches as a user's first run has them) and measures, in this order, the
first call (tracing, instantiation and one step; batch 2, text sequence 16) of:

  TF        a fresh, untraced tf.function of the zoo model's train step. Timed
            twice (two fresh functions): the first pays the process's one-time
            Keras and TF start-up, the second (`tf`) is what the others are held to.
  fs cold   `tf_fusionstitch.optimize` of another fresh tf.function, with an
            empty kernel and rewrite cache (a fresh TF_FUSIONSTITCH_CACHE_DIR).
            The op library is built (or found) once per machine beforehand and
            not counted; neither is `import tf_fusionstitch` (reported apart).
  fs warm   a new OptimizedFunction of a new tf.function, both caches warm.
  fs bg     optimize(..., background=True) of another fresh tf.function with
            empty caches again: its first call runs the original while the
            rewrite compiles on a thread (tf_fusionstitch/background.py);
            `ready` is the time from that call's start until the optimized
            function is ready (OptimizedFunction.wait), after which calls
            run it. Left out with --background=false (a shorter sweep).

--models=all: every zoo model (benchmarks/zoo). --repeats=N runs N processes per model:
TF's own first call moves by up to a third between processes, so the table then shows
the medians (of the walls, and of each process's own ratios).

Wall time and CPU time (this process plus the compilers it waited for) of
each; the machine is shared, so CPU time is the steadier number. With
--profile, the cold call is run under cProfile and its stats written there.
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

_REPO = pathlib.Path(__file__).resolve().parents[1]
MODELS = ("mobilenet_v2", "resnet50", "densenet121", "efficientnet_b0", "bert", "llama", "t5")


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _timed(call):
    wall, cpu = time.perf_counter(), _cpu()
    result = call()
    return result, time.perf_counter() - wall, _cpu() - cpu


def _fresh_dir(root: pathlib.Path, label: str) -> str:
    path = root / label
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)
    return str(path)


def child(name: str, size: str, profile: str, oplib_dir: str, background: bool) -> dict:
    sys.path.insert(0, str(_REPO))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from benchmarks import zoo

    m = zoo.build(name, size, seed=0)
    batch = m.make_batch(0, 2, 16)
    args = (*batch.inputs, batch.labels)

    def fresh():
        return tf.function(m.train_step.python_function,
                           input_signature=m.train_step.input_signature)

    row = {"model": name, "size": size}
    for label in ("tf_first_in_process", "tf"):
        loss, row[f"{label}_wall"], row[f"{label}_cpu"] = _timed(
            lambda: float(fresh()(*args).numpy()))
    row["tf_loss"] = loss

    # Imported after TF's calls, so its import time is its own (reported, not in cold).
    _, row["import_wall"], row["import_cpu"] = _timed(
        lambda: __import__("tf_fusionstitch"))
    import tf_fusionstitch as fs
    from tf_fusionstitch.custom_ops import loader
    # The op library is built once per machine: load it from its own directory.
    os.environ["TF_FUSIONSTITCH_CACHE_DIR"] = oplib_dir
    loader.load()
    root = pathlib.Path(tempfile.mkdtemp(prefix="fs-first-call-"))
    os.environ["TF_FUSIONSTITCH_CACHE_DIR"] = _fresh_dir(root, "kernels")
    for label in ("cold", "warm"):
        fast = fs.optimize(fresh())

        def call():
            return float(fast(*args).numpy())
        if label == "cold" and profile:
            import cProfile
            profiler = cProfile.Profile()
            loss, row["cold_wall"], row["cold_cpu"] = _timed(lambda: profiler.runcall(call))
            out = pathlib.Path(profile)
            out.mkdir(parents=True, exist_ok=True)
            profiler.dump_stats(str(out / f"{name}-{size}.prof"))
        else:
            loss, row[f"{label}_wall"], row[f"{label}_cpu"] = _timed(call)
        report = fast.report()
        row[f"{label}_loss"] = loss
        row[f"{label}_rewrite_s"] = report.rewrite_seconds
        row[f"{label}_compile_s"] = report.compile_seconds
        row[f"{label}_compilations"] = report.compilations
        row[f"{label}_kernels"] = [report.kernels_before, report.kernels_after]
        row[f"{label}_cache_hit"] = bool(report.cache_hit)
        row[f"{label}_fallbacks"] = len(report.fallbacks)
    if background:
        _background_call(fs, fresh, args, root, row)
    shutil.rmtree(root, ignore_errors=True)
    return row


def _background_call(fs, fresh, args, root: pathlib.Path, row: dict) -> None:
    os.environ["TF_FUSIONSTITCH_CACHE_DIR"] = _fresh_dir(root, "background")
    started = time.perf_counter()
    fast = fs.optimize(fresh(), background=True)
    row["bg_loss"], row["bg_wall"], row["bg_cpu"] = _timed(lambda: float(fast(*args).numpy()))
    fast.wait()
    row["bg_ready_wall"] = time.perf_counter() - started
    report = fast.report()
    row["bg_kernels"] = None if report is None else [report.kernels_before,
                                                     report.kernels_after]


def _fmt(row, key, width=7, digits=1):
    return f"{row[key]:{width}.{digits}f}" if key in row else " " * (width - 1) + "-"


def _model_names(value: str) -> list:
    if value != "all":
        return value.split(",")
    sys.path.insert(0, str(_REPO))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # the registry imports TF
    from benchmarks.zoo import NAMES
    return list(NAMES)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--sizes", default="tiny,real")
    parser.add_argument("--profile", default="")
    parser.add_argument("--background", default="true", choices=("true", "false"),
                        help="also time optimize(..., background=True)")
    parser.add_argument("--out", default="", help="append JSON rows to this file")
    parser.add_argument("--repeats", type=int, default=1,
                        help="processes per model; each pairs its own TF and fs calls, and "
                             "the table shows the medians of the walls and of the ratios")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "SIZE"), help=argparse.SUPPRESS)
    parser.add_argument("--oplib_dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("ROW " + json.dumps(child(*args.child, args.profile, args.oplib_dir,
                                              args.background == "true")), flush=True)
        return

    oplib_dir = args.oplib_dir or tempfile.mkdtemp(prefix="fs-oplib-")
    os.makedirs(oplib_dir, exist_ok=True)
    os.chmod(oplib_dir, 0o700)
    print(f"{'model':16} {'size':5} {'TF1 wall':>8} {'TF wall':>8} {'TF cpu':>7} "
          f"{'cold wall':>9} {'cold cpu':>8} {'warm wall':>9} {'warm cpu':>8} "
          f"{'cold/TF':>7} {'warm/TF':>7} {'bg wall':>7} {'bg/TF':>6} {'ready':>6} kernels",
          flush=True)
    rows_done = []
    for size in args.sizes.split(","):
        for name in _model_names(args.models):
            command = [sys.executable, __file__, "--child", name, size,
                       "--oplib_dir", oplib_dir, "--profile", args.profile,
                       "--background", args.background]
            runs, failure = [], None
            for _ in range(max(1, args.repeats)):
                proc = subprocess.run(command, capture_output=True, text=True)
                rows = [l[4:] for l in proc.stdout.splitlines() if l.startswith("ROW ")]
                if proc.returncode != 0 or not rows:
                    failure = proc.stderr.strip().splitlines()[-1:]
                    break
                runs.append(json.loads(rows[0]))
            if failure is not None:
                print(f"{name:16} {size:5} failed: {failure}", flush=True)
                continue
            row = _median_row(runs)
            print(f"{name:16} {size:5} {row['tf_first_in_process_wall']:8.1f} "
                  f"{row['tf_wall']:8.1f} {row['tf_cpu']:7.1f} {row['cold_wall']:9.1f} "
                  f"{row['cold_cpu']:8.1f} {row['warm_wall']:9.1f} {row['warm_cpu']:8.1f} "
                  f"{row['cold_over_tf']:7.2f} "
                  f"{row['warm_over_tf']:7.2f} {_fmt(row, 'bg_wall')} "
                  f"{_fmt(row, 'bg_over_tf', 6, 2)} "
                  f"{_fmt(row, 'bg_ready_wall', 6)} "
                  f"{row['cold_kernels']} ({row['cold_compilations']} compiled, "
                  f"{row['cold_fallbacks']} fallbacks)", flush=True)
            rows_done.append(row)
            if args.out:
                with open(args.out, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
    for line in _summary(rows_done):
        print(line, flush=True)


def _median_row(runs: list) -> dict:
    """One row of `runs` (a model's processes): the first run's fields, with each wall
    and CPU time the median over the runs, each ratio over TF the median of the runs' own
    ratios, and the runs' ratios kept (`<label>_over_tf_runs`)."""
    row = dict(runs[0])
    for key in row:
        if key.endswith(("_wall", "_cpu")) and all(key in r for r in runs):
            row[key] = statistics.median(r[key] for r in runs)
    for label in ("cold", "warm", "bg"):
        if all(f"{label}_wall" in r for r in runs):
            ratios = [r[f"{label}_wall"] / r["tf_wall"] for r in runs]
            row[f"{label}_over_tf"] = statistics.median(ratios)
            row[f"{label}_over_tf_runs"] = ratios
    row["runs"] = len(runs)
    return row


# What a first call may cost over TF's own: with empty caches, and with warm ones.
BARS = {"cold": 2.0, "warm": 1.2}


def _summary(rows: list) -> list:
    """The worst cold and warm first call over TF's, and the rows over BARS."""
    if not rows:
        return []
    lines = []
    for label, bar in BARS.items():
        ratios = {f"{r['model']} {r['size']}": r[f"{label}_over_tf"] for r in rows}
        worst = max(ratios, key=ratios.get)
        over = sorted(name for name, ratio in ratios.items() if ratio > bar)
        lines.append(f"{label}: at most {ratios[worst]:.2f}x TF's first call ({worst}); "
                     f"{len(over)} of {len(rows)} rows over {bar}x{': ' if over else ''}"
                     f"{', '.join(over)}")
    return lines


if __name__ == "__main__":
    main()
