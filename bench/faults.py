"""Faults during a running job, measured: what a killed process costs and whether the job is whole.

Cases (each a real deployment; small jobs: mlp-digits on 2 stages, batch 64 in 4 microbatches):
  stage    SIGKILL of a stage process (rank 1), PostgreSQL + Redis, `pipeboard worker`
  worker   SIGKILL of the Celery worker under `pipeboard up` (which restarts it)
  api      SIGKILL of the API server under `pipeboard up` (which restarts it; the job goes on)
  up       SIGKILL of `pipeboard up` itself (its workers stop and hand the job back), then a new `up`
  2-host   a job on two worker hosts (network namespaces where allowed), uninterrupted to its target,
           then with one host's worker SIGKILLed (and started again), for the member and the leader
For each: the job's status and attempt, the step attempt 2 resumed from, the largest loss
difference against an uninterrupted job of the same spec (every step), whether every step is
there once, whether an SSE client that reconnected with Last-Event-ID got every event once, whether
any process of the job is left, and the time from the kill to (1) the new attempt's training
processes reporting where they resume and (2) its first new step. Timings on a shared machine
are noisy; the processor is printed.

    .venv/bin/python bench/faults.py [--cases stage,worker,api,up,2-host] [--schedules gpipe,1f1b]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PIPEBOARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")

import httpx  # noqa: E402

from tests.app.hosts import WorkerHosts  # noqa: E402
from tests.app.test_e2e_support import (  # noqa: E402
    start_up,
    FAULT_JOB,
    Deployment,
    check_resumed_run,
    due_for_kill,
    free_port,
    group_alive,
    losses_by_attempt,
    redis_env,
)
from tests.app.test_e2e_faults import TWO_HOST_JOB  # noqa: E402
from tests.conftest import POSTGRES_URL, REDIS_URL  # noqa: E402
from pipeboard.app.core.db import private_schema  # noqa: E402



def processor() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return f"{fields.get('Model name', '?').strip()} (family {fields.get('CPU family', '?').strip()}, " \
           f"model {fields.get('Model', '?').strip()}), {os.cpu_count()} CPUs"


class Watch:
    """A job's stream, read to its end across reconnections; times are this process's monotonic clock."""

    def __init__(self, dep: Deployment, job_id: int) -> None:
        self.dep, self.job_id = dep, job_id
        self.messages: list[dict[str, Any]] = []
        self.at: list[float] = []
        self.connections = 0  # streams opened (the first, then one per reconnection with Last-Event-ID)

    def run(self, on_message: Callable[[dict[str, Any]], None] = lambda m: None, timeout: float = 600,
            hang_up: Callable[[dict[str, Any]], bool] = lambda m: False) -> None:
        """Read to the end; after a message ``hang_up`` accepts, drop the connection and resume
        with Last-Event-ID (as a browser does after a network hiccup)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            last = int(self.messages[-1]["id"]) if self.messages else 0
            try:
                for message in self.dep.events(self.job_id, last_id=last, timeout=timeout):
                    if message["event"] == "open":
                        self.connections += 1
                        continue
                    self.messages.append(message)
                    self.at.append(time.monotonic())
                    on_message(message)
                    if message["event"] == "end":
                        return
                    if hang_up(message):
                        break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)  # the API is coming back
        raise TimeoutError(f"job {self.job_id} did not end within {timeout} s")

    def first(self, predicate: Callable[[dict[str, Any]], bool], after: float) -> float | None:
        return next((t for m, t in zip(self.messages, self.at) if t >= after and predicate(m)), None)


def attempt_started(n: int) -> Callable[[dict[str, Any]], bool]:
    return lambda m: m["event"] == "attempt" and m["data"]["attempt"] == n


def new_step(n: int) -> Callable[[dict[str, Any]], bool]:
    return lambda m: m["event"] == "metrics" and any(p.get("attempt") == n for p in m["data"]["points"])


def job_losses(dep: Deployment, job_id: int) -> dict[int, float]:
    points = dep.api("GET", f"/jobs/{job_id}/metrics", params={"limit": 100000})["points"]
    return {p["step"]: p["values"]["loss"] for p in points if "loss" in p["values"]}


def reference(dep: Deployment, spec: dict[str, Any]) -> dict[int, float]:
    """The losses of an uninterrupted job of ``spec``."""
    job_id = dep.api("POST", "/jobs", json=spec)["id"]
    Watch(dep, job_id).run()
    assert dep.api("GET", f"/jobs/{job_id}")["status"] == "succeeded", dep.logs()
    return job_losses(dep, job_id)


