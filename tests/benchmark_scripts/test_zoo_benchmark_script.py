"""benchmarks/zoo.py, the model-zoo benchmark, run end to end at tiny sizes.

One CNN's inference and one transformer's train step with six timed rounds (the
fewest that give the round-by-round median a 95% interval): the script must exit
0 and write its section of the --out file with both rows, each with fewer
kernels than TF, first-call times for TF and fs cold and warm, every contender's
step time and an interval; the summary gives the geometric means. No timing is
asserted.
"""

import re
import subprocess
import sys

import pytest

# The script under test imports TensorFlow (in its own process).
pytestmark = pytest.mark.tf

from tf_fusionstitch.runtime import cpu_compiler
import repo_paths

SCRIPT = repo_paths.BENCHMARKS / "zoo.py"

try:  # kernels are compiled C++
    cpu_compiler.compiler_command()
except cpu_compiler.CompilerNotFound as exc:
    pytest.skip(f"no C++ compiler: {exc}", allow_module_level=True)


def test_tiny_rows_have_kernels_first_calls_and_intervals(tmp_path):
    out = tmp_path / "RESULTS.md"
    out.write_text("# Benchmark results\n\nkept\n")
    res = subprocess.run([sys.executable, str(SCRIPT), "--size=tiny", "--models=mobilenet,llama",
                          "--functions=inference,train_step", "--train_models=llama",
                          "--rounds=6", "--warmup=0", f"--out={out}"],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    text = out.read_text()
    assert text.startswith("# Benchmark results\n\nkept\n"), text
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
