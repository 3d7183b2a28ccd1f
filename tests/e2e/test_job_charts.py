"""The job page's step charts in Chromium against `pipeboard up`: tokens/s beside samples/s when the run reports
them (and nothing extra when it does not), and a long job's series given to the charts bounded in points."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e]

SPEC = {"model": "mlp-digits", "workers": 2, "schedule": "1f1b", "microbatches": 4, "stop": {"steps": 5}}

# A finished job of `steps` steps made through the run's own sink, in a process of the server's deployment.
SEEDED = """
import sys
from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import JobStatus
from pipeboard.app.services import jobs, runner
from pipeboard.app.services.run_sink import DbSink
from pipeboard.trainer.schedule.actions import TimelineEvent
from pipeboard.trainer.sink import MetricRecord

job_id, steps, tokens = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
assert runner.claim_next(None, "seed@a") == job_id
sink = DbSink(job_id, own_group=False)
sink.on_status("running", start_step=0, hosts={0: "a", 1: "a"})
sink.on_events([TimelineEvent(w, w, 0, 0, "F", 0.01 * k + 0.002 * w, 0.01 * k + 0.006, step=k) for k in range(3) for w in (0, 1)])
for first in range(0, steps, 500):
    sink.on_metrics([MetricRecord(step=k + 1, wall_s=0.01 * (k + 1), values={"loss": 1.0, "samples_per_s": 64.0,
                     **({"tokens": 640.0, "tokens_per_s": 640.0} if tokens else {})}) for k in range(first, min(steps, first + 500))])
if len(sys.argv) < 5 or sys.argv[4] != "running":
    with get_sessionmaker()() as s:
        assert jobs.finish(s, job_id, JobStatus.SUCCEEDED, expected=(JobStatus.RUNNING,))
"""

# More steps of a running job, reported as its run reports them.
MORE_STEPS = """
import sys
from pipeboard.app.services.run_sink import DbSink
from pipeboard.trainer.sink import MetricRecord

job_id, first, last = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
DbSink(job_id, own_group=False).on_metrics([MetricRecord(step=k, wall_s=0.01 * k, values={"loss": 0.5, "samples_per_s": 96.0})
                                            for k in range(first, last + 1)])
"""


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(workers=0)


def run_script(server, script: str, *argv: object) -> None:
    done = subprocess.run([sys.executable, "-c", script, *map(str, argv)], env=server.env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr


def seeded_job(server, steps: int, tokens: bool, running: bool = False) -> int:
    job = server.api("POST", "/jobs", {**SPEC, "name": f"seeded-{steps}", "priority": 100})
    run_script(server, SEEDED, job["id"], steps, "1" if tokens else "0", "running" if running else "finished")
    return job["id"]


THROUGHPUT = """() => { const c = document.getElementById('chart-throughput');
    return (c.data || []).map((t) => ({name: t.name, axis: t.yaxis || 'y', n: t.x.length, last: t.y[t.y.length - 1]})); }"""


def test_tokens_per_second_beside_samples_only_when_the_run_reports_them(server, page, shoot) -> None:
    with_tokens, without = seeded_job(server, 20, True), seeded_job(server, 20, False)
    server.sign_in(page)
    page.goto(f"{server.url}/#/jobs/{with_tokens}")
    page.wait_for_function("() => ((document.getElementById('chart-throughput') || {}).data || []).length === 2")
    assert page.evaluate(THROUGHPUT) == [{"name": "samples/s", "axis": "y", "n": 20, "last": 64},
                                         {"name": "tokens/s", "axis": "y2", "n": 20, "last": 640}]
    assert page.evaluate("() => document.getElementById('chart-throughput').layout.yaxis2.title.text") == "tokens/s"
    assert "tokens/s" in page.locator("#job-stats").inner_text().lower()
    shoot(page, "job-tokens-per-second")
    page.goto(f"{server.url}/#/jobs/{without}")
    page.wait_for_function("() => (document.getElementById('chart-throughput')?.data?.[0]?.x || []).length === 20")
    assert [t["name"] for t in page.evaluate(THROUGHPUT)] == ["samples/s"]
    assert page.evaluate("() => document.getElementById('chart-throughput').layout.yaxis2") is None
    assert "tokens/s" not in page.locator("#job-stats").inner_text().lower()


def test_a_long_jobs_charts_get_a_bounded_number_of_points(server, page) -> None:
    job_id = seeded_job(server, 6000, False)
    server.sign_in(page)
    page.goto(f"{server.url}/#/jobs/{job_id}")
    page.wait_for_function("() => (document.getElementById('chart-throughput')?.data?.[0]?.x || []).length > 0")
    shown = page.evaluate(THROUGHPUT)[0]
    # 6,000 steps, at most the page's 1,000 points a series, the last step among them
    assert 500 <= shown["n"] <= 1000
    assert page.evaluate("() => Math.max(...document.getElementById('chart-loss').data[0].x)") == pytest.approx(60.0)


def test_a_running_jobs_page_reads_what_is_stored_then_follows_from_there(server, page) -> None:
    """A long running job's page draws its stored series at once (thinned, as a finished job's) and
    opens the stream after the event the job was read at, not replaying every event since the start;
    steps reported afterwards arrive through the stream, once each."""
    job_id = seeded_job(server, 3000, False, running=True)
    last_event = server.api("GET", f"/jobs/{job_id}")["last_event_seq"]
    streams: list[tuple[str, str | None]] = []
    page.on("request", lambda r: streams.append((r.url, r.headers.get("last-event-id")))
            if f"/jobs/{job_id}/events" in r.url else None)
    server.sign_in(page)
    page.goto(f"{server.url}/#/jobs/{job_id}")
    page.wait_for_function("() => (document.getElementById('chart-throughput')?.data?.[0]?.x || []).length > 0")
    shown = page.evaluate(THROUGHPUT)[0]
    assert 500 <= shown["n"] <= 1000 and shown["last"] == 64  # the stored series, thinned by the server
    for _ in range(300):  # the stream opens once the first reads are drawn
        if streams:
            break
        page.wait_for_timeout(100)
    url, header = streams[0]
    assert last_event > 0 and (header == str(last_event) or url.endswith(f"last_event_id={last_event}")), streams[0]
    run_script(server, MORE_STEPS, job_id, 3001, 3010)
    page.wait_for_function("() => document.getElementById('chart-throughput').data[0].y.at(-1) === 96")
    steps = page.evaluate("() => document.getElementById('chart-loss').data[0].x.length")
    assert steps == shown["n"] + 10  # the ten new steps, each once
    assert server.api("GET", f"/jobs/{job_id}")["status"] == "running"  # nothing but its own steps happened to it
