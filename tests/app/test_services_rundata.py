"""Timeline windows and downsampling, metric downsampling, the pure helpers behind them."""

from __future__ import annotations

from sqlalchemy import insert

from pipeboard.app.models import EventSource, Job, MetricPoint
from pipeboard.app.models import TimelineEvent as TimelineEventRow
from pipeboard.app.services import rundata
from pipeboard.app.services.downsample import evenly, pick_steps


def test_evenly_keeps_ends_and_count():
    assert evenly(list(range(10)), 20) == list(range(10))
    picked = evenly(list(range(1000)), 7)
    assert len(picked) == 7 and picked[0] == 0 and picked[-1] == 999
    assert evenly([1, 2], 0) == [] and evenly([1, 2, 3], 1) == [3]


def test_pick_steps_budget_and_newest():
    steps = list(range(100))
    kept = pick_steps(steps, budget_events=200, events_per_step=10)
    assert 19 <= len(kept) <= 21 and 99 in kept and 0 in kept
    assert pick_steps(steps, 10_000, 10) == set(steps)


def seed(session, steps: int = 100, per_step: int = 8) -> int:
    job = Job(name="t", spec={})
    session.add(job)
    session.flush()
    rows, seq = [], 0
    for step in range(steps):
        for w in range(per_step):
            seq += 1
            start = step * 1.0 + w * 0.1
            rows.append({"job_id": job.id, "source": EventSource.MEASURED, "seq": seq, "worker": w % 2, "stage": w % 2,
                         "replica": 0, "microbatch": w // 2, "kind": "F" if w < 4 else "B", "start": start, "end": start + 0.05, "step": step})
    session.execute(insert(TimelineEventRow), rows)
    session.execute(insert(MetricPoint), [{"job_id": job.id, "seq": i + 1, "step": i, "wall_s": float(i), "epoch": 0.0, "values": {"loss": 1.0 / (i + 1)}} for i in range(steps)])
    session.commit()
    return job.id


def test_timeline_downsamples_whole_steps(session):
    job_id = seed(session)
    full = rundata.timeline(session, job_id)
    assert full.total == 800 and not full.downsampled and full.steps == [0, 99] and full.time_range[0] == 0.0
    small = rundata.timeline(session, job_id, limit=80)
    assert small.downsampled and small.total == 800 and len(small.events) <= 80
    by_step: dict[int, int] = {}
    for e in small.events:
        by_step[e.step] = by_step.get(e.step, 0) + 1
    assert set(by_step.values()) == {8} and 99 in by_step  # complete iterations, newest included


def test_timeline_windows(session):
    job_id = seed(session)
    by_step = rundata.timeline(session, job_id, step_from=10, step_to=12)
    assert {e.step for e in by_step.events} == {10, 11, 12} and by_step.total == 24
    by_time = rundata.timeline(session, job_id, t_from=50.0, t_to=50.99)
    assert {e.step for e in by_time.events} == {50}
    newer = rundata.timeline(session, job_id, after_seq=790)
    assert len(newer.events) == 10
    assert rundata.timeline(session, job_id, source="predicted").total == 0


def test_metrics_downsample_keeps_last(session):
    job_id = seed(session)
    few = rundata.metrics(session, job_id, limit=10)
    assert few.downsampled and len(few.points) == 10 and few.points[-1].step == 99 and few.total == 100
    window = rundata.metrics(session, job_id, step_from=5, step_to=6)
    assert [p.step for p in window.points] == [5, 6]
