"""A job's measured and predicted timeline and its metric series, windowed and downsampled."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from pipeboard.app.models import EventSource, MetricPoint
from pipeboard.app.models import TimelineEvent as TimelineEventRow
from pipeboard.app.schemas import MetricPointPublic, MetricsPublic, TimelineEventPublic, TimelinePublic
from pipeboard.app.services import attempts
from pipeboard.app.services.downsample import pick_steps
from pipeboard.trainer.runtime.report import step_ranges

T = TimelineEventRow


def _window(table: Any, step_from: int | None, step_to: int | None, after_seq: int | None) -> list[Any]:
    """The step range and `after_seq` clauses that timeline and metric reads share."""
    where = []
    if step_from is not None:
        where.append(table.step >= step_from)
    if step_to is not None:
        where.append(table.step <= step_to)
    if after_seq is not None:
        where.append(table.seq > after_seq)
    return where


def timeline(
    session: Session,
    job_id: int,
    *,
    source: str = "measured",
    step_from: int | None = None,
    step_to: int | None = None,
    t_from: float | None = None,
    t_to: float | None = None,
    after_seq: int | None = None,
    limit: int = 20000,
) -> TimelinePublic:
    src = EventSource(source)
    base = [T.job_id == job_id, T.source == src]
    bounds = session.execute(select(func.min(T.step), func.max(T.step), func.min(T.start), func.max(T.end)).where(*base)).one()
    where = base + _window(T, step_from, step_to, after_seq)
    if t_from is not None:
        where.append(T.end >= t_from)
    if t_to is not None:
        where.append(T.start <= t_to)
    per_step = session.execute(select(T.step, func.count()).where(*where).group_by(T.step)).all()
    total = sum(n for _, n in per_step)
    downsampled = total > limit
    if downsampled:
        # Whole steps are kept or dropped, so every bar shown is a real, complete iteration.
        counts = dict(per_step)
        keep = pick_steps(list(counts), limit, total / max(len(counts), 1))
        while len(keep) > 1 and sum(counts[s] for s in keep) > limit:  # uneven steps: drop the oldest
            keep.discard(min(keep))
        where.append(T.step.in_(sorted(keep)))
    rows = session.scalars(select(T).where(*where).order_by(T.seq)).all()
    # which host ran each worker, per attempt (a retried attempt may place ranks elsewhere)
    hosts = attempts.hosts_by_attempt(session, job_id) if src is EventSource.MEASURED else {}
    return TimelinePublic(
        source=src.value,
        events=[
            TimelineEventPublic(worker=r.worker, stage=r.stage, replica=r.replica, microbatch=r.microbatch, kind=r.kind, start=r.start,
                                end=r.end, step=r.step, attempt=r.attempt, host=hosts.get(r.attempt, {}).get(str(r.worker)))
            for r in rows
        ],
        total=total,
        downsampled=downsampled,
        steps=[] if bounds[0] is None else [int(bounds[0]), int(bounds[1])],
        time_range=[] if bounds[2] is None else [float(bounds[2]), float(bounds[3])],
    )


def metrics(session: Session, job_id: int, *, step_from: int | None = None, step_to: int | None = None, after_seq: int | None = None, limit: int = 5000) -> MetricsPublic:
    M = MetricPoint
    where = [M.job_id == job_id, *_window(M, step_from, step_to, after_seq)]
    kept, total = _thinned(session, job_id, where, select(M), limit, rows_as_objects=True)
    return MetricsPublic(
        points=[MetricPointPublic(seq=r.seq, step=r.step, wall_s=r.wall_s, epoch=r.epoch, values=_numbers(r.values), attempt=r.attempt)
                for r in kept],
        total=total,
        downsampled=len(kept) < total,
    )


def _thinned(session: Session, job_id: int, where: list[Any], columns: Any, limit: int, *,
             rows_as_objects: bool = False) -> tuple[list[Any], int]:
    """The metric rows under ``where``, evenly thinned to at most ``limit`` (the last kept), and how many there are.
    The points are picked by key in the index (every stride-th seq, and the last), and only the kept points' rows are
    read and parsed: one page of a day-long job reads a few thousand points however long it ran."""
    M = MetricPoint
    lo, hi, total = session.execute(select(func.min(M.seq), func.max(M.seq), func.count()).where(*where)).one()
    read = session.scalars if rows_as_objects else session.execute
    if total <= limit:
        return list(read(columns.where(*where).order_by(M.seq)).all()), int(total)
    if limit == 1:
        pick = M.seq == hi
    else:  # at most limit - 1 multiples of the stride in [lo, hi], and hi
        stride = -(-(hi - lo + 1) // (limit - 1))
        pick = or_((M.seq - lo) % stride == 0, M.seq == hi)
    return list(read(columns.where(*where, pick).order_by(M.seq)).all()), int(total)


def chrome_trace(session: Session, job_id: int, source: str = "measured", *, step_from: int | None = None,
                 step_to: int | None = None) -> dict[str, Any]:
    """The recorded actions (all windows, or those between ``step_from`` and ``step_to``) as a Chrome/Perfetto
    trace; ``otherData.detail_steps`` says which steps have actions (a long job keeps them only in windows)."""
    from pipeboard.trainer.schedule.actions import TimelineEvent
    from pipeboard.trainer.schedule.trace import to_chrome_trace

    where = [T.job_id == job_id, T.source == EventSource(source), *_window(T, step_from, step_to, None)]
    rows = session.scalars(select(T).where(*where).order_by(T.seq)).all()
    events = [TimelineEvent(worker=r.worker, stage=r.stage, replica=r.replica, microbatch=r.microbatch, kind=r.kind, start=r.start, end=r.end, step=r.step) for r in rows]
    steps = session.scalars(select(T.step).where(T.job_id == job_id, T.source == EventSource(source)).group_by(T.step).order_by(T.step)).all()
    return to_chrome_trace(events, metadata={"detail_steps": ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in step_ranges(list(steps)))})


def _numbers(values: dict[str, Any] | None) -> dict[str, float]:
    """A metric point's named numbers; the step summary (``stages``) is served by `step_summaries`."""
    return {k: v for k, v in (values or {}).items() if k != "stages"}


