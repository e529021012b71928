"""Show (or redo) the CPU cost calibration that fusion="explore" prices plans with.

  python -m tf_fusionstitch.tools.calibrate            # this machine's costs, measured if absent
  python -m tf_fusionstitch.tools.calibrate --force    # measure again, replace the cached ones

Prints each cost next to its builtin value (rewriters/cpu_cost_model.py).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app
from absl import flags

FLAGS = flags.FLAGS


def _define_flags():
    # Only when run as a program: tests import this module next to other tools.
    flags.DEFINE_bool("force", False, "Measure again even if this machine's costs are cached.")


def format_record(record, builtin) -> str:
    """The calibration as a table, costs against the builtin ones."""
    costs = record["costs"]
    rows = [("launch", "us", 1e6), ("bandwidth", "GB/s", 1e-9),
            ("stream_bandwidth", "GB/s", 1e-9), ("cache_speedup", "x", 1),
            ("row_cache_bytes", "KiB", 1 / 1024), ("max_live_buffers", "", 1),
            ("cores", "", 1), ("matmul_flops", "GFLOP/s", 1e-9),
            ("parallel_grain", "us", 1e6), ("inline_op", "us", 1e6), ("plan_error", "%", 100)]
    lines = [f"machine: {record['machine']} (calibration took {record['seconds']} s)",
             f"{'cost':<24}{'measured':>12}{'builtin':>12}"]
    for name, unit, scale in rows:
        lines.append(f"{name + (' (' + unit + ')' if unit else ''):<24}"
                     f"{costs[name] * scale:>12.3g}{builtin[name] * scale:>12.3g}")
    lines.append("compute-bound primitives (ns per element):")
    if not costs["compute"]:
        lines.append("  none: every op is priced by its memory traffic")
    for prim, seconds in sorted(costs["compute"].items()):
        lines.append(f"  {prim:<22}{seconds * 1e9:>12.3g}")
    from tf_fusionstitch.rewriters import plan_checks
    checks = [plan_checks.Check(**c) for c in record.get("plan_checks", [])]
    if checks:
        lines.append("plan model against TF's own time (ms):")
        lines.append(f"  {'graph':<30}{'measured':>10}{'predicted':>11}{'error':>8}")
    for check in checks:
        lines.append(f"  {check.graph:<30}{check.measured_s * 1e3:>10.3f}"
                     f"{check.predicted_s * 1e3:>11.3f}{100 * check.error:>7.0f}%")
    if checks:
        lines.append("error on the cost of a change, of the changed graph's time "
                     "(plan_error: the largest):")
        for (base, changed), error in plan_checks.change_errors(checks).items():
            lines.append(f"  {base + ' -> ' + changed:<58}{100 * error:>7.1f}%")
    return "\n".join(lines)


def main(argv):
    del argv
    from tf_fusionstitch.rewriters import cpu_cost_model, cpu_costs
    record = None if FLAGS.force else cpu_costs.cached_record()
    if record is None:
        record = cpu_costs.recalibrate()
    print(format_record(record, cpu_cost_model.BUILTIN))


if __name__ == "__main__":
    _define_flags()
    app.run(main)
