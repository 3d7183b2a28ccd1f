"""Fixtures for service tests that need committed data in a private database (not the rolled
back `session`): the SSE stream, DbSink and the runner open their own sessions, as in production."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipeboard.app.core.config import get_settings
from pipeboard.app.core.db import make_engine, reset_engine
from pipeboard.app.models import Base, Job
from tests.conftest import private_schema, require_postgres


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def live_db(request, tmp_path, monkeypatch) -> Iterator[str]:
    """A fresh database with all tables that the process's settings point at."""
    drop = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/live.sqlite"
    else:
        url, drop = private_schema(require_postgres(), prefix="pbs")
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    engine.dispose()
    monkeypatch.setenv("PIPEBOARD_DATABASE_URL", url)
    get_settings.cache_clear()
    reset_engine()
    yield url
    reset_engine()
    monkeypatch.delenv("PIPEBOARD_DATABASE_URL")
    get_settings.cache_clear()
    if drop:
        drop()


def new_job(status: str = "queued", **values) -> int:
    from pipeboard.app.core.db import get_sessionmaker
    from pipeboard.app.models import JobStatus

    with get_sessionmaker()() as s:
        job = Job(name="t", status=JobStatus(status), **{"spec": {"model": "mlp-digits"}, **values})
        s.add(job)
        s.commit()
        return job.id
