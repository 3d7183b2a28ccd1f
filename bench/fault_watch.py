"""What bench/faults.py reads of a job it kills: its event stream across reconnections (``Watch``),
when to kill, its losses, whether a resumed job is whole, and its run's process group.

A job is read over the REST API of a ``Served`` deployment; the process group alone is not in the
API, and comes from the deployment's database through pipeboard's own models."""

from __future__ import annotations

import time
from typing import Any, Callable

import httpx

from bench.service_probe import Served

Message = dict[str, Any]


class Watch:
    """A job's stream, read to its end across reconnections; times are this process's monotonic clock."""

    def __init__(self, server: Served, job_id: int) -> None:
        self.server, self.job_id = server, job_id
        self.messages: list[Message] = []
        self.at: list[float] = []
        self.connections = 0  # streams opened: the first, then one per reconnection with Last-Event-ID

    def run(self, on_message: Callable[[Message], None] = lambda m: None, timeout: float = 600,
            hang_up: Callable[[Message], bool] = lambda m: False) -> None:
        """Read to the `end` event. After a message ``hang_up`` accepts, drop the connection and
        reconnect with Last-Event-ID, as a browser does after a network hiccup; an API that does not
        answer (killed, restarting) is asked again."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.read_until(on_message, hang_up, timeout):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"job {self.job_id} did not end within {timeout} s")

    def read_until(self, on_message: Callable[[Message], None], hang_up: Callable[[Message], bool],
                   timeout: float) -> bool:
        """One connection, from after the last message kept; True once the `end` event came."""
        last = int(self.messages[-1]["id"]) if self.messages else 0
        for message in self.server.events(self.job_id, timeout=timeout, last_id=last):
            if message["event"] == "open":
                self.connections += 1
                continue
            self.messages.append(message)
            self.at.append(time.monotonic())
            on_message(message)
            if message["event"] == "end":
                return True
            if hang_up(message):
                return False
        return False

    def first(self, predicate: Callable[[Message], bool], after: float) -> float | None:
        """When the first message ``predicate`` accepts came, at or after ``after``."""
        return next((at for m, at in zip(self.messages, self.at) if at >= after and predicate(m)), None)


def attempt_started(n: int) -> Callable[[Message], bool]:
    return lambda m: m["event"] == "attempt" and m["data"]["attempt"] == n


def new_step(n: int) -> Callable[[Message], bool]:
    return lambda m: m["event"] == "metrics" and any(p.get("attempt") == n for p in m["data"]["points"])


def latest_step(message: Message) -> int:
    """The highest step of a `metrics` message (-1 for any other event)."""
    return max((p["step"] for p in message["data"]["points"]), default=-1) if message["event"] == "metrics" else -1


def past_checkpoint(every: int) -> Callable[[Message], bool]:
    """The first `metrics` message half an interval past the first checkpoint (complete on disk by
    then). No later: the stream shows a step a second or so after the run took it, and a kill that
    waited longer could come after the job's last step."""
    return lambda m: latest_step(m) > every + every // 2


def job_losses(server: Served, job_id: int) -> dict[int, float]:
    """{step: loss} of the job's series as the service keeps it."""
    points = server.api("GET", f"/jobs/{job_id}/metrics?limit=100000")["points"]
    return {p["step"]: p["values"]["loss"] for p in points if "loss" in p["values"]}


def streamed_losses(messages: list[Message]) -> dict[int, dict[int, float]]:
    """{attempt: {step: loss}} as the stream showed them, points a later attempt replaced included."""
    seen: dict[int, dict[int, float]] = {}
    for point in (p for m in messages if m["event"] == "metrics" for p in m["data"]["points"]):
        if "loss" in point["values"]:
            seen.setdefault(point.get("attempt", 1), {})[point["step"]] = point["values"]["loss"]
    return seen


def expect(condition: bool, failure: str) -> None:
    if not condition:
        raise AssertionError(failure)


def events_once(messages: list[Message]) -> None:
    """Every event of the job exactly once, in order, across reconnections."""
    ids = [int(m["id"]) for m in messages if m["event"] != "open"]
    expect(ids == list(range(1, len(ids) + 1)), "events not exactly once")


def resumed_whole(server: Served, job_id: int, messages: list[Message]) -> None:
    """Raise AssertionError saying what a killed job that resumed once lacks: it succeeded on attempt
    2, resumed from a checkpoint, holds every step once (attempt 1's up to the checkpoint, attempt
    2's after it, later in wall time), the steps both attempts trained have the same losses, and
    the timeline splits at the checkpoint with a host on every event."""
    events_once(messages)
    job = server.api("GET", f"/jobs/{job_id}")
    expect(job["status"] == "succeeded" and job["attempt"] == 2 == len(job["attempts"]), f"{job['status']} on attempt {job['attempt']}")
    first, second = job["attempts"]
    expect(first["status"] == "failed" and second["trigger"] == "auto" and second["status"] == "succeeded",
           f"attempts {first['status']}, {second['trigger']} {second['status']}")
    resume = second["resume_step"]
    expect(resume > 0 and resume % job["spec"]["checkpoints"]["every"] == 0, f"resumed from step {resume}")
    marks = [(m["data"]["attempt"], m["data"]["resume_step"]) for m in messages if m["event"] == "attempt"]
    expect(marks == [(1, 0), (2, resume)], f"attempt events {marks}")
    points = server.api("GET", f"/jobs/{job_id}/metrics?limit=100000")["points"]
    trained = [(p["step"], p["attempt"]) for p in points if "loss" in p["values"]]
    expect(sorted(s for s, _ in trained) == list(range(1, job["summary"]["steps"] + 1)), "steps not each once")
    expect(all((attempt == 1) == (step <= resume) for step, attempt in trained), "steps of the wrong attempt")
    wall = {a: [p["wall_s"] for p in points if p["attempt"] == a] for a in (1, 2)}
    expect(bool(wall[1] and wall[2]) and min(wall[2]) > max(wall[1]), "attempt 2's points not after attempt 1's")
    same_losses(streamed_losses(messages), resume)
    timeline = server.api("GET", f"/jobs/{job_id}/timeline?limit=200000")["events"]
    expect({(e["attempt"], e["step"] >= resume) for e in timeline} == {(1, False), (2, True)}, "timeline not split at the checkpoint")
    expect(all(e["host"] for e in timeline), "timeline events without a host")


def same_losses(losses: dict[int, dict[int, float]], resume: int) -> None:
    """The steps attempt 1 showed past the checkpoint, trained again by attempt 2, with its losses
    (weights, optimizer and RNG state, data order restored); none when the kill came right at it."""
    redone = sorted(step for step in losses.get(1, {}) if step > resume)
    expect(redone == list(range(resume + 1, resume + 1 + len(redone))) and set(redone) <= set(losses.get(2, {})),
           f"attempt 2 did not redo steps {redone[:3]}...")
    for step in redone:
        before, again = losses[1][step], losses[2][step]
        expect(abs(again - before) <= 1e-6 * max(1.0, abs(before)), f"step {step}: loss {before} then {again}")


def process_group(server: Served, job_id: int) -> int | None:
    """The process group of the job's run on its leader (the API does not show it: the database does)."""
    from sqlalchemy.orm import Session

    from pipeboard.app.core.config import settings_from_env
    from pipeboard.app.core.db import make_engine
    from pipeboard.app.models import Job

    engine = make_engine(settings_from_env(server.env).database_url)
    try:
        with Session(engine) as session:
            job = session.get(Job, job_id)
            return job.pgid if job else None
    finally:
        engine.dispose()
