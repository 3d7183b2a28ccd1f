"""An adversarial probe of access and malformed requests, re-run against a real server: each
request it sends (no token, one user acting on another's jobs and contexts, a model's source
climbing out of its context, bodies nested too deep or truncated, bad `Last-Event-ID` headers),
what an unguarded server answered, and what this one answers.

A fresh data folder, `pipeboard migrate`, tokens made with `pipeboard token create --user` (alice
and bob write tokens, the admin's), and uvicorn serving the API on a free loopback port; no worker,
so jobs stay queued. Prints the processor and a Markdown table; exit 1 if any finding is not
closed as expected.

    .venv/bin/python bench/probe_access.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from pipeboard.trainer.hostinfo import cpu_name
from service_probe import archive, free_port

ROOT = Path(__file__).resolve().parents[1]
PIPEBOARD = [str(Path(sys.executable).parent / "pipeboard")]  # the installed command
JOB = {"model": "mlp-digits", "workers": 2, "stop": {"steps": 2}}
TASK = "def make_task(data=None):\n    raise RuntimeError('not run by this probe')\n"


def token(env: dict[str, str], name: str, scope: str, user: str) -> str:
    made = subprocess.run([*PIPEBOARD, "token", "create", name, "--scope", scope, "--user", user], env=env,
                          capture_output=True, text=True, check=True, cwd=ROOT)
    return made.stdout.strip()


def start(tmp: Path) -> tuple[subprocess.Popen, str, dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPEBOARD_")}
    env["PIPEBOARD_DATA_DIR"] = str(tmp / "data")
    # `heads`: every branch (a revision another change adds beside 0006 until they are chained)
    subprocess.run([*PIPEBOARD, "migrate", "heads"], env=env, check=True, capture_output=True, cwd=ROOT)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "pipeboard.app.main:app", "--port", str(port),
                               "--log-level", "warning"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=open(tmp / "server.log", "wb"), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/api/v1/health", timeout=2).status_code == 200:
                return server, url, env
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit(f"the server did not start: {(tmp / 'server.log').read_text()[-2000:]}")


def outcome(answer: httpx.Response) -> str:
    try:
        detail = answer.json().get("detail") if answer.content else None
    except ValueError:
        detail = None
    return f"{answer.status_code}" + (f" {detail!r}" if isinstance(detail, str) else "")


def probe(url: str, env: dict[str, str]) -> list[tuple[str, str, str, bool]]:
    """(request, then, now, closed) per finding."""
    who = {"alice": token(env, "alice-laptop", "write", "alice"), "bob": token(env, "bob-laptop", "write", "bob"),
           "admin": token(env, "root", "admin", "admin")}
    client = httpx.Client(base_url=url + "/api/v1", timeout=60)

    def as_(user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {who[user]}"}

    rows = []
    job = client.post("/jobs", json=JOB, headers=as_("alice")).json()["id"]
    anonymous = client.get("/jobs")
    rows.append(("`GET /jobs` without a token", "200, every job", outcome(anonymous), anonymous.status_code == 401))
    for verb, says in (("cancel", "cancels"), ("retry", "retries")):
        answer = client.post(f"/jobs/{job}/{verb}", headers=as_("bob"))
        rows.append((f"bob {says} alice's job", "200", outcome(answer), answer.status_code == 404))
    read = client.get(f"/jobs/{job}", headers=as_("bob"))
    counts = {u: client.get("/jobs", headers=as_(u)).json()["count"] for u in ("bob", "alice", "admin")}
    rows.append(("bob reads alice's job / lists jobs (alice, admin list)", "everything",
                 f"{outcome(read)} / count {counts['bob']} (alice {counts['alice']}, admin {counts['admin']})",
                 read.status_code == 404 and counts == {"bob": 0, "alice": 1, "admin": 1}))

    alices = client.post("/contexts", headers=as_("alice"), files={"file": ("a.tar.gz", archive({"mytask.py": TASK}))}).json()
    bobs = client.post("/contexts", headers=as_("bob"), files={"file": ("b.tar.gz", archive({"other.py": TASK}))}).json()
    on_hers = client.post("/models", headers=as_("bob"),
                          json={"name": "bob-on-alice", "source": "mytask.py:make_task", "context": alices["sha256"]})
    rows.append(("bob registers a model on alice's context", "ran, read her files", outcome(on_hers),
                 on_hers.status_code == 422))
    climbing = client.post("/models", headers=as_("alice"), json={
        "name": "climber", "source": f"../{bobs['sha256']}/other.py:make_task", "context": alices["sha256"]})
    rows.append(("`source: ../<other sha>/other.py:make_task`", "ran", outcome(climbing), climbing.status_code == 422))

    deep = "{" + '"k": {' * 500 + "}" * 500 + "}"
    nested = client.post("/models", headers={**as_("alice"), "Content-Type": "application/json"},
                         content='{"name": "deep", "source": "json:loads", "config": ' + deep + "}")
    listing = client.get("/models", headers=as_("alice"))
    rows.append(("`POST /models` config nested 500 deep, then `GET /models`", "500, row stored; `GET /models` 500 for good",
                 f"{outcome(nested)}; GET {listing.status_code}", nested.status_code == 422 and listing.status_code == 200))

    whole = archive({"mytask.py": TASK * 200})
    truncated = client.post("/contexts", headers=as_("alice"), files={"file": ("cut.tar.gz", whole[: len(whole) // 2])})
    rows.append(("truncated `.tar.gz`", "500 (EOFError)", outcome(truncated), truncated.status_code == 422))

    for label, value in (("\"²\" (byte 0xB2)", b"\xb2"), ("5,000 digits", b"5" * 5000)):
        answer = client.get(f"/jobs/{job}/events", headers=[(b"Authorization", as_("alice")["Authorization"].encode()),
                                                             (b"Last-Event-ID", value)])
        rows.append((f"`Last-Event-ID` {label}", "500 (ValueError)", outcome(answer), answer.status_code == 400))

    profile = client.post("/profiles/upload", headers=as_("alice"),
                          files={"file": ("p.json", ("[" * 100_000 + "]" * 100_000).encode())})
    rows.append(("profile upload nested 100,000 deep", "500 (RecursionError)", outcome(profile), profile.status_code == 422))

    shadow = client.post("/jobs", json={**JOB, "data": "/etc/shadow"}, headers=as_("alice"))
    missing = client.post("/jobs", json={**JOB, "data": "/etc/nonexistent"}, headers=as_("alice"))
    same = (shadow.status_code == missing.status_code == 422
            and shadow.json()["detail"].replace("/etc/shadow", "P") == missing.json()["detail"].replace("/etc/nonexistent", "P"))
    rows.append(("`data: /etc/shadow` and `/etc/nonexistent`", "201 and 422 (an oracle)",
                 f"{outcome(shadow)} and {missing.status_code}, {'the same' if same else 'DIFFERENT'} message", same))

    heads = [client.head("/health").status_code, client.head("/jobs", headers=as_("alice")).status_code]
    rows.append(("`HEAD /health`, `HEAD /jobs`", "405, 405", ", ".join(map(str, heads)), heads == [200, 200]))
    return rows


def main() -> int:
    print(f"processor: {cpu_name()}, {os.cpu_count()} CPUs; python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="probe-access-") as tmp:
        server, url, env = start(Path(tmp))
        try:
            rows = probe(url, env)
        finally:
            server.terminate()
            server.wait(timeout=20)
    print("\n| request | then | now | closed |\n|---|---|---|---|")
    for request, then, now, closed in rows:
        print(f"| {request} | {then} | {now} | {'yes' if closed else 'NO'} |")
    still_open = [r[0] for r in rows if not r[3]]
    print(f"\n{len(rows) - len(still_open)} of {len(rows)} findings closed" + (f"; open: {still_open}" if still_open else ""))
    return 1 if still_open else 0


if __name__ == "__main__":
    raise SystemExit(main())
