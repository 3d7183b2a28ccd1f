"""The tuner's search: every applicable schedule, split, microbatch count and recompute, ranked
by predicted time per sample under a memory cap; a cap nothing fits names the smallest need."""

import re

import pytest

from pipeboard.trainer.schedule import registry
from pipeboard.trainer.tune import TuneError, search
from pipeboard.trainer.tune.candidate import Candidate
from tests.trainer.tune_profiles import profiles


def test_every_registered_schedule_is_tried_and_the_ranking_is_by_time_per_sample():
    result = search(profiles(32), workers=2, batch_size=32, microbatches=[2, 4, 8])
    tried = {c.schedule for c in result.candidates} | {s["candidate"].split()[0] for s in result.skipped}
    assert tried == set(registry.names())
    assert "dp" in {c.schedule for c in result.candidates}
    times = [c.predicted_time_per_sample_s for c in result.candidates]
    assert times == sorted(times) and result.choice is result.candidates[0]
    assert {c.microbatches for c in result.candidates} == {2, 4, 8}
    assert {tuple(c.recompute) for c in result.candidates if c.schedule == "1f1b"} == {(False, False), (True, True)}
    # each candidate is distinct
    assert len({c.key for c in result.candidates}) == len(result.candidates)


def test_recompute_costs_time_and_saves_memory():
    result = search(profiles(32), workers=2, batch_size=32, microbatches=[8], schedules=["gpipe"])
    by = {(c.plan["method"], tuple(c.recompute)): c for c in result.candidates}
    off, on = by[("pipedream", (False, False))], by[("pipedream", (True, True))]
    assert on.predicted_step_s > off.predicted_step_s
    assert on.predicted_memory_bytes < off.predicted_memory_bytes


def test_a_cap_rules_out_the_fastest_and_the_choice_fits():
    free = search(profiles(32), workers=2, batch_size=32, microbatches=[2, 4, 8])
    cap = free.choice.predicted_memory_bytes - 1
    capped = search(profiles(32), workers=2, batch_size=32, microbatches=[2, 4, 8], memory_bytes=cap)
    assert capped.choice.fits and capped.choice.predicted_memory_bytes <= cap
    assert capped.choice.key != free.choice.key
    over = [c for c in capped.candidates if not c.fits]
    assert over and all(c.predicted_memory_bytes > cap and str(cap) in c.why for c in over)
    # those that fit come first
    fits = [c.fits for c in capped.candidates]
    assert fits == sorted(fits, reverse=True)


def test_a_cap_nothing_fits_gets_one_line_naming_the_smallest_need():
    kw = {"workers": 2, "batch_size": 32, "microbatches": [2, 4, 8]}
    with pytest.raises(TuneError) as info:
        search(profiles(32), memory_bytes=1000, **kw)
    message = str(info.value)
    assert "\n" not in message and info.value.field == "memory_bytes"
    need = int(re.search(r"the smallest any candidate needs is (\d+) bytes \(", message).group(1))
    free = search(profiles(32), **kw)
    assert need <= min(c.predicted_memory_bytes for c in free.candidates)
    # exactly that much fits, a byte less does not
    assert search(profiles(32), memory_bytes=need, **kw).choice.predicted_memory_bytes == need
    with pytest.raises(TuneError, match=f"needs is {need} bytes"):
        search(profiles(32), memory_bytes=need - 1, **kw)


def test_only_counts_with_a_profile_at_their_microbatch_size_are_tried():
    result = search(profiles(32, counts=(4,)), workers=2, batch_size=32, microbatches=[1, 2, 4, 8])
    assert {c.microbatches for c in result.candidates} == {4}
    assert all(c.microbatch_size == 8 for c in result.candidates)
    with pytest.raises(TuneError, match="^batch_size: ") as info:
        search(profiles(32, counts=(4,)), workers=2, batch_size=32, microbatches=[2])
    assert info.value.field == "batch_size"


@pytest.mark.parametrize("kwargs, field", [
    ({"workers": 0}, "workers"), ({"batch_size": 0}, "batch_size"), ({"memory_bytes": -1}, "memory_bytes"),
    ({"schedules": ["nope"]}, "schedules"), ({"microbatches": [0]}, "microbatches"),
])
def test_bad_input_names_its_field(kwargs, field):
    args = {"workers": 2, "batch_size": 32, "microbatches": [2]} | kwargs
    with pytest.raises(TuneError) as info:
        search(profiles(32), **args)
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")


def test_chunked_schedules_get_one_worker_per_virtual_stage_and_skips_say_why():
    result = search(profiles(32), workers=2, batch_size=32, microbatches=[2, 4], schedules=["interleaved-1f1b", "dualpipev"])
    chunked = [c for c in result.candidates if c.chunks > 1]
    assert chunked and all(len(c.plan["stages"]) == 4 and len(c.recompute) == 4 for c in chunked)
    assert all(st["replicas"] == 1 for c in chunked for st in c.plan["stages"])
    assert any("dualpipev" in s["candidate"] and "microbatches" in s["why"] for s in result.skipped)


def test_candidates_round_trip_as_json():
    c = search(profiles(32), workers=2, batch_size=32, microbatches=[4]).choice
    d = c.to_dict()
    assert {"plan", "schedule", "microbatches", "recompute", "predicted_step_s", "predicted_memory_bytes",
            "measured_step_s"} <= set(d)
    assert Candidate.from_dict(d).key == c.key


def test_a_candidate_with_a_field_it_does_not_have_is_refused():
    d = search(profiles(32), workers=2, batch_size=32, microbatches=[4]).choice.to_dict()
    with pytest.raises(TuneError, match=r"choice: unknown field\(s\) \['stages'\]"):
        Candidate.from_dict(d | {"stages": 3})
