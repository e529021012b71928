"""benchmarks/zoo.py, the model-zoo benchmark, run end to end at tiny sizes.

One CNN's inference and one transformer's train step with six timed rounds (the
fewest that give the round-by-round median a 95% interval): the script must exit
0 and write its section of the --out file with both rows, each with fewer
kernels than TF, first-call times for TF and fs cold and warm, every contender's
step time and an interval; the summary gives the geometric means. No timing is
asserted.
"""

import re

import pytest
import script_testlib

pytestmark = pytest.mark.tf   # the script imports TensorFlow (in its own process)

SCRIPT = script_testlib.benchmark_script("zoo.py")


def test_tiny_rows_have_kernels_first_calls_and_intervals(tmp_path):
    text = script_testlib.run_into_results(
        SCRIPT, tmp_path, "--size=tiny", "--models=mobilenet,llama",
        "--functions=inference,train_step", "--train_models=llama", "--rounds=6", "--warmup=0",
        timeout=900)
    section = text[text.index("<!-- zoo:begin -->"):text.index("<!-- zoo:end -->")]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 10 and cells[0] in ("mobilenet", "llama"):
            rows[(cells[0], cells[1])] = cells
    assert set(rows) == {("mobilenet", "inference"), ("llama", "inference"),
                         ("llama", "train_step")}, section
    for key, cells in rows.items():
        before, after = map(int, re.fullmatch(r"(\d+) -> (\d+)", cells[3]).groups())
        assert 0 < after < before, (key, cells)
        assert cells[4] == "0", (key, cells)                       # no fallback
        assert re.fullmatch(r"[\d.]+ / [\d.]+ / [\d.]+ \([\d.]+x, [\d.]+x\)", cells[5]), cells
        for ms in (cells[6], cells[7], cells[9]):                  # TF, XLA and fs ran
            assert float(ms) > 0, (key, cells)
        for ratio in (cells[10], cells[11]):
            low_median_high = re.fullmatch(r"([\d.]+)x \(([\d.]+)-([\d.]+)\)", ratio)
            assert low_median_high, (key, ratio)
            median, low, high = map(float, low_median_high.groups())
            assert 0 < low <= median <= high, (key, ratio)
    assert "geometric mean" in section and "faster than XLA" in section, section
    assert "failed at" not in section, section
