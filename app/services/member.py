"""A worker's part in a job on several hosts that another worker leads (app/services/multihost.py):
the `pipeboard.join_job` task's body.

The member builds the job's `pipeboard train --torchrun` command itself, from the database (the
job, its plan, its code context) with paths of its own host (its data folder holds its
checkpoints), and runs torch's elastic agent for its share of the processes as its own process
group, like any phase of a job. Its heartbeat is its row of the attempt's hosts; when the job no
longer runs the attempt (cancelled, failed, retried) it ends its group. When its agent fails it
ends the attempt (retried from the checkpoint, or failed), unless the leader did first.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy import select, update

from pipeboard.app.core.config import get_settings
from pipeboard.app.models import AttemptNode, Job, JobAttempt
from pipeboard.app.models import Plan as PlanRow
from pipeboard.app.services import attempts, jobs, multihost, profiles
from pipeboard.app.services.errors import PhaseFailed
from pipeboard.app.services.runner import JobRun, Stopped, checkpoint_dir, spec_of, train_command, write_run_file
from pipeboard.app.services.tx import begin_write

log = logging.getLogger(__name__)


class MemberRun(JobRun):
    def __init__(self, job_id: int, attempt: int, node: str) -> None:
        super().__init__(job_id, node)
        self.member_attempt = attempt

    def beat(self, s) -> bool:
        return multihost.member_alive(s, self.job_id, self.attempt, self.node)

    def record_group(self, pid: int) -> None:
        begin_write(self.session)
        self.session.execute(update(AttemptNode).where(AttemptNode.job_id == self.job_id, AttemptNode.attempt == self.attempt,
                                                       AttemptNode.node == self.node).values(pgid=pid))
        self.session.commit()

    def execute(self) -> None:
        self.attempt = self.member_attempt
        if not multihost.joined(self.session, self.job_id, self.attempt, self.node):
            log.info("job %s attempt %s no longer needs %s", self.job_id, self.attempt, self.node)
            self.session.close()
            return
        monitor = threading.Thread(target=self._monitor, name=f"job-{self.job_id}-member", daemon=True)
        monitor.start()
        try:
            self.run_agent()
        except Stopped:
            pass
        except PhaseFailed as exc:
            self.session.rollback()
            failure = multihost.explain(self.session, self.job_id, self.attempt, exc)
            jobs.fail_or_retry(self.session, self.job_id, self.attempt, f"{get_settings().node_name}: {failure.message}",
                               retryable=isinstance(failure, PhaseFailed) and failure.retryable)
        except Exception as exc:
            log.exception("job %s: member %s failed", self.job_id, self.node)
            self.session.rollback()
            jobs.fail_or_retry(self.session, self.job_id, self.attempt, f"{get_settings().node_name}: {type(exc).__name__}: {exc}",
                               retryable=False)
        finally:
            self.stop.set()
            self.kill_child()
            monitor.join(timeout=5)
            self.session.close()

    def run_agent(self) -> None:
        job = self.session.get(Job, self.job_id)
        spec = spec_of(job)
        workdir = get_settings().data_dir / "jobs" / str(job.id) / f"attempt-{self.attempt}"
        workdir.mkdir(parents=True, exist_ok=True)
        source, _, default_args, model_id = profiles.resolve_model(self.session, spec.model.name, check_zoo=False)
        run_path = write_run_file(workdir / "run.json", spec, self.session.get(PlanRow, job.plan_id).data, source,
                                  default_args, checkpoint_dir=checkpoint_dir(job.id),
                                  recorded=attempts.recorded_step(self.session, job.id))
        train = train_command(job.id, run_path, attempt=self.attempt)
        endpoint = self.session.scalar(select(JobAttempt.rendezvous).where(JobAttempt.job_id == job.id,
                                                                           JobAttempt.attempt == self.attempt))
        command = multihost.agent_command(job, self.attempt, train, nodes=spec.layout.nodes,
                                          processes=spec.layout.processes, endpoint=endpoint, is_host=False)
        self.run_child(command, workdir / f"agent-{get_settings().node_name}.log", phase="train",
                       cwd=self.code_dir(model_id, workdir))


def run_member(job_id: int, attempt: int, node: str) -> None:
    """The `pipeboard.join_job` task: take part in attempt ``attempt`` of job ``job_id`` as ``node``."""
    MemberRun(job_id, attempt, node).execute()
