"""Faults during a running job, measured: what a killed process costs and whether the job is whole.

Cases (each a real deployment; small jobs: mlp-digits on 2 stages, batch 64 in 4 microbatches):
  stage    SIGKILL of a stage process (rank 1), PostgreSQL + Redis, `pipeboard up --workers 0` and a
           `pipeboard worker`
  worker   SIGKILL of the Celery worker under `pipeboard up` (which restarts it)
  api      SIGKILL of the API server under `pipeboard up` (which restarts it; the job goes on)
  up       SIGKILL of `pipeboard up` itself (its workers stop and hand the job back), then a new `up`
  2-host   a job on two worker hosts (`pipeboard worker` each, as on two machines; network namespaces
           where allowed: bench/hosts.py) beside `pipeboard up --workers 0`, uninterrupted to its
           target, then with one host's worker SIGKILLed (and started again), for the member and the leader
For each: the job's status and attempt, the step attempt 2 resumed from, the largest loss
difference against an uninterrupted job of the same spec (every step), whether every step is
there once, whether an SSE client that reconnected with Last-Event-ID got every event once, whether
any process of the job is left, and the time from the kill to (1) the new attempt's training
processes reporting where they resume and (2) its first new step. Timings on a shared machine
are noisy; the processor is printed.

    .venv/bin/python bench/faults.py [--cases stage,worker,api,up,2-host] [--schedules gpipe,1f1b]
        [--postgres-url URL] [--redis-url URL]

PostgreSQL (a schema of its own per deployment, dropped after) and Redis (a key prefix of its own)
default to PIPEBOARD_TEST_POSTGRES_URL / PIPEBOARD_TEST_REDIS_URL, else the local servers.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fault_watch import (Watch, attempt_started, events_once, job_losses, latest_step, new_step,  # noqa: E402
                               past_checkpoint, process_group, resumed_whole)
from bench.hosts import HostNetwork, WorkerHost, service_ports  # noqa: E402
from bench.service_probe import Served, processor  # noqa: E402
from pipeboard.app.core.db import private_schema  # noqa: E402
from pipeboard.app.core.lifetime import group_alive  # noqa: E402

# mlp-digits on two balanced stages (a real pipeline even for so small a model), long enough to be
# killed mid-run: the stream shows a step a second or so after the run took it, and the kill waits
# for a step past the first checkpoint. Attempt 2 trains again the steps attempt 1 showed after its
# checkpoint, so their losses can be compared.
FAULT_JOB = {"model": "mlp-digits", "workers": 2, "method": "time", "schedule": "1f1b", "microbatches": 4,
             "batch_size": 64, "stop": {"steps": 1000}, "checkpoint_every": 100}
# One stage per host, to a target. Validation only every 400 steps: the target (near step 66 when
# checked each epoch) cannot end attempt 1 before the kill, made past checkpoint 20.
TWO_HOST_JOB = {**FAULT_JOB, "nodes": 2, "stop": {"target": 0.85}, "hyperparameters": {"eval_every": 400},
                "checkpoint_every": 20}
HOSTS = ("host-a", "host-b")


def wait_for_workers(server: Served, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not server.healthy(count):
        if time.monotonic() > deadline:
            raise SystemExit(f"fewer than {count} workers came up:\n{server.tail()}")
        time.sleep(0.3)


@contextmanager
def served_on_postgres(tmp: Path, postgres_url: str, redis_url: str, **settings: str) -> Iterator[Served]:
    """`pipeboard up --workers 0` (the API alone) on a PostgreSQL schema of its own (dropped after)
    and Redis under a key prefix of its own, heartbeats every 0.5 s, and ``settings`` (PIPEBOARD_*)."""
    tmp.mkdir(parents=True)
    database_url, drop = private_schema(postgres_url, prefix="pbfaults")
    env = {"PIPEBOARD_BROKER_URL": redis_url, "PIPEBOARD_RESULT_BACKEND": redis_url,
           "PIPEBOARD_KEY_PREFIX": f"pbfaults-{uuid.uuid4().hex[:12]}:", "PIPEBOARD_HEARTBEAT_SECONDS": "0.5", **settings}
    server = None
    try:
        server = Served(tmp, database_url, env, workers=0)
        yield server
    finally:
        if server is not None:
            server.stop()
        drop()


def reference(server: Served, spec: dict[str, Any]) -> dict[int, float]:
    """The losses of an uninterrupted job of ``spec``."""
    job_id = server.api("POST", "/jobs", spec)["id"]
    Watch(server, job_id).run()
    job = server.api("GET", f"/jobs/{job_id}")
    if job["status"] != "succeeded":
        raise SystemExit(f"the uninterrupted job {job['status']}: {job['error']}\n{server.tail()}")
    return job_losses(server, job_id)


def checks(server: Served, watch: Watch, attempts: int) -> str:
    try:
        if attempts == 2:
            resumed_whole(server, watch.job_id, watch.messages)
            return "ok"
        events_once(watch.messages)
        return "ok (one attempt)"
    except AssertionError as exc:
        return f"FAILED: {str(exc).splitlines()[0][:120]}"


def loss_gap(mine: dict[int, float], ref: dict[int, float]) -> str:
    """The largest loss difference over the steps both jobs have, and how many those are."""
    common = sorted(set(mine) & set(ref))
    gap = f"{max(abs(mine[s] - ref[s]) for s in common):.1e} over {len(common)} steps" if common else "n/a"
    return gap + (f" (uninterrupted: {len(ref)} steps)" if len(common) != len(ref) else "")


def recovery_times(watch: Watch, killed_at: float, attempt: int) -> dict[str, str]:
    """From the kill to the new attempt's training reporting where it resumes, and to its first step."""
    resumed, stepped = watch.first(attempt_started(attempt), killed_at), watch.first(new_step(attempt), killed_at)
    return {"kill -> resumed": f"{resumed - killed_at:.1f} s" if resumed else "-",
            "kill -> new step": f"{stepped - killed_at:.1f} s" if stepped else "-"}


