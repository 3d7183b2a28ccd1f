"""The Celery app: its configuration, and a real worker subprocess on the SQLite broker and on Redis."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import kombu.transport.sqlalchemy
import pytest
from sqlalchemy import create_engine, select

from pipeboard.app.core.config import Settings
from pipeboard.app.core.db import make_engine
from pipeboard.app.models import WorkerHeartbeat
from pipeboard.app.worker import REDIS_VISIBILITY_TIMEOUT_S, broker_supports_broadcast, celery_app, celery_config


def test_sqlite_transport_polls_every_tenth_of_a_second_and_every_second_while_it_trains() -> None:
    from pipeboard.app.core import polling

    transport = kombu.transport.sqlalchemy.Transport.__new__(kombu.transport.sqlalchemy.Transport)
    assert transport.polling_interval == 0.1
    polling.run_started()
    try:
        assert transport.polling_interval == 1.0
    finally:
        polling.run_ended()
    assert transport.polling_interval == 0.1
    assert celery_app.conf.worker_prefetch_multiplier == 1
    assert celery_app.conf.task_acks_late is True
    assert celery_app.conf.worker_pool == "threads"
    assert "pipeboard.ping" in celery_app.tasks


def test_sqlite_transport_options_are_all_create_engine_keywords(tmp_path: Path) -> None:
    # The transport passes every option to create_engine(); an unknown key would break it.
    config = celery_config(Settings(data_dir=tmp_path))
    assert config["broker_url"].startswith("sqlalchemy+sqlite:///")
    engine = create_engine(f"sqlite:///{tmp_path}/probe.sqlite", **config["broker_transport_options"])
    engine.dispose()


def test_redis_configuration_is_prefixed_and_patient(tmp_path: Path) -> None:
    config = celery_config(Settings(data_dir=tmp_path, broker_url="redis://r:6379/2", key_prefix="team-a:"))
    assert config["result_backend"] == "redis://r:6379/2"
    assert config["broker_transport_options"] == {"visibility_timeout": REDIS_VISIBILITY_TIMEOUT_S, "global_keyprefix": "team-a:"}
    assert config["result_backend_transport_options"] == {"global_keyprefix": "team-a:"}
    assert broker_supports_broadcast("redis://r:6379/2")
    assert not broker_supports_broadcast(config["broker_url"].replace("redis", "sqlalchemy+sqlite", 1))


def heartbeat_hostnames(database_url: str) -> list[str]:
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            return list(connection.scalars(select(WorkerHeartbeat.hostname)))
    finally:
        engine.dispose()


def wait_for(predicate: Callable[[], bool], timeout_s: float = 15) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.slow
def test_real_worker_on_the_sqlite_broker(start_worker, sqlite_broker_env: dict[str, str]) -> None:
    worker = start_worker(sqlite_broker_env)
    reply = worker.call("pipeboard.ping", 1, "two", timeout=30, three=3)
    assert reply["args"] == [1, "two"] and reply["kwargs"] == {"three": 3}
    # Thread pool: the task ran in the worker process itself, which may start process groups.
    assert reply["pid"] == worker.process.pid
    assert reply["hostname"].startswith("test0-")
    database_url = worker.settings.database_url
    assert wait_for(lambda: heartbeat_hostnames(database_url) == [reply["hostname"]])
    assert worker.stop() == 0
    assert heartbeat_hostnames(database_url) == []  # removed on a clean shutdown


@pytest.mark.slow
@pytest.mark.redis
def test_real_worker_on_redis(start_worker, redis_broker_env: dict[str, str]) -> None:
    worker = start_worker(redis_broker_env)
    reply = worker.call("pipeboard.ping", "over redis", timeout=30)
    assert reply["args"] == ["over redis"]
    assert abs(reply["worker_time"] - time.time()) < 60
    # Broadcast reaches exactly this worker: the key prefix hides every other test's workers.
    replies = worker.client.control.ping(timeout=1.0)
    assert [list(r)[0] for r in replies] == [reply["hostname"]]
    assert worker.stop() == 0