def report(case: str, dep: Deployment, watch: Watch, killed_at: float | None, ref: dict[int, float] | None,
           groups: set[int], attempts: int = 2) -> None:
    job = dep.api("GET", f"/jobs/{watch.job_id}")
    row = {"case": case, "status": f"{job['status']} on attempt {job['attempt']}"}
    try:
        if attempts == 2:
            check_resumed_run(dep, watch.job_id, watch.messages)
            row["checks"] = "ok"
        else:
            ids = [int(m["id"]) for m in watch.messages]
            assert ids == list(range(1, len(ids) + 1)), "events not exactly once"
            row["checks"] = "ok (one attempt)"
    except AssertionError as exc:
        row["checks"] = f"FAILED: {str(exc).splitlines()[0][:120]}"
    row["resumed from"] = job["attempts"][-1]["resume_step"]
    if ref is not None:
        mine = job_losses(dep, watch.job_id)
        common = sorted(set(mine) & set(ref))
        row["max |loss - uninterrupted|"] = f"{max(abs(mine[s] - ref[s]) for s in common):.1e} over {len(common)} steps" \
            if common else "n/a"
        if len(common) != len(ref):
            row["max |loss - uninterrupted|"] += f" (uninterrupted: {len(ref)} steps)"
    row["sse reconnects"] = watch.connections - 1
    groups.add(dep.job_row(watch.job_id).pgid)
    time.sleep(0.5)
    row["left running"] = sum(group_alive(g) for g in groups if g)
    if killed_at is not None:
        up = watch.first(attempt_started(attempts), killed_at)
        step = watch.first(new_step(attempts), killed_at)
        row["kill -> resumed"] = f"{up - killed_at:.1f} s" if up else "-"
        row["kill -> new step"] = f"{step - killed_at:.1f} s" if step else "-"
    print("  " + "; ".join(f"{k}: {v}" for k, v in row.items()), flush=True)


def killed_run(dep: Deployment, spec: dict[str, Any], kill: Callable[[dict[str, Any]], None],
               due: Callable[[dict[str, Any]], bool] = due_for_kill) -> tuple[Watch, dict[str, Any]]:
    """Run a job of ``spec`` and call ``kill(state)`` once, at the first message ``due`` accepts;
    ``state``: the job, its run's pids, leader and process groups so far, then when it was killed."""
    watch = Watch(dep, dep.api("POST", "/jobs", json=spec)["id"])
    state: dict[str, Any] = {"killed": None, "groups": set(), "pids": {}, "job_id": watch.job_id}

    def on(message: dict[str, Any]) -> None:
        if message["event"] == "progress" and message["data"].get("phase") == "running":
            row = dep.job_row(watch.job_id)
            state.update(pids=message["data"]["pids"], leader=row.worker_hostname)
            state["groups"].add(row.pgid)
        if state["killed"] is None and due(message):
            state["killed"] = time.monotonic()
            kill(state)  # at once: every moment between the step seen and the kill is more steps

    watch.run(on, hang_up=attempt_started(2))  # one reconnection with Last-Event-ID, mid-job
    return watch, state


# --- cases -----------------------------------------------------------------------------------


def stage_case(tmp: Path, schedules: list[str]) -> None:
    tmp.mkdir(parents=True)
    database_url, drop = private_schema(POSTGRES_URL)
    env = {**redis_env(tmp, REDIS_URL), "PIPEBOARD_DATABASE_URL": database_url}
    try:
        with Deployment(env, tmp).running() as dep:
            for schedule in schedules:
                spec = {**FAULT_JOB, "schedule": schedule}
                ref = reference(dep, spec)
                watch, state = killed_run(dep, spec, lambda st: os.kill(int(st["pids"]["1"]), signal.SIGKILL))
                report(f"stage SIGKILL, {schedule}", dep, watch, state["killed"], ref, state["groups"])
    finally:
        drop()


