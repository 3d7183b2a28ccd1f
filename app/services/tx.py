"""Write transactions that SQLite can serialise.

On SQLite (WAL), a transaction that has read and then tries to write fails AT ONCE with
"database is locked" if another process committed in between: its snapshot is stale, so the
busy timeout cannot help. The worker and training processes write all the time (heartbeats,
events), so every write path here first ends any read-only transaction, making the write the
first statement of a fresh transaction, which then waits its turn under the busy timeout.
PostgreSQL does not need this; there it is a cheap no-op commit.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from pipeboard.app.core.db import IMMEDIATE


def begin_write(session: Session) -> None:
    """End the session's current transaction; call only where it holds no uncommitted writes."""
    if session.in_transaction():
        session.commit()


def begin_read_write(session: Session) -> None:
    """`begin_write` for a write that must read first (find or create): on SQLite the next
    transaction begins IMMEDIATE, taking the write lock before its first read (waiting its turn
    under the busy timeout), so no commit can come between its read and its write."""
    begin_write(session)
    if session.get_bind().dialect.name == "sqlite":
        session.connection(execution_options={IMMEDIATE: True})

