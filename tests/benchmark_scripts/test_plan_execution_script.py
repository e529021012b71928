"""benchmarks/plan_execution.py run end to end on a tiny model: every plan of its set is
built, run under `planner.parallelize` on 4 logical CPUs and timed; the section it writes
holds one row per plan with its predicted times (assumed and measured cluster spec) and its
measured time, and per spec Spearman's rho and the rank of the search's pick. No correlation is asserted (a tiny model on a shared machine)."""

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
        # predicted under the assumed and the measured spec, measured (ms)
        assert float(row[1]) > 0 and float(row[3]) > 0 and float(row[5]) > 0, row
        assert re.fullmatch(r"\d+\.\d\d-\d+\.\d\d", row[6]), row  # the median's interval
    for column in (2, 4, 7):   # ranks: predicted (each spec), measured
        assert sorted(int(row[column]) for row in rows) == list(range(1, len(rows) + 1)), \
            section
    for spec in ("assumed", "measured"):   # the assumed figures and this machine's
        rho = float(re.search(rf"{spec} spec \(.*\): Spearman's rho \(predicted vs measured "
                              r"median\) = (-?\d\.\d+)", section).group(1))
        assert -1.0 <= rho <= 1.0, section
        if f"the {spec} spec's pick (" in section and "parallelize does not run" in section:
            continue   # a pick that pipelines tensor-parallel stages is named, not run
        assert sum("pick: " in row[0] and spec in row[0] for row in rows) == 1, section
        assert re.search(rf"the {spec} spec's pick \(dp, auto\) is .*: measured rank \d+ of "
                         f"{len(rows)}", section), section
