"""Who may call what (app/api/security.py): closed from the first start, scopes, expiry,
revocation, the failed-authentication limit, and PIPEBOARD_AUTH=off on loopback only."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from pipeboard.app.core.config import Settings
from pipeboard.app.main import InsecureConfiguration, create_app
from pipeboard.app.models import ApiToken, Job, Model
from tests.conftest import ROOT, TEST_BASE_URL, app_on, bearer

JOB = {"model": "mlp-digits", "workers": 2, "stop": {"steps": 2}}


def code_running_model(marker: Path) -> dict:
    """The body that ran a shell command on a server open to strangers (CVE-2023-48022's kind)."""
    return {"name": "x", "source": "subprocess:getoutput", "config": {"cmd": f"id > {marker}"}}


def test_a_fresh_server_runs_nothing_for_strangers(anonymous, session, tmp_path: Path):
    assert session.scalar(select(func.count()).select_from(ApiToken)) == 0  # a first start: no token yet
    marker = tmp_path / "ran"
    model = anonymous.post("/api/v1/models", json=code_running_model(marker))
    assert model.status_code == 401, model.text
    assert "write token" in model.json()["detail"] and model.headers["WWW-Authenticate"] == "Bearer"
    minted = anonymous.post("/api/v1/tokens", json={"name": "mine", "scope": "admin"})
    assert minted.status_code == 401 and "admin token" in minted.json()["detail"]
    assert anonymous.post("/api/v1/jobs", json=JOB).status_code == 401
    assert not marker.exists()
    assert session.scalar(select(func.count()).select_from(ApiToken)) == 0
    assert session.scalar(select(func.count()).select_from(Model)) == 0
    assert session.scalar(select(func.count()).select_from(Job)) == 0


def test_a_read_token_runs_nothing_either(anonymous, session, make_token, tmp_path: Path):
    read = bearer(make_token("read"))
    marker = tmp_path / "ran"
    model = anonymous.post("/api/v1/models", json=code_running_model(marker), headers=read)
    assert model.status_code == 403 and "needs a write token (scope 'write' or 'admin')" in model.json()["detail"]
    minted = anonymous.post("/api/v1/tokens", json={"name": "mine", "scope": "admin"}, headers=read)
    assert minted.status_code == 403 and "scope 'admin'" in minted.json()["detail"]
    assert anonymous.post("/api/v1/jobs", json=JOB, headers=read).status_code == 403
    assert anonymous.get("/api/v1/jobs", headers=read).status_code == 200
    assert not marker.exists()
    assert session.scalar(select(func.count()).select_from(Model)) == 0
    assert session.scalar(select(func.count()).select_from(Job)) == 0


def test_write_and_admin_tokens_write(anonymous, make_token):
    for scope in ("write", "admin"):
        submitted = anonymous.post("/api/v1/jobs", json=JOB, headers=bearer(make_token(scope, f"t-{scope}")))
        assert submitted.status_code == 201, submitted.text


def test_an_expired_token_is_401(anonymous, make_token):
    expired = make_token("admin", "old", expires_at=datetime.now(timezone.utc) - timedelta(seconds=1))
    for method, path in (("GET", "/api/v1/tokens/me"), ("POST", "/api/v1/tokens"), ("GET", "/api/v1/jobs")):
        refused = anonymous.request(method, path, json={"name": "x"} if method == "POST" else None, headers=bearer(expired))
        assert refused.status_code == 401, (path, refused.text)
        assert "expired" in refused.json()["detail"] and "invalid_token" in refused.headers["WWW-Authenticate"]
    later = make_token("read", "later", expires_at=datetime.now(timezone.utc) + timedelta(hours=1))
    assert anonymous.get("/api/v1/tokens/me", headers=bearer(later)).status_code == 200


def test_a_revoked_token_fails_at_once(anonymous, session, make_token):
    write = make_token("write", "soon revoked")
    assert anonymous.post("/api/v1/jobs", json=JOB, headers=bearer(write)).status_code == 201
    row = session.scalar(select(ApiToken).where(ApiToken.name == "soon revoked"))
    row.revoked = True
    session.commit()
    refused = anonymous.post("/api/v1/jobs", json=JOB, headers=bearer(write))
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]


def test_repeated_bad_tokens_get_429_with_retry_after(anonymous, make_token):
    good = bearer(make_token("read"))
    for _ in range(30):  # authenticating adds nothing to the count
        assert anonymous.get("/api/v1/tokens/me", headers=good).status_code == 200
    for attempt in range(10):  # PIPEBOARD_AUTH_FAILURE_LIMIT's default: 10/minute
        assert anonymous.get("/api/v1/jobs", headers=bearer(f"pb_guess{attempt}")).status_code == 401
    limited = anonymous.get("/api/v1/jobs", headers=bearer("pb_guess10"))
    assert limited.status_code == 429 and "too many failed authentications" in limited.json()["detail"]
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    # While limited, a token is not even looked up (so guessing learns nothing); no token is the plain 401.
    assert anonymous.get("/api/v1/tokens/me", headers=good).status_code == 429
    assert anonymous.get("/api/v1/jobs").status_code == 401


