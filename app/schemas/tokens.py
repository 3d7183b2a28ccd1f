"""API tokens and who is asking (`/tokens`, `/me`)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from pipeboard.app.schemas.common import NAME_PATTERN


Scope = Literal["read", "write", "admin"]
MAX_TOKEN_LIFETIME_S = 10 * 365 * 86400  # an expiry further out is no expiry


class TokenCreate(BaseModel):
    """A new token; `expires_in_s` or `expires_at` (not both) make it stop working at that time."""

    model_config = ConfigDict(strict=True, json_schema_extra={"examples": [
        {"name": "ci", "scope": "write", "expires_in_s": 30 * 86400},
        {"name": "viewer", "scope": "read"},
    ]})

    name: str = Field(pattern=NAME_PATTERN, description="What the token is for, e.g. ci.")
    scope: Scope = Field(default="read", description="`read`: GET routes; `write`: every route but token management; "
                                                     "`admin`: everything.")
    expires_in_s: int | None = Field(default=None, ge=1, le=MAX_TOKEN_LIFETIME_S,
                                     description="Seconds from now after which the token stops working.")
    expires_at: AwareDatetime | None = Field(default=None, strict=False,
                                             description="When the token stops working (ISO 8601 with a time zone).")

    @model_validator(mode="after")
    def _one_expiry(self) -> TokenCreate:
        if self.expires_in_s is not None and self.expires_at is not None:
            raise ValueError("give at most one of 'expires_in_s' or 'expires_at'")
        if self.expires_at is not None:
            ahead = self.expires_at - datetime.now(timezone.utc)
            if ahead <= timedelta(0):
                raise ValueError("expires_at: must be in the future")
            if ahead > timedelta(seconds=MAX_TOKEN_LIFETIME_S):
                raise ValueError(f"expires_at: at most {MAX_TOKEN_LIFETIME_S // 86400} days ahead")
        return self

    def expiry(self) -> datetime | None:
        """When the token expires, in UTC; None for never."""
        if self.expires_in_s is not None:
            return datetime.now(timezone.utc) + timedelta(seconds=self.expires_in_s)
        return self.expires_at.astimezone(timezone.utc) if self.expires_at is not None else None


class TokenPublic(BaseModel):
    id: int
    name: str
    scope: Scope
    prefix: str
    created_at: datetime | None = None
    last_used_at: datetime | None = None
    expires_at: datetime | None = Field(default=None, description="When it stops working; null: never.")
    revoked: bool = False


class TokenCreated(TokenPublic):
    token: str = Field(description="The secret, shown once; send it as `Authorization: Bearer <token>`.")


class Me(BaseModel):
    authenticated: bool
    name: str | None = None
    scope: Scope | None = None
    expires_at: datetime | None = Field(default=None, description="When the token stops working; null: never.")
    read_auth: bool = Field(description="Whether reads need a token on this server.")
    write_auth: bool = Field(description="Whether writes need a write token on this server: always, but with "
                                         "PIPEBOARD_AUTH=off (a loopback-only server).")