def report(case: str, server: Served, watch: Watch, killed_at: float | None, ref: dict[int, float] | None,
           groups: set[int | None], attempts: int = 2) -> None:
    job = server.api("GET", f"/jobs/{watch.job_id}")
    row = {"case": case, "status": f"{job['status']} on attempt {job['attempt']}",
           "checks": checks(server, watch, attempts), "resumed from": job["attempts"][-1]["resume_step"]}
    if ref is not None:
        row["max |loss - uninterrupted|"] = loss_gap(job_losses(server, watch.job_id), ref)
    row["sse reconnects"] = watch.connections - 1
    groups.add(process_group(server, watch.job_id))
    time.sleep(0.5)
    row["left running"] = sum(group_alive(g) for g in groups if g)
    if killed_at is not None:
        row.update(recovery_times(watch, killed_at, attempts))
    print("  " + "; ".join(f"{k}: {v}" for k, v in row.items()), flush=True)


def killed_run(server: Served, spec: dict[str, Any], kill: Callable[[dict[str, Any]], None],
               due: Callable[[dict[str, Any]], bool] = past_checkpoint(FAULT_JOB["checkpoint_every"]),
               ) -> tuple[Watch, dict[str, Any]]:
    """Run a job of ``spec`` and call ``kill(state)`` once, at the first message ``due`` accepts;
    ``state``: the run's stage pids, its leader host and process groups so far, then when it was killed."""
    watch = Watch(server, server.api("POST", "/jobs", spec)["id"])
    state: dict[str, Any] = {"killed": None, "groups": set(), "pids": {}}

    def on(message: dict[str, Any]) -> None:
        if message["event"] == "progress" and message["data"].get("phase") == "running":
            state.update(pids=message["data"]["pids"], leader=server.api("GET", f"/jobs/{watch.job_id}")["worker"])
            state["groups"].add(process_group(server, watch.job_id))
        if state["killed"] is None and due(message):
            state["killed"] = time.monotonic()
            kill(state)  # at once: every moment between the step seen and the kill is more steps

    watch.run(on, hang_up=attempt_started(2))  # one reconnection with Last-Event-ID, mid-job
    return watch, state


# --- cases -----------------------------------------------------------------------------------


def stage_case(tmp: Path, schedules: list[str], postgres_url: str, redis_url: str) -> None:
    with served_on_postgres(tmp, postgres_url, redis_url) as server:
        host = WorkerHost(HOSTS[0], server.env, tmp)
        try:
            host.start()
            wait_for_workers(server, 1)
            for schedule in schedules:
                spec = {**FAULT_JOB, "schedule": schedule}
                ref = reference(server, spec)
                watch, state = killed_run(server, spec, lambda st: os.kill(int(st["pids"]["1"]), signal.SIGKILL))
                report(f"stage SIGKILL, {schedule}", server, watch, state["killed"], ref, state["groups"])
        finally:
            host.stop()


def kill_api(server: Served, state: dict[str, Any]) -> None:
    """SIGKILL `pipeboard up`'s API server; return once the one it starts instead answers."""
    os.kill(server.processes()["api"], signal.SIGKILL)
    while not server.healthy(0):
        time.sleep(0.1)
    state["back"] = time.monotonic()


def kill_up(server: Served) -> None:
    """SIGKILL `pipeboard up` (its children get SIGTERM and hand the job back), then start it again."""
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    time.sleep(2)  # its worker hands the job back
    server.start()


