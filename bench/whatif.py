"""Two what-ifs at once, one for a slow model with no cached profile: does the other wait? And where
does the slow model's code run? (Profiled inline in the API process, a factory that sleeps 30 s
delayed another user's what-if to 30.2 s.)

Against what `pipeboard up` serves after its migrations (the API, and one Celery worker, each its own
process) in a fresh data folder:
1. `mlp-digits` is what-iffed once and its profiling job awaited, so its profile is cached;
2. a code context whose task factory sleeps `--sleep` seconds is uploaded and registered (its
   validation, on the worker, sleeps too) and awaited until `ready`;
3. at once, from two threads: the slow model's what-if (no cached profile) and mlp-digits'.
   Each answer's time is measured;
4. while the slow model is profiled: the process listing, every process running the profiling
   (`pipeboard.app.services.profile_run`) with its chain of parents, and the API process's
   (uvicorn's) descendants;
5. the slow model's profiling job followed to its end and the what-if asked again (`--follow`).

Prints the processor and the figures; exit 1 if the other what-if took a second or more, or any
profiling ran under the API process.

    .venv/bin/python bench/whatif.py --sleep 30
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from pipeboard.trainer.hostinfo import cpu_name
from service_probe import SERVE, archive, free_port

ROOT = Path(__file__).resolve().parents[1]
PIPEBOARD = [str(Path(sys.executable).parent / "pipeboard")]
LEVELS = [{"workers": 2, "bandwidth": 1e9}]
WHAT_IF = {"batch_size": 16, "microbatches": 2, "levels": LEVELS, "method": "time"}
SLOW_TASK = """import time

SLEEP_S = {sleep}


def make_task(data=None):
    time.sleep(SLEEP_S)  # a slow model: its factory takes this long every time it is built
    from pipeboard.trainer import zoo

    return zoo.get("mlp-digits", hidden=24)
