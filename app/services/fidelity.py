"""A train job's prediction against its run: `summary.fidelity`, live and final, and the online
correction after the first steps.

The figures (docs/api.md, "Prediction fidelity"):

- ``predicted_step_s``: the plan's ``predicted.steady_step_s`` (the simulator's steady step under
  the profile's costs), or its ``iteration_time_s`` when the plan has none; ``basis`` names which;
- ``measured_step_s``: ``pipeboard.trainer.schedule.measured.steady_step_s`` of the step completion
  times, the one definition. At the end it is the run's own summary ``step_s``; while the job runs
  it is the same function over the completion times the run has reported (its metric points);
- ``error``: measured / predicted - 1;
- ``corrected_step_s``: the re-fitted prediction (``pipeboard.trainer.schedule.refit``) from the
  events of the attempt's first ``CORRECT_AFTER`` steps (its first step, the warm-up, left out),
  ``corrected_after_step``, ``corrected_error``, and ``terms``: per cost term, predicted and
  measured seconds per action, their factor and whether it moved.

While a job trains, a ``Watch`` thread of the worker (its own, so that a slow correction never
delays the job's heartbeat, and niced below it) looks about once a second; it appends a ``fidelity`` event to the
job's log (the SSE stream) at most every ``LIVE_EVERY_S`` and when the correction is made. The final figures go into the summary when the job succeeds.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from pipeboard.app.models import EventSource, Job, JobEvent, MetricPoint, Profile
from pipeboard.app.models import Plan as PlanRow
from pipeboard.app.models import TimelineEvent as TimelineEventRow
from pipeboard.app.schemas.jobspec import stored
from pipeboard.app.services import events, planning

log = logging.getLogger(__name__)

CORRECT_AFTER = 5  # measured steps before the prediction is re-fitted
LIVE_EVERY_S = 5.0  # at most one live `fidelity` event this often
WATCH_NICENESS = 10  # the Watch thread's, as the run's own database writer's (pipeboard.trainer.sink.BackgroundSink)
EVENT = "fidelity"


def predicted_of(predicted: dict[str, Any] | None) -> tuple[float | None, str | None]:
    """(seconds per step, basis) of a plan's ``predicted``."""
    if not predicted:
        return None, None
    if predicted.get("steady_step_s"):
        return float(predicted["steady_step_s"]), "steady_step_s"
    if predicted.get("iteration_time_s"):
        return float(predicted["iteration_time_s"]), "iteration_time_s"
    return None, None


def _error(measured: float | None, predicted: float | None) -> float | None:
    return measured / predicted - 1 if measured and predicted else None


def completion_times(session: Session, job_id: int) -> tuple[dict[int, float], set[int]]:
    """({step: when its last worker finished it}, the steps that completed after a pause) from the
    job's metric points: the runtime writes one point per completed step (``step`` = steps done,
    ``wall_s`` = completion, ``after_pause`` after a checkpoint or an evaluation); evaluation
    points (which carry ``metric``) are not completions. A step measured again by a later attempt
    counts with the later attempt's time."""
    from pipeboard.trainer.schedule.measured import AFTER_PAUSE

    rows = session.execute(select(MetricPoint.step, MetricPoint.wall_s, MetricPoint.attempt, MetricPoint.values)
                           .where(MetricPoint.job_id == job_id).order_by(MetricPoint.attempt, MetricPoint.seq)).all()
    done, pauses = {}, set()
    for step, wall, _, values in rows:
        if "metric" not in (values or {}):
            done[step - 1] = wall
            if (values or {}).get(AFTER_PAUSE):
                pauses.add(step - 1)
            else:  # measured again by a later attempt, without a pause
                pauses.discard(step - 1)
    return done, pauses


def live_measured(session: Session, job_id: int) -> tuple[float | None, int]:
    from pipeboard.trainer.schedule.measured import steady_step_s

    done, pauses = completion_times(session, job_id)
    return steady_step_s(done, pauses), len(done)