def up_cases(tmp: Path, schedules: list[str], cases: list[str]) -> None:
    tmp.mkdir(parents=True)
    server = Served(tmp, extra_env={"PIPEBOARD_HEARTBEAT_SECONDS": "0.5"})
    try:
        refs = {s: reference(server, {**FAULT_JOB, "schedule": s}) for s in schedules}
        for schedule in schedules if "worker" in cases else []:
            watch, state = killed_run(server, {**FAULT_JOB, "schedule": schedule},
                                      lambda st: os.kill(server.processes()["worker"], signal.SIGKILL))
            report(f"worker SIGKILL (pipeboard up), {schedule}", server, watch, state["killed"], refs[schedule], state["groups"])
        schedule = schedules[-1]
        if "api" in cases:
            watch, state = killed_run(server, {**FAULT_JOB, "schedule": schedule}, lambda st: kill_api(server, st))
            back = re.search(r"the API server is back", server.log.read_text())
            report(f"API SIGKILL (pipeboard up), {schedule}", server, watch, None, refs[schedule], state["groups"], attempts=1)
            print(f"    (training never stopped; the API answered again: {bool(back)}, "
                  f"{state['back'] - state['killed']:.1f} s after the kill)", flush=True)
        if "up" in cases:
            watch, state = killed_run(server, {**FAULT_JOB, "schedule": schedule}, lambda st: kill_up(server))
            report(f"pipeboard up SIGKILL + restart, {schedule}", server, watch, state["killed"], refs[schedule], state["groups"])
    finally:
        server.stop()


def uninterrupted_on_hosts(server: Served, hosts: dict[str, WorkerHost]) -> dict[int, float]:
    """A two-host job to its target, printed; its losses."""
    started = time.monotonic()
    watch = Watch(server, server.api("POST", "/jobs", TWO_HOST_JOB)["id"])
    watch.run()
    job = server.api("GET", f"/jobs/{watch.job_id}")
    if job["status"] != "succeeded":
        raise SystemExit(f"{job['status']}: {job['error']}\n" + "\n".join(h.tail() for h in hosts.values()))
    seen = sorted({e["host"] for e in server.api("GET", f"/jobs/{watch.job_id}/timeline?limit=200000")["events"]})
    summary = job["summary"]
    print(f"  2 hosts, uninterrupted: {job['status']}, reached target {summary['reached_target']} "
          f"({summary['metric_name']} {summary['final_metric']:.3f}) in {summary['steps']} steps, "
          f"{time.monotonic() - started:.1f} s from submit; timeline hosts {seen}", flush=True)
    return job_losses(server, watch.job_id)


def restart_host(hosts: dict[str, WorkerHost], state: dict[str, Any], role: str) -> None:
    """SIGKILL the leader's worker or the other host's, and start it again, as a supervisor would."""
    victim = state["leader"] if role == "leader" else next(n for n in hosts if n != state["leader"])
    hosts[victim].kill()
    hosts[victim].start()


def two_host_case(tmp: Path, postgres_url: str, redis_url: str) -> None:
    with served_on_postgres(tmp, postgres_url, redis_url, PIPEBOARD_JOIN_TIMEOUT_S="60") as server:
        network = HostNetwork(service_ports(server.env))
        hosts = {name: WorkerHost(name, server.env, tmp, network, i) for i, name in enumerate(HOSTS)}
        try:
            for host in hosts.values():
                host.start()
            wait_for_workers(server, len(hosts))
            print(f"  (hosts in network namespaces of their own: {network.isolated})", flush=True)
            ref = uninterrupted_on_hosts(server, hosts)
            for role in ("member", "leader"):
                watch, state = killed_run(server, TWO_HOST_JOB, lambda st, role=role: restart_host(hosts, st, role),
                                          lambda m: latest_step(m) > TWO_HOST_JOB["checkpoint_every"])
                report(f"2 hosts, {role}'s worker SIGKILL", server, watch, state["killed"], ref, state["groups"])
        finally:
            for host in hosts.values():
                host.stop()
            network.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="stage,worker,api,up,2-host")
    ap.add_argument("--schedules", default="gpipe,1f1b")
    ap.add_argument("--postgres-url", default=os.environ.get("PIPEBOARD_TEST_POSTGRES_URL",
                                                             "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--redis-url", default=os.environ.get("PIPEBOARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"))
    args = ap.parse_args()
    cases, schedules = args.cases.split(","), args.schedules.split(",")
    print(f"processor: {processor()}; load average {os.getloadavg()[0]:.1f} (shared machine: timings are noisy)")
    print(f"job: {FAULT_JOB}; on two hosts: {TWO_HOST_JOB}")
    with tempfile.TemporaryDirectory(prefix="pipeboard-faults-") as tmp:
        if "stage" in cases:
            stage_case(Path(tmp) / "stage", schedules, args.postgres_url, args.redis_url)
        if {"worker", "api", "up"} & set(cases):
            up_cases(Path(tmp) / "up", schedules, cases)
        if "2-host" in cases:
            two_host_case(Path(tmp) / "hosts", args.postgres_url, args.redis_url)


if __name__ == "__main__":
    main()