def test_the_failure_limit_is_a_setting(session):
    with TestClient(app_on(session, Settings(auth_failure_limit="2/hour")), base_url=TEST_BASE_URL) as stranger:
        assert [stranger.get("/api/v1/jobs", headers=bearer("pb_x")).status_code for _ in range(3)] == [401, 401, 429]
        assert int(stranger.get("/api/v1/jobs", headers=bearer("pb_x")).headers["Retry-After"]) > 60


def test_auth_off_lets_requests_through_on_loopback(session):
    with TestClient(app_on(session, Settings(auth=False)), base_url=TEST_BASE_URL) as local:
        assert local.post("/api/v1/jobs", json=JOB).status_code == 201
        assert local.get("/api/v1/tokens/me").json()["write_auth"] is False


def test_auth_off_still_refuses_a_request_that_came_in_elsewhere(session):
    # The API refuses to start like this; should it be served on another address anyway
    # (`uvicorn --host 0.0.0.0` without BIND_HOST), requests arriving there are refused.
    settings = Settings(auth=False, allowed_hosts="10.1.2.3")
    with TestClient(app_on(session, settings), base_url="http://10.1.2.3") as remote:
        refused = remote.post("/api/v1/jobs", json=JOB)
        assert refused.status_code == 403 and "PIPEBOARD_AUTH=off" in refused.json()["detail"]


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "192.168.1.20", "example.com"])
def test_auth_off_is_refused_unless_bound_to_loopback(bind: str):
    with pytest.raises(InsecureConfiguration, match="PIPEBOARD_AUTH: off is allowed only"):
        create_app(Settings(auth=False, bind_host=bind))
    for loopback in ("127.0.0.1", "::1", "localhost"):
        create_app(Settings(auth=False, bind_host=loopback))


def test_uvicorn_refuses_to_load_the_app_with_auth_off_on_a_public_address(tmp_path: Path):
    env = {**os.environ, "PIPEBOARD_DATA_DIR": str(tmp_path), "PIPEBOARD_AUTH": "off", "PIPEBOARD_BIND_HOST": "0.0.0.0"}
    result = subprocess.run([sys.executable, "-c", "import pipeboard.app.main"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "pipeboard: PIPEBOARD_AUTH: off is allowed only when the server binds to loopback (127.0.0.1, ::1, localhost), "
        "not 0.0.0.0: anyone who reaches it could run code"]


def test_reads_need_a_token_by_default(anonymous, make_token):
    for path in ("/api/v1/jobs", "/api/v1/models", "/api/v1/tokens/me", "/api/v1/jobs/1/events", "/api/v1/jobs/1/trace"):
        refused = anonymous.get(path)
        assert refused.status_code == 401, path
        assert refused.json()["detail"].startswith("this request needs an API token (any scope)")
        assert refused.headers["WWW-Authenticate"] == "Bearer"
    read = bearer(make_token("read"))
    assert anonymous.get("/api/v1/jobs", headers=read).status_code == 200
    assert anonymous.get("/api/v1/tokens/me", headers=read).json()["read_auth"] is True
    assert anonymous.get("/api/v1/health").status_code == 200


def test_no_route_but_health_answers_without_a_token(anonymous):
    """Every operation the API documents, with its path parameters filled: 401, /health alone
    answers; so a router or route added later without `require_token` fails here."""
    samples = {"job_id": "1", "profile_id": "1", "plan_id": "1", "token_id": "1", "model_ref": "m",
               "sha256": "a" * 64}
    checked = 0
    for path, operations in anonymous.app.openapi()["paths"].items():
        concrete = path
        for name, value in samples.items():
            concrete = concrete.replace("{" + name + "}", value)
        for method in operations:
            answer = anonymous.request(method.upper(), concrete)
            expected = 200 if path == "/api/v1/health" else 401
            assert answer.status_code == expected, (method, path, answer.status_code, answer.text)
            checked += 1
    assert checked > 20


def test_reads_open_again_only_when_configured(session, make_token):
    with TestClient(app_on(session, Settings(read_auth=False)), base_url=TEST_BASE_URL) as stranger:
        assert stranger.get("/api/v1/jobs").status_code == 200
        assert stranger.post("/api/v1/jobs", json=JOB).status_code == 401


