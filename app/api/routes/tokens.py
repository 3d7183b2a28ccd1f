"""`/tokens`: API tokens (admin tokens only; also `pipeboard token create`), and `/tokens/me` for the browser's sign-in."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import Field
from sqlalchemy import func, select, update

from pipeboard.app.api.deps import SessionDep
from pipeboard.app.api.common import AUTH_RESPONSES, NOT_FOUND, Limit, Offset, ServiceRoute, TokenId
from pipeboard.app.api import security
from pipeboard.app.api.security import AdminAccess, ReadAccess
from pipeboard.app.models import ApiToken
from pipeboard.app.schemas import NAME_PATTERN, Me, Page, TokenCreate, TokenCreated, TokenPublic
from pipeboard.app.services import tokens
from pipeboard.app.services.errors import NotFound
from pipeboard.app.services.tokens import FIRST_ADMIN
from pipeboard.app.services.tx import begin_write

class UserTokenCreate(TokenCreate):
    user: str = Field(default=FIRST_ADMIN, pattern=NAME_PATTERN, description=(
        "Whose token it is (created if new): what it submits, registers and uploads is that user's, and it sees only "
        "that user's work (everyone's with scope `admin`). Default: the admin user."))


class WhoAmI(Me):
    user: str | None = Field(default=None, description="The user the token belongs to: whose work it sees and acts on.")


router = APIRouter(prefix="/tokens", tags=["tokens"], route_class=ServiceRoute, responses=AUTH_RESPONSES)


def public(row: ApiToken) -> TokenPublic:
    return TokenPublic(id=row.id, name=row.name, scope=row.scope.value, prefix=row.prefix, created_at=row.created_at,
                       last_used_at=row.last_used_at, expires_at=row.expires_at, revoked=row.revoked)


@router.post(
    "",
    response_model=TokenCreated,
    status_code=201,
    summary="Create an API token",
    description=(
        "Returns the secret once; only its SHA-256 hash is stored. `user`: whose token it is (created if new; "
        "default the admin user). `scope`: `read` (GET routes), `write` (every "
        "route but token management) or `admin` (everything). `expires_in_s` or `expires_at` (not both) make it "
        "stop working then (401 `expired`). Needs an admin token (403 for any other); on the server machine "
        "`pipeboard token create NAME --scope write` does the same without one."
    ),
)
def create_token(body: UserTokenCreate, session: SessionDep, _: AdminAccess) -> TokenCreated:
    row, secret = tokens.create_token(session, body.name, body.scope, expires_at=body.expiry(), user=body.user)
    session.commit()
    return TokenCreated(**public(row).model_dump(), token=secret)


@router.get(
    "",
    response_model=Page[TokenPublic],
    summary="List API tokens",
    description="Names, scopes, prefixes, last use and expiry; never the secrets. Needs an admin token.",
)
def list_tokens(session: SessionDep, _: AdminAccess, offset: Offset = 0, limit: Limit = 100) -> Page[TokenPublic]:
    count = session.scalar(select(func.count()).select_from(ApiToken)) or 0
    rows = session.scalars(select(ApiToken).order_by(ApiToken.id).offset(offset).limit(limit)).all()
    return Page(data=[public(r) for r in rows], count=count)


@router.get(
    "/me",
    response_model=WhoAmI,
    summary="Who am I",
    description=(
        "The browser's sign-in check: send `Authorization: Bearer <token>`; 200 with the token's name, scope and "
        "expiry, or 401 without a token or for an unknown, revoked or expired one. `read_auth` and `write_auth` say "
        "whether this server needs a token for reads and for writes (both, unless PIPEBOARD_AUTH=off)."
    ),
)
def me(principal: ReadAccess, request: Request) -> WhoAmI:
    return WhoAmI(authenticated=principal.authenticated, name=principal.name, user=principal.user, scope=principal.scope,
              expires_at=principal.expires_at, read_auth=security.read_auth_enabled(request),
              write_auth=security.app_settings(request).auth)


@router.post(
    "/{token_id}/revoke",
    response_model=TokenPublic,
    summary="Revoke an API token",
    description="The token stops working at once. Needs an admin token.",
    responses=NOT_FOUND,
)
def revoke_token(token_id: TokenId, session: SessionDep, _: AdminAccess) -> TokenPublic:
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFound("token", token_id)
    begin_write(session)
    session.execute(update(ApiToken).where(ApiToken.id == token_id).values(revoked=True))
    session.commit()
    session.refresh(row)
    return public(row)