def device_note(session: Session, job: Job) -> str | None:
    """Where the job's profile was measured on another device than the job runs on: one line
    (trainer/runtime/machine.py, device_note), else None."""
    from pipeboard.trainer.runtime.machine import device_note as note

    profile = session.get(Profile, job.profile_id) if job.profile_id is not None else None
    machine = getattr(stored(job.spec), "machine", None)
    return note(profile.data if profile else None, getattr(machine, "device", "cpu"))


def figures(predicted: dict[str, Any] | None, measured_step_s: float | None, steps: int | None,
            corrected: dict[str, Any] | None, *, live: bool, note: str | None = None) -> dict[str, Any]:
    """The ``fidelity`` object (see the module docstring)."""
    value, basis = predicted_of(predicted)
    out: dict[str, Any] = {"predicted_step_s": value, "basis": basis, "device_note": note,
                           "measured_step_s": measured_step_s,
                           "measured_steps": steps, "error": _error(measured_step_s, value), "live": live,
                           "corrected_step_s": None, "corrected_after_step": None, "corrected_error": None, "terms": None}
    if corrected:
        out.update(corrected)
        out["corrected_error"] = _error(measured_step_s, corrected["corrected_step_s"])
    return out


def _plan_inputs(session: Session, job: Job) -> tuple[Any, Any, list[int]] | None:
    """(costs, schedule, replicas) the job's plan was simulated with, as planning.simulate makes them."""
    from pipeboard.trainer.schedule.action_costs import costs_from_plan, data_parallel_costs_from_plan
    from pipeboard.trainer.schedule.simulator import stage_costs
    from pipeboard.trainer.schedule import registry

    if job.plan_id is None:
        return None
    plan = session.get(PlanRow, job.plan_id)
    profile = session.get(Profile, job.profile_id) if job.profile_id is not None else None
    layout = stored(job.spec).layout
    chunks, micro, schedule = layout.chunks, layout.microbatches, layout.schedule_to_run()
    sched = planning.runtime_schedule(plan.data, schedule, micro, chunks=chunks,
                                      vertical_sync=layout.vertical_sync, weight_grads=layout.weight_grads)
    costs = planning.profile_costs(plan.data, schedule, micro, profile.data if profile else None, chunks)
    if costs is None:
        costs = (data_parallel_costs_from_plan(plan.data)[0] if registry.is_data_parallel(schedule)
                 else costs_from_plan(plan.data))
    if chunks > 1:
        costs = stage_costs(sched, costs)  # one per virtual stage, as the schedule names them
    replicas = ([data_parallel_costs_from_plan(plan.data)[1]] if registry.is_data_parallel(schedule)
                else planning.stage_replicas(plan.data) if chunks == 1 else None)
    return costs, sched, replicas


def correct(session: Session, job: Job, attempt: int, after: int = CORRECT_AFTER) -> dict[str, Any] | None:
    """The re-fitted prediction from the first ``after`` steps ``attempt`` measured (None before it
    has measured them, or without a plan)."""
    from pipeboard.trainer.schedule.actions import TimelineEvent
    from pipeboard.trainer.schedule.refit import moved_terms, refit

    T = TimelineEventRow
    mine = [T.job_id == job.id, T.source == EventSource.MEASURED, T.attempt == attempt]
    first = session.scalar(select(func.min(T.step)).where(*mine))
    if first is None or not _steps_done(session, job.id, attempt, first + after):
        return None
    inputs = _plan_inputs(session, job)
    if inputs is None:
        return None
    costs, sched, replicas = inputs
    rows = session.scalars(select(T).where(*mine, T.step > first, T.step < first + after)).all()
    measured = [TimelineEvent(r.worker, r.stage, r.replica, r.microbatch, r.kind, r.start, r.end, r.step) for r in rows]
    layout = stored(job.spec).layout
    schedule, chunks = layout.schedule_to_run(), layout.chunks
    fit = refit(costs, measured, schedule=schedule, microbatches=layout.microbatches,
                batch_weight_grads=bool(sched.meta.get("batch_weight_grads")), replicas=replicas, chunks=chunks)
    return {"corrected_step_s": fit.step_s, "corrected_after_step": first + after, "terms": moved_terms(fit.terms)}


