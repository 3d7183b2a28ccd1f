"""The deployments bench/sandbox.py and bench/sandbox_cost.py measure on, and what their parts share:
`pipeboard up --workers 1` (one task at a time) on a private SQLite database, the small job they
run, a user's upload, a model's validation waited for, a job's start timed, and medians."""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx

from bench.service_probe import Served

# mlp-digits on two balanced stages (method "time": a real pipeline even for so small a model).
SMALL_JOB = {"model": "mlp-digits", "workers": 2, "method": "time", "schedule": "1f1b", "microbatches": 2,
             "batch_size": 16, "stop": {"steps": 4}}


@contextmanager
def deployment(tmp: Path, name: str, **settings: str) -> Iterator[Served]:
    """`pipeboard up --workers 1 --concurrency 1` in ``tmp / name`` (SQLite database and broker in
    its data folder, heartbeats every 0.5 s, calibration figures of its own) with ``settings``
    (name=value: PIPEBOARD_NAME), for the block."""
    where = tmp / name
    where.mkdir(parents=True)
    env = {"PIPEBOARD_HEARTBEAT_SECONDS": "0.5", "PIPEBOARD_CALIBRATION_DIR": str(where / "calibration"),
           **{f"PIPEBOARD_{key.upper()}": value for key, value in settings.items()}}
    server = Served(where, extra_env=env, concurrency=1)
    try:
        yield server
    finally:
        server.stop()


def upload(client: httpx.Client, project: Path) -> str:
    """The project folder's sha256 once uploaded as a code context (packed as `pipeboard` packs one)."""
    from pipeboard.app.services import contexts

    answer = client.post("/contexts", files={"file": ("project.tar.gz", contexts.pack(project), "application/gzip")})
    if answer.status_code not in (200, 201):
        raise RuntimeError(f"upload: {answer.status_code} {answer.text[:500]}")
    return answer.json()["sha256"]


def validated(client: httpx.Client, name: str, timeout: float = 300) -> dict[str, Any]:
    """The model once its validation ended (or as it is after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while True:
        model = client.get(f"/models/{name}").json()
        if model.get("status") != "validating" or time.monotonic() > deadline:
            return model
        time.sleep(0.2)


def seconds_to_first_step(server: Served, spec: dict[str, Any]) -> tuple[int, float]:
    """Submit ``spec``: the job's id and the seconds from the POST to its first measured step."""
    began = time.monotonic()
    job = server.api("POST", "/jobs", spec)
    for message in server.events(job["id"], timeout=600, until="timeline"):
        if message["event"] == "end":
            raise RuntimeError(f"job ended early: {message['data']}")
    return job["id"], time.monotonic() - began


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f} (range {min(values):.3f} to {max(values):.3f})"


def chosen_parts(parser: argparse.ArgumentParser, text: str, known: tuple[str, ...]) -> list[str]:
    """The comma-separated ``--parts``; one that is not ``known`` is the parser's error."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    unknown = set(parts) - set(known)
    if unknown:
        parser.error(f"--parts: unknown {', '.join(sorted(unknown))} ({', '.join(known)})")
    return parts
