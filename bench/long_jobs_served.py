"""A long job through the service, as a user runs it: `pipeboard up` (the API and a real
Celery worker, own data folder) on the embedded SQLite default and on PostgreSQL, one mlp-digits job
of 4 stages (uniform split) x 16 microbatches (batch 64, 1F1B) for --steps steps, then:

- database bytes and rows per step, amortised (GET /jobs/{id}/storage: stored values' lengths; for
  SQLite also the file with its WAL),
- the writer's lag at the end: how much later than training the last step was readable over HTTP.
  The bench polls GET /metrics?after_seq= (4 Hz) all along; the run's step times are seconds since
  its own origin, so the clock offset is taken as the smallest (seen - step time) over the whole
  run, and the lag is the last step's (seen - step time) above it. It is exact to within the
  fastest step's own delay (a commit and a poll, tens of ms). Also the run's own figure: its summary's
  wall_s - train_s (last step to summary, writer excluded),
- over HTTP (httpx, median of 3): the job page's first requests (GET /jobs/{id}, /detail, /timeline of
  the newest recorded window and /metrics limit 1,000, as the page asks them, /storage), and /timeline
  of every window at once (limit 100,000), /metrics at its default limit (5,000), /steps,
- in Chromium (Debian's /usr/bin/chromium through playwright, as tests/e2e): the job page's load, from
  navigation to its throughput chart and Gantt drawn, and the timeline request's own duration (the
  browser's Resource Timing), median of 3 loads, and the page's Plotly draws and the points they were given,
- screenshots (--shots): the job page while it runs just after "Record the next 20 steps" was
  clicked, the finished job's step charts over all its steps, the Gantt on a periodic window and on
  the requested one.

--baseline-steps: the same job with every action of every step kept (PIPEBOARD_DETAIL_FIRST_STEPS =
its steps: what the service stored before detail windows), same figures.
--pairs: samples/s of the job through the service against `pipeboard train` alone (same model,
stages, microbatches, batch; --pair-steps steps), alternating, the median ratio and its spread.

--existing DATA_DIR:JOB: only the reads and the page of a job already in a data folder (another run's), served by
this checkout: one job timed under two versions of the code.
--stages, --microbatches: another pipeline shape (the page's and the store's costs depend on the steps; 2 stages of
1 microbatch train hundreds of steps a second, a cheap way to a long job).

    .venv/bin/python bench/long_jobs_served.py --steps 50000 --baseline-steps 5000 --pairs 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from service_probe import Served  # noqa: E402

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402

PIPEBOARD = str(Path(sys.executable).parent / "pipeboard")
MODEL, STAGES, MICROBATCHES, BATCH = "mlp-digits", 4, 16, 64
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def spec(steps: int, name: str) -> dict:
    return {"name": name, "model": MODEL, "batch_size": BATCH, "workers": STAGES, "method": "uniform",
            "schedule": "1f1b", "microbatches": MICROBATCHES, "stop": {"steps": steps}}


def set_shape(stages: int, microbatches: int) -> None:
    """A smaller pipeline trains many more steps a second; the page's and the store's cost depend on the steps."""
    global STAGES, MICROBATCHES
    STAGES, MICROBATCHES = stages, microbatches


def follow(server: Served, job_id: int, on_step=None) -> dict:
    """Poll the job's new metric points until it ends; record when each last step was first seen."""
    seq, seen, last_step = 0, [], -1
    while True:
        points = server.http.get(f"/jobs/{job_id}/metrics", params={"after_seq": seq, "limit": 100000}).json()["points"]
        now = time.monotonic()
        for p in points:
            seq = max(seq, p["seq"])
            if "samples_per_s" in p["values"] or "loss" in p["values"]:
                if p["step"] > last_step:
                    last_step = p["step"]
                    latest = p
        if points and last_step >= 0:
            seen.append((now, latest["step"], latest["wall_s"]))
            if on_step:
                on_step(last_step)
        job = server.api("GET", f"/jobs/{job_id}")
        if job["status"] in ("succeeded", "failed", "cancelled") and not points:
            break
        time.sleep(0.25)
    offset = min(t - w for t, _, w in seen)
    t_end, step_end, w_end = seen[-1]
    return {"job": job, "lag_s": (t_end - w_end) - offset, "last_step": step_end}