def _steps_done(session: Session, job_id: int, attempt: int, step: int) -> bool:
    """Whether ``attempt`` has reported step ``step - 1`` complete (its metric point ``step``)."""
    return session.scalar(select(func.count()).select_from(MetricPoint).where(
        MetricPoint.job_id == job_id, MetricPoint.attempt == attempt, MetricPoint.step >= step)) > 0


def final(session: Session, job_id: int, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The finished run's fidelity: its summary's ``step_s`` against the plan's prediction."""
    job = session.get(Job, job_id)
    if job is None or job.kind != "train" or job.plan_id is None:
        return None
    predicted = session.get(PlanRow, job.plan_id).predicted
    try:
        corrected = correct(session, job, job.attempt)
    except Exception as exc:  # the run succeeded; a correction that cannot be made is left out
        log.warning("job %s: no corrected prediction: %s", job_id, exc)
        corrected = None
    measured, steps = summary.get("step_s"), summary.get("steps")
    if measured is None:  # a run stopped by its time limit ends without its own summary
        measured, steps = live_measured(session, job_id)
    return figures(predicted, measured, steps, corrected, live=False, note=device_note(session, job))


def latest(session: Session, job: Job) -> dict[str, Any] | None:
    """What GET /jobs/{id} shows: the summary's figures once there are some, else the newest live event's."""
    if job.summary and job.summary.get("fidelity"):
        return job.summary["fidelity"]
    if job.kind != "train" or job.status.is_final:
        return None
    return session.scalar(select(JobEvent.payload).where(JobEvent.job_id == job.id, JobEvent.kind == EVENT)
                          .order_by(JobEvent.seq.desc()).limit(1))


class Watch(threading.Thread):
    """Live figures of a training attempt, from a thread of the worker with its own session."""

    def __init__(self, job_id: int, attempt: int, period_s: float = 1.0) -> None:
        super().__init__(name=f"job-{job_id}-fidelity", daemon=True)
        self.job_id, self.attempt, self.period_s = job_id, attempt, period_s
        self.stopped = threading.Event()
        self.corrected: dict[str, Any] | None = None
        self.failed = False  # the correction could not be made (said once in the log)
        self._last_sent = 0.0
        self._last_steps = -1

    def run(self) -> None:
        from pipeboard.app.core.db import get_sessionmaker
        from pipeboard.trainer.hostinfo import lower_this_thread

        lower_this_thread(WATCH_NICENESS)  # below the worker's heartbeat, in the worker's own session
        with get_sessionmaker()() as session:
            while not self.stopped.wait(self.period_s):
                try:
                    self.poll(session)
                except Exception as exc:  # a database hiccup must not end the watch
                    session.rollback()
                    log.warning("job %s: live fidelity failed: %s", self.job_id, exc)

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=10)

    def poll(self, session: Session) -> None:
        due = time.monotonic() - self._last_sent >= LIVE_EVERY_S
        if not due and (self.corrected is not None or self.failed):
            return
        try:
            job = session.get(Job, self.job_id)
            session.refresh(job)
            fresh = False
            if job.plan_id is not None and self.corrected is None and not self.failed:
                try:
                    self.corrected = correct(session, job, self.attempt)
                except Exception as exc:
                    self.failed = True
                    log.warning("job %s: no corrected prediction: %s", self.job_id, exc)
                fresh = self.corrected is not None
            if job.plan_id is None or not (fresh or due):
                return
            measured, steps = live_measured(session, self.job_id)
            predicted = session.get(PlanRow, job.plan_id).predicted
            note = device_note(session, job)
        finally:
            session.rollback()  # end the reads: the append below starts its own write
        if not fresh and steps == self._last_steps:
            return
        self._last_sent, self._last_steps = time.monotonic(), steps
        events.append(session, self.job_id, [(EVENT, figures(predicted, measured, steps, self.corrected, live=True, note=note))])
