"""GET /api/v1/health, and the app's error handlers (no traceback ever reaches a client)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from pipeboard.app.core.config import VERSION, Settings, get_settings
from pipeboard.app.core.db import get_session, make_engine
from pipeboard.app.main import create_app
from pipeboard.app.models import WorkerHeartbeat, utcnow
from tests.conftest import TEST_BASE_URL


def test_health_reports_database_broker_and_no_workers(client: TestClient) -> None:
    response = client.get("/api/v1/health")
    assert response.status_code == 200
    assert response.json() == {"database": "ok", "broker": "ok", "workers": 0, "worker_devices": [], "version": VERSION}


def test_workers_are_counted_from_fresh_heartbeats(client: TestClient, session: Session) -> None:
    stale_after = get_settings().stale_after_seconds
    session.add_all([
        WorkerHeartbeat(hostname="a@h", pid=1, pool="threads", concurrency=2),
        WorkerHeartbeat(hostname="b@h", pid=2, pool="threads", concurrency=2),
        WorkerHeartbeat(hostname="gone@h", pid=3, pool="threads", concurrency=2,
                        seen_at=utcnow() - timedelta(seconds=stale_after + 5)),
    ])
    session.flush()
    body = client.get("/api/v1/health").json()
    assert body["workers"] == 2
    # no GPU reported by either (the first has not probed yet: None; a CPU host: [])
    assert body["worker_devices"] == [{"worker": "a@h", "host": "a@h", "devices": []},
                                      {"worker": "b@h", "host": "b@h", "devices": []}]


def test_health_lists_each_workers_gpus(client: TestClient, session: Session) -> None:
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85_520_809_984, "capability": "9.0",
           "cuda": "12.8", "driver": "12.8"}
    session.add_all([WorkerHeartbeat(hostname="pipeboard@gpu", host="gpu", pid=1, pool="prefork", concurrency=1,
                                     devices=[gpu, {**gpu, "index": 1}]),
                     WorkerHeartbeat(hostname="pipeboard@cpu", host="cpu", pid=2, pool="prefork", concurrency=1,
                                     devices=[])])
    session.flush()
    listed = {w["worker"]: w for w in client.get("/api/v1/health").json()["worker_devices"]}
    assert listed["pipeboard@gpu"] == {"worker": "pipeboard@gpu", "host": "gpu", "devices": [gpu, {**gpu, "index": 1}]}
    assert listed["pipeboard@cpu"]["devices"] == []


def test_unreachable_broker_is_named_and_503(client: TestClient, tmp_path: Path) -> None:
    client.app.dependency_overrides[get_settings] = lambda: Settings(
        data_dir=tmp_path, broker_url="redis://127.0.0.1:9/0", health_timeout_seconds=0.5
    )
    response = client.get("/api/v1/health")
    assert response.status_code == 503
    body = response.json()
    assert body["database"] == "ok"
    assert body["broker"].startswith("unreachable: ")
    assert body["workers"] == 0


def test_unreachable_database_is_named_and_503(tmp_path: Path) -> None:
    engine = make_engine("postgresql+psycopg://postgres@127.0.0.1:9/nothing", connect_args={"connect_timeout": 2})
    app = create_app()

    def dead_session():
        with Session(engine) as db_session:
            yield db_session

    app.dependency_overrides[get_session] = dead_session
    app.dependency_overrides[get_settings] = lambda: Settings(data_dir=tmp_path)
    response = TestClient(app, base_url=TEST_BASE_URL).get("/api/v1/health")
    assert response.status_code == 503
    assert response.json()["database"].startswith("unreachable: ")
    assert response.json()["broker"] == "ok"
    engine.dispose()


def app_with_route(path: str, endpoint) -> object:
    """A fresh app with one extra route, placed before the dashboard's catch-all mount at `/`."""
    app = create_app()
    app.add_api_route(path, endpoint, methods=["GET"])
    app.router.routes.insert(0, app.router.routes.pop())
    return app


def test_unexpected_errors_become_a_plain_500() -> None:
    def boom() -> None:
        raise RuntimeError("secret internals")

    app = app_with_route("/boom", boom)

    response = TestClient(app, base_url=TEST_BASE_URL, raise_server_exceptions=False).get("/boom")
    assert response.status_code == 500
    assert response.json() == {"detail": "internal error (RuntimeError)"}
    assert "secret" not in response.text and "Traceback" not in response.text


def test_validation_errors_name_the_field() -> None:
    def items(limit: int) -> dict:
        return {"limit": limit}

    app = app_with_route("/items", items)

    response = TestClient(app, base_url=TEST_BASE_URL).get("/items", params={"limit": "many"})
    assert response.status_code == 422
    assert response.json()["detail"].startswith("limit: ")
    assert response.json()["errors"][0]["loc"] == ["query", "limit"]


def test_openapi_describes_the_service() -> None:
    schema = TestClient(create_app(), base_url=TEST_BASE_URL).get("/openapi.json").json()
    assert schema["info"]["title"] == "pipeboard"
    assert schema["info"]["version"] == VERSION
    assert "/api/v1/health" in schema["paths"]
