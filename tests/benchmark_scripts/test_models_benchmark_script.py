"""benchmarks/models.py, the reference-model benchmark, run end to end at tiny sizes.

BERT's training step and inference with six timed rounds (the fewest that give the
round-by-round median a 95% interval): the script must exit 0, write
its section of the --out file with both rows, and the kernel counts must be ordered
FusionStitch <= xla_like <= TF (the paper's Table 2 column). No timing is asserted.
"""

import re

import pytest
import script_testlib

pytestmark = pytest.mark.tf   # the script imports TensorFlow (in its own process)

SCRIPT = script_testlib.benchmark_script("models.py")


def test_tiny_bert_rows_have_ordered_kernel_counts(tmp_path):
    text = script_testlib.run_into_results(
        SCRIPT, tmp_path, "--size=tiny", "--models=bert", "--batch=2", "--repeats=6",
        "--warmup=0", timeout=300)
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
