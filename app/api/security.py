"""Who may call what: bearer tokens (app/services/tokens.py), checked on every request that needs one.

Policy (documented in docs/api.md), closed from the first start:
- every write needs a `write` or `admin` token, on a fresh install too: `pipeboard up` creates an
  admin token when the database has none that works and prints it once, in a sign-in URL;
- minting, listing and revoking tokens over HTTP needs an `admin` token (on the server machine,
  `pipeboard token create` writes the database directly);
- every route but `/health` needs a token, reads included (a read-scope token suffices for them):
  `api_router` declares `require_token` on every router but health's, the event stream and the
  trace download included (`PIPEBOARD_READ_AUTH=false` opens reads again, to anyone who reaches
  the server, and shows them everything);
- an unknown, revoked or expired token is a 401; failed authentications are counted per client
  address and, past `PIPEBOARD_AUTH_FAILURE_LIMIT`, requests that carry a token get 429 with
  Retry-After until the window has room (requests that authenticate add nothing to the count);
- `PIPEBOARD_AUTH=off` lets every request through, only on a loopback-bound server: the API refuses
  to start otherwise (app/main.py), and a request that arrives on another address is refused here.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from pipeboard.app.api.deps import SessionDep
from pipeboard.app.core.config import Settings
from pipeboard.app.models import ApiToken, TokenScope, User
from pipeboard.app.services.tokens import hash_token, utcnow
from pipeboard.app.services.tx import begin_write

WRITE_SCOPES = ("write", "admin")
SAFE_METHODS = ("GET", "HEAD")
HOW_TO_GET_ONE = "an admin runs `pipeboard token create NAME --scope write --user YOU` on the server machine"

# Declares bearer authentication in the OpenAPI document (and the Authorize button of /docs) on the
# routes that need a token; the header itself is read by `bearer_from`, so that a malformed one is
# a 401 on every route.
bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description="An API token (`pb_...`), sent as `Authorization: Bearer <token>`. Scopes: read, write, admin.",
)


@dataclass(frozen=True)
class Principal:
    token_id: int | None
    name: str | None  # the token's
    scope: str | None
    expires_at: datetime | None = None
    user_id: int | None = None  # whose work it sees and acts on (all of it with scope admin)
    user: str | None = None

    @property
    def authenticated(self) -> bool:
        return self.token_id is not None

    @property
    def can_write(self) -> bool:
        return self.scope in WRITE_SCOPES

    @property
    def is_admin(self) -> bool:
        return self.scope == "admin"


ANONYMOUS = Principal(None, None, None)


class FailureLimiter:
    """Failed authentications per client address, with the `limits` library (a moving window in
    this process's memory: each API process counts its own)."""

    NAMESPACE = "pipeboard-auth-failures"

    def __init__(self, rate: str) -> None:
        from limits import parse_many, storage, strategies

        self.rates = parse_many(rate)
        self.limiter = strategies.MovingWindowRateLimiter(storage.MemoryStorage())

    def retry_after(self, client: str) -> int | None:
        """Whole seconds until `client` may try again; None while it has failures to spare."""
        waits = []
        for rate in self.rates:
            if not self.limiter.test(rate, self.NAMESPACE, client):
                reset_at, _ = self.limiter.get_window_stats(rate, self.NAMESPACE, client)
                waits.append(max(1, math.ceil(reset_at - time.time())))
        return max(waits) if waits else None

    def failed(self, client: str) -> None:
        for rate in self.rates:
            self.limiter.hit(rate, self.NAMESPACE, client)


def failure_limiter(request: Request) -> FailureLimiter:
    """The app's limiter: one per `create_app()`."""
    return request.app.state.auth_failures


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def unauthorized(message: str, invalid: bool = False) -> HTTPException:
    challenge = 'Bearer error="invalid_token"' if invalid else "Bearer"
    return HTTPException(401, message, headers={"WWW-Authenticate": challenge})


def bearer_from(request: Request) -> str | None:
    """The token in `Authorization: Bearer <token>`; None without the header; ValueError if malformed."""
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise ValueError("Authorization header must be 'Bearer <token>'")
    return value.strip()


def principal_of(request: Request, session: Session) -> Principal:
    """Who sent this request: ANONYMOUS without a token; 401 for a bad one, 429 past the failure limit."""
    if not request.headers.get("authorization"):
        return ANONYMOUS
    limiter, client = failure_limiter(request), client_address(request)
    wait = limiter.retry_after(client)
    if wait is not None:
        raise HTTPException(429, f"too many failed authentications from {client}: try again in {wait} s",
                            headers={"Retry-After": str(wait)})
    try:
        secret = bearer_from(request)
    except ValueError as exc:
        limiter.failed(client)
        raise unauthorized(str(exc)) from None
    digest = hash_token(secret)
    found = session.execute(select(ApiToken, User.name).join(User, User.id == ApiToken.user_id)
                            .where(ApiToken.token_hash == digest)).first()
    row, user = found if found is not None else (None, None)
    now = utcnow()
    principal = None
    # compare_digest on the stored hash keeps the comparison constant-time even if an index
    # lookup is not.
    if row is None or row.revoked or not hmac.compare_digest(row.token_hash, digest):
        problem = "invalid or revoked API token"
    elif row.expires_at is not None and row.expires_at <= now:
        problem = f"API token {row.name!r} expired at {row.expires_at.isoformat(timespec='seconds')}"
    else:
        principal = Principal(row.id, row.name, TokenScope(row.scope).value, row.expires_at, row.user_id, user)
    begin_write(session)  # the lookup read; the update below must start a fresh transaction
    if principal is None:
        limiter.failed(client)
        raise unauthorized(problem, invalid=True)
    session.execute(update(ApiToken).where(ApiToken.id == principal.token_id).values(last_used_at=now))
    session.commit()
    return principal


def app_settings(request: Request) -> Settings:
    """The settings the app was made with (`create_app(settings)`)."""
    return request.app.state.settings


def read_auth_enabled(request: Request) -> bool:
    return app_settings(request).read_auth


def auth_enabled(request: Request) -> bool:
    """False only with PIPEBOARD_AUTH=off, and then only for a request that came in on loopback."""
    if app_settings(request).auth:
        return True
    server = request.scope.get("server")
    host = server[0] if server else None
    if server and server[1] is not None and not is_loopback_address(host):
        raise HTTPException(403, f"authentication is off (PIPEBOARD_AUTH=off), which serves loopback only; "
                                 f"this request came in on {host}")
    return False


def is_loopback_address(host: str | None) -> bool:
    if host is None or host.lower() == "localhost":
        return host is not None
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def current_principal(request: Request, session: SessionDep) -> Principal:
    """Who sent the request, looked up once per request: FastAPI caches a dependency within one
    request, so the router-wide `require_token` and a route's write or admin check share it (one
    lookup, one failure counted for a bad token)."""
    return principal_of(request, session)


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


def require_token(
    request: Request, principal: CurrentPrincipal,
    _declared: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)],
) -> Principal:
    """Any working token (read scope is enough); declared on the routers (app/api/router.py).
    Without one, a request that changes something hears which scope it would need."""
    if auth_enabled(request) and read_auth_enabled(request) and not principal.authenticated:
        if request.method not in SAFE_METHODS:
            raise unauthorized(f"this request needs a write token (scope 'write' or 'admin'): send "
                               f"'Authorization: Bearer <token>' ({HOW_TO_GET_ONE})")
        raise unauthorized(f"this request needs an API token (any scope): send 'Authorization: Bearer <token>' "
                           f"({HOW_TO_GET_ONE})")
    return principal



