"""The memory per stage every view shows (``choose.simulate_plan``: `pipeboard plan`, POST /plans,
the plan page, the new-job card) is the tuner's (``tune.cost.predict_memory``, equal to
``plan_memory``): from the profile's saved and weight-pass bytes whether or not the profile has
what the time model needs, and for an asynchronous schedule over the batches a run keeps in
flight (its stashed weight versions)."""

from dataclasses import replace

import pytest

from pipeboard.trainer import choose
from pipeboard.trainer.tune import cost, splits
from pipeboard.trainer.tune.given import split_plan
from tests.trainer.tune_profiles import chain_profile


def saving_profile(saved_per_output: float = 6.0, link: bool = True):
    """chain_profile(8) whose layers save ``saved_per_output`` x their output for the backward."""
    prof = chain_profile(8)
    prof.layers = [replace(layer, saved_bytes=saved_per_output * layer.activation_bytes,
                           weight_grad_bytes=layer.activation_bytes, weight_input_bytes=layer.activation_bytes)
                   for layer in prof.layers]
    return prof if link else replace(prof, link=None)


def shown(prof, split, schedule: str, m: int = 4, recompute=None) -> list[int]:
    plan = split_plan(prof, split["stages"], 2, 5e9)
    sched, sim = choose.simulate_plan(plan, schedule, m, profile_data=prof.to_dict(), optimizer="adam",
                                      recompute=recompute)
    return choose.stage_memory(sched, sim)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1", "pipedream"])
def test_the_memory_shown_is_the_tuners(schedule):
    prof = saving_profile()
    for split in splits.pipeline_splits(prof, 2, 5e9):
        for redo in ([False, False], [True, False], [False, True], [True, True]):
            asked = [s for s, on in enumerate(redo) if on] or None
            assert shown(prof, split, schedule, recompute=asked) == cost.predict_memory(
                cost.in_flight(prof, split), schedule, 4, 1, redo, "adam"), (split, redo)


def test_pipedreams_memory_counts_the_weight_versions_its_steady_state_stashes():
    prof = saving_profile()
    split = splits.pipeline_splits(prof, 2, 5e9)[0]
    weights = sum(layer.parameter_bytes for layer in prof.layers if layer.name in split["stages"][0]["layers"])
    # the first stage keeps a version per batch in flight that 1F1B's single one never needs
    assert shown(prof, split, "pipedream")[0] - shown(prof, split, "1f1b")[0] >= weights


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "pipedream"])
def test_a_profile_without_a_link_predicts_the_same_memory_from_its_saved_bytes(schedule):
    split = splits.pipeline_splits(saving_profile(), 2, 5e9)[0]
    with_link = shown(saving_profile(), split, schedule)
    assert shown(saving_profile(link=False), split, schedule) == with_link
    assert shown(saving_profile(12.0, link=False), split, schedule) > with_link  # what the layers save counts
