"""Our optimum equals the reference optimizer's on the shared PipeDream profiles.

`../shared/pipedream-profiles/reference-plans.jsonl` holds what msr-fiddle/pipedream's
`optimizer_graph_hierarchical.py` printed for the shared profiles under six configurations.
Every line it finished (64) is checked here with the strategies the planner picks, and the
smaller ones also with the plain recurrence; `bench/planner.py` also times them.
"""

from __future__ import annotations

import json

import pytest

from tests.shared_data import SHARED_PROFILES, graph_txt, shared_profiles_dir
from pipeboard.trainer.plan import plan
from pipeboard.trainer.plan.formulas import level_specs
from pipeboard.trainer.plan.pipedream_plan import solve
from pipeboard.trainer.plan.recurrence import work
from pipeboard.trainer.plan.reference_flags import parse_reference_flags
from pipeboard.trainer.plan.states import state_chain
from pipeboard.trainer.profile.schema import Profile
from pipeboard.trainer.profile.files import load_profile


def reference_lines():
    path = SHARED_PROFILES / "reference-plans.jsonl"
    if not path.is_file():
        return [pytest.param(None, id="reference-plans-missing")]
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [pytest.param(rec, id=f"{rec['profile']}-{rec['config']}") for rec in lines if rec["rc"] == 0]


_profiles: dict[str, Profile] = {}


@pytest.mark.parametrize("rec", reference_lines())
def test_objective_equals_the_reference(rec):
    shared_profiles_dir()
    if rec is None:
        pytest.fail("reference-plans.jsonl missing from the shared profiles")
    name = rec["profile"]
    if name not in _profiles:
        _profiles[name] = load_profile(graph_txt(name))
    kw = parse_reference_flags(rec["args"])
    result = plan(_profiles[name], **kw)
    ref = rec["ref"]
    assert result.state_graph == "antichain" and result.states == ref["states"]
    assert result.predicted_time_s == pytest.approx(float(ref["pipeline_time_per_sample_s"]), rel=1e-12)
    assert result.single_worker_time_s == pytest.approx(ref["single_stage_time_s"], rel=1e-12)
    assert result.speedup_vs_single == pytest.approx(ref["speedup_vs_1"], rel=1e-9)
    assert result.data_parallel_speedup_vs_single == pytest.approx(ref["dp_speedup_vs_1"], rel=1e-9)
    assert result.speedup_vs_data_parallel == pytest.approx(ref["pipedream_vs_dp"], rel=1e-9)
    # Same shape where the reference reports it: stages per level and their replicas sum.
    ours = {lv.level: lv.stages for lv in result.levels}
    for lv in ref["levels"]:
        stages = ours[lv["level"]]
        assert stages[0].start == 0 and stages[-1].end == ref["states"]
        assert all(a.end == b.start for a, b in zip(stages, stages[1:]))
        assert all(1 <= s.replicas <= kw["levels"][lv["level"] - 1][0] for s in stages)
    assert result.workers_used == result.total_workers  # no --fewer-workers: every worker used


def small_reference_lines():
    """The lines small enough for the pure-Python recurrence in a unit test (a third of them)."""
    out, chains = [], {}
    for param in reference_lines():
        rec = param.values[0]
        if rec is None or not (SHARED_PROFILES / rec["profile"] / "graph.txt").is_file():
            return [param]
        if rec["profile"] not in chains:
            chains[rec["profile"]] = state_chain(load_profile(SHARED_PROFILES / rec["profile"] / "graph.txt"))
        if work(chains[rec["profile"]], level_specs(parse_reference_flags(rec["args"])["levels"])) <= 3e5:
            out.append(param)
    return out


@pytest.mark.parametrize("rec", small_reference_lines())
def test_the_plain_recurrence_finds_the_reference_optimum(rec):
    shared_profiles_dir()
    if rec is None:
        pytest.fail("reference-plans.jsonl missing from the shared profiles")
    kw = parse_reference_flags(rec["args"])
    chain = state_chain(load_profile(graph_txt(rec["profile"])))
    mem = (kw["memory_bytes"] or 16e9) if kw["memory_constraint"] else None
    _, got = solve(chain, kw["levels"], memory_bytes=mem, straight=kw["straight"],
                   activation_compression=kw["activation_compression"], strategies=["plain"] * len(kw["levels"]))
    assert got == pytest.approx(float(rec["ref"]["pipeline_time_per_sample_s"]), rel=1e-12)
