"""benchmarks/compare_plans.py end to end at tiny sizes: every plan is rewritten and timed,
and each plan after the first gets its round-by-round ratio with a 95% interval; with
--processes, in each process and then over processes. No timing is asserted. A malformed
plan is refused with a message that names it."""

import re
import subprocess
import sys

import pytest
import script_testlib

pytestmark = pytest.mark.tf   # the script imports TensorFlow (in its own process)

SCRIPT = script_testlib.benchmark_script("compare_plans.py")


def _run(*flags):
    return subprocess.run([sys.executable, str(SCRIPT), "--size=tiny", *flags],
                          capture_output=True, text=True, timeout=300)


def test_three_plans_of_a_loop_model_are_compared_in_two_processes():
    res = _run("--model=dien", "--plans=xla_like,stitch,explore:pack=False+explore_k=2",
               "--rounds=6", "--warmup=0", "--processes=2")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    labels = {"xla_like", "stitch", "explore:pack=False+explore_k=2"}
    processes = re.split(r"^--- process \d of 2$", out, flags=re.M)
    assert len(processes) == 3, out   # what came before, then each process's output
    for own in processes[1:]:
        kernels = dict(re.findall(r"^(\S+): memory-intensive kernels TF \d+ -> (\d+)", own,
                                  re.M))
        assert set(kernels) == labels, own
        assert int(kernels["stitch"]) <= int(kernels["xla_like"]), own
        lines = {m[0]: m for m in re.findall(
            r"^  (\S+) +median +([\d.]+) ms, CPU +([\d.]+) ms(?:; ratio median ([\d.]+)x, "
            r"middle half ([\d.]+)-([\d.]+)x, 95% interval ([\d.]+)-([\d.]+)x)?$", own, re.M)}
        assert set(lines) == labels, own
        # explore's measured choice against XLA's rule plan is decided before the rounds
        assert re.search(r"^  measured choice: runs the (fused|XLA-rule plan) function", own,
                         re.M), own
        assert lines["xla_like"][3] == "", own       # the baseline has no ratio
        for label in ("stitch", "explore:pack=False+explore_k=2"):
            median, low, high, lowest, highest = map(float, lines[label][3:])
            assert float(lines[label][1]) > 0
            assert 0 < lowest <= low <= median <= high <= highest, lines[label]
    # over processes: the median of the two processes' medians and their range (two
    # processes are too few for a 95% interval), and how many processes kept each function
    summary = out[out.index("2 processes of 6 rounds"):]
    over = {m[0]: m for m in re.findall(
        r"^  (\S+) +median +([\d.]+) ms, kernels ([\d/]+)(?:; ratio median ([\d.]+)x, "
        r"processes ([\d.]+)-([\d.]+)x)?$", summary, re.M)}
    assert set(over) == labels, summary
    for label in ("stitch", "explore:pack=False+explore_k=2"):
        median, lowest, highest = map(float, over[label][3:])
        assert 0 < lowest <= median <= highest, over[label]
    kept = re.search(r"^    measured choice \(processes above\): (.*) of 2 processes$", summary,
                     re.M)
    assert kept, summary
    counts = re.findall(r"the (fused|XLA-rule plan) function in ([12])", kept.group(1))
    assert sum(int(n) for _, n in counts) == 2, summary


def test_a_zoo_models_train_step_is_compared():
    """zoo:<name> builds a zoo model (benchmarks/zoo/) at the batch and
    sequence length benchmarks/zoo.py times it at."""
    res = _run("--model=zoo:gpt2", "--plans=xla_like,explore", "--rounds=6", "--warmup=0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"^zoo:gpt2 train_step, batch 4x16, 6 rounds;", res.stdout, re.M), \
        res.stdout
    assert re.search(r"^  explore +median .* 95% interval [\d.]+-[\d.]+x$", res.stdout, re.M), \
        res.stdout


def test_a_plan_option_without_a_value_is_refused():
    res = _run("--model=dien", "--plans=xla_like,explore:pack", "--rounds=1")
    assert res.returncode != 0
    assert "option 'pack' is not key=value" in res.stderr, res.stderr
