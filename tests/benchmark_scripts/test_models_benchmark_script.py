"""benchmarks/models.py, the reference-model benchmark, run end to end at tiny sizes.

BERT's training step and inference with six timed rounds (the fewest that give the
round-by-round median a 95% interval): the script must exit 0, write
its section of the --out file with both rows, and the kernel counts must be ordered
FusionStitch <= xla_like <= TF (the paper's Table 2 column). No timing is asserted.
"""

import re
import subprocess
import sys

from tf_fusionstitch.runtime import cpu_compiler
import pytest
import repo_paths

# The script under test imports TensorFlow (in its own process).
pytestmark = pytest.mark.tf

SCRIPT = repo_paths.BENCHMARKS / "models.py"

try:  # kernels are compiled C++
    cpu_compiler.compiler_command()
except cpu_compiler.CompilerNotFound as exc:
    pytest.skip(f"no C++ compiler: {exc}", allow_module_level=True)


def test_tiny_bert_rows_have_ordered_kernel_counts(tmp_path):
    out = tmp_path / "RESULTS.md"
    out.write_text("# Benchmark results\n\nkept\n")
    res = subprocess.run([sys.executable, str(SCRIPT), "--size=tiny", "--models=bert",
                          "--batch=2", "--repeats=6", "--warmup=0", f"--out={out}"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    text = out.read_text()
    assert text.startswith("# Benchmark results\n\nkept\n"), text  # other sections kept
    section = text[text.index("<!-- models:begin -->"):text.index("<!-- models:end -->")]
    assert "load average" in section and "cores" in section and "TF 2." in section
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 3 and cells[0] == "bert":
            rows[cells[1]] = cells
    assert set(rows) == {"train_step", "inference"}, section
    for function, cells in rows.items():
        counts = re.fullmatch(r"(\d+) / (\d+) / (\d+)", cells[3])
        assert counts, (function, cells)
        tf_count, xla_like, stitch = map(int, counts.groups())
        assert 0 < stitch <= xla_like <= tf_count, (function, cells)
        assert cells[4] == f"{100.0 * stitch / xla_like:.0f}%", cells
        for ms in cells[7:11]:  # TF, XLA, xla_like and fs each ran
            assert float(ms) > 0, (function, cells)
    assert "failed" not in section and "differs from TF" not in section, section
    # per row, fs against xla_like round by round: median inside its middle half, and
    # the middle half inside the median's interval (with six rounds: the extremes)
    paired = re.findall(r"round by round \(xla_like's time over fs's in the same round\): "
                        r"median ([\d.]+)x, middle half ([\d.]+)-([\d.]+)x, 95% interval "
                        r"of the median ([\d.]+)-([\d.]+)x", section)
    assert len(paired) == 2, section
    for median, low, high, lowest, highest in paired:
        assert 0 < float(lowest) <= float(low) <= float(median) <= float(high) \
            <= float(highest), paired
