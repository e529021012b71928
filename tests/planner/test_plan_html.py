"""Plan.save_html: the device mesh, the variables' splits and the pipeline
timeline, on one self-contained page (TF-free)."""

import pytest

from html_testlib import Page
from tf_fusionstitch.planner import ir, micro_batches, plan_html
from tf_fusionstitch.planner.plan import Plan


def make_plan(replicas=2, tensor_parallel=2, stages=2, micro=4, schedule="1f1b"):
    ops = [f"op{i}" for i in range(12)]
    return Plan(variable_splits={"dense/kernel:0": 1, "dense/bias:0": None, "emb:0": 0},
                stages=[ops[s::stages] for s in range(stages)], replicas=replicas,
                tensor_parallel=tensor_parallel, micro_batches=micro,
                predicted_step_time=0.002, peak_memory_per_device=1e9, feasible=True,
                cluster=f"{replicas * tensor_parallel * stages}xH200", schedule=schedule,
                tp_collectives={"all_reduce/forward": 2})


@pytest.mark.parametrize("schedule", micro_batches.SCHEDULES)
@pytest.mark.parametrize("stages,micro", [(1, 3), (3, 2), (4, 6)])
def test_the_timeline_runs_the_schedule_without_overlap(schedule, stages, micro):
    blocks = plan_html.timeline(stages, micro, schedule, replicas=2)
    orders = micro_batches.schedule(schedule, stages, micro)
    end = {}
    for s in range(stages):
        mine = sorted((b for b in blocks if b[0] == s and b[2] != "all-reduce"),
                      key=lambda b: b[4])
        assert [(b[3], b[2]) for b in mine] == orders[s]   # the schedule's order
        for a, b in zip(mine, mine[1:]):
            assert a[4] + a[5] <= b[4]                       # one block at a time
        end.update(((s, b[3], b[2]), (b[4], b[4] + b[5])) for b in mine)
    for (s, m, phase), (start, _) in end.items():
        if phase == ir.FORWARD and s > 0:
            assert start >= end[(s - 1, m, ir.FORWARD)][1]  # activations arrive first
        if phase == ir.BACKWARD and s + 1 < stages:
            assert start >= end[(s + 1, m, ir.BACKWARD)][1]
    # both schedules take (m + p - 1) forward and backward slots (cost_model.pipeline_time)
    last = max(b[4] + b[5] for b in blocks if b[2] != "all-reduce")
    assert last == (micro + stages - 1) * (plan_html.FORWARD_SLOTS + plan_html.BACKWARD_SLOTS)
    assert len([b for b in blocks if b[2] == "all-reduce"]) == stages


def test_save_html_shows_the_mesh_the_splits_and_the_timeline(tmp_path):
    plan = make_plan()
    plan.save_html(tmp_path / "plan.html")
    page = Page(tmp_path / "plan.html")
    assert page.fetches() == []        # self-contained: nothing to load
    text = " ".join(page.text)
    for device in range(8):
        assert f"device:GPU:{device}" in text
    assert "split on axis 1 over 2 shards" in text and "replicated" in text
    assert "2 of 3 variables split" in text and "all_reduce/forward x2" in text
    assert page.data["stages"] == 2
    assert sorted(b[1] for b in page.data["blocks"] if b[0] == 0) == sorted(
        [f"F{m}" for m in range(4)] + [f"B{m}" for m in range(4)] + ["all-reduce\n2 replicas"])
