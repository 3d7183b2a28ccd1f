"""API tokens: created once, shown once, stored as a SHA-256 hash.

Tokens are 256-bit random secrets, so a fast hash is the right tool (a slow password hash only
helps against guessable secrets). Used by the API (`POST /tokens`, app/api/security.py checks
them) and, on the server machine, by `pipeboard token create` and `pipeboard up`'s first start,
which write the database directly.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime, timezone

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session

from pipeboard.app.models import ApiToken, TokenScope, User
from pipeboard.app.schemas import MAX_TOKEN_LIFETIME_S
from pipeboard.app.services.tx import begin_read_write

TOKEN_PREFIX = "pb_"
SCOPES = tuple(s.value for s in TokenScope)  # read, write, admin
FIRST_ADMIN = "admin"  # the name of the token `pipeboard up` creates on a first start, and of its user
DURATION = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_prefix(token: str) -> str:
    """What lists show so a person can tell tokens apart without seeing the secret."""
    return token[: len(TOKEN_PREFIX) + 6]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def parse_duration(text: str) -> int:
    """`30d`, `12h`, `90m`, `45s`, `2w` or plain seconds -> seconds; ValueError naming the format."""
    match = DURATION.match(text)
    seconds = int(match.group(1)) * UNIT_SECONDS[match.group(2)] if match else 0
    if seconds < 1:
        raise ValueError(f"{text!r} is not a duration such as 30d, 12h, 90m, 45s or 2w")
    if seconds > MAX_TOKEN_LIFETIME_S:
        raise ValueError(f"{text!r} is more than {MAX_TOKEN_LIFETIME_S // 86400} days")
    return seconds


def user_named(session: Session, name: str) -> User:
    """The user called `name`, created if new (a token is what brings a user into being)."""
    row = session.scalar(select(User).where(User.name == name))
    if row is None:
        row = User(name=name)
        session.add(row)
        session.flush()
    return row


def create_token(session: Session, name: str, scope: str = "read", expires_at: datetime | None = None,
                 user: str = FIRST_ADMIN) -> tuple[ApiToken, str]:
    """Store a new token of `user` (created if new; by default the admin's own); returns the row
    and the secret (never stored). The caller commits."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if expires_at is not None and expires_at.tzinfo is None:
        raise ValueError("expires_at must carry a time zone")
    begin_read_write(session)  # the user is read, then the token written
    owner = user_named(session, user)
    secret = new_token()
    row = ApiToken(name=name, scope=TokenScope(scope), token_hash=hash_token(secret), prefix=token_prefix(secret),
                   expires_at=expires_at, user_id=owner.id)
    session.add(row)
    session.flush()
    return row, secret


def usable(scope: str | None = None, now: datetime | None = None) -> Select:
    """A query for tokens that still work (not revoked, not expired), of `scope` if given."""
    now = now or utcnow()
    query = select(ApiToken.id).where(ApiToken.revoked.is_(False), or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > now))
    return query.where(ApiToken.scope == TokenScope(scope)) if scope else query


def has_usable_admin(session: Session) -> bool:
    return session.scalar(usable("admin").limit(1)) is not None


def ensure_first_admin(session: Session) -> str | None:
    """A first start: when no admin token works, create one named `admin` and return its secret
    (to be shown once); None when an admin token exists already."""
    if has_usable_admin(session):
        return None
    _, secret = create_token(session, FIRST_ADMIN, "admin")
    session.commit()
    return secret
