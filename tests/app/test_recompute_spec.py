"""A job's `layout.recompute` (`none`, `all` or stage numbers, as `pipeboard train --recompute`):
refused at the door by name when it cannot be a stage of the job, carried to the run's
configuration resolved against the plan's stages, counted in the job's predicted memory, and
offered by the new-job form."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeboard.app.models import Job
from pipeboard.app.schemas import JobSpec
from pipeboard.app.services import planning
from pipeboard.app.services.errors import ServiceError
from pipeboard.app.services.runner import run_config
from pipeboard.trainer.runtime.run_config import ConfigError, RunConfig
from tests.app.test_services_planning import calibrated_chain

BASE = {"version": 2, "model": {"name": "mlp-digits", "batch_size": 32},
        "layout": {"workers": 2, "schedule": "1f1b", "microbatches": 4}, "length": {"steps": 20}}
FRONTEND = Path(__file__).resolve().parents[2] / "frontend" / "js" / "pages" / "newjob.js"
FORM_CONTROLS = FRONTEND.parents[1] / "jobform.js"  # the form's controls, the error's field among them


def spec_with(**layout) -> JobSpec:
    return JobSpec.model_validate({**BASE, "layout": {**BASE["layout"], **layout}})


def uniform_plan(spec: JobSpec) -> dict:
    levels = planning.levels_of(None, spec.layout.workers)
    return planning.make_plan(calibrated_chain(), levels, memory_bytes=None, method="uniform").to_dict()


def test_the_default_is_none_and_the_run_recomputes_nothing():
    spec = JobSpec.model_validate(BASE)
    assert spec.layout.recompute == "none"
    assert RunConfig.from_dict(run_config(spec, uniform_plan(spec))).recompute is None


@pytest.mark.parametrize("given, expected", [("all", [0, 1]), ([0], [0]), ([1], [1]), ([], None)])
def test_the_run_gets_the_plans_stage_numbers(given, expected):
    spec = spec_with(recompute=given)
    cfg = RunConfig.from_dict(run_config(spec, uniform_plan(spec)))
    cfg.validate()
    assert cfg.recompute == expected


def test_all_under_data_parallel_is_the_one_stage():
    spec = spec_with(schedule="dp", recompute="all")
    cfg = RunConfig.from_dict(run_config(spec, uniform_plan(spec)))
    cfg.validate()
    assert cfg.recompute == [0] and cfg.stages is not None and len(cfg.stages) == 1


def test_a_number_the_plan_lacks_is_named_by_the_run_and_by_the_jobs_prediction():
    spec = spec_with(workers=4, recompute=[3])
    data = calibrated_chain()
    levels = planning.levels_of(None, 2)  # a plan of two stages, as a planner choosing fewer would give
    plan = planning.make_plan(data, levels, memory_bytes=None, method="uniform")
    with pytest.raises(ConfigError, match="recompute: stage 3 is not a stage of this run"):
        RunConfig.from_dict(run_config(spec, plan.to_dict())).validate()
    with pytest.raises(ServiceError, match=r"recompute: stage 3 is not a stage of this plan \(0..1\)"):
        planning.simulate(plan, "1f1b", 4, profile_data=data, recompute=[3])


def test_the_predicted_memory_counts_recompute():
    data = calibrated_chain()
    plan = planning.make_plan(data, planning.levels_of(None, 2), memory_bytes=None, method="uniform")
    _, off = planning.simulate(plan, "1f1b", 4, profile_data=data)
    _, on = planning.simulate(plan, "1f1b", 4, profile_data=data, recompute="all")
    _, first = planning.simulate(plan, "1f1b", 4, profile_data=data, recompute=[0])
    assert on.summary()["memory"] != off.summary()["memory"]
    # stage 0's worker keeps its inputs only; stage 1's is as without recompute
    assert first.summary()["memory"][1] == off.summary()["memory"][1]
    assert first.summary()["memory"][0]["activations"] < off.summary()["memory"][0]["activations"]


REFUSED = [
    ("a word it does not know", {"recompute": "some"},
     "layout.recompute: none, all, or a list of stage numbers from 0 (as [0, 2]); got 'some'"),
    ("a negative stage", {"recompute": [-1]},
     "layout.recompute: none, all, or a list of stage numbers from 0 (as [0, 2]); got [-1]"),
    ("a true", {"recompute": True}, "layout.recompute: none, all, or a list of stage numbers"),
    ("a repeated stage", {"recompute": [1, 1]}, "layout.recompute: stage numbers repeat: [1, 1]"),
    ("past the workers", {"recompute": [0, 2]},
     "layout.recompute: stage 2 is past the job's last possible stage, 1 (2 workers x 1 chunks)"),
    ("past data parallel's one stage", {"schedule": "dp", "recompute": [1]},
     "layout.recompute: stage 1 is past the job's last possible stage, 0 (data parallel: one stage)"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_what_cannot_be_a_stage_is_a_422_naming_the_field(case, client, session):
    _, layout, message = case
    before = session.query(Job).count()
    answer = client.post("/api/v1/jobs", json={**BASE, "layout": {**BASE["layout"], **layout}})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"].startswith(message), answer.json()["detail"]
    assert session.query(Job).count() == before


def test_a_job_with_recompute_is_stored_with_it(client):
    answer = client.post("/api/v1/jobs", json={**BASE, "layout": {**BASE["layout"], "recompute": [0]}})
    assert answer.status_code in (201, 202), answer.text
    assert answer.json()["spec"]["layout"]["recompute"] == [0]


def test_openapi_describes_the_field_and_its_example(client):
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    layout = schema["LayoutSection"]["properties"]["recompute"]
    assert "pipeboard train --recompute" not in layout["description"] and "`all`" in layout["description"]
    assert schema["JobSpec"]["examples"][0]["layout"]["recompute"] == "none"


def test_the_form_sends_the_field_from_a_select():
    assert "recompute: els.recompute.value" in FRONTEND.read_text()
    assert "'layout.recompute': 'f-recompute'" in FORM_CONTROLS.read_text()
