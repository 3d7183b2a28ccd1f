"""app/services/tokens.py: durations, and the admin token a first start creates (once)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select

from pipeboard.app.models import ApiToken
from pipeboard.app.services.tokens import create_token, ensure_first_admin, has_usable_admin, hash_token, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("45s", 45),
                                               ("2w", 14 * 86400), ("3600", 3600), (" 7d ", 7 * 86400)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0d", "-1d", "1y", "soon", "1.5h", "99999w"])
def test_bad_durations_say_what_a_duration_is(text: str) -> None:
    with pytest.raises(ValueError, match="duration|more than"):
        parse_duration(text)


def test_a_first_start_creates_one_admin_token(session) -> None:
    secret = ensure_first_admin(session)
    assert secret is not None and secret.startswith("pb_")
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(secret)))
    assert (row.name, row.scope.value, row.expires_at, row.revoked) == ("admin", "admin", None, False)
    assert ensure_first_admin(session) is None  # later starts
    assert len(session.scalars(select(ApiToken)).all()) == 1


def test_only_a_working_admin_token_counts(session) -> None:
    create_token(session, "gone", "admin")[0].revoked = True
    create_token(session, "old", "admin", expires_at=datetime.now(timezone.utc) - timedelta(seconds=1))
    create_token(session, "ci", "write")  # not an admin
    session.commit()
    assert not has_usable_admin(session)
    create_token(session, "tomorrow", "admin", expires_at=datetime.now(timezone.utc) + timedelta(days=1))
    session.commit()
    assert has_usable_admin(session) and ensure_first_admin(session) is None


def test_a_token_needs_a_known_scope_and_an_aware_expiry(session) -> None:
    with pytest.raises(ValueError, match="scope"):
        create_token(session, "x", "root")
    with pytest.raises(ValueError, match="time zone"):
        create_token(session, "x", "read", expires_at=datetime(2030, 1, 1))


def test_a_token_is_created_while_another_process_writes_between_its_read_and_its_write(tmp_path) -> None:
    """SQLite (WAL): a transaction that read and then writes fails at once with "database is
    locked" if another process committed in between; create_token takes the write lock before it
    reads the user, so another writer waits for it instead (and it never sees a stale snapshot)."""
    import sqlite3

    from sqlalchemy import text
    from sqlalchemy.orm import Session

    from pipeboard.app.core.db import make_engine
    from pipeboard.app.models import Base
    from pipeboard.app.services.tx import begin_read_write

    path = tmp_path / "db.sqlite"
    engine = make_engine(f"sqlite:///{path}")
    Base.metadata.create_all(engine)
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    with Session(engine) as session:
        session.execute(text("SELECT count(*) FROM users")).all()  # a read: its snapshot
        other.execute("INSERT INTO users (name, created_at) VALUES ('carol', '2026-12-06')")  # another process commits
        _, secret = create_token(session, "ci", "write", user="dave")
        with pytest.raises(sqlite3.OperationalError, match="locked"):  # it holds the write lock
            other.execute("INSERT INTO users (name, created_at) VALUES ('erin', '2026-12-06')")
        session.commit()
        begin_read_write(session)
        session.execute(text("SELECT count(*) FROM users")).all()
        with pytest.raises(sqlite3.OperationalError, match="locked"):  # before any write of its own
            other.execute("INSERT INTO users (name, created_at) VALUES ('frank', '2026-12-06')")
        session.rollback()
    other.execute("INSERT INTO users (name, created_at) VALUES ('grace', '2026-12-06')")  # free again once it ended
    assert secret.startswith("pb_")
    engine.dispose()
