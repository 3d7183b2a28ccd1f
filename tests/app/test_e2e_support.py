"""A real deployment for end-to-end tests: uvicorn serving the API and `celery worker`
processes, on a private SQLite database with the embedded SQLite broker or Redis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx

from pipeboard.app.core.db import make_engine
from pipeboard.app.core.lifetime import group_alive, group_members  # noqa: F401 - the tests' too
from pipeboard.app.models import Base
from pipeboard.app.services.sse import parse_stream
from tests.conftest import ROOT, deployment_env, free_port, settings_from_env  # noqa: F401 - free_port: the benches' too

SMALL_JOB = {
    "model": "mlp-digits",
    "workers": 2,
    "method": "time",  # two balanced stages: a real pipeline even for a tiny model
    "schedule": "1f1b",
    "microbatches": 2,
    "batch_size": 16,
    "stop": {"steps": 4},
}


def start_up(port: int, env: dict[str, str], cwd: Path, log: Path, timeout: float = 120) -> subprocess.Popen:
    """`pipeboard up --workers 1` on ``port`` with ``env`` over this environment, its output
    appended to ``log``; returned once /health counts its worker (RuntimeError with the log's
    tail if it exits or is not ready within ``timeout``)."""
    with open(log, "ab") as out:
        process = subprocess.Popen([sys.executable, "-c", "from pipeboard.app.cli import main; main()", "up", "--port",
                                    str(port), "--workers", "1"], cwd=cwd, env={**os.environ, **env},
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=2).json().get("workers") == 1:
                return process
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError(f"pipeboard up did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)


def stop_process(process: subprocess.Popen, timeout: float = 15) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


@dataclass
class Deployment:
    env: dict[str, str]
    workdir: Path
    processes: list[subprocess.Popen] = field(default_factory=list)
    url: str = ""

    def __post_init__(self) -> None:
        from sqlalchemy.orm import Session

        from pipeboard.app.services.tokens import create_token

        engine = make_engine(settings_from_env(self.env).database_url)
        Base.metadata.create_all(engine)
        with Session(engine) as session:  # every write needs a token: the deployment's admin
            _, self.token = create_token(session, "e2e", "admin")
            session.commit()
        engine.dispose()
        self.env["PIPEBOARD_TOKEN"] = self.token  # for `pipeboard submit`/`jobs` run against it
        self.http = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {self.token}"})

    def _spawn(self, argv: list[str], name: str) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")
        process = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **self.env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    def start_server(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        server = self._spawn([sys.executable, "-m", "uvicorn", "pipeboard.app.main:app", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"], "server")
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"server exited: {self.log('server')[-2000:]}")
            try:
                if self.http.get(self.url + "/api/v1/tokens/me").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.2)

    def start_worker(self) -> subprocess.Popen:
        from pipeboard.app.worker import worker_argv

        argv = worker_argv(concurrency=1, hostname=f"e2e-{uuid.uuid4().hex[:6]}@%h", loglevel="info")
        return self._spawn([sys.executable, "-m", "celery", "-A", "pipeboard.app.worker:celery_app", *argv], f"worker-{len(self.processes)}")

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.workdir.glob("*.log")))

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, self.url + "/api/v1" + path, **kwargs)
        assert response.status_code < 400, f"{method} {path}: {response.status_code} {response.text}\n{self.logs()}"
        return response.json()

    def events(self, job_id: int, last_id: int = 0, timeout: float = 240, until: str = "end"):
        """SSE messages (data decoded) until an event named ``until``."""
        headers = {"Last-Event-ID": str(last_id)} if last_id else {}
        deadline = time.monotonic() + timeout
        with self.http.stream("GET", f"{self.url}/api/v1/jobs/{job_id}/events", headers=headers, timeout=httpx.Timeout(10, read=timeout)) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            for message in parse_stream(response.iter_lines()):
                message["data"] = json.loads(message["data"])
                yield message
                if message.get("event") == until or time.monotonic() > deadline:
                    return

    def job_row(self, job_id: int) -> Any:
        from sqlalchemy.orm import Session

        from pipeboard.app.models import Job

        engine = make_engine(settings_from_env(self.env).database_url)
        try:
            with Session(engine) as s:
                return s.get(Job, job_id)
        finally:
            engine.dispose()

    def wait_for_training(self, job_id: int, timeout: float = 180, after: int = 0) -> Any:
        """Block until the run has reported measured timeline events (after log entry ``after``,
        e.g. a retry's); returns the job row."""
        for message in self.events(job_id, last_id=after, timeout=timeout, until="timeline"):
            assert message["event"] != "end", f"job ended early: {message['data']}\n{self.logs()}"
        row = self.job_row(job_id)
        assert row.pgid, "running job has no process group"
        return row

    def close(self) -> None:
        for process in reversed(self.processes):
            stop_process(process)
        self.http.close()

    @contextmanager
    def running(self) -> Iterator[Deployment]:
        """The API and one worker up for the block (``self.worker``); everything stopped after."""
        try:
            self.start_server()
            self.worker = self.start_worker()
            yield self
        finally:
            self.close()


def embedded_env(tmp: Path) -> dict[str, str]:
    return deployment_env(tmp)


def redis_env(tmp: Path, redis_url: str) -> dict[str, str]:
    return deployment_env(tmp, redis_url)


# A job long enough to be killed mid-run: the stream shows steps a second or more after the run
# took them (a few hundred steps of this small model), so the kill, made on seeing the first step
# past the first checkpoint, must still find the run going. Attempt 2 redoes the steps attempt 1
# reported after its newest checkpoint, and their losses can be compared.
FAULT_JOB = {**SMALL_JOB, "batch_size": 64, "microbatches": 4, "stop": {"steps": 1000}, "checkpoint_every": 100}


class KillAfterCheckpoint:
    """Calls ``kill()`` from a thread of its own the moment the job's checkpoint of step ``step``
    is complete on disk under one of ``data_dirs``.

    Not when the job's stream shows a step past it: the service records steps about a second
    after the run takes them (a loaded machine: a whole 1,000-step run went by before its stream
    showed step 150). A lost run hands over what its stages reported before it ends, so the
    service has the steps up to about the kill (the stages report a quarter second at a time;
    100 steps apart at ~6 ms a step), and the next attempt resumes from a checkpoint before it.

    ``recorded``: also wait until the service has recorded step ``step``. For a kill that takes
    the reports in flight with it (the Celery worker's): the next attempt resumes at or before the
    last recorded step, and under CI's load that can trail the checkpoint by hundreds of steps.
    ``killed_at``: monotonic time of the kill (None: not yet)."""

    def __init__(self, dep: "Deployment", job_id: int, data_dirs: list[Path], kill, step: int = 200,
                 recorded: bool = False) -> None:
        import threading

        self.markers = [d / "jobs" / str(job_id) / "checkpoints" / f"step-{step:08d}" / "COMPLETE" for d in data_dirs]
        self.step, self.recorded = step, recorded
        self.dep, self.job_id, self.kill = dep, job_id, kill
        self.killed_at: float | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + 300
        while not any(m.exists() for m in self.markers):
            if time.monotonic() > deadline:
                return
            time.sleep(0.002)
        if self.recorded:
            from sqlalchemy.orm import Session

            from pipeboard.app.services.attempts import recorded_step

            engine = make_engine(settings_from_env(self.dep.env).database_url)
            try:
                with Session(engine) as s:
                    while recorded_step(s, self.job_id) < self.step:  # what the next attempt resumes at or before
                        if time.monotonic() > deadline:
                            return
                        s.rollback()  # a fresh snapshot each look
                        time.sleep(0.02)
            finally:
                engine.dispose()
        try:
            # Attempt 1's run, not a next one: had attempt 1 ended for another reason first (a
            # heartbeat missed under load), a kill now would spend the job's last attempt.
            job = self.dep.api("GET", f"/jobs/{self.job_id}")
            assert job["attempt"] == 1 and job["status"] == "running", f"attempt 1 ended before the kill: {job}"
            self.kill()
            self.killed_at = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc

    def rank_pid(self, rank: int) -> int:
        """The pid of stage process ``rank`` of the job's run (named pipeboard-rN)."""
        leader = self.dep.job_row(self.job_id).pgid
        for pid in group_members(leader) + descendants(leader):  # sandboxed: below the relay, in bwrap's groups
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == f"pipeboard-r{rank}":
                    return pid
            except OSError:
                continue
        raise LookupError(f"no process pipeboard-r{rank} in group {leader}")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (a sandboxed run's are in process groups of bwrap's, not the leader's)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        children.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(stat.parent.name))
    found, stack = [], [pid]
    while stack:
        below = children.get(stack.pop(), [])
        found += below
        stack += below
    return found


def due_for_kill(message: dict[str, Any], every: int = 100) -> bool:
    """The first `metrics` message well past the first checkpoint. Not later: the run writes its
    metrics once a second, so the stream shows a step well after the run took it, and a kill
    that waited for a step early in a later interval could come after the last step."""
    if message["event"] != "metrics":
        return False
    # half an interval past it: the checkpoint of step `every` is complete on disk by then
    return max(p["step"] for p in message["data"]["points"]) > every + every // 2


def losses_by_attempt(messages: list[dict[str, Any]]) -> dict[int, dict[int, float]]:
    """{attempt: {step: loss}} from a stream's `metrics` messages (including points dropped later)."""
    out: dict[int, dict[int, float]] = {}
    for m in messages:
        if m["event"] == "metrics":
            for p in m["data"]["points"]:
                if "loss" in p["values"]:
                    out.setdefault(p.get("attempt", 1), {})[p["step"]] = p["values"]["loss"]
    return out


def check_resumed_run(dep: Deployment, job_id: int, messages: list[dict[str, Any]], total_steps: int | None = None) -> dict[str, Any]:
    """The checks every killed-and-resumed job must pass; returns the job. `messages`: its whole
    stream, read by one or more connections (each resumed with Last-Event-ID). `total_steps`:
    default the steps the job's summary says it trained (a target rule)."""
    ids = [int(m["id"]) for m in messages if m["event"] != "open"]
    assert ids == list(range(1, len(ids) + 1)), "every event exactly once, across attempts and reconnections"
    job = dep.api("GET", f"/jobs/{job_id}")
    assert job["status"] == "succeeded" and job["attempt"] == 2, f"{job}\n{dep.logs()}"
    total_steps = total_steps or job["summary"]["steps"]
    first, second = job["attempts"]
    assert first["status"] == "failed" and (second["trigger"], second["status"]) == ("auto", "succeeded")
    resume = second["resume_step"]
    every = job["spec"]["checkpoints"]["every"]
    assert resume > 0 and resume % every == 0, "attempt 2 continues from a checkpoint, not from step 0"
    marks = [m["data"] for m in messages if m["event"] == "attempt"]
    assert [(m["attempt"], m["resume_step"]) for m in marks] == [(1, 0), (2, resume)]
    # The job's series: every step once, attempt 1's up to the checkpoint, attempt 2's after it.
    points = dep.api("GET", f"/jobs/{job_id}/metrics", params={"limit": 100000})["points"]
    steps = [(p["step"], p["attempt"]) for p in points if "loss" in p["values"]]
    assert sorted(s for s, _ in steps) == list(range(1, total_steps + 1))
    assert all((a == 1) == (s <= resume) for s, a in steps)
    assert min(p["wall_s"] for p in points if p["attempt"] == 2) > max(p["wall_s"] for p in points if p["attempt"] == 1)
    # The steps attempt 1 reported after the checkpoint, trained again by attempt 2: same losses
    # (weights, optimizer state, RNG state and data order all restored). None when the run was
    # lost just after recording the checkpoint's own step (a kill can land there).
    losses = losses_by_attempt(messages)
    redone = sorted(s for s in losses[1] if s > resume)
    assert redone == list(range(resume + 1, resume + 1 + len(redone))) and set(redone) <= set(losses[2]), (resume, redone[:3])
    for step in redone:
        assert abs(losses[2][step] - losses[1][step]) <= 1e-6 * max(1.0, abs(losses[1][step])), step
    timeline = dep.api("GET", f"/jobs/{job_id}/timeline", params={"limit": 200000})
    assert {(e["attempt"], e["step"] >= resume) for e in timeline["events"]} == {(1, False), (2, True)}
    assert all(e["host"] for e in timeline["events"])
    return job