"""


def start(tmp: Path) -> tuple[subprocess.Popen, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPEBOARD_")}
    env["PIPEBOARD_DATA_DIR"] = str(tmp / "data")
    subprocess.run([*PIPEBOARD, "migrate", "heads"], env=env, check=True, capture_output=True, cwd=ROOT)
    secret = subprocess.run([*PIPEBOARD, "token", "create", "bench", "--scope", "write"], env=env,
                            capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVE.format(port=port)], env=env, cwd=ROOT,
                              stdout=open(tmp / "up.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            health = httpx.get(url + "/api/v1/health", timeout=2)
            if health.status_code == 200 and health.json().get("workers", 0) >= 1:
                return server, url, secret
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    os.killpg(server.pid, signal.SIGTERM)
    raise SystemExit(f"pipeboard up did not start: {(tmp / 'up.log').read_text()[-2000:]}")


def follow(api: httpx.Client, job: dict, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while job["status"] not in ("succeeded", "failed", "cancelled") and time.monotonic() < deadline:
        time.sleep(1)
        job = api.get(f"/jobs/{job['id']}").json()
    return job


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line), from `ps`."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True).stdout
    table = {}
    for line in out.splitlines():
        parts = line.split(None, 2)
        table[int(parts[0])] = (int(parts[1]), parts[2] if len(parts) > 2 else "")
    return table


def chain(table: dict[int, tuple[int, str]], pid: int) -> list[int]:
    out = []
    while pid in table and pid not in out:
        out.append(pid)
        pid = table[pid][0]
    return out


def short(args: str, width: int = 110) -> str:
    return args if len(args) <= width else args[:width - 3] + "..."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sleep", type=float, default=30.0, help="Seconds the slow model's factory sleeps.")
    parser.add_argument("--follow", action=argparse.BooleanOptionalAction, default=True,
                        help="Follow the slow model's profiling to its end and ask again.")
    args = parser.parse_args()
    print(f"processor: {cpu_name()}; cores: {os.cpu_count()}; slow factory sleeps {args.sleep:g} s")
    failed = 0
    answers: dict[str, tuple[float, httpx.Response]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-whatif-") as tmp:
        server, url, secret = start(Path(tmp))
        api = httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {secret}"}, timeout=120)
        try:
            warm = api.post("/plans", json={**WHAT_IF, "model": "mlp-digits"})
            if warm.status_code == 202:
                job = follow(api, warm.json()["job"], 600)
                print(f"1. mlp-digits profiled on the worker first (job {job['id']}: {job['status']})")
            sha = api.post("/contexts", files={"file": ("slow.tar.gz", archive({"slow.py": SLOW_TASK.format(sleep=args.sleep)}),
                                                        "application/gzip")}).json()["sha256"]
            api.post("/models", json={"name": "slow", "source": "slow.py:make_task", "context": sha})
            t0 = time.monotonic()
            while (model := api.get("/models/slow").json())["status"] == "validating" and time.monotonic() - t0 < 600:
                time.sleep(1)
            print(f"2. slow model registered: {model['status']} after {time.monotonic() - t0:.1f} s of validation")

            def ask(name: str) -> None:
                started = time.monotonic()
                answer = api.post("/plans", json={**WHAT_IF, "model": name})
                answers[name] = (time.monotonic() - started, answer)

            threads = [threading.Thread(target=ask, args=(n,)) for n in ("slow", "mlp-digits")]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            print("3. two what-ifs at once:")
            for name, (took, answer) in answers.items():
                print(f"   {name}: {answer.status_code} in {took:.3f} s"
                      + (f" (profiling job {answer.json()['job']['id']})" if answer.status_code == 202 else ""))
            other_s = answers["mlp-digits"][0]
            failed += answers["mlp-digits"][1].status_code != 201 or other_s >= 1.0
            slow_job = answers["slow"][1].json().get("job") if answers["slow"][1].status_code == 202 else None

            # 4. where the slow model's profiling runs, by process
            seen: list[int] = []
            deadline = time.monotonic() + 120
            while not seen and time.monotonic() < deadline:
                table = processes()
                # this server's profiling processes (the python ones; bwrap wraps them in its sandbox)
                seen = [p for p, (_, a) in table.items() if server.pid in chain(table, p)
                        and "-m pipeboard.app.services.profile_run" in a and not a.startswith("/usr/bin/bwrap")]
                time.sleep(0.5)
            api_pids = [p for p, (_, a) in table.items() if "uvicorn pipeboard.app.main:app" in a and server.pid in chain(table, p)]
            print(f"4. the API process (uvicorn): {api_pids}; the slow model's profiling processes: {seen}")
            for pid in seen:
                print(f"   {pid}, and its parents up to `pipeboard up`'s:")
                lineage = chain(table, pid)
                for p in lineage[:lineage.index(server.pid) + 1]:
                    print(f"     {p:>7}  {short(table[p][1])}")
                under_api = [a for a in api_pids if a in lineage]
                failed += bool(under_api)
                print(f"   under the API process: {'YES' if under_api else 'no'}")
            descendants = [p for p in table if any(a in chain(table, p)[1:] for a in api_pids)]
            print(f"   the API process's own children: {[(p, short(table[p][1], 60)) for p in descendants] or 'none'}")
            failed += not seen or bool(descendants)

            if args.follow and slow_job:
                t0 = time.monotonic()
                done = follow(api, slow_job, 900)
                again = api.post("/plans", json={**WHAT_IF, "model": "slow"})
                print(f"5. the slow model's profiling job {done['id']}: {done['status']} after {time.monotonic() - t0:.0f} s "
                      f"more; the what-if again: {again.status_code}"
                      + (f", plan {again.json()['id']} on profile {again.json()['profile_id']}" if again.status_code == 201 else ""))
                failed += again.status_code != 201
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
    print(f"\nthe other what-if: {'under' if answers.get('mlp-digits', (9, None))[0] < 1 else 'NOT under'} a second; "
          f"{'all checks passed' if not failed else f'{failed} check(s) failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
