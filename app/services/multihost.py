"""A job on several hosts (``nodes: N``): reserve N worker hosts together, run torch's elastic
agent on each, and say what went wrong when they do not all come.

The worker that claims the job (the leader) profiles and plans as for one host, then reserves
N - 1 other hosts in one transaction (a gang: all or nothing, never half a job holding hosts that
another job waits for), waiting up to ``JOIN_TIMEOUT_S`` for enough of them to be alive and free,
and sends each a `pipeboard.join_job` task on its own queue (Celery's `worker_direct`). Every host's
worker then starts torch's elastic agent (`torch.distributed.run`, i.e. torchrun, through
`node_agent`) with the c10d rendezvous on the leader (`is_host=1` there), one agent per host, each
starting its share of the job's worker processes: `pipeboard train --torchrun` ranks, rank 0 of
which reports to the database. Torch forms the group (and tears it down when a process fails);
pipeboard only places the agents and watches them.

A host is free when none of the running attempts has it among its hosts. An attempt whose hosts
never all joined fails with a message naming which did (their agents started) and which did not;
one that failed after training began (a host or a process lost) is retried like any lost attempt.
"""

from __future__ import annotations

import socket
import sys
import time
from typing import Any, Callable

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from pipeboard.app.core.config import get_settings
from pipeboard.app.models import AttemptNode, Job, JobAttempt, JobStatus, WorkerHeartbeat
from pipeboard.app.services import attempts, jobs
from pipeboard.app.services.errors import RUN_LOST_EXIT, PhaseFailed, ServiceError
from pipeboard.app.services.tx import begin_write

JOIN_TASK = "pipeboard.join_job"


def address() -> str:
    """Where the other hosts reach this one: NODE_ADDRESS, else what NODE_NAME resolves to."""
    st = get_settings()
    if st.node_address:
        return st.node_address
    try:
        return socket.gethostbyname(st.node_name)
    except OSError:
        return "127.0.0.1"


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def free_nodes(session: Session, exclude_hosts: set[str]) -> list[tuple[str, str]]:
    """(node, host) of alive workers on hosts that no running attempt uses, one per host, hosts
    in ``exclude_hosts`` left out."""
    cutoff = jobs.utcnow().timestamp() - get_settings().stale_after_seconds
    busy = set(session.scalars(  # hosts taking part in a running attempt, through any of their workers
        select(AttemptNode.host).join(Job, (Job.id == AttemptNode.job_id) & (Job.attempt == AttemptNode.attempt))
        .where(Job.status == JobStatus.RUNNING)).all())
    out, hosts = [], set(exclude_hosts) | busy
    for node, host, seen in session.execute(select(WorkerHeartbeat.hostname, WorkerHeartbeat.host, WorkerHeartbeat.seen_at)
                                            .order_by(WorkerHeartbeat.host, WorkerHeartbeat.hostname)).all():
        if host and host not in hosts and seen.timestamp() >= cutoff:
            out.append((node, host))
            hosts.add(host)
    return out


def reserve(session: Session, job_id: int, attempt: int, others: int, stopped: Callable[[], bool]) -> list[tuple[str, str]]:
    """Reserve ``others`` hosts besides this one for the attempt, all in one transaction, waiting
    up to the join timeout for enough to be alive and free; ServiceError (naming ``nodes``) if not."""
    st = get_settings()
    deadline = time.monotonic() + st.join_timeout_s
    while True:
        begin_write(session)
        # One reservation at a time: a no-op update of every worker's row takes their locks (the
        # write lock on SQLite), so two leaders cannot both count a host as free.
        session.execute(update(WorkerHeartbeat).values(hostname=WorkerHeartbeat.hostname))
        candidates = free_nodes(session, {st.node_name})
        if len(candidates) >= others:
            chosen = candidates[:others]
            session.add_all([AttemptNode(job_id=job_id, attempt=attempt, node=node, host=host, role="member")
                             for node, host in chosen])
            session.commit()
            return chosen
        session.rollback()
        if time.monotonic() > deadline or stopped():
            found = ", ".join(f"{host} ({node})" for node, host in candidates) or "no other"
            raise ServiceError(f"nodes: the job needs {others + 1} hosts; within {st.join_timeout_s:.0f} s only "
                               f"{len(candidates) + 1} were alive and free: {st.node_name} (this one), {found}",
                               status=409, field="nodes")
        time.sleep(min(1.0, st.heartbeat_seconds))


