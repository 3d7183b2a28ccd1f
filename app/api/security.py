"""API tokens: created once, shown once, stored as a SHA-256 hash, sent as `Authorization: Bearer`.

Tokens are 256-bit random secrets, so a fast hash is the right tool (a slow password hash only
helps against guessable secrets). Scopes: `read` can call GET routes, `write` can call all.

Policy (documented in docs/api.md):
- writes need a write token once any token exists; a fresh install with no tokens is open so
  that `make up` works at once, and creating the first token (`pipeboard token create`) closes it;
- reads need a token only when the setting `PIPEBOARD_READ_AUTH` is true.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.api.deps import SessionDep
from app.core.config import get_settings
from app.models import ApiToken, TokenScope
from app.services.tx import begin_write

TOKEN_PREFIX = "pb_"
SCOPES = ("read", "write")


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_prefix(token: str) -> str:
    """What lists show so a person can tell tokens apart without seeing the secret."""
    return token[: len(TOKEN_PREFIX) + 6]


@dataclass(frozen=True)
class Principal:
    token_id: int | None
    name: str | None
    scope: str | None

    @property
    def authenticated(self) -> bool:
        return self.token_id is not None

    @property
    def can_write(self) -> bool:
        return self.scope == "write"


ANONYMOUS = Principal(None, None, None)


def create_token(session: Session, name: str, scope: str = "read") -> tuple[ApiToken, str]:
    """Store a new token's hash; returns the row and the secret (never stored)."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    secret = new_token()
    row = ApiToken(name=name, scope=TokenScope(scope), token_hash=hash_token(secret), prefix=token_prefix(secret))
    session.add(row)
    session.flush()
    return row, secret


def any_token_exists(session: Session) -> bool:
    return session.scalar(select(ApiToken.id).where(ApiToken.revoked.is_(False)).limit(1)) is not None


def bearer_from(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise HTTPException(401, "Authorization header must be 'Bearer <token>'", headers={"WWW-Authenticate": "Bearer"})
    return value.strip()


def authenticate(session: Session, secret: str | None) -> Principal:
    """The principal for a bearer secret; 401 for an unknown or revoked one."""
    if secret is None:
        return ANONYMOUS
    digest = hash_token(secret)
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest))
    # compare_digest on the stored hash keeps the comparison constant-time even if an index
    # lookup is not.
    principal = None if row is None or row.revoked or not hmac.compare_digest(row.token_hash, digest) else Principal(row.id, row.name, TokenScope(row.scope).value)
    begin_write(session)  # the lookup read; the update below must start a fresh transaction
    if principal is None:
        raise HTTPException(401, "invalid or revoked API token", headers={"WWW-Authenticate": "Bearer"})
    session.execute(update(ApiToken).where(ApiToken.id == principal.token_id).values(last_used_at=datetime.now(timezone.utc)))
    session.commit()
    return principal


def read_auth_enabled() -> bool:
    return get_settings().read_auth


def current_principal(request: Request, session: SessionDep) -> Principal:
    return authenticate(session, bearer_from(request))


def require_read(request: Request, session: SessionDep) -> Principal:
    principal = authenticate(session, bearer_from(request))
    if read_auth_enabled() and not principal.authenticated:
        raise HTTPException(401, "this server needs an API token for reads: send 'Authorization: Bearer <token>'", headers={"WWW-Authenticate": "Bearer"})
    return principal


def require_write(request: Request, session: SessionDep) -> Principal:
    principal = authenticate(session, bearer_from(request))
    exists = not principal.authenticated and any_token_exists(session)
    begin_write(session)  # leave the route a fresh transaction for its writes
    if principal.authenticated:
        if not principal.can_write:
            raise HTTPException(403, f"token {principal.name!r} has scope 'read'; this request needs a write token")
        return principal
    if exists:
        raise HTTPException(401, "writes need a write token: send 'Authorization: Bearer <token>'", headers={"WWW-Authenticate": "Bearer"})
    return principal


ReadAccess = Annotated[Principal, Depends(require_read)]
WriteAccess = Annotated[Principal, Depends(require_write)]
AnyPrincipal = Annotated[Principal, Depends(current_principal)]
