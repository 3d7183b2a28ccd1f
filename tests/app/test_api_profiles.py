"""Profiles: upload graph.txt or JSON (size-limited), read back per-layer rows, profile as a job."""

from __future__ import annotations

import pytest

from pipeboard.app.core.config import get_settings
from tests.shared_data import graph_txt

GRAPH = """node1 -- Input -- forward_compute_time=0.0, backward_compute_time=0.0, activation_size=1000.0, parameter_size=0.0
node2 -- Linear -- forward_compute_time=2.5, backward_compute_time=5.0, activation_size=400.0, parameter_size=4096.0
node3 -- Linear -- forward_compute_time=1.5, backward_compute_time=3.0, activation_size=40.0, parameter_size=1024.0
\tnode1 -- node2
\tnode2 -- node3
"""


def upload(client, content: bytes, filename: str = "graph.txt"):
    return client.post("/api/v1/profiles/upload", files={"file": (filename, content, "text/plain")})


def test_upload_graph_txt_and_get_rows(client):
    created = upload(client, GRAPH.encode())
    assert created.status_code == 201, created.text
    body = created.json()
    assert [row["name"] for row in body["layers"]] == ["node1", "node2", "node3"]
    assert body["total_forward_ms"] == pytest.approx(4.0) and body["total_backward_ms"] == pytest.approx(8.0)
    full = client.get(f"/api/v1/profiles/{body['id']}", params={"include_data": True}).json()
    assert full["data"]["format"] == "pipeboard.profile" and full["layers"][1]["parameter_bytes"] == 4096.0
    # the stored JSON uploads again as a profile JSON
    import json

    again = upload(client, json.dumps(full["data"]).encode(), "p.json")
    assert again.status_code == 201 and len(again.json()["layers"]) == 3
    assert client.get("/api/v1/profiles").json()["count"] == 2


def test_shared_pipedream_profile_uploads(client):
    body = upload(client, graph_txt("resnet18").read_bytes()).json()
    assert len(body["layers"]) > 10 and body["total_forward_ms"] > 0


def test_bad_uploads_name_the_field(client, monkeypatch):
    bad_line = upload(client, b"node1 -- Input -- forward_compute_time=abc, backward_compute_time=0, activation_size=1, parameter_size=0\n")
    assert bad_line.status_code == 422 and bad_line.json()["detail"].startswith("file:") and "line 1" in bad_line.json()["detail"]
    assert upload(client, b"").status_code == 422
    assert upload(client, b"\xff\xfe\x00binary").status_code == 422
    monkeypatch.setenv("PIPEBOARD_MAX_UPLOAD_BYTES", "100")
    get_settings.cache_clear()
    try:
        too_big = upload(client, GRAPH.encode())
        assert too_big.status_code == 413 and "limit of 100 bytes" in too_big.json()["detail"]
    finally:
        monkeypatch.delenv("PIPEBOARD_MAX_UPLOAD_BYTES")
        get_settings.cache_clear()
    assert client.get("/api/v1/profiles/424242").status_code == 404


def test_profile_request_queues_a_profile_job(client):
    queued = client.post("/api/v1/profiles", json={"model": "mlp-digits", "batch_size": 16})
    assert queued.status_code == 202, queued.text
    assert queued.json()["status"] == "queued" and queued.json()["spec"]["model"]["name"] == "mlp-digits"
    listed = client.get("/api/v1/jobs", params={"kind": "profile"}).json()
    assert listed["count"] == 1
    unknown = client.post("/api/v1/profiles", json={"model": "nope"})
    assert unknown.status_code == 422 and unknown.json()["detail"].startswith("model:")