def agent_command(job: Job, attempt: int, train: list[str], *, nodes: int, processes: int, endpoint: str,
                  is_host: bool) -> list[str]:
    """torchrun (`torch.distributed.run`, through node_agent) for this host's share of the job's
    ``processes`` worker processes."""
    st = get_settings()
    return [sys.executable, "-m", "pipeboard.app.services.node_agent",
            f"--nnodes={nodes}", f"--nproc-per-node={processes // nodes}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id=pipeboard-job{job.id}-attempt{attempt}",
            f"--rdzv-conf=join_timeout={st.join_timeout_s:g},is_host={int(is_host)}",
            "--max-restarts=0", "--monitor-interval=0.5", f"--local-addr={address()}",
            "--no-python", *train, "--torchrun"]


def lead(session: Session, job: Job, attempt: int, train: list[str], processes: int, stopped: Callable[[], bool]) -> list[str]:
    """On the leader: reserve the other hosts, record the rendezvous, send each its join task;
    returns this host's agent command (it hosts the rendezvous)."""
    nodes = attempts.nodes_of(job.spec)
    chosen = reserve(session, job.id, attempt, nodes - 1, stopped)
    host = address()
    endpoint = f"{host}:{free_port(host)}"
    begin_write(session)
    session.execute(update(JobAttempt).where(JobAttempt.job_id == job.id, JobAttempt.attempt == attempt)
                    .values(rendezvous=endpoint))
    session.commit()
    from celery.utils import worker_direct

    for node, _host in chosen:
        jobs.send_task(JOIN_TASK, job.id, attempt, queue=worker_direct(node))
    return agent_command(job, attempt, train, nodes=nodes, processes=processes, endpoint=endpoint, is_host=True)


def explain(session: Session, job_id: int, attempt: int, failure: PhaseFailed) -> ServiceError:
    """Why a multi-host attempt's agent failed: before training began, which hosts joined (their
    agents started) and which did not (not retried: the same hosts would be missing again), or,
    all of them there, a start that failed; after, a lost host or process. The last two are lost
    attempts (retried from the checkpoint)."""
    session.rollback()
    row = session.get(JobAttempt, (job_id, attempt))
    if row is not None and row.hosts:  # training had begun: a host or a process was lost
        return PhaseFailed(failure.message, RUN_LOST_EXIT)
    members = session.scalars(select(AttemptNode).where(AttemptNode.job_id == job_id, AttemptNode.attempt == attempt)
                              .order_by(AttemptNode.role, AttemptNode.host)).all()
    joined = [f"{m.host} ({m.node})" for m in members if m.joined_at is not None]
    missing = [f"{m.host} ({m.node})" for m in members if m.joined_at is None]
    timeout = get_settings().join_timeout_s
    text = (f"nodes: {len(joined)} of {len(members)} hosts joined torch's rendezvous within {timeout:.0f} s: "
            f"{', '.join(joined) or 'none'}; not joined: {', '.join(missing) or 'none'}")
    if not missing:  # they all came; the start failed (a port taken, a process killed): worth another attempt
        return PhaseFailed(f"all {len(members)} hosts joined, but the run did not start: {failure.message}", RUN_LOST_EXIT)
    return ServiceError(text, status=500, field="nodes")


def joined(session: Session, job_id: int, attempt: int, node: str) -> bool:
    """A member starts: mark its agent joined, if the job still runs that attempt and reserved it."""
    begin_write(session)
    t = jobs.utcnow()
    current = select(Job.id).where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.attempt == attempt).exists()
    result = session.execute(update(AttemptNode).where(AttemptNode.job_id == job_id, AttemptNode.attempt == attempt,
                                                       AttemptNode.node == node, current)
                             .values(joined_at=t, heartbeat_at=t))
    session.commit()
    return result.rowcount == 1


def member_alive(session: Session, job_id: int, attempt: int, node: str, **values: Any) -> bool:
    """A member's heartbeat (and any ``values``); False once the job no longer runs that attempt."""
    current = select(Job.id).where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.attempt == attempt).exists()
    result = session.execute(update(AttemptNode).where(AttemptNode.job_id == job_id, AttemptNode.attempt == attempt,
                                                       AttemptNode.node == node, current)
                             .values(heartbeat_at=jobs.utcnow(), **values))
    session.commit()
    return result.rowcount == 1