class Up:
    """`pipeboard up --workers 1` on a free port, in ``tmp``; a Deployment-like client of it."""

    def __init__(self, tmp: Path) -> None:
        tmp.mkdir(parents=True)
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {"PIPEBOARD_DATA_DIR": str(tmp / "data"), "PIPEBOARD_HEARTBEAT_SECONDS": "0.5"}
        self.log = tmp / "up.log"
        self.client: Deployment | None = None
        self.start()

    def start(self) -> None:
        self.process = start_up(self.port, self.env, ROOT, self.log)
        if self.client is None:
            self.client = Deployment(dict(self.env), self.tmp)
            self.client.url = self.url

    def child(self, marker: str) -> int:
        pids = []
        for task in Path(f"/proc/{self.process.pid}/task").glob("*"):
            pids += [int(p) for p in (task / "children").read_text().split()]
        return next(p for p in pids if marker in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace"))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(60)


def up_cases(tmp: Path, schedules: list[str], cases: list[str]) -> None:
    up = Up(tmp)
    dep = up.client
    try:
        refs = {s: reference(dep, {**FAULT_JOB, "schedule": s}) for s in schedules}
        for schedule in schedules if "worker" in cases else []:
            watch, state = killed_run(dep, {**FAULT_JOB, "schedule": schedule}, lambda st: os.kill(up.child("celery"), signal.SIGKILL))
            report(f"worker SIGKILL (pipeboard up), {schedule}", dep, watch, state["killed"], refs[schedule], state["groups"])
        schedule = schedules[-1]
        if "api" in cases:
            def kill_api(state: dict[str, Any]) -> None:
                os.kill(up.child("uvicorn"), signal.SIGKILL)
                while True:  # until the restarted server answers
                    try:
                        httpx.get(f"{up.url}/api/v1/health", timeout=1)
                        break
                    except httpx.HTTPError:
                        time.sleep(0.1)
                state["back"] = time.monotonic()

            watch, state = killed_run(dep, {**FAULT_JOB, "schedule": schedule}, kill_api)
            back = re.search(r"the API server is back", up.log.read_text())
            report(f"API SIGKILL (pipeboard up), {schedule}", dep, watch, None, refs[schedule], state["groups"], attempts=1)
            print(f"    (training never stopped; the API answered again: {bool(back)}, "
                  f"{state['back'] - state['killed']:.1f} s after the kill)", flush=True)
        if "up" in cases:
            def kill_up(state: dict[str, Any]) -> None:
                os.kill(up.process.pid, signal.SIGKILL)  # the supervisor and its API; its children get SIGTERM
                up.process.wait()
                time.sleep(2)  # its worker hands the job back
                up.start()

            watch, state = killed_run(dep, {**FAULT_JOB, "schedule": schedule}, kill_up)
            report(f"pipeboard up SIGKILL + restart, {schedule}", dep, watch, state["killed"], refs[schedule], state["groups"])
    finally:
        up.stop()


def two_host_case(tmp: Path) -> None:
    tmp.mkdir(parents=True)
    database_url, drop = private_schema(POSTGRES_URL)
    env = {**redis_env(tmp, REDIS_URL), "PIPEBOARD_DATABASE_URL": database_url, "PIPEBOARD_JOIN_TIMEOUT_S": "60"}
    dep = Deployment(env, tmp)
    hosts = WorkerHosts(env, tmp)
    try:
        dep.start_server()
        for name in hosts.names:
            hosts.start(name)
        while dep.api("GET", "/health")["workers"] < 2:
            time.sleep(0.3)
        print(f"  (hosts in network namespaces of their own: {hosts.isolated})", flush=True)
        started = time.monotonic()
        first = Watch(dep, dep.api("POST", "/jobs", json=TWO_HOST_JOB)["id"])
        first.run()
        job = dep.api("GET", f"/jobs/{first.job_id}")
        assert job["status"] == "succeeded", f"{job['status']}: {job['error']}\n{hosts.logs()}"
        hosts_seen = sorted({e["host"] for e in dep.api("GET", f"/jobs/{first.job_id}/timeline", params={"limit": 200000})["events"]})
        print(f"  2 hosts, uninterrupted: {job['status']}, reached target {job['summary']['reached_target']} "
              f"({job['summary']['metric_name']} {job['summary']['final_metric']:.3f}) in {job['summary']['steps']} steps, "
              f"{time.monotonic() - started:.1f} s from submit; timeline hosts {hosts_seen}", flush=True)
        ref = job_losses(dep, first.job_id)
        for victim_role in ("member", "leader"):
            def kill_host(state: dict[str, Any], role: str = victim_role) -> None:
                leader = state["leader"]
                victim = leader if role == "leader" else next(n for n in hosts.names if n != leader)
                hosts.kill(victim)
                hosts.start(victim)  # what a supervisor does

            watch, state = killed_run(dep, TWO_HOST_JOB, kill_host,
                                      lambda m: m["event"] == "metrics" and max(p["step"] for p in m["data"]["points"]) > 20)
            report(f"2 hosts, {victim_role}'s worker SIGKILL", dep, watch, state["killed"], ref, state["groups"])
    finally:
        hosts.close()
        dep.close()
        drop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="stage,worker,api,up,2-host")
    ap.add_argument("--schedules", default="gpipe,1f1b")
    args = ap.parse_args()
    cases, schedules = args.cases.split(","), args.schedules.split(",")
    print(f"processor: {processor()}; load average {os.getloadavg()[0]:.1f} (shared machine: timings are noisy)")
    print(f"job: {FAULT_JOB}; on two hosts: {TWO_HOST_JOB}")
    with tempfile.TemporaryDirectory(prefix="pipeboard-faults-") as tmp:
        if "stage" in cases:
            stage_case(Path(tmp) / "stage", schedules)
        if {"worker", "api", "up"} & set(cases):
            up_cases(Path(tmp) / "up", schedules, cases)
        if "2-host" in cases:
            two_host_case(Path(tmp) / "hosts")


if __name__ == "__main__":
    main()
