"""The tuner's predictions are the trainer's one cost model: its cached steady state equals
schedule.predict.steady_step_s, its memory equals plan.memory_fit.plan_memory, and recompute
is charged by predict.recomputed."""

import pytest

from pipeboard.trainer.plan.memory_fit import plan_memory
from pipeboard.trainer.schedule import registry
from pipeboard.trainer.schedule.predict import profile_overhead, stage_costs, steady_step_s
from pipeboard.trainer.tune import cost, splits
from tests.trainer.tune_profiles import chain_profile


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1", "pipedream"])
def test_time_is_predicts_steady_state(schedule):
    prof = chain_profile(8)
    split = splits.pipeline_splits(prof, 2, 5e9)[0]
    stages = [st["layers"] for st in split["stages"]]
    costs = stage_costs(prof, stages, microbatches=4, replicas=[1, 1], overhead=profile_overhead(prof, stages))
    expected = steady_step_s(costs, schedule, 4, batch_weight_grads="batched" in registry.get(schedule).weight_grads,
                             replicas=[1, 1])
    assert cost.predict_time(prof, split, schedule, 4, 1, [False, False], 5e9) == pytest.approx(expected, rel=1e-12)


def test_recompute_adds_each_recomputed_stages_forward_to_its_backward():
    prof = chain_profile(8)
    split = splits.pipeline_splits(prof, 2, 5e9)[0]
    off = cost.predict_time(prof, split, "gpipe", 1, 1, [False, False], 5e9)
    first = cost.predict_time(prof, split, "gpipe", 1, 1, [True, False], 5e9)
    # gpipe, one microbatch: the step is every forward and backward in sequence; with its weight
    # gradients batched (BI, then W(-1)) a recomputing first stage computes nothing in its BI (its
    # inputs want no gradients), and its W replays the forward, the input gradients and its own
    # (predict.recomputed)
    fwd = sum(layer.forward_ms for layer in prof.layers if layer.name in split["stages"][0]["layers"]) / 1e3
    stages = [st["layers"] for st in split["stages"]]
    c = stage_costs(prof, stages, microbatches=1, replicas=[1, 1], overhead=profile_overhead(prof, stages))[0]
    assert first - off == pytest.approx(-c.bi_s + (fwd + c.bi_s + c.w_s - c.w_batched_s), rel=1e-9)


@pytest.mark.parametrize("schedule, m", [("1f1b", 4), ("gpipe", 2), ("pipedream", 4), ("zb-h1", 4)])
def test_memory_is_plan_memory(schedule, m):
    prof = chain_profile(8)
    for split in splits.pipeline_splits(prof, 2, 5e9):
        for redo in ([False, False], [True, False], [True, True]):
            expected = plan_memory(split, schedule, m, optimizer="adam", recompute=redo).memory_bytes
            assert cost.predict_memory(split, schedule, m, 1, redo, "adam") == expected


def test_data_parallel_is_one_replicated_stage_and_its_memory_is_plan_memorys():
    prof = chain_profile(8)
    split = splits.data_parallel_split(prof, 4, 5e9)
    assert len(split["stages"]) == 1 and split["stages"][0]["replicas"] == 4
    assert cost.predict_memory(split, "dp", 2, 1, [False], "adam") == \
        plan_memory(split, "dp", 2, optimizer="adam").memory_bytes


def test_without_a_measured_link_transfers_are_costed_at_the_given_bandwidth():
    prof = chain_profile(8)
    prof.link = None
    split = splits.pipeline_splits(prof, 2, 5e9)[0]
    fast = cost.predict_time(prof, split, "1f1b", 4, 1, [False, False], 1e12)
    slow = cost.predict_time(prof, split, "1f1b", 4, 1, [False, False], 1e6)
    assert slow > fast
