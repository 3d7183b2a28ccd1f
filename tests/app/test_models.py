"""The domain tables on SQLite and PostgreSQL: relations, enums, timestamps, batched run data."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from pipeboard.app.models import (
    ApiToken,
    EventSource,
    Job,
    JobEvent,
    JobStatus,
    MetricPoint,
    Model,
    Plan,
    Profile,
    TimelineEvent,
    TokenScope,
    User,
)
from pipeboard.trainer.schedule.actions import TimelineEvent as Event


def make_job(session: Session, **fields: object) -> Job:
    model = Model(name="resnet18-test", source="resnet18", config={"classes": 10})
    session.add(model)
    session.flush()
    profile = Profile(model_id=model.id, name="p", data={"layers": []}, batch_size=32)
    session.add(profile)
    session.flush()
    plan = Plan(profile_id=profile.id, request={"workers": 4}, data={"stages": []})
    session.add(plan)
    session.flush()
    job = Job(name="run", spec={"epochs": 1}, model_id=model.id, profile_id=profile.id, plan_id=plan.id, **fields)
    session.add(job)
    session.flush()
    return job


def test_defaults_and_relations(session: Session) -> None:
    job = make_job(session)
    session.commit()
    loaded = session.get(Job, job.id)
    assert loaded.status is JobStatus.QUEUED
    assert (loaded.priority, loaded.attempt, loaded.cancel_requested) == (0, 0, False)
    assert loaded.spec == {"epochs": 1}
    assert loaded.created_at.tzinfo is not None
    assert abs(loaded.created_at - datetime.now(timezone.utc)) < timedelta(minutes=1)
    assert session.get(Plan, job.plan_id).predicted is None


def test_status_is_stored_as_its_lowercase_value(session: Session) -> None:
    job = make_job(session, status=JobStatus.RUNNING)
    assert session.execute(text("SELECT status FROM jobs WHERE id = :id"), {"id": job.id}).scalar() == "running"
    assert JobStatus.CANCELLED.is_final and not JobStatus.RUNNING.is_final


def test_unknown_status_is_refused_by_the_database(session: Session) -> None:
    job = make_job(session)
    with pytest.raises(IntegrityError):
        with session.begin_nested():
            session.execute(text("UPDATE jobs SET status = 'exploded' WHERE id = :id"), {"id": job.id})


def test_aware_timestamps_come_back_in_utc(session: Session) -> None:
    plus_two = timezone(timedelta(hours=2))
    job = make_job(session, started_at=datetime(2026, 1, 1, 12, 0, tzinfo=plus_two))
    session.commit()
    session.expire_all()
    assert session.get(Job, job.id).started_at == datetime(2026, 1, 1, 10, 0, tzinfo=timezone.utc)


def test_model_names_are_unique(session: Session) -> None:
    session.add(Model(name="same", source="a"))
    session.flush()
    with pytest.raises(IntegrityError):
        with session.begin_nested():
            session.add(Model(name="same", source="b"))


def test_timeline_events_batch_insert_and_ordered_read(session: Session) -> None:
    job = make_job(session)
    events = [Event(worker=w, stage=w, replica=0, microbatch=m, kind="F", start=m * 0.1, end=m * 0.1 + 0.05)
              for m in range(50) for w in range(2)]
    rows = [{"job_id": job.id, "source": EventSource.MEASURED, "seq": i, **e.to_dict()} for i, e in enumerate(events)]
    session.execute(insert(TimelineEvent), rows)  # one executemany
    session.execute(insert(TimelineEvent), [{**rows[0], "source": EventSource.PREDICTED}])
    after = session.scalars(
        select(TimelineEvent)
        .where(TimelineEvent.job_id == job.id, TimelineEvent.source == EventSource.MEASURED, TimelineEvent.seq >= 90)
        .order_by(TimelineEvent.seq)
    ).all()
    assert [r.seq for r in after] == list(range(90, 100))
    assert Event(**{k: getattr(after[0], k) for k in Event.__dataclass_fields__}) == events[90]


def test_a_sequence_number_is_taken_once(session: Session) -> None:
    job = make_job(session)
    session.add(JobEvent(job_id=job.id, seq=1, kind="status", payload={"status": "running"}))
    session.flush()
    with pytest.raises(IntegrityError):
        with session.begin_nested():
            session.add(JobEvent(job_id=job.id, seq=1, kind="progress", payload={}))


def test_deleting_a_job_deletes_its_run_data(session: Session) -> None:
    job = make_job(session)
    session.add_all([
        MetricPoint(job_id=job.id, seq=0, step=1, wall_s=0.5, values={"loss": 2.3}),
        JobEvent(job_id=job.id, seq=0, kind="status", payload={"status": "queued"}),
        TimelineEvent(job_id=job.id, source=EventSource.PREDICTED, seq=0, worker=0, stage=0,
                      microbatch=0, kind="F", start=0.0, end=1.0),
    ])
    session.flush()
    session.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": job.id})
    for table in (MetricPoint, JobEvent, TimelineEvent):
        assert session.scalars(select(table).where(table.job_id == job.id)).all() == []


def test_deleting_a_model_keeps_its_profiles(session: Session) -> None:
    job = make_job(session)
    session.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": job.id})
    session.execute(text("DELETE FROM models WHERE id = :id"), {"id": job.model_id})
    assert session.get(Profile, job.profile_id, populate_existing=True).model_id is None


def test_api_token_hash_is_unique(session: Session) -> None:
    user = User(name="ci-user")
    session.add(user)
    session.flush()
    session.add(ApiToken(name="ci", scope=TokenScope.WRITE, token_hash="h" * 64, prefix="pb_abc", user_id=user.id))
    session.flush()
    with pytest.raises(IntegrityError):
        with session.begin_nested():
            session.add(ApiToken(name="other", scope=TokenScope.READ, token_hash="h" * 64, prefix="pb_def", user_id=user.id))
