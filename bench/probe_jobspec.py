"""An adversarial probe of job specifications, re-run against a real server: each job it submits
(fields out of range, dropped, or contradicting one another or the cluster), what an unchecked
server did with it, and what this one answers; then a valid job, to show that what the
specification says reaches the run.

A fresh data folder, `pipeboard migrate heads`, a write token (`pipeboard token create`), and what
`pipeboard up` serves after its migrations (the API, the dashboard and one Celery worker, each its own
process) on a free loopback port. Prints the processor
and a Markdown table; exit 1 if a finding is not closed as expected.

    .venv/bin/python bench/probe_jobspec.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from pipeboard.trainer.hostinfo import cpu_name
from service_probe import SERVE, free_port

ROOT = Path(__file__).resolve().parents[1]
PIPEBOARD = [str(Path(sys.executable).parent / "pipeboard")]  # the installed command
V2 = {"version": 2, "model": {"name": "mlp-digits", "batch_size": 32},
      "layout": {"workers": 2, "schedule": "1f1b", "microbatches": 4}, "length": {"steps": 3}}
V1 = {"model": "mlp-digits", "workers": 2, "schedule": "1f1b", "microbatches": 4, "batch_size": 32, "stop": {"steps": 3}}


def with_(section: str, **fields) -> dict:
    return {**V2, section: {**V2.get(section, {}), **fields}}


# (finding, what it got then, the body as sent, the start of the 422 expected now)
FINDINGS = [
    ("`machine.device: cuda`, no GPU worker", "201, trained on CPU", json.dumps(with_("machine", device="cuda")),
     "machine.device: device cuda: no live worker reports a GPU"),
    ("`device: cuda` top-level (version-1 body)", "201, dropped silently, trained on CPU",
     json.dumps({**V1, "device": "cuda"}), "device: Extra inputs are not permitted"),
    ("`memory_bytes: Infinity`", "201, failed at run time",
     json.dumps({**V1, "memory_bytes": float("inf")}), "layout.memory_bytes: Input should be a finite number"),
    ("`stop.target: \"nan\"`", "201, stored NaN, no stop rule shown, ran 8,800 steps",
     json.dumps({**V1, "stop": {"target": "nan"}}), "length.target: Input should be a finite number"),
    ("microbatches 64, batch size 32", "accepted, failed later", json.dumps({**V1, "microbatches": 64}),
     "layout.microbatches: 64 microbatches do not divide model.batch_size 32 evenly"),
    ("`chunks: 16` under 1f1b", "accepted, failed later", json.dumps({**V1, "hyperparameters": {"chunks": 16}}),
     "layout.chunks: 1f1b runs one chunk per worker"),
    ("`nodes: 2` on one host", "accepted, failed later", json.dumps({**V1, "nodes": 2}),
     "layout.nodes: the job needs 2 hosts; 1 host(s) have a live worker"),
]


def start(tmp: Path) -> tuple[subprocess.Popen, str, str, Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPEBOARD_")}
    data = tmp / "data"
    env["PIPEBOARD_DATA_DIR"] = str(data)
    subprocess.run([*PIPEBOARD, "migrate", "heads"], env=env, check=True, capture_output=True, cwd=ROOT)
    secret = subprocess.run([*PIPEBOARD, "token", "create", "probe", "--scope", "write"], env=env,
                            capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVE.format(port=port)], env=env, cwd=ROOT,
                              stdout=open(tmp / "up.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # up, and its worker heart-beating (a live host)
        try:
            health = httpx.get(url + "/api/v1/health", timeout=2)
            if health.status_code == 200 and health.json().get("workers", 0) >= 1:
                return server, url, secret, data
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    os.killpg(server.pid, signal.SIGTERM)
    raise SystemExit(f"pipeboard up did not start: {(tmp / 'up.log').read_text()[-2000:]}")


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def main() -> int:
    print(f"processor: {cpu_name()}")
    with tempfile.TemporaryDirectory(prefix="probe-jobspec-") as tmp:
        server, url, secret, data = start(Path(tmp))
        api = httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {secret}"}, timeout=60)
        failed = 0
        try:
            print("\n| finding | then | now |\n|---|---|---|")
            for finding, then, body, expected in FINDINGS:
                answer = api.post("/jobs", content=body, headers={"Content-Type": "application/json"})
                detail = answer.json().get("detail", "") if answer.status_code != 201 else ""
                ok = answer.status_code == 422 and detail.startswith(expected)
                failed += not ok
                print(f"| {cell(finding)} | {cell(then)} | {answer.status_code} \"{cell(detail)}\"{'' if ok else ' UNEXPECTED'} |")
            queued = api.get("/jobs").json()["count"]
            print(f"\njobs in the queue after the refused ones: {queued}")
            failed += queued != 0

            # a valid job: bf16, sgd, seed 7 and 3 steps reach the run (its run file, and its summary)
            spec = {**with_("machine", device="cpu", precision="bf16"), "optimizer": {"name": "sgd", "seed": 7}}
            job = api.post("/jobs", json=spec).json()
            deadline = time.monotonic() + 300
            while job["status"] not in ("succeeded", "failed", "cancelled") and time.monotonic() < deadline:
                time.sleep(1)
                job = api.get(f"/jobs/{job['id']}").json()
            run_files = sorted((data / "jobs" / str(job["id"])).rglob("run.json"))
            run = json.loads(run_files[0].read_text()) if run_files else {}
            reached = {k: run.get(k) for k in ("precision", "device", "optimizer", "seed", "steps", "schedule")}
            print(f"\na valid job: {job['status']} after {job.get('summary', {}).get('steps')} steps; its run file "
                  f"({run_files[0].relative_to(data) if run_files else 'none'}): {reached}")
            failed += job["status"] != "succeeded" or reached != {"precision": "bf16", "device": "cpu", "optimizer": "sgd",
                                                                 "seed": 7, "steps": 3, "schedule": "1f1b"}
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
    print(f"\n{'all findings closed' if not failed else f'{failed} finding(s) not closed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
