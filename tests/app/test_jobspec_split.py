"""layout.split: a job's explicit stages (a tuner's choice), refused by name when they cannot be
the job's plan, and trained as given (trainer.tune.given.split_plan, the job's plan)."""

import pytest

from pipeboard.app.schemas.jobspec import JobSpec
from pipeboard.app.services import planning
from pipeboard.app.services.errors import ServiceError
from pipeboard.app.services.runner import run_config
from tests.trainer.tune_profiles import chain_profile

SPLIT = [{"layers": ["l0", "l1", "l2"], "replicas": 1}, {"layers": ["l3", "l4", "l5", "l6", "l7"], "replicas": 1}]


def spec(**layout):
    return JobSpec.model_validate({"model": {"name": "mlp", "batch_size": 32}, "layout": {"workers": 2, **layout},
                                   "length": {"steps": 2}})


def fields(s):
    return [f for f, _ in s.problems()]


def test_a_split_that_fits_the_workers_has_no_problem():
    assert fields(spec(split=SPLIT, schedule="1f1b")) == []


@pytest.mark.parametrize("layout, field", [
    ({"split": [{"layers": ["l0"], "replicas": 1}], "schedule": "1f1b"}, "layout.split"),  # 1 replica, 2 workers
    ({"split": [{"layers": ["l0", "l1"]}, {"layers": ["l1", "l2"]}], "schedule": "1f1b"}, "layout.split"),
    ({"split": SPLIT, "schedule": "dp"}, "layout.split"),  # dp: one stage, a replica per worker
    ({"split": SPLIT, "schedule": "interleaved-1f1b", "chunks": 2}, "layout.split"),  # 4 virtual stages
    ({"split": SPLIT, "schedule": "1f1b", "method": "time"}, "layout.method"),
    ({"split": SPLIT, "schedule": "1f1b", "memory_bytes": 1e9}, "layout.memory_bytes"),
    ({"split": SPLIT, "schedule": "1f1b", "recompute": [2]}, "layout.recompute"),
])
def test_a_split_that_cannot_be_the_plan_is_refused_naming_the_field(layout, field):
    assert field in fields(spec(**layout))


def test_a_malformed_split_is_a_validation_error_at_the_field(client):
    body = {"model": {"name": "mlp", "batch_size": 32}, "layout": {"workers": 2, "split": [{"layers": []}]},
            "length": {"steps": 2}}
    made = client.post("/api/v1/jobs", json=body)
    assert made.status_code == 422 and "split" in made.text, made.text
    body["layout"]["split"] = [{"layers": ["l0"], "replicas": 1}]
    made = client.post("/api/v1/jobs", json=body)
    assert made.status_code == 422 and "layout.split" in made.text, made.text


def test_the_jobs_plan_is_the_split_as_given_not_a_replan():
    profile = chain_profile(8).to_dict()
    split = [{"layers": ["l0"], "replicas": 1}, {"layers": [f"l{i}" for i in range(1, 8)], "replicas": 1}]
    plan = planning.split_plan(profile, split, [(2, 5e9)])
    assert [st.layers for st in plan.stages] == [["l0"], [f"l{i}" for i in range(1, 8)]]
    assert plan.method == "split" and [st.replicas for st in plan.stages] == [1, 1]
    # its costs are the planner's for those layers: the second stage does 7 times the first's work
    assert plan.stages[1].compute_s == pytest.approx(7 * plan.stages[0].compute_s)
    cfg = run_config(spec(split=split, schedule="1f1b"), plan.to_dict())  # what the run trains
    assert cfg["stages"] == [st["layers"] for st in split] and cfg["replicas"] == [1, 1]
    even = planning.make_plan(profile, [(2, 5e9)], memory_bytes=None, method="pipedream", schedule="1f1b",
                              microbatches=4)
    assert [st.layers for st in even.stages] != [st["layers"] for st in split]  # the planner would not choose it


def test_a_replicated_split_takes_its_workers():
    plan = planning.split_plan(chain_profile(8).to_dict(), [{"layers": ["l0", "l1"], "replicas": 2},
                                                            {"layers": [f"l{i}" for i in range(2, 8)], "replicas": 1}],
                               [(3, 5e9)])
    assert [st.workers for st in plan.stages] == [[0, 1], [2]]


@pytest.mark.parametrize("split, why", [
    ([{"layers": ["l0", "l2"], "replicas": 1}, {"layers": ["l1"] + [f"l{i}" for i in range(3, 8)], "replicas": 1}],
     "later stage"),
    ([{"layers": ["l0"], "replicas": 1}, {"layers": ["l1"], "replicas": 1}], "on no stage"),
    ([{"layers": ["l0", "x"], "replicas": 1}, {"layers": [f"l{i}" for i in range(1, 8)], "replicas": 1}], "not a layer"),
])
def test_a_split_the_model_does_not_have_fails_naming_the_field(split, why):
    with pytest.raises(ServiceError) as err:
        planning.split_plan(chain_profile(8).to_dict(), split, [(2, 5e9)])
    assert err.value.field == "layout.split" and str(err.value).startswith("layout.split: ") and why in str(err.value)


def test_a_job_spec_from_a_tune_carries_the_choice_split():
    from pipeboard.trainer.tune import search
    from pipeboard.trainer.tune.tuned import job_spec
    from tests.trainer.tune_profiles import profiles

    result = search(profiles(32), workers=2, batch_size=32, schedules=["1f1b"])
    doc = {**result.to_dict(), "run": {"model": "mlp", "workers": 2, "batch_size": 32}}
    made = JobSpec.model_validate(job_spec(doc))
    assert [st.model_dump() for st in made.layout.split] == [
        {"layers": st["layers"], "replicas": st["replicas"]} for st in result.choice.plan["stages"]]
    assert made.problems() == []