def timed(fn, n: int = 3) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def http_reads(server: Served, job_id: int) -> dict:
    def get(path: str, **params):
        return lambda: server.http.get(path, params=params).raise_for_status()

    newest = server.http.get(f"/jobs/{job_id}/steps", params={"limit": 1}).json()["detail_steps"][-1]
    reads = {"job": get(f"/jobs/{job_id}"), "detail": get(f"/jobs/{job_id}/detail"),
             "timeline": get(f"/jobs/{job_id}/timeline", step_from=newest[0], step_to=newest[1], limit=100000),
             "timeline_every_window": get(f"/jobs/{job_id}/timeline", limit=100000),
             "metrics": get(f"/jobs/{job_id}/metrics", limit=1000), "metrics_5000": get(f"/jobs/{job_id}/metrics"),
             "steps": get(f"/jobs/{job_id}/steps", limit=1),
             "steps_all": get(f"/jobs/{job_id}/steps", limit=5000), "storage": get(f"/jobs/{job_id}/storage")}
    out = {name: timed(fn) for name, fn in reads.items()}

    def page():  # the job page's first requests, as it sends them: at once
        threads = [threading.Thread(target=reads[n]) for n in ("job", "detail", "timeline", "metrics", "storage")]
        [t.start() for t in threads]
        [t.join() for t in threads]
    out["page_requests"] = timed(page)
    return out


DRAWN = ("() => ['chart-throughput', 'gantt-live'].every((id) => ((document.getElementById(id) || {}).data || [])"
         ".some((t) => (t.x || []).length > 0))")
# counts the page's Plotly draws and the points they are given (every trace's x), from navigation on
COUNT_DRAWS = """window.__draws = 0; window.__points = 0;
Object.defineProperty(window, 'Plotly', { configurable: true, get() { return window.__plotly; }, set(p) {
  const react = p.react;
  p.react = function (div, data, ...rest) { window.__draws++; window.__points += (data || []).reduce((n, t) => n + (t.x || []).length, 0);
    return react.call(this, div, data, ...rest); };
  window.__plotly = p; } });"""
TIMELINE_MS = ("() => performance.getEntriesByType('resource').filter((e) => e.name.includes('/timeline') && !e.name.includes('predicted'))"
               ".map((e) => e.duration)")


