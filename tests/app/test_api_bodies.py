"""Request bodies (app/api/bodies.py): the declared content type or 415, and a size limit or 413,
on the declared Content-Length and on the bytes that stream in."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from pipeboard.app.core.config import Settings
from tests.conftest import TEST_BASE_URL, app_on, bearer

JOB = {"model": "mlp-digits", "workers": 2, "stop": {"steps": 2}}


def test_a_json_route_refuses_other_content_types_with_415(client):
    body = json.dumps(JOB).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = {"Content-Type": content_type} if content_type else {}
        refused = client.post("/api/v1/jobs", content=body, headers=headers)
        assert refused.status_code == 415, (content_type, refused.text)
        assert "application/json" in refused.json()["detail"]
    assert client.post("/api/v1/jobs", content=body, headers={"Content-Type": "application/json; charset=utf-8"}).status_code == 201
    assert client.get("/api/v1/jobs").json()["count"] == 1  # the refused ones queued nothing


def test_an_upload_route_takes_multipart_only(client):
    refused = client.post("/api/v1/profiles/upload", json={"file": "node1 -- x -- forward=1"})
    assert refused.status_code == 415 and "multipart/form-data" in refused.json()["detail"]
    graph = (b"node1 -- Input -- forward_compute_time=0.0, backward_compute_time=0.0, activation_size=1000.0, parameter_size=0.0\n"
             b"node2 -- Linear -- forward_compute_time=2.5, backward_compute_time=5.0, activation_size=400.0, parameter_size=4096.0\n"
             b"\tnode1 -- node2\n")
    assert client.post("/api/v1/profiles/upload", files={"file": ("graph.txt", graph)}).status_code == 201


def test_an_oversize_declared_body_is_413_before_it_is_read(session, make_token):
    app = app_on(session, Settings(max_body_bytes=100))
    with TestClient(app, base_url=TEST_BASE_URL, headers=bearer(make_token())) as client:
        body = json.dumps({**JOB, "name": "x" * 200}).encode()
        refused = client.post("/api/v1/jobs", content=body, headers={"Content-Type": "application/json"})
        assert refused.status_code == 413, refused.text
        assert "PIPEBOARD_MAX_BODY_BYTES" in refused.json()["detail"] and str(len(body)) in refused.json()["detail"]
        assert client.post("/api/v1/jobs", json=JOB).status_code == 201  # 68 bytes


def test_an_oversize_streamed_body_is_413_as_it_comes_in(client):
    # No Content-Length (chunked): the bytes are counted as they arrive, against MAX_BODY_BYTES
    # (1 MiB by default).
    def chunks():
        yield b'{"model": "mlp-digits", "name": "'
        for _ in range(40):
            yield b"x" * 32768
        yield b'"}'

    refused = client.post("/api/v1/jobs", content=chunks(), headers={"Content-Type": "application/json"})
    assert refused.status_code == 413, refused.text
    assert "streamed body" in refused.json()["detail"] and "PIPEBOARD_MAX_BODY_BYTES" in refused.json()["detail"]
    assert client.get("/api/v1/jobs").json()["count"] == 0


def test_uploads_have_their_own_larger_limit(client):
    # Over MAX_BODY_BYTES (JSON) but within MAX_UPLOAD_BYTES: the upload route reads it (and
    # refuses it as a graph, not as too large).
    big = b"#" + b"x" * (2 * 1024 * 1024) + b"\n"
    answer = client.post("/api/v1/profiles/upload", files={"file": ("graph.txt", big)})
    assert answer.status_code == 422, answer.text
