"""benchmarks/planner.py's real-model path (keras_hub backbones and keras.applications ResNet50,
built in graph mode) run end to end at tiny sizes: the script must exit 0 and write a summary
row and a per-method table for each case asked for. No search result is asserted."""

import re

import pytest
import repo_paths
import script_testlib

pytestmark = pytest.mark.tf   # the script imports TensorFlow (in its own process)

CASES = ["hub_bert_large-8xV100", "hub_gpt2_xl-8xH200", "hub_llama2_7b-4x8xH200",
         "keras_resnet50-8xV100"]
METHODS = ["dp", "greedy", "random", "annealing", "dqn"]


def test_tiny_real_models_write_their_rows(tmp_path):
    text = script_testlib.run_into_results(
        repo_paths.BENCHMARKS / "planner.py", tmp_path, "--small", "--seeds=1", "--budget=8",
        f"--cases={','.join(CASES)}", timeout=300)
    section = text[text.index("<!-- planner:begin -->"):text.index("<!-- planner:end -->")]
    summary = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in CASES:
            summary[cells[0]] = cells
    assert sorted(summary) == sorted(CASES), section
    for name, cells in summary.items():
        assert cells[1] == "8", cells                      # the --budget given
        assert float(cells[2].rstrip("*")) > 0, cells      # best predicted step (ms)
        for cell in cells[3:8]:                            # every method: gap, hits
            assert re.fullmatch(r"(\d+\.\d\d%|inf), [01]/1", cell), cells
    for name in CASES:
        heading = f"### {name} (auto, budget 8)"
        assert heading in section, section
        table = section[section.index(heading):].split("\n\n")[2]
        methods = [row.split("|")[1].strip() for row in table.splitlines()[2:]]
        assert methods == METHODS, table
    assert "pure data parallelism (8 replicas)" in section, section
