"""Tokens: shown once, stored hashed, read tokens cannot write, reads closed by a setting."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import select

from app.api import security
from app.core.config import get_settings
from app.models import ApiToken

JOB = {"model": "mlp-digits", "workers": 2, "stop": {"steps": 2}}


def make_token(session, scope: str) -> str:
    _, secret = security.create_token(session, f"t-{scope}", scope)
    session.commit()
    return secret


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_token_is_stored_hashed_and_shown_once(client, session):
    created = client.post("/api/v1/tokens", json={"name": "ci", "scope": "write"})
    assert created.status_code == 201, created.text
    secret = created.json()["token"]
    row = session.scalar(select(ApiToken).where(ApiToken.name == "ci"))
    assert row.token_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in (row.token_hash, row.prefix) and secret.startswith(row.prefix)
    listed = client.get("/api/v1/tokens", headers=bearer(secret)).json()
    assert listed["count"] == 1 and "token" not in listed["data"][0]


def test_read_token_cannot_write(client, session):
    read = make_token(session, "read")
    denied = client.post("/api/v1/jobs", json=JOB, headers=bearer(read))
    assert denied.status_code == 403 and "write token" in denied.json()["detail"]
    assert client.post("/api/v1/tokens", json={"name": "x", "scope": "write"}, headers=bearer(read)).status_code == 403
    assert client.get("/api/v1/jobs", headers=bearer(read)).status_code == 200


def test_writes_need_a_token_once_one_exists(client, session):
    make_token(session, "write")
    anonymous = client.post("/api/v1/tokens", json={"name": "sneaky", "scope": "write"})
    assert anonymous.status_code == 401 and "write token" in anonymous.json()["detail"]
    bad = client.post("/api/v1/tokens", json={"name": "sneaky"}, headers=bearer("pb_not-a-real-token"))
    assert bad.status_code == 401


def test_revoked_token_stops_working(client, session):
    write = make_token(session, "write")
    other = make_token(session, "read")
    other_id = session.scalar(select(ApiToken.id).where(ApiToken.name == "t-read"))
    assert client.post(f"/api/v1/tokens/{other_id}/revoke", headers=bearer(write)).json()["revoked"] is True
    assert client.get("/api/v1/tokens/me", headers=bearer(other)).status_code == 401


def test_me_signs_the_browser_in(client, session):
    assert client.get("/api/v1/tokens/me").json()["authenticated"] is False
    write = make_token(session, "write")
    me = client.get("/api/v1/tokens/me", headers=bearer(write)).json()
    assert me == {"authenticated": True, "name": "t-write", "scope": "write", "read_auth": False, "write_auth": True}
    assert client.get("/api/v1/tokens/me", headers={"Authorization": "Basic abc"}).status_code == 401


@pytest.fixture
def read_auth(monkeypatch):
    monkeypatch.setenv("PIPEBOARD_READ_AUTH", "true")
    get_settings.cache_clear()
    yield
    monkeypatch.delenv("PIPEBOARD_READ_AUTH")
    get_settings.cache_clear()


def test_reads_closed_by_setting(client, session, read_auth):
    assert client.get("/api/v1/jobs").status_code == 401
    assert client.get("/api/v1/models").status_code == 401
    read = make_token(session, "read")
    assert client.get("/api/v1/jobs", headers=bearer(read)).status_code == 200
