"""The app's door (app/main.py): the Host allow-list, CORS only when configured, and 405s that
name every method of the resource."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from pipeboard.app.core.config import Settings
from tests.conftest import TEST_BASE_URL, app_on


def test_a_foreign_host_header_is_refused(anonymous):
    for host in ("evil.example", "attacker.test:8000", "127.0.0.1.nip.io"):
        refused = anonymous.get("/api/v1/jobs", headers={"Host": host})
        assert refused.status_code == 400 and "host" in refused.text.lower(), host
    for host in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST"):
        assert anonymous.get("/api/v1/health", headers={"Host": host}).status_code == 200, host


def test_the_bind_host_and_allowed_hosts_are_answered(session):
    settings = Settings(bind_host="10.0.0.7", allowed_hosts="pipeboard.example.com, *.lab.example")
    assert settings.trusted_hosts()[:4] == ["localhost", "127.0.0.1", "[::1]", "10.0.0.7"]
    with TestClient(app_on(session, settings), base_url=TEST_BASE_URL) as client:
        for host in ("10.0.0.7:8000", "pipeboard.example.com", "gpu1.lab.example"):
            assert client.get("/api/v1/health", headers={"Host": host}).status_code == 200, host
        assert client.get("/api/v1/health", headers={"Host": "example.com"}).status_code == 400


def test_a_wildcard_bind_answers_this_machines_names():
    import socket

    hosts = Settings(bind_host="0.0.0.0").trusted_hosts()
    assert socket.gethostname().lower() in hosts and "0.0.0.0" not in hosts


def test_no_cors_headers_unless_configured(anonymous, session):
    preflight = {"Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"}
    plain = anonymous.get("/api/v1/jobs", headers={"Origin": "https://elsewhere.example"})
    assert "access-control-allow-origin" not in plain.headers
    assert anonymous.options("/api/v1/jobs", headers=preflight).status_code == 405
    with TestClient(app_on(session, Settings(cors_origins="https://ci.example")), base_url=TEST_BASE_URL) as client:
        allowed = client.options("/api/v1/jobs", headers={**preflight, "Origin": "https://ci.example",
                                                           "Access-Control-Request-Headers": "authorization"})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "https://ci.example"
        other = client.get("/api/v1/jobs", headers={"Origin": "https://elsewhere.example"})
        assert "access-control-allow-origin" not in other.headers


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("OPTIONS", "/api/v1/jobs", "GET, HEAD, POST"),
    ("OPTIONS", "/api/v1/models", "GET, HEAD, POST"),
    ("OPTIONS", "/api/v1/profiles", "GET, HEAD, POST"),
    ("OPTIONS", "/api/v1/tokens", "GET, HEAD, POST"),
    ("DELETE", "/api/v1/jobs/3", "GET, HEAD"),
    ("PUT", "/api/v1/tokens/3/revoke", "POST"),
    ("POST", "/", "GET, HEAD"),
    ("POST", "/css/app.css", "GET, HEAD"),
])
def test_every_405_names_the_allowed_methods(anonymous, method, path, allow):
    answer = anonymous.request(method, path)
    assert answer.status_code == 405 and answer.headers["Allow"] == allow
    assert allow in answer.json()["detail"]


def test_head_answers_every_get_route_with_the_gets_head_and_no_body(client):
    paths = ["/api/v1/health", "/api/v1/jobs", "/api/v1/models", "/api/v1/schedules", "/api/v1/tokens/me", "/",
             "/css/app.css", "/api/v1/jobs/999", "/api/v1/jobs/999/trace"]
    for path in paths:
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code, path
        assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"], path
        if "content-length" in got.headers:
            assert head.headers["content-length"] == got.headers["content-length"], path
    assert client.head("/api/v1/jobs/999").status_code == 404
    assert client.head("/api/v1/jobs", headers={"Authorization": ""}).status_code == 401


def test_bad_settings_name_the_setting():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="auth_failure_limit"):
        Settings(auth_failure_limit="often")
    with pytest.raises(ValidationError, match="allowed_hosts"):
        Settings(allowed_hosts="a.*.example")
