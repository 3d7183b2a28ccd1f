"""Models: the zoo is listed; task factories are registered only if their task checks and torch.fx splits it."""

from __future__ import annotations

import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.a = nn.Linear(4, width)
        self.b = nn.Linear(width, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class Branchy(nn.Module):
    """Control flow on a tensor's value: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.a(x)
        return x


def _task(model, out: int = 2):
    from torch.utils.data import TensorDataset

    from trainer import Task

    return Task(model=model, train_data=TensorDataset(torch.zeros(3, 4), torch.zeros(3, out)),
                loss=nn.functional.mse_loss, batch_size=3)


def tiny_factory(width: int = 8):
    return _task(Tiny(width))


def branchy_factory():
    return _task(Branchy(), out=4)


def not_a_pair():
    return Tiny()


HERE = __name__


def test_zoo_is_listed_and_gettable(client):
    page = client.get("/api/v1/models").json()
    names = [m["name"] for m in page["data"]]
    assert "mlp-digits" in names and page["count"] == len(names)
    got = client.get("/api/v1/models/mlp-digits").json()
    assert got["kind"] == "zoo" and got["id"] is None
    assert client.get("/api/v1/models/no-such").status_code == 404


def test_register_traceable_model(client):
    created = client.post("/api/v1/models", json={"name": "tiny", "source": f"{HERE}:tiny_factory", "config": {"width": 16}})
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["kind"] == "import" and body["config"] == {"width": 16} and "traced layers" in body["description"]
    assert client.get(f"/api/v1/models/{body['id']}").json()["name"] == "tiny"
    assert client.post("/api/v1/models", json={"name": "tiny", "source": f"{HERE}:tiny_factory"}).status_code == 409


def test_untraceable_and_broken_models_are_refused(client):
    branchy = client.post("/api/v1/models", json={"name": "branchy", "source": f"{HERE}:branchy_factory"})
    assert branchy.status_code == 422 and branchy.json()["detail"].startswith("source:") and "torch.fx" in branchy.json()["detail"]
    missing = client.post("/api/v1/models", json={"name": "missing", "source": "no_such_pkg.mod:make"})
    assert missing.status_code == 422 and "no module named 'no_such_pkg'" in missing.json()["detail"]
    pair = client.post("/api/v1/models", json={"name": "pair", "source": f"{HERE}:not_a_pair"})
    assert pair.status_code == 422 and "not a trainer.Task" in pair.json()["detail"]
    bad_path = client.post("/api/v1/models", json={"name": "x", "source": "not an import path"})
    assert bad_path.status_code == 422 and "source" in bad_path.json()["detail"]
