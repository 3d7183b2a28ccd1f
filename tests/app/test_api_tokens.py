"""`/tokens`: shown once, stored hashed, managed by admin tokens only, with an optional expiry."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone

from sqlalchemy import select

from pipeboard.app.models import ApiToken
from tests.conftest import bearer


def test_token_is_stored_hashed_and_shown_once(client, session, make_token):
    admin = make_token("admin")
    created = client.post("/api/v1/tokens", json={"name": "ci", "scope": "write"}, headers=bearer(admin))
    assert created.status_code == 201, created.text
    secret = created.json()["token"]
    row = session.scalar(select(ApiToken).where(ApiToken.name == "ci"))
    assert row.token_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in (row.token_hash, row.prefix) and secret.startswith(row.prefix)
    listed = client.get("/api/v1/tokens", headers=bearer(admin)).json()
    assert {t["name"] for t in listed["data"]} == {"suite-writer", "t-admin", "ci"}
    assert listed["count"] == 3 and all("token" not in t for t in listed["data"])


def test_an_admin_token_can_mint_an_admin_token(client, make_token):
    admin = make_token("admin")
    created = client.post("/api/v1/tokens", json={"name": "second admin", "scope": "admin"}, headers=bearer(admin))
    assert created.status_code == 201, created.text
    again = client.post("/api/v1/tokens", json={"name": "third", "scope": "read"}, headers=bearer(created.json()["token"]))
    assert again.status_code == 201 and again.json()["scope"] == "read"


def test_write_and_read_tokens_cannot_manage_tokens(client, session, make_token):
    write, read = make_token("write", "w"), make_token("read", "r")
    other_id = session.scalar(select(ApiToken.id).where(ApiToken.name == "r"))
    for secret, scope in ((write, "write"), (read, "read")):
        minted = client.post("/api/v1/tokens", json={"name": "mine", "scope": "admin"}, headers=bearer(secret))
        assert minted.status_code == 403, minted.text
        assert f"scope '{scope}'" in minted.json()["detail"] and "admin token (scope 'admin')" in minted.json()["detail"]
        assert client.get("/api/v1/tokens", headers=bearer(secret)).status_code == 403
        assert client.post(f"/api/v1/tokens/{other_id}/revoke", headers=bearer(secret)).status_code == 403
    assert session.scalar(select(ApiToken.id).where(ApiToken.name == "mine")) is None
    assert session.get(ApiToken, other_id).revoked is False


def test_expiry_in_seconds_or_at_a_time(client, make_token):
    admin = bearer(make_token("admin"))
    before = datetime.now(timezone.utc)
    made = client.post("/api/v1/tokens", json={"name": "month", "scope": "write", "expires_in_s": 30 * 86400}, headers=admin)
    assert made.status_code == 201, made.text
    expires = datetime.fromisoformat(made.json()["expires_at"])
    assert before + timedelta(days=30) <= expires <= datetime.now(timezone.utc) + timedelta(days=30)
    at = (before + timedelta(hours=2)).isoformat()
    made = client.post("/api/v1/tokens", json={"name": "two hours", "expires_at": at}, headers=admin)
    assert made.status_code == 201 and datetime.fromisoformat(made.json()["expires_at"]) == datetime.fromisoformat(at)
    assert client.get("/api/v1/tokens/me", headers=bearer(made.json()["token"])).json()["expires_at"] == made.json()["expires_at"]


def test_bad_expiries_are_422_naming_the_field(client, make_token):
    admin = bearer(make_token("admin"))
    past = (datetime.now(timezone.utc) - timedelta(minutes=1)).isoformat()
    cases = [
        ({"name": "x", "expires_at": past}, "expires_at"),
        ({"name": "x", "expires_at": "2030-01-01T00:00:00"}, "expires_at"),  # no time zone
        ({"name": "x", "expires_in_s": 0}, "expires_in_s"),
        ({"name": "x", "expires_in_s": True}, "expires_in_s"),
        ({"name": "x", "expires_in_s": 60, "expires_at": "2030-01-01T00:00:00Z"}, "expires_in_s"),
        ({"name": "x", "scope": "root"}, "scope"),
    ]
    for body, field in cases:
        refused = client.post("/api/v1/tokens", json=body, headers=admin)
        assert refused.status_code == 422 and field in refused.json()["detail"], (body, refused.text)


def test_revoked_token_stops_working(client, session, make_token):
    admin = make_token("admin")
    other = make_token("read", "t-read")
    other_id = session.scalar(select(ApiToken.id).where(ApiToken.name == "t-read"))
    assert client.get("/api/v1/tokens/me", headers=bearer(other)).status_code == 200
    assert client.post(f"/api/v1/tokens/{other_id}/revoke", headers=bearer(admin)).json()["revoked"] is True
    gone = client.get("/api/v1/tokens/me", headers=bearer(other))
    assert gone.status_code == 401 and "revoked" in gone.json()["detail"]


def test_me_signs_the_browser_in(anonymous, make_token):
    signed_out = anonymous.get("/api/v1/tokens/me")
    assert signed_out.status_code == 401 and "needs an API token" in signed_out.json()["detail"]
    write = make_token("write")
    me = anonymous.get("/api/v1/tokens/me", headers=bearer(write)).json()
    assert me == {"authenticated": True, "name": "t-write", "user": "admin", "scope": "write", "expires_at": None,
                  "read_auth": True, "write_auth": True}
    assert anonymous.get("/api/v1/tokens/me", headers={"Authorization": "Basic abc"}).status_code == 401