def require_write(
    request: Request, session: SessionDep, principal: CurrentPrincipal,
    _declared: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)],
) -> Principal:
    begin_write(session)  # leave the route a fresh transaction for its writes
    if not auth_enabled(request):
        return principal
    if not principal.authenticated:
        raise unauthorized(f"this request needs a write token (scope 'write' or 'admin'): send "
                           f"'Authorization: Bearer <token>' ({HOW_TO_GET_ONE})")
    if not principal.can_write:
        raise HTTPException(403, f"token {principal.name!r} has scope {principal.scope!r}; this request needs a write "
                                 "token (scope 'write' or 'admin')")
    return principal


def require_admin(
    request: Request, session: SessionDep, principal: CurrentPrincipal,
    _declared: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)],
) -> Principal:
    begin_write(session)
    if not auth_enabled(request):
        return principal
    if not principal.authenticated:
        raise unauthorized("token management needs an admin token (scope 'admin'): send 'Authorization: Bearer "
                           "<token>' (`pipeboard token create NAME --scope admin` on the server machine prints one)")
    if not principal.is_admin:
        raise HTTPException(403, f"token {principal.name!r} has scope {principal.scope!r}; token management needs "
                                 "an admin token (scope 'admin')")
    return principal


ReadAccess = Annotated[Principal, Depends(require_token)]
WriteAccess = Annotated[Principal, Depends(require_write)]
AdminAccess = Annotated[Principal, Depends(require_admin)]