def browser_figures(server: Served, job_id: int, shots: Path | None, requested: list | None, label: str) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        context.add_init_script(COUNT_DRAWS)
        page = context.new_page()
        page.set_default_timeout(180000)
        page.goto(f"{server.url}/#token={server.token}")
        page.locator("#auth-status", has_text="admin").wait_for()
        loads, timeline, draws = [], [], []
        for _ in range(3):
            page.goto(f"{server.url}/#/jobs")
            page.evaluate("() => { performance.clearResourceTimings(); window.__draws = 0; window.__points = 0; }")
            t = time.perf_counter()
            page.goto(f"{server.url}/#/jobs/{job_id}")
            page.wait_for_function(DRAWN)
            loads.append(time.perf_counter() - t)
            timeline += page.evaluate(TIMELINE_MS)[-1:]
            page.wait_for_timeout(1000)  # the draws after the measured ones (the utilisation's, the windows')
            draws.append(page.evaluate("() => [window.__draws, window.__points]"))
        if shots:
            page.locator("#detail-windows", has_text="Full actions").wait_for()
            page.screenshot(path=str(shots / f"{label}-charts.png"), full_page=True)
            options = page.eval_on_selector_all("#detail-window option", "(os) => os.map((o) => o.value).filter(Boolean)")
            windows = [o for o in options if requested is None or o != f"{requested[0]}:{requested[1]}"]
            middle = windows[len(windows) // 2]
            for name, value in [("window", middle)] + ([("requested", f"{requested[0]}:{requested[1]}")] if requested else []):
                page.select_option("#detail-window", value)
                first = value.split(":")[0]
                page.wait_for_function(f"() => (document.getElementById('gantt-live').data || []).some((t) => t.x.length > 0)")
                page.wait_for_timeout(1500)
                page.screenshot(path=str(shots / f"{label}-gantt-{name}-{first}.png"), full_page=True)
        browser.close()
    return {"page_load_s": statistics.median(loads), "timeline_request_s": statistics.median(timeline) / 1000 if timeline else None,
            "plotly_draws": draws[-1][0], "plotly_points": draws[-1][1]}


def request_while_running(server: Served, job_id: int, shots: Path | None, label: str) -> None:
    """Open the running job's page and click "Record the next 20 steps", as a user would."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
        page.set_default_timeout(180000)
        page.goto(f"{server.url}/#token={server.token}")
        page.locator("#auth-status", has_text="admin").wait_for()
        page.goto(f"{server.url}/#/jobs/{job_id}")
        page.locator("#record-detail").wait_for(state="visible")
        page.locator("#detail-windows", has_text="Full actions").wait_for()
        count = "() => (document.getElementById('detail-windows').textContent.match(/\\d+–\\d+/g) || []).length"
        before = page.evaluate(count)
        page.click("#record-detail")
        page.locator("#detail-windows", has_text="Asked").wait_for()
        # the page reloads its windows 3 s after asking, then every 10 s: wait for the new one there
        page.wait_for_function(f"() => ({count})() > {before}", timeout=60000)
        if shots:
            page.screenshot(path=str(shots / f"{label}-running-requested.png"), full_page=True)
        browser.close()


def file_bytes(data: Path) -> int | None:
    files = [data / "pipeboard.sqlite", data / "pipeboard.sqlite-wal"]
    return sum(f.stat().st_size for f in files if f.exists()) if files[0].exists() else None


def served_job(database: str, pg_url: str, steps: int, *, keep_all: bool, shots: Path | None, request_at: float | None) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"pblj-{database}-"))
    url, drop = None, None
    if database == "postgres":
        from pipeboard.app.core.db import private_schema

        url, drop = private_schema(pg_url, prefix="pbljs")
    env = {"PIPEBOARD_DETAIL_FIRST_STEPS": str(steps)} if keep_all else {}
    server = Served(tmp, url, env)
    label = f"{database}-{steps}" + ("-all" if keep_all else "")
    try:
        job = server.api("POST", "/jobs", spec(steps, f"long-{label}"))
        asked = threading.Event()

        def on_step(step: int) -> None:
            if request_at is not None and not asked.is_set() and step >= request_at * steps:
                asked.set()
                threading.Thread(target=request_while_running, args=(server, job["id"], shots, label), daemon=True).start()
        t0 = time.monotonic()
        followed = follow(server, job["id"], on_step)
        took = time.monotonic() - t0
        final = followed["job"]
        if final["status"] != "succeeded":
            raise SystemExit(f"job {label} {final['status']}: {final.get('error')}\n{server.tail()}")
        summary = final["summary"]
        disk = server.api("GET", f"/jobs/{job['id']}/storage")
        windows = server.http.get(f"/jobs/{job['id']}/steps", params={"limit": 1}).json()["detail_steps"]
        requested = next((w for w in windows if w[1] - w[0] + 1 == 20), None)
        plan = server.api("GET", f"/plans/{final['plan_id']}")
        result = {
            "label": label, "steps": summary["steps"], "stages": len(plan["plan"]["stages"]), "took_s": took,
            "samples_per_s": summary["samples_per_s"], "bytes_per_step": disk["bytes"] / steps, "rows_per_step": disk["rows"] / steps,
            "tables": {k: v for k, v in disk["tables"].items()}, "detail_steps": disk["detail_steps"], "windows": len(windows),
            "requested_window": requested, "dropped": summary.get("detail_dropped_actions"),
            "lag_s": followed["lag_s"], "run_end_s": summary["wall_s"] - summary["train_s"],
            "file_bytes_per_step": (lambda b: b / steps if b else None)(file_bytes(server.data)),
            "http": http_reads(server, job["id"]),
        }
        if os.path.exists(CHROMIUM):
            try:
                result["browser"] = browser_figures(server, job["id"], shots, requested, label)
            except Exception as exc:  # the figures above are kept; say what the browser met
                print(f"[{label}] Chromium: {exc!r}"[:2000], flush=True)
        return result
    finally:
        server.stop()
        if drop:
            drop()


def existing_job(data: Path, job_id: int) -> dict:
    """The page's and the reads' figures of a job already in a data folder (another bench run's), served by this
    checkout: the same job timed under two versions of the code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPEBOARD_")}
    made = subprocess.run([sys.executable, "-c", "from pipeboard.app.cli import main; main()", "token", "create", "bench", "--scope", "admin"],
                          env={**env, "PIPEBOARD_DATA_DIR": str(data)}, capture_output=True, text=True, check=True, cwd=ROOT)
    token = re.search(r"pb_[A-Za-z0-9_-]+", made.stdout).group(0)
    server = Served(data.parent, None, {}, token=token)
    try:
        steps = server.api("GET", f"/jobs/{job_id}")["summary"]["steps"]
        return {"label": f"{data}: job {job_id}, {steps} steps", "http": http_reads(server, job_id),
                "browser": browser_figures(server, job_id, None, None, "existing")}
    finally:
        server.stop()


def direct_run(steps: int) -> float:
    """`pipeboard train` alone, no service: the same job's steady samples/s."""
    out = subprocess.run([PIPEBOARD, "train", "--model", MODEL, "--stages", str(STAGES), "--workers", str(STAGES), "--schedule", "1f1b",
                          "--microbatches", str(MICROBATCHES), "--batch-size", str(BATCH), "--steps", str(steps), "--json"],
                         capture_output=True, text=True, cwd=tempfile.mkdtemp(prefix="pblj-direct-"), check=True,
                         env={k: v for k, v in os.environ.items() if not k.startswith("PIPEBOARD_")})
    return json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"]


def report(r: dict) -> None:
    file_part = f", SQLite file {r['file_bytes_per_step']:.0f} B/step" if r.get("file_bytes_per_step") else ""
    print(f"\n[{r['label']}] {r['steps']} steps on {r['stages']} stages in {r['took_s']:.0f} s, {r['samples_per_s']:.1f} samples/s", flush=True)
    print(f"  storage: {r['bytes_per_step']:.0f} B/step{file_part}, {r['rows_per_step']:.3f} rows/step; "
          f"tables {json.dumps(r['tables'])}; {r['detail_steps']} steps with actions in {r['windows']} windows; "
          f"requested window {r['requested_window']}; dropped actions {r['dropped']}", flush=True)
    print(f"  writer lag at the end {r['lag_s']:.3f} s (run: last step to summary {r['run_end_s']:.3f} s)", flush=True)
    print("  HTTP (median of 3): " + ", ".join(f"{k} {v:.3f} s" for k, v in r["http"].items()), flush=True)
    if "browser" in r:
        b = r["browser"]
        tl = f"{b['timeline_request_s']:.3f} s" if b["timeline_request_s"] is not None else "n/a"
        print(f"  Chromium (median of 3): job page drawn {b['page_load_s']:.3f} s, its timeline request {tl}; "
              f"{b['plotly_draws']} Plotly draws given {b['plotly_points']} points in all", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50000)
    parser.add_argument("--baseline-steps", type=int, default=5000, help="every action kept (0: none)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--pair-steps", type=int, default=2000)
    parser.add_argument("--databases", default="sqlite,postgres")
    parser.add_argument("--stages", type=int, default=STAGES)
    parser.add_argument("--microbatches", type=int, default=MICROBATCHES)
    parser.add_argument("--postgres-url", default=os.environ.get("PIPEBOARD_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--shots", default="", help="folder for screenshots (empty: none)")
    parser.add_argument("--only", default="long,pairs,baseline", help="which parts to run, in this order")
    parser.add_argument("--existing", default="", help="DATA_DIR:JOB_ID: only time the page and reads of that job, served by this checkout")
    args = parser.parse_args()
    if args.existing:
        data, job_id = args.existing.rsplit(":", 1)
        print(f"processor: {cpu_name()}, {os.cpu_count()} CPUs", flush=True)
        r = existing_job(Path(data), int(job_id))
        b = r["browser"]
        print(f"[{r['label']}]\n  HTTP (median of 3): " + ", ".join(f"{k} {v:.3f} s" for k, v in r["http"].items()), flush=True)
        print(f"  Chromium (median of 3): job page drawn {b['page_load_s']:.3f} s, its timeline request {b['timeline_request_s']:.3f} s; "
              f"{b['plotly_draws']} Plotly draws given {b['plotly_points']} points in all", flush=True)
        return
    set_shape(args.stages, args.microbatches)
    shots = Path(args.shots) if args.shots else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    print(f"processor: {cpu_name()}, {os.cpu_count()} CPUs", flush=True)
    print(f"{MODEL}, {STAGES} stages x {MICROBATCHES} microbatches, batch {BATCH}, 1F1B", flush=True)
    databases = args.databases.split(",")
    for part in args.only.split(","):
        if part == "long":
            for db in databases:
                report(served_job(db, args.postgres_url, args.steps, keep_all=False, shots=shots, request_at=0.4))
        elif part == "baseline" and args.baseline_steps:
            for db in databases:
                report(served_job(db, args.postgres_url, args.baseline_steps, keep_all=True, shots=None, request_at=None))
        elif part == "pairs" and args.pairs:
            ratios = []
            for i in range(args.pairs):
                alone = direct_run(args.pair_steps)
                served = served_job(databases[0], args.postgres_url, args.pair_steps, keep_all=False, shots=None, request_at=None)["samples_per_s"]
                ratios.append(served / alone)
                print(f"pair {i + 1}: alone {alone:.1f} samples/s, through the service ({databases[0]}) {served:.1f} samples/s, "
                      f"ratio {served / alone:.3f}", flush=True)
            print(f"samples/s through the service / alone over {args.pairs} pairs of {args.pair_steps} steps: median {statistics.median(ratios):.3f}, "
                  f"spread {min(ratios):.3f}-{max(ratios):.3f}", flush=True)


if __name__ == "__main__":
    main()
