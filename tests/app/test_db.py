"""Engines and sessions: SQLite pragmas, savepoints, and the rolled-back test transaction."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from pipeboard.app.core.db import check_database, get_engine, get_session, make_engine, reset_engine
from pipeboard.app.models import Model


def test_sqlite_engine_creates_folder_and_sets_pragmas(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/new/folder/x.sqlite")
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    engine.dispose()
    assert (tmp_path / "new" / "folder" / "x.sqlite").exists()


def test_savepoint_rolls_back_only_the_inner_work(session: Session) -> None:
    session.add(Model(name="outer", source="mlp"))
    session.flush()
    with pytest.raises(IntegrityError):
        with session.begin_nested():
            session.add(Model(name="outer", source="duplicate"))
            session.flush()
    names = session.scalars(select(Model.name).where(Model.name == "outer")).all()
    assert names == ["outer"]


def test_session_commits_stay_invisible_to_other_connections(session: Session, db_engine: Engine) -> None:
    session.add(Model(name="isolated", source="mlp"))
    session.commit()  # releases the test's savepoint; the outer transaction is still open
    assert session.scalar(select(Model.id).where(Model.name == "isolated")) is not None
    with db_engine.connect() as other:
        assert other.execute(select(Model.id).where(Model.name == "isolated")).first() is None


def test_session_starts_empty_after_other_tests(session: Session) -> None:
    # The tests above committed rows named "outer" and "isolated"; rollback removed them.
    assert session.scalars(select(Model).where(Model.name.in_(["outer", "isolated"]))).all() == []


def test_process_engine_follows_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pipeboard.app.core.config import get_settings

    monkeypatch.setenv("PIPEBOARD_DATABASE_URL", f"sqlite:///{tmp_path}/process.sqlite")
    get_settings.cache_clear()
    reset_engine()
    try:
        assert str(get_engine().url).endswith("process.sqlite")
        check_database()
        sessions = get_session()
        db_session = next(sessions)
        assert db_session.execute(text("SELECT 1")).scalar() == 1
        sessions.close()
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
        reset_engine()


def test_check_database_raises_when_unreachable() -> None:
    engine = make_engine("postgresql+psycopg://postgres@127.0.0.1:9/nothing", connect_args={"connect_timeout": 2})
    with pytest.raises(OperationalError):
        check_database(engine)
