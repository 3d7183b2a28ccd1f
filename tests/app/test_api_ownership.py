"""Users own their work (app/api/ownership.py), through the API: alice's jobs, plans, models, contexts
and profiles are hers; bob neither sees nor acts on them (404, as for what does not exist, never a 403
that would say it is there); an admin token sees and acts on everyone's."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pipeboard.app.services.contexts import pack
from pipeboard.app.services.tokens import create_token
from tests.conftest import bearer

JOB = {"model": "mlp-digits", "workers": 2, "stop": {"steps": 2}}
TASK = "def make_task(data=None):\n    raise RuntimeError('never run here')\n"
GRAPH = ("node1 -- Input -- forward_compute_time=0.0, backward_compute_time=0.0, activation_size=10.0, parameter_size=0.0\n"
         "node2 -- Linear -- forward_compute_time=2.5, backward_compute_time=5.0, activation_size=4.0, parameter_size=8.0\n"
         "node3 -- Linear -- forward_compute_time=2.5, backward_compute_time=5.0, activation_size=4.0, parameter_size=8.0\n"
         "\tnode1 -- node2\n\tnode2 -- node3\n")  # a profile file, as PipeDream's profiler writes it


@pytest.fixture
def users(session):
    """Write tokens of alice and bob, and an admin token, as Authorization headers."""
    made = {}
    for who, scope in (("alice", "write"), ("bob", "write"), ("root", "admin")):
        _, secret = create_token(session, f"{who}-laptop", scope, user=who if who != "root" else "admin")
        made[who] = bearer(secret)
    session.commit()
    return made


def upload(client, headers, folder: Path, files: dict[str, str]) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    answer = client.post("/api/v1/contexts", headers=headers,
                         files={"file": ("project.tar.gz", io.BytesIO(pack(folder)), "application/gzip")})
    assert answer.status_code in (200, 201), answer.text
    return answer.json() | {"status": answer.status_code}


def test_each_user_sees_and_acts_on_only_their_jobs_and_admin_on_all(anonymous, users):
    submitted = anonymous.post("/api/v1/jobs", json=JOB, headers=users["alice"])
    assert submitted.status_code == 201, submitted.text
    job = submitted.json()["id"]
    assert anonymous.get("/api/v1/jobs", headers=users["alice"]).json()["count"] == 1
    assert anonymous.get("/api/v1/jobs", headers=users["bob"]).json() == {"data": [], "count": 0}
    assert anonymous.get("/api/v1/jobs", headers=users["root"]).json()["count"] == 1
    for method, path in (("GET", ""), ("GET", "/timeline"), ("GET", "/metrics"), ("GET", "/trace"),
                         ("GET", "/events"), ("HEAD", ""), ("POST", "/cancel"), ("POST", "/retry")):
        answer = anonymous.request(method, f"/api/v1/jobs/{job}{path}", headers=users["bob"])
        assert answer.status_code == 404, (method, path, answer.text)
        if method != "HEAD":
            assert answer.json()["detail"] == f"job {job} not found"
    # the same answer as a job that does not exist
    assert anonymous.post("/api/v1/jobs/999999/cancel", headers=users["bob"]).json()["detail"] == "job 999999 not found"
    assert anonymous.get(f"/api/v1/jobs/{job}", headers=users["alice"]).json()["status"] == "queued"
    assert anonymous.get(f"/api/v1/jobs/{job}/trace", headers=users["alice"]).status_code == 200
    assert anonymous.post(f"/api/v1/jobs/{job}/cancel", headers=users["alice"]).json()["status"] == "cancelled"
    assert anonymous.post(f"/api/v1/jobs/{job}/retry", headers=users["root"]).status_code == 200


def test_models_and_contexts_are_their_owners(anonymous, users, tmp_path: Path):
    context = upload(anonymous, users["alice"], tmp_path / "alice", {"mytask.py": TASK, "tokens.txt": "1 2\n"})
    sha = context["sha256"]
    assert context["status"] == 201
    model = anonymous.post("/api/v1/models", headers=users["alice"],
                           json={"name": "alices", "source": "mytask.py:make_task", "context": sha})
    assert model.status_code == 202, model.text
    assert anonymous.get("/api/v1/models/alices", headers=users["alice"]).status_code == 200
    assert anonymous.get(f"/api/v1/contexts/{sha}", headers=users["alice"]).status_code == 200

    # bob: not found, not listed, not usable, not deletable; the same answers as for nothing
    assert anonymous.get("/api/v1/models/alices", headers=users["bob"]).json()["detail"] == "model 'alices' not found"
    assert "alices" not in {m["name"] for m in anonymous.get("/api/v1/models", headers=users["bob"]).json()["data"]}
    assert anonymous.get(f"/api/v1/contexts/{sha}", headers=users["bob"]).status_code == 404
    on_hers = anonymous.post("/api/v1/models", headers=users["bob"],
                             json={"name": "bobs", "source": "mytask.py:make_task", "context": sha})
    nothing = anonymous.post("/api/v1/models", headers=users["bob"],
                             json={"name": "bobs", "source": "mytask.py:make_task", "context": "0" * 64})
    assert on_hers.status_code == nothing.status_code == 422
    assert on_hers.json()["detail"] == f"context: no code context {sha} (upload it first: POST /contexts)"
    job = anonymous.post("/api/v1/jobs", json={**JOB, "model": "alices"}, headers=users["bob"])
    assert job.status_code == 422 and "unknown model 'alices'" in job.json()["detail"], job.text
    assert anonymous.delete("/api/v1/models/alices", headers=users["bob"]).status_code == 404
    assert anonymous.delete(f"/api/v1/contexts/{sha}", headers=users["bob"]).status_code == 404
    assert anonymous.post(f"/api/v1/contexts/{sha}/share", json={"user": "bob"}, headers=users["bob"]).status_code == 404

    # the admin sees it all
    assert anonymous.get("/api/v1/models/alices", headers=users["root"]).status_code == 200
    assert anonymous.get(f"/api/v1/contexts/{sha}", headers=users["root"]).status_code == 200

    # bob uploading the same bytes is told nothing of alice's: a 201, then it is his too
    again = upload(anonymous, users["bob"], tmp_path / "bob", {"mytask.py": TASK, "tokens.txt": "1 2\n"})
    assert again["sha256"] == sha and again["status"] == 201
    assert upload(anonymous, users["bob"], tmp_path / "bob", {})["status"] == 200

    # deleting: a context that models run from is a 409 naming them; then the model, then the context
    used = anonymous.delete(f"/api/v1/contexts/{sha}", headers=users["alice"])
    assert used.status_code == 409 and "alices" in used.json()["detail"]
    assert anonymous.delete("/api/v1/models/alices", headers=users["alice"]).status_code == 204
    assert anonymous.get("/api/v1/models/alices", headers=users["root"]).status_code == 404
    assert anonymous.delete(f"/api/v1/contexts/{sha}", headers=users["alice"]).status_code == 204
    assert anonymous.get(f"/api/v1/contexts/{sha}", headers=users["alice"]).status_code == 404
    assert anonymous.get(f"/api/v1/contexts/{sha}", headers=users["bob"]).status_code == 200  # still his
    assert anonymous.delete(f"/api/v1/contexts/{sha}", headers=users["root"]).status_code == 204
    assert anonymous.get(f"/api/v1/contexts/{sha}", headers=users["bob"]).status_code == 404
    zoo = anonymous.delete("/api/v1/models/mlp-digits", headers=users["root"])
    assert zoo.status_code == 409 and "zoo model" in zoo.json()["detail"]


def test_a_shared_context_is_usable_by_the_user_it_was_shared_with(anonymous, users, tmp_path: Path):
    sha = upload(anonymous, users["alice"], tmp_path / "p", {"mytask.py": TASK})["sha256"]
    unknown = anonymous.post(f"/api/v1/contexts/{sha}/share", json={"user": "nobody"}, headers=users["alice"])
    assert unknown.status_code == 422 and unknown.json()["detail"] == "user: no user named 'nobody'"
    shared = anonymous.post(f"/api/v1/contexts/{sha}/share", json={"user": "bob"}, headers=users["alice"])
    assert shared.json() == {"sha256": sha, "user": "bob", "shared": True}
    assert anonymous.get(f"/api/v1/contexts/{sha}", headers=users["bob"]).status_code == 200
    model = anonymous.post("/api/v1/models", headers=users["bob"],
                           json={"name": "bobs", "source": "mytask.py:make_task", "context": sha})
    assert model.status_code == 202, model.text
    assert anonymous.get("/api/v1/models/bobs", headers=users["alice"]).status_code == 404  # the model is bob's


@pytest.mark.parametrize("source", ["../" + "e" * 64 + "/other.py:make_task", "/etc/other.py:make_task",
                                    "sub/../../x.py:make_task", "other.py:make_task"])
def test_a_models_source_must_lie_inside_its_context(anonymous, users, tmp_path: Path, source):
    sha = upload(anonymous, users["alice"], tmp_path / "p", {"mytask.py": TASK})["sha256"]
    refused = anonymous.post("/api/v1/models", headers=users["alice"], json={"name": "m", "source": source, "context": sha})
    assert refused.status_code == 422, refused.text
    # a path inside the context, or none: the schema's pattern already refuses an absolute one
    assert refused.json()["detail"].startswith("source: ")
    if not source.startswith("/"):
        assert refused.json()["detail"].startswith(f"source: {source!r} must name a .py file inside the model's code context")


def test_profiles_uploaded_are_their_uploaders(anonymous, users):
    up = anonymous.post("/api/v1/profiles/upload", headers=users["alice"], files={"file": ("graph.txt", GRAPH, "text/plain")})
    assert up.status_code == 201, up.text
    pid = up.json()["id"]
    assert anonymous.get(f"/api/v1/profiles/{pid}", headers=users["alice"]).status_code == 200
    assert anonymous.get(f"/api/v1/profiles/{pid}", headers=users["bob"]).json()["detail"] == f"profile {pid} not found"
    assert pid not in {p["id"] for p in anonymous.get("/api/v1/profiles", headers=users["bob"]).json()["data"]}
    assert pid in {p["id"] for p in anonymous.get("/api/v1/profiles", headers=users["root"]).json()["data"]}


def test_plans_are_their_requesters(anonymous, users):
    up = anonymous.post("/api/v1/profiles/upload", headers=users["alice"], files={"file": ("graph.txt", GRAPH, "text/plain")})
    pid = up.json()["id"]
    what_if = {"profile_id": pid, "levels": [{"workers": 2, "bandwidth": 1e9}], "schedule": "1f1b", "microbatches": 4}
    # bob may not plan alice's profile: the same 404 as a profile that does not exist
    refused = anonymous.post("/api/v1/plans", json=what_if, headers=users["bob"])
    assert refused.status_code == 404 and refused.json()["detail"] == f"profile {pid} not found"
    made = anonymous.post("/api/v1/plans", json=what_if, headers=users["alice"])
    assert made.status_code == 201, made.text
    plan = made.json()["id"]
    assert anonymous.get(f"/api/v1/plans/{plan}", headers=users["alice"]).json()["profile_id"] == pid
    hidden = anonymous.get(f"/api/v1/plans/{plan}", headers=users["bob"])
    assert hidden.status_code == 404 and hidden.json()["detail"] == f"plan {plan} not found"
    assert anonymous.get("/api/v1/plans/999999", headers=users["bob"]).json()["detail"] == "plan 999999 not found"
    assert anonymous.get(f"/api/v1/plans/{plan}", headers=users["root"]).status_code == 200
    # the admin plans alice's profile too; that plan is the admin's, not alice's
    mine = anonymous.post("/api/v1/plans", json=what_if, headers=users["root"]).json()["id"]
    assert anonymous.get(f"/api/v1/plans/{mine}", headers=users["alice"]).status_code == 404


def test_admins_mint_tokens_for_users_over_http(anonymous, users):
    minted = anonymous.post("/api/v1/tokens", json={"name": "carols", "scope": "write", "user": "carol"},
                            headers=users["root"])
    assert minted.status_code == 201, minted.text
    me = anonymous.get("/api/v1/tokens/me", headers=bearer(minted.json()["token"])).json()
    assert me["user"] == "carol" and me["name"] == "carols"
    assert anonymous.get("/api/v1/tokens/me", headers=users["alice"]).json()["user"] == "alice"