def step_summaries(session: Session, job_id: int, *, step_from: int | None = None, step_to: int | None = None,
                   limit: int = 5000) -> dict[str, Any]:
    """Every step's compact summary, columnar: steps, wall times, losses, samples/s, and per step one row per
    stage (columns as ``trainer.runtime.detail.SUMMARY_COLUMNS``); evenly thinned to ``limit`` points."""
    from pipeboard.trainer.runtime.detail import SUMMARY_COLUMNS

    M = MetricPoint
    # The database picks the steps' points (an evaluation's point has no summary).
    where = [M.job_id == job_id, M.values["stages"].as_string().is_not(None), *_window(M, step_from, step_to, None)]
    kept, total = _thinned(session, job_id, where, select(M.step, M.wall_s, M.attempt, M.values), limit)
    return {
        "columns": list(SUMMARY_COLUMNS),
        "step": [r[0] for r in kept],
        "wall_s": [r[1] for r in kept],
        "attempt": [r[2] for r in kept],
        "loss": [r[3].get("loss") for r in kept],
        "samples_per_s": [r[3].get("samples_per_s") for r in kept],
        "stages": [r[3]["stages"] for r in kept],
        "total": total,
        "downsampled": len(kept) < total,
        "detail_steps": detail_windows(session, job_id),
    }


def detail_windows(session: Session, job_id: int) -> list[list[int]]:
    """The [first, last] step ranges whose full actions are recorded (a bounded set of steps: docs/storage.md)."""
    detail = session.execute(select(T.step).where(T.job_id == job_id, T.source == EventSource.MEASURED).group_by(T.step)
                             .order_by(T.step)).scalars().all()
    return step_ranges(list(detail))


def last_step(session: Session, job_id: int) -> int | None:
    """The step of the newest metric point (a resumed attempt's steps continue from where it resumed): one row read
    by key, so its cost does not grow with the job."""
    M = MetricPoint
    return session.scalar(select(M.step).where(M.job_id == job_id).order_by(M.seq.desc()).limit(1))

