"""A job whose specification gives `layout.split` trains that split: the real profiling and
training children, the job's plan (its row, and the run file the training child reads) has
exactly the stages given; a split the model does not have fails the job naming the field."""

from __future__ import annotations

from sqlalchemy import update

from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import Job, JobStatus
from pipeboard.app.models import Plan as PlanRow
from pipeboard.app.models import Profile as ProfileRow
from pipeboard.app.schemas import JobSpec
from pipeboard.app.services import runner
from tests.app.test_services_support import live_db, new_job  # noqa: F401  (fixture)

MODEL = {"name": "mlp-digits", "args": {"hidden": 16}, "batch_size": 16}


def job_with(layout: dict) -> int:
    spec = JobSpec.model_validate({"model": MODEL, "layout": {"workers": 2, "schedule": "1f1b", "microbatches": 4,
                                                              **layout}, "length": {"steps": 2}})
    assert spec.problems() == []
    job_id = new_job("running", kind="train")
    with get_sessionmaker()() as s:
        s.execute(update(Job).where(Job.id == job_id).values(spec=spec.model_dump(mode="json")))
        s.commit()
    return job_id


def test_a_job_with_a_split_trains_exactly_that_split(live_db):
    first = job_with({})  # planned: its profile gives the layer names
    runner.JobRun(first).execute()
    with get_sessionmaker()() as s:
        job = s.get(Job, first)
        assert job.status == JobStatus.SUCCEEDED, job.error
        planned = [st["layers"] for st in s.get(PlanRow, job.plan_id).data["stages"]]
        profile = s.get(ProfileRow, job.profile_id).data
    names = [layer["name"] for layer in profile["layers"]]
    weighted = [layer["name"] for layer in profile["layers"] if layer["parameter_bytes"] > 0]
    cut = names.index(weighted[-1])  # every layer before the last weighted one on stage 0: not the planner's
    split = [{"layers": names[:cut], "replicas": 1}, {"layers": names[cut:], "replicas": 1}]
    assert [st["layers"] for st in split] != planned

    given = job_with({"split": split})
    runner.JobRun(given).execute()
    with get_sessionmaker()() as s:
        job = s.get(Job, given)
        assert job.status == JobStatus.SUCCEEDED, job.error
        plan = s.get(PlanRow, job.plan_id)
        assert [st["layers"] for st in plan.data["stages"]] == [st["layers"] for st in split]
        assert plan.data["method"] == "split" and plan.request["split"] == split
    # what the training child was given: the run's configuration from the job's spec and that plan
    cfg = runner.run_config(JobSpec.model_validate(job.spec), plan.data)
    assert cfg["stages"] == [st["layers"] for st in split]

    wrong = job_with({"split": [{"layers": names[:cut], "replicas": 1}, {"layers": ["nope"], "replicas": 1}]})
    runner.JobRun(wrong).execute()
    with get_sessionmaker()() as s:
        job = s.get(Job, wrong)
        assert job.status == JobStatus.FAILED and job.error.startswith("layout.split: "), job.error
