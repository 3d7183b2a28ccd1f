"""Where attempts run, in the database. Jobs on several hosts: the gang reservation takes alive,
free hosts other than this one, all or none; a shortfall names what there was; an attempt whose
hosts did not all join fails naming which did, and one that failed after training began counts as
lost (retried). A job on one host: its next attempt goes to the worker whose host holds its
checkpoints while that worker lives, to any worker once it does not."""

from __future__ import annotations

from datetime import timedelta

import pytest

from pipeboard.app.core.config import get_settings
from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import AttemptNode, JobAttempt, JobStatus, WorkerHeartbeat
from pipeboard.app.services import jobs, multihost
from pipeboard.app.services.errors import RUN_LOST_EXIT, PhaseFailed, ServiceError
from tests.app.test_services_support import live_db, new_job  # noqa: F401  (fixture)


@pytest.fixture
def quick_join(monkeypatch):
    monkeypatch.setenv("PIPEBOARD_JOIN_TIMEOUT_S", "0.3")
    monkeypatch.setenv("PIPEBOARD_NODE_NAME", "host-a")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def workers(*rows: tuple[str, str, float]) -> None:
    """Worker heartbeats: (node, host, seconds since seen)."""
    now = jobs.utcnow()
    with get_sessionmaker()() as s:
        s.add_all([WorkerHeartbeat(hostname=node, host=host, pid=1, pool="threads", concurrency=1,
                                   seen_at=now - timedelta(seconds=ago)) for node, host, ago in rows])
        s.commit()


def running_attempt(job_id: int, nodes: list[tuple[str, str, str, bool]]) -> None:
    """Attempt 1 of ``job_id`` running, with (node, host, role, joined) taking part."""
    with get_sessionmaker()() as s:
        s.add(JobAttempt(job_id=job_id, attempt=1, trigger="submit", status=JobStatus.RUNNING, nodes=len(nodes)))
        s.add_all([AttemptNode(job_id=job_id, attempt=1, node=node, host=host, role=role,
                               joined_at=jobs.utcnow() if joined else None) for node, host, role, joined in nodes])
        s.commit()


def test_reservation_takes_free_hosts_all_or_none(live_db, quick_join):
    busy = new_job("running", attempt=1, spec={"model": "mlp-digits", "nodes": 1})
    running_attempt(busy, [("pipeboard@host-b", "host-b", "leader", True)])
    workers(("pipeboard@host-a", "host-a", 0), ("other@host-a", "host-a", 0),  # this host: never a second one
            ("pipeboard@host-b", "host-b", 0),  # busy with another job
            ("pipeboard@host-c", "host-c", 60),  # its heartbeats stopped
            ("pipeboard@host-d", "host-d", 0), ("more@host-d", "host-d", 0))  # one node per host
    job = new_job("running", attempt=1, spec={"model": "mlp-digits", "nodes": 3})
    with get_sessionmaker()() as s:
        with pytest.raises(ServiceError) as short:
            multihost.reserve(s, job, 1, 2, lambda: False)
        assert short.value.field == "nodes" and short.value.message == (
            "nodes: the job needs 3 hosts; within 0 s only 2 were alive and free: host-a (this one), host-d (more@host-d)")
        assert s.query(AttemptNode).filter_by(job_id=job).count() == 0  # nothing held while waiting
        assert multihost.reserve(s, job, 1, 1, lambda: False) == [("more@host-d", "host-d")]
        assert [(n.node, n.role, n.joined_at) for n in s.query(AttemptNode).filter_by(job_id=job)] == [("more@host-d", "member", None)]
        with pytest.raises(ServiceError, match="only 1 were alive and free: host-a"):  # host-d is this job's now
            multihost.reserve(s, new_job("running", attempt=1, spec={"model": "mlp-digits", "nodes": 2}), 1, 1, lambda: False)


def test_a_failed_attempt_says_which_hosts_joined_or_counts_as_lost(live_db):
    job = new_job("running", attempt=1, spec={"model": "mlp-digits", "nodes": 3})
    running_attempt(job, [("pipeboard@host-a", "host-a", "leader", True), ("pipeboard@host-b", "host-b", "member", True),
                          ("pipeboard@host-c", "host-c", "member", False)])
    failure = PhaseFailed("train failed (exit code 1): RendezvousTimeoutError", 1)
    with get_sessionmaker()() as s:
        told = multihost.explain(s, job, 1, failure)
        assert not isinstance(told, PhaseFailed) and told.field == "nodes"
        assert told.message == (f"nodes: 2 of 3 hosts joined torch's rendezvous within {get_settings().join_timeout_s:.0f} s: "
                                "host-a (pipeboard@host-a), host-b (pipeboard@host-b); not joined: host-c (pipeboard@host-c)")
        s.query(JobAttempt).filter_by(job_id=job).update({"hosts": {"0": "host-a", "1": "host-b", "2": "host-c"}})
        s.commit()
        lost = multihost.explain(s, job, 1, failure)  # training had begun: a host or a process was lost
        assert isinstance(lost, PhaseFailed) and lost.returncode == RUN_LOST_EXIT and lost.retryable


def test_a_one_host_job_s_next_attempt_waits_for_the_worker_holding_its_checkpoints_while_it_lives(live_db):
    from pipeboard.app.services import runner

    workers(("w1@host-a", "host-a", 0), ("w2@host-b", "host-b", 0))
    job = new_job("running", attempt=1, spec={"model": "mlp-digits"})
    running_attempt(job, [("w1@host-a", "host-a", "leader", True)])
    with get_sessionmaker()() as s:
        assert jobs.fail_or_retry(s, job, 1, "stage 1 (rank 1) was killed by SIGKILL", retryable=True)
        assert s.get(JobAttempt, (job, 2)).prefer_node == "w1@host-a"
    assert runner.claim_next(None, "w2@host-b") is None  # its checkpoints are on host-a
    assert runner.claim_next(None, "w1@host-a", job_id=job, attempt=2) == job
    with get_sessionmaker()() as s:  # out of attempts, retried by hand; then host-a's worker stops heart-beating
        assert "no automatic attempt left of 2" in jobs.fail_or_retry(s, job, 2, "stage 0 (rank 0) was killed", retryable=True)
        assert jobs.retry(s, job).attempt == 3 and s.get(JobAttempt, (job, 3)).prefer_node == "w1@host-a"
        stale = jobs.utcnow() - timedelta(seconds=get_settings().stale_after_seconds + 1)
        s.query(WorkerHeartbeat).filter_by(hostname="w1@host-a").update({"seen_at": stale})
        s.commit()
        jobs.reap_stale(s)  # released: any worker may run it now
        assert s.get(JobAttempt, (job, 3)).prefer_node is None
    assert runner.claim_next(None, "w2@host-b") == job


def test_an_attempt_whose_hosts_all_joined_but_did_not_start_counts_as_lost(live_db):
    job = new_job("running", attempt=1, spec={"model": "mlp-digits", "nodes": 2})
    running_attempt(job, [("pipeboard@host-a", "host-a", "leader", True), ("pipeboard@host-b", "host-b", "member", True)])
    with get_sessionmaker()() as s:
        told = multihost.explain(s, job, 1, PhaseFailed("train failed (exit code 1): address already in use", 1))
    assert isinstance(told, PhaseFailed) and told.retryable
    assert told.message == "all 2 hosts joined, but the run did not start: train failed (exit code 1): address already in use"
