"""Models: the zoo is listed; task factories are stored, then a worker validates them in a subprocess
(task built, one batch through, split by torch.fx), and only a validated one is ready."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeboard.app.services import model_checks


class Tiny(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.a = nn.Linear(4, width)
        self.b = nn.Linear(width, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class Branchy(nn.Module):
    """Control flow on a tensor's value: no capture can take both paths (torch.export refuses it)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.a(x)
        return x


def _task(model, out: int = 2):
    from torch.utils.data import TensorDataset

    from pipeboard.trainer import Task

    return Task(model=model, train_data=TensorDataset(torch.zeros(3, 4), torch.zeros(3, out)),
                loss=nn.functional.mse_loss, batch_size=3)


def tiny_factory(width: int = 8):
    return _task(Tiny(width))


def branchy_factory():
    return _task(Branchy(), out=4)


def not_a_pair():
    return Tiny()


def raising_factory():
    raise RuntimeError("no data here")


def hanging_factory():
    import time

    time.sleep(3600)


def greedy_factory():
    hoard = []
    while True:
        hoard.append(bytearray(256 << 20))


HERE = __name__


def test_zoo_is_listed_and_gettable(client):
    page = client.get("/api/v1/models").json()
    names = [m["name"] for m in page["data"]]
    assert "mlp-digits" in names and page["count"] == len(names)
    got = client.get("/api/v1/models/mlp-digits").json()
    assert got["kind"] == "zoo" and got["id"] is None
    assert client.get("/api/v1/models/no-such").status_code == 404


@pytest.fixture
def on_workers(monkeypatch):
    """Workers that can import this test module (an import path "installed on the workers")."""
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))


def register(client, session, body):
    """POST it, then validate it as the worker's task does: the outcome as GET shows it."""
    created = client.post("/api/v1/models", json=body)
    assert created.status_code == 202, created.text
    model = created.json()
    assert model["status"] == "validating" and model["id"] is not None
    model_checks.validate_model(session, model["id"])
    return client.get(f"/api/v1/models/{model['id']}").json()


def test_registering_only_stores_and_queues_a_worker_validates(client, session, on_workers):
    model = register(client, session, {"name": "tiny", "source": f"{HERE}:tiny_factory", "config": {"width": 16}})
    assert model["status"] == "ready" and model["kind"] == "import" and model["config"] == {"width": 16}
    assert model["layers"] == 2 and "layers" in model["message"]  # a and b; the relu between them runs in b's
    assert client.get("/api/v1/models/tiny").json()["id"] == model["id"]
    assert client.post("/api/v1/models", json={"name": "tiny", "source": f"{HERE}:tiny_factory"}).status_code == 409


def test_a_model_that_fails_validation_is_stored_failed_with_the_message(client, session, on_workers):
    branchy = register(client, session, {"name": "branchy", "source": f"{HERE}:branchy_factory"})
    assert branchy["status"] == "failed" and "cannot be split" in branchy["message"], branchy
    job = client.post("/api/v1/jobs", json={"model": "branchy", "workers": 2, "schedule": "1f1b", "microbatches": 2,
                                            "batch_size": 4, "stop": {"steps": 1}})
    assert job.status_code == 422 and "failed validation" in job.json()["detail"]


@pytest.mark.parametrize("factory,words", [
    ("no_such_pkg.mod:make", "no module named 'no_such_pkg'"),
    (f"{HERE}:not_a_pair", "not a pipeboard.trainer.Task"),
    (f"{HERE}:raising_factory", "RuntimeError: no data here"),
])
def test_broken_factories_fail_validation_with_their_message(on_workers, tmp_path, factory, words):
    result = model_checks.run_validation(factory, {}, None, tmp_path, time_limit_s=120, memory_bytes=8 << 30)
    assert not result["ok"] and words in result["message"], result


def test_a_factory_that_hangs_or_allocates_without_end_is_stopped(on_workers, tmp_path):
    hung = model_checks.run_validation(f"{HERE}:hanging_factory", {}, None, tmp_path, time_limit_s=1, memory_bytes=8 << 30)
    assert not hung["ok"] and "longer than 1 s" in hung["message"]
    greedy = model_checks.run_validation(f"{HERE}:greedy_factory", {}, None, tmp_path, time_limit_s=120,
                                         memory_bytes=3 << 30)
    assert not greedy["ok"] and "memory" in greedy["message"].lower(), greedy


def test_registration_refuses_what_it_can_tell_at_the_door(client):
    bad_path = client.post("/api/v1/models", json={"name": "x", "source": "not an import path"})
    assert bad_path.status_code == 422 and "source" in bad_path.json()["detail"]
    file_without_context = client.post("/api/v1/models", json={"name": "x", "source": "task.py:make"})
    assert file_without_context.status_code == 422 and file_without_context.json()["detail"].startswith("context:")
    unknown = client.post("/api/v1/models", json={"name": "x", "source": "task.py:make", "context": "0" * 64})
    assert unknown.status_code == 422 and "no code context" in unknown.json()["detail"]
