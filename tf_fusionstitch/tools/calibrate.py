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
    rows = [("launch", "us", 1e6), ("bandwidth", "GB/s", 1e-9), ("cache_speedup", "x", 1),
            ("row_cache_bytes", "KiB", 1 / 1024), ("max_live_buffers", "", 1)]
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
