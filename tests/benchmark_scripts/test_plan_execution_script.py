"""benchmarks/plan_execution.py run end to end on a tiny model: every plan of its set is
built, run under `planner.parallelize` on 4 logical CPUs and timed; the section it writes
holds one row per plan with a predicted and a measured time, Spearman's rho and the rank of
the search's pick. No correlation is asserted (a tiny model on a shared machine)."""

import re

import pytest
import repo_paths
import script_testlib

pytestmark = pytest.mark.tf   # the script imports TensorFlow (in its own process)


def test_small_run_writes_a_row_per_plan_and_the_correlation(tmp_path):
    text = script_testlib.run_into_results(
        repo_paths.BENCHMARKS / "plan_execution.py", tmp_path, "--small", "--rounds=6",
        "--warmup=1", timeout=300)
    section = text[text.index("<!-- plan_execution:begin -->"):
                   text.index("<!-- plan_execution:end -->")]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if re.match(r"\| \dx\dx\d", line)]
    assert len(rows) >= 8, section
    meshes = {row[0].split()[0] for row in rows}
    assert {"4x1x1", "1x4x1", "2x2x1", "1x1x4", "2x1x2"} <= meshes, section
    for row in rows:
        assert float(row[1]) > 0 and float(row[2]) > 0, row      # predicted, measured (ms)
        assert re.fullmatch(r"\d+\.\d\d-\d+\.\d\d", row[3]), row  # the median's interval
    assert sorted(int(row[5]) for row in rows) == list(range(1, len(rows) + 1)), section
    assert sum("(search pick)" in row[0] for row in rows) == 1, section
    rho = float(re.search(r"Spearman's rho \(predicted vs measured median\) = (-?\d\.\d+)",
                          section).group(1))
    assert -1.0 <= rho <= 1.0, section
    assert re.search(r"the search's pick \(dp, auto\) is .*: measured rank \d+ of "
                     f"{len(rows)}", section), section
