"""What a Celery task does with a job: claim it, profile -> plan -> train, watch it, finish it.

The heavy phases run as child processes in a NEW process group (start_new_session): a prefork
worker's child is daemonic and could not start the training processes itself, and a group lets
cancel and failure end every process of the run with one killpg. While a job runs, a monitor
thread refreshes its heartbeat and polls for cancellation; if the worker itself dies, the
heartbeat goes stale and `jobs.reap_stale` fails the job (and the run's sink ends its group).
Claiming the job is app/services/claim.py's; the run file, command and environment a phase
starts with are app/services/run_setup.py's.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select, update

from pipeboard.app.core import polling
from pipeboard.app.core.config import get_settings
from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import EventSource, Job, JobStatus, Model
from pipeboard.app.models import Plan as PlanRow
from pipeboard.app.models import TimelineEvent as TimelineEventRow
from pipeboard.app.services import attempts, contexts, events, fidelity, jobs, multihost, placement, planning, profiles
# claiming and the run's setup, importable from here as before (app/services/member.py, tests/)
from pipeboard.app.services.claim import claim_next
from pipeboard.app.services.errors import PhaseFailed, ServiceError
from pipeboard.app.services.run_setup import (  # noqa: F401
    EPOCHS_UNDER_A_TIME_RULE, checkpoint_dir, child_env, pipeboard_command, run_config, spec_of, train_command, write_run_file)
from pipeboard.app.services.tx import begin_write

log = logging.getLogger(__name__)

TERM_GRACE_S = 3.0
POLL_S = 0.2

# Runs in progress in this process, so a stopping worker can end them (see abandon_all).
_active: dict[int, "JobRun"] = {}
_active_lock = threading.Lock()


class Stopped(Exception):
    """The job was cancelled or reaped while this worker ran it."""


def now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class JobRun:
    job_id: int
    node: str | None = None  # the Celery worker's node name

    def __post_init__(self) -> None:
        self.attempt = 0  # the job's attempt this run is (set before the monitor starts)
        self.abandoned: str | None = None  # why the worker gave the run up (abandon_all)
        self.stop = threading.Event()
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.session = get_sessionmaker()()

    # --- monitor --------------------------------------------------------------------------

    def _monitor(self) -> None:
        """Heartbeat and cancellation watch, in its own session (sessions are not thread-safe)."""
        period = get_settings().heartbeat_seconds
        with get_sessionmaker()() as s:
            while not self.stop.is_set():
                try:
                    if not self.beat(s):  # cancelled, or reaped (and retried) by someone else
                        self.stop.set()
                        self.kill_child()
                        return
                except Exception as exc:  # a database hiccup must not kill the monitor
                    s.rollback()
                    log.warning("job %s heartbeat failed: %s", self.job_id, exc)
                self.stop.wait(min(period, 1.0))

    def beat(self, s) -> bool:
        """Refresh the heartbeat; False once the job no longer runs this attempt."""
        result = s.execute(update(Job).where(Job.id == self.job_id, Job.status == JobStatus.RUNNING,
                                             Job.attempt == self.attempt).values(heartbeat_at=now()))
        s.commit()
        return result.rowcount == 1

    def record_group(self, pid: int) -> None:
        """Where cancel, the reaper and a dying worker's supervisor find the run's group."""
        begin_write(self.session)
        self.session.execute(update(Job).where(Job.id == self.job_id).values(pid=pid, pgid=pid))
        self.session.commit()

    def kill_child(self) -> None:
        with self.lock:
            proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE_S
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        _signal_group(proc.pid, signal.SIGKILL)

    # --- phases ---------------------------------------------------------------------------

    def execute(self) -> None:
        self.attempt = self.session.scalar(select(Job.attempt).where(Job.id == self.job_id))
        self.session.commit()
        monitor = threading.Thread(target=self._monitor, name=f"job-{self.job_id}-monitor", daemon=True)
        monitor.start()
        with _active_lock:
            _active[self.job_id] = self
        polling.run_started()
        try:
            job = self.session.get(Job, self.job_id)
            workdir = get_settings().data_dir / "jobs" / str(job.id) / f"attempt-{job.attempt}"
            workdir.mkdir(parents=True, exist_ok=True)
            if job.kind == "profile":
                profile_id = self.profile_phase(job, workdir)
                self.done(JobStatus.SUCCEEDED, summary={"profile_id": profile_id})
            else:
                self.train_job(job, workdir)
        except Stopped:
            if self.abandoned:  # here, in the task's thread: never queue a task from a signal handler
                self.kill_child()
                jobs.fail_or_retry(self.session, self.job_id, self.attempt, self.abandoned, retryable=True,
                                   message="worker stopped")
        except PhaseFailed as exc:  # killed or lost: another attempt may resume it
            self.session.rollback()
            jobs.fail_or_retry(self.session, self.job_id, self.attempt, exc.message, retryable=exc.retryable)
        except ServiceError as exc:
            self.done(JobStatus.FAILED, error=exc.message)
        except Exception as exc:
            log.exception("job %s failed", self.job_id)
            self.done(JobStatus.FAILED, error=f"{type(exc).__name__}: {exc}")
        finally:
            with _active_lock:
                _active.pop(self.job_id, None)
            polling.run_ended()
            self.stop.set()
            self.kill_child()
            monitor.join(timeout=5)
            self.session.close()

    def progress(self, phase: str, message: str, **fields: Any) -> None:
        events.append(self.session, self.job_id, [("progress", {"phase": phase, "message": message, **fields})])

    def done(self, status: JobStatus, *, error: str | None = None, summary: dict[str, Any] | None = None) -> None:
        self.session.rollback()
        if summary is None and status == JobStatus.SUCCEEDED:
            summary = self.session.scalar(select(Job.summary).where(Job.id == self.job_id))
        jobs.finish(self.session, self.job_id, status, expected=(JobStatus.RUNNING,), error=error, summary=summary,
                    attempt=self.attempt)

    def check(self) -> None:
        if self.stop.is_set():
            raise Stopped()

    def code_dir(self, model_id: int | None, workdir: Path) -> Path:
        """Where the model's code runs: its code context unpacked into the job's work folder, or
        the work folder itself (zoo models, import paths installed on the workers)."""
        digest = self.session.scalar(select(Model.context_sha256).where(Model.id == model_id)) if model_id else None
        if digest is None:
            return workdir
        target = workdir / "context"
        if not target.is_dir():
            contexts.extract(bytes(contexts.get(self.session, digest).content), target)
        return target

    def profile_phase(self, job: Job, workdir: Path) -> int:
        spec = spec_of(job)
        model = spec.model.name
        source, _, default_args, model_id = profiles.resolve_model(self.session, model, check_zoo=False)
        args = {**default_args, **spec.model.args}
        code_dir = self.code_dir(model_id, workdir)
        batch = spec.model.batch_size
        device = spec.machine.device
        calibration: list[str] = []
        if job.kind == "train":
            # The simulator charges one profiled batch per microbatch: measure at that size; the
            # batched weight gradients (W(-1)) at the whole batch; the link and the runtime's
            # per-action overhead; all with the torch threads each worker will have.
            whole, batch = batch, max(1, batch // spec.layout.microbatches)
            calibration = profiles.calibration_args(spec.layout.processes, whole, spec.layout.weight_grads,
                                                    spec.optimizer.name, spec.layout.microbatches)
        elif getattr(spec, "calibrate_for", None) is not None:  # a what-if's: profiled as its job would be
            run = spec.calibrate_for
            batch = max(1, run.batch_size // run.microbatches)
            calibration = profiles.calibration_args(run.workers, run.batch_size, run.weight_grads,
                                                    microbatches=run.microbatches)
        key = profiles.cache_key(model + (f" data={spec.model.data}" if spec.model.data else ""), args, batch, device,
                                 calibration=calibration)
        row = profiles.cached(self.session, key, calibrated_too=job.kind == "profile")
        if row is None:
            message = f"profiling {model} at batch size {batch}"
            if calibration:
                message += (f" ({calibration[2]} torch thread(s) per worker), then "
                            + ("at the batch size for the batched weight gradients, " if "--weight-batch-size" in calibration else "")
                            + "the link between two worker processes and the runtime's per-action overhead"
                            + (", and pilot runs of the runtime" if "--pilot-workers" in calibration else "")
                            + " (a few seconds)")
            self.progress("profile", message)
            out = workdir / "profile.json"
            cmd = [sys.executable, "-m", "pipeboard.app.services.profile_run", "--source", source,
                   "--model-args", json.dumps(args), "--batch-size", str(batch), "--device", device,
                   "--repeats", str(getattr(spec, "repeats", 5)), "-o", str(out), *calibration,
                   *profiles.machine_cache_args(calibration)]
            if spec.model.data:
                cmd += ["--data", spec.model.data]
            self.run_child(cmd, workdir / "profile.log", phase="profile", cwd=code_dir)
            row = profiles.store(self.session, json.loads(out.read_text()), name=key, origin="profiled", model_id=model_id)
        else:
            self.progress("profile", f"using cached profile {row.id} of {model}")
        begin_write(self.session)
        self.session.execute(update(Job).where(Job.id == job.id).values(profile_id=row.id, model_id=model_id))
        self.session.commit()
        return row.id

    def train_job(self, job: Job, workdir: Path) -> None:
        layout = spec_of(job).layout
        if job.plan_id is not None and self.attempt > 1:  # a resumed attempt: the checkpoints' plan
            return self.train_phase(job, workdir, self.stored_plan(job, workdir))
        profile_id = self.profile_phase(job, workdir)
        self.check()
        prof = profiles.get(self.session, profile_id)
        dumped = layout.model_dump(mode="json")
        levels = planning.levels_of(dumped["levels"], dumped["workers"])
        schedule = layout.schedule_to_run()
        # the plan the job's own schedule runs fastest under the cost model that predicts it
        if layout.split is not None:  # the stages the specification gives (a tuner's choice): no planning
            plan_obj = planning.split_plan(prof.data, dumped["split"], levels, chunks=layout.chunks)
        else:
            plan_obj = planning.make_plan(prof.data, levels, memory_bytes=layout.memory_bytes, method=layout.method,
                                          schedule=schedule, microbatches=layout.microbatches,
                                          weight_grads=layout.weight_grads, chunks=layout.chunks)
        micro = max(1, spec_of(job).model.batch_size // layout.microbatches)
        sched, sim = planning.simulate(plan_obj, schedule, layout.microbatches, samples_per_microbatch=micro,
                                       chunks=layout.chunks, vertical_sync=layout.vertical_sync,
                                       weight_grads=layout.weight_grads, profile_data=prof.data,
                                       recompute=layout.recompute)
        predicted = planning.predicted_summary(plan_obj, sched, sim, layout.microbatches, timeline_limit=0)
        request = {k: dumped[k] for k in ("levels", "workers", "memory_bytes", "method", "schedule", "microbatches",
                                          "weight_grads", "split")}
        plan_row = PlanRow(profile_id=profile_id, request=request, data=plan_obj.to_dict(), predicted=predicted,
                           owner_id=job.owner_id)  # the job's plan is its owner's, like the job
        begin_write(self.session)
        self.session.add(plan_row)
        self.session.flush()
        rows = [
            {"job_id": job.id, "source": EventSource.PREDICTED, "seq": i + 1, **ev.to_dict()}
            for i, ev in enumerate(sim.timeline)
        ]
        if rows:
            self.session.execute(insert(TimelineEventRow), rows)
        self.session.execute(update(Job).where(Job.id == job.id).values(plan_id=plan_row.id))
        self.session.commit()
        self.progress("plan", f"plan {plan_row.id}: {len(planning.stage_replicas(plan_obj))} stage(s)",
                      plan_id=plan_row.id, predicted_iteration_s=predicted["iteration_time_s"])
        self.check()
        plan_path = workdir / "plan.json"
        plan_path.write_text(json.dumps(plan_obj.to_dict()))
        self.train_phase(job, workdir, plan_path)

    def stored_plan(self, job: Job, workdir: Path) -> Path:
        """The plan the job's earlier attempts trained (and checkpointed) with, as a file."""
        plan_path = workdir / "plan.json"
        plan_path.write_text(json.dumps(self.session.get(PlanRow, job.plan_id).data))
        self.progress("plan", f"attempt {self.attempt}: plan {job.plan_id}, as before", plan_id=job.plan_id)
        return plan_path

    def train_phase(self, job: Job, workdir: Path, plan_path: Path) -> None:
        spec = spec_of(job)
        self.progress("train", "starting training" if self.attempt <= 1 else
                      f"attempt {self.attempt}: resuming training from the newest checkpoint")
        source, _, default_args, model_id = profiles.resolve_model(self.session, spec.model.name, check_zoo=False)
        time_s = spec.length.time_s
        if time_s is not None:  # the training time earlier attempts had counts
            time_s = max(1.0, time_s - attempts.trained_s(self.session, job.id, self.attempt))
        run_path = write_run_file(plan_path.parent / "run.json", spec, json.loads(plan_path.read_text()), source,
                                  default_args, checkpoint_dir=checkpoint_dir(job.id),
                                  recorded=attempts.recorded_step(self.session, job.id))
        command = train_command(job.id, run_path, attempt=self.attempt)
        several = spec.layout.nodes > 1
        if several:  # torch's elastic agent here, and on the hosts reserved with this one
            self.progress("train", f"reserving {spec.layout.nodes} hosts")
            command = multihost.lead(self.session, job, self.attempt, command, spec.layout.processes, self.stop.is_set)
            self.progress("train", "starting torch's elastic agent on every host (c10d rendezvous)")
        watch = fidelity.Watch(job.id, self.attempt)  # live prediction figures while it trains
        watch.start()
        try:
            timed_out = self.run_child(command, workdir / "train.log", phase="train", time_limit=time_s,
                                       cwd=self.code_dir(model_id, workdir))
        except PhaseFailed as exc:
            raise multihost.explain(self.session, job.id, self.attempt, exc) if several else exc
        finally:
            watch.stop()
        summary = self.session.scalar(select(Job.summary).where(Job.id == job.id)) or {}
        if timed_out:
            summary = {**summary, "stopped_by": "time"}
        summary = {**summary, "fidelity": fidelity.final(self.session, job.id, summary)}
        self.done(JobStatus.SUCCEEDED, summary=summary)

    def run_child(self, cmd: list[str], log_path: Path, *, phase: str, time_limit: float | None = None,
                  cwd: Path | None = None) -> bool:
        """Run ``cmd`` as its own process group (in ``cwd``, default the log's folder) and wait; True
        when stopped by ``time_limit``. Raises Stopped on cancel, ServiceError (with the log's tail)
        on failure."""
        self.check()
        from pipeboard.app.services import proctree, sandbox  # a tree that ends whole; users' code sandboxed

        where = str(cwd or log_path.parent)
        base = child_env()
        held = placement.held_devices(self.session, self.job_id, self.attempt)
        if held is not None:  # a cuda attempt sees only the GPUs placement gave it (as cuda:0, 1, ...)
            base["CUDA_VISIBLE_DEVICES"] = held
        cmd, env = sandbox.for_phase(phase, cmd, base, cwd=where, workdir=log_path.parent)
        with open(log_path, "wb") as log_file:
            proc = proctree.spawn(cmd, stdout=log_file, env=env, cwd=where)
        with self.lock:
            self.proc = proc
        self.record_group(proc.pid)
        started = time.monotonic()
        timed_out = False
        try:
            while proc.poll() is None:
                if self.stop.is_set():
                    self.kill_child()
                    raise Stopped()
                if time_limit and time.monotonic() - started > time_limit:
                    timed_out = True
                    self.kill_child()
                    break
                time.sleep(POLL_S)
        finally:
            # Whatever the leader did, nothing it started outlives the phase (its group, setsid
            # children too); bounded, and the leader reaped: no zombie left either.
            if proctree.end(proc):
                log.warning("job %s: processes of %s did not exit after SIGKILL", self.job_id, proc.pid)
            with self.lock:
                self.proc = None
        if self.stop.is_set():
            raise Stopped()
        if proc.returncode != 0 and not timed_out:
            raise PhaseFailed(f"{phase} failed (exit code {proc.returncode}): {_tail(log_path)}", proc.returncode)
        return timed_out


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def abandon_all(reason: str) -> list[int]:
    """Give up every run of this process: each ends its group, then retries its job (or fails
    it, out of attempts) from its own thread, which the warm shutdown waits for.

    Called when the worker begins to shut down: a warm shutdown would otherwise wait for runs
    of any length, and a later SIGKILL of the worker would orphan them (each run is its own
    session, outside the worker's process group)."""
    with _active_lock:
        runs = list(_active.values())
    for run in runs:
        run.abandoned = f"{reason} ({get_settings().node_name})"
        run.stop.set()
    return [run.job_id for run in runs]


def run_next(task_id: str | None = None, node: str | None = None, job_id: int | None = None,
             attempt: int | None = None) -> int | None:
    """The body of the Celery tasks: run the best queued job (or attempt ``attempt`` of job
    ``job_id``), if any; returns its id."""
    job_id = claim_next(task_id, node, job_id, attempt)
    if job_id is not None:
        JobRun(job_id, node).execute()
    return job_id
