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
with get_sessionmaker()() as s:
    assert jobs.finish(s, job_id, JobStatus.SUCCEEDED, expected=(JobStatus.RUNNING,))
"""


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(workers=0)


def seeded_job(server, steps: int, tokens: bool) -> int:
    job = server.api("POST", "/jobs", {**SPEC, "name": f"seeded-{steps}", "priority": 100})
    done = subprocess.run([sys.executable, "-c", SEEDED, str(job["id"]), str(steps), "1" if tokens else "0"], env=server.env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
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
