"""Every promised error: one PlanError (a ValueError) with a message naming the field."""

from __future__ import annotations

import re

import pytest

from pipeboard.trainer.plan import Plan, PlanError, levels_from_lists, plan
from pipeboard.trainer.profile.schema import Layer, Profile


def chain(n=4, params=1e8, acts=1e7) -> Profile:
    layers = [Layer(name=f"l{i}", desc=f"L{i}", forward_ms=1.0, backward_ms=2.0, activation_bytes=acts,
                    parameter_bytes=params) for i in range(n)]
    return Profile(layers=layers, edges=[(f"l{i}", f"l{i + 1}") for i in range(n - 1)])


@pytest.mark.parametrize("levels,field", [
    ([(0, 1e9)], "workers (level 1)"),
    ([(4, 1e9), (-1, 1e9)], "workers (level 2)"),
    ([(2.5, 1e9)], "workers (level 1)"),
    ([(4, 0)], "bandwidth (level 1)"),
    ([(4, 1e9), (2, -5e9)], "bandwidth (level 2)"),
    ([(4, float("nan"))], "bandwidth (level 1)"),
    ([], "levels"),
    ([(4,)], "levels[1]"),
])
def test_bad_levels(levels, field):
    with pytest.raises(PlanError, match=re.escape(field)):
        plan(chain(), levels)


def test_mismatched_level_lists():
    with pytest.raises(PlanError, match=r"--workers has 2 value\(s\) but --bandwidth has 1"):
        levels_from_lists([4, 4], [1e9])
    assert levels_from_lists([4, 2], [1e10, 1e9]) == [(4, 1e10), (2, 1e9)]


@pytest.mark.parametrize("kwargs,field", [
    ({"method": "random"}, "method"),
    ({"activation_compression": 0}, "activation_compression"),
    ({"activation_compression": -2.0}, "activation_compression"),
    ({"memory_bytes": -1.0}, "memory"),
    ({"max_states": 0}, "max_states"),
])
def test_bad_options(kwargs, field):
    with pytest.raises(PlanError, match=field):
        plan(chain(), [(2, 1e9)], **kwargs)


def test_plan_error_is_a_value_error():
    assert issubclass(PlanError, ValueError)


def test_memory_cap_reports_the_smallest_memory_that_fits():
    prof = chain()
    with pytest.raises(PlanError, match="smallest memory per worker that fits is") as info:
        plan(prof, [(4, 1e9)], straight=True, memory_constraint=True, memory_bytes=1e6)
    need = float(re.search(r"fits is (\d+) bytes", str(info.value)).group(1))
    # Straight on 4 workers: the first stage stashes 3 copies of its 1e8 + 1e7 bytes.
    assert need == pytest.approx(3 * 1.1e8, rel=1e-6)
    assert plan(prof, [(4, 1e9)], straight=True, memory_constraint=True, memory_bytes=need).predicted_time_s > 0
    with pytest.raises(PlanError):
        plan(prof, [(4, 1e9)], straight=True, memory_constraint=True, memory_bytes=need * (1 - 1e-6))


def test_straight_pipeline_needs_a_state_per_worker():
    with pytest.raises(PlanError, match="only 4 states for 8 workers"):
        plan(chain(4), [(8, 1e9)], straight=True)
    relaxed = plan(chain(4, acts=1.0), [(8, 1e9)], straight=True, fewer_workers=True)
    assert len(relaxed.stages) == 4 and relaxed.workers_used == 4


def test_malformed_plan_json():
    with pytest.raises(PlanError, match="format"):
        Plan.from_dict({"format": "other"})
    with pytest.raises(PlanError, match="line 1"):
        Plan.from_json("{nope")
    good = plan(chain(), [(2, 1e9)]).to_dict()
    del good["stages"]
    with pytest.raises(PlanError, match="malformed"):
        Plan.from_dict(good)
