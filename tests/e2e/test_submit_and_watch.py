"""The whole loop in real Chromium against `pipeboard up` with a real Celery worker: fill in the
new-job form, see the what-if plan, submit, watch the job go running then succeeded over the live
event stream, and check the measured Gantt has bars for every worker, the predicted Gantt and
prediction error are shown, the time-to-accuracy chart has points, the plan and compare pages
draw, and nothing was logged to the console. Screenshots of each page go to test-artifacts/."""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WORKERS = 2

GANTT_ROWS = """(id) => {
  const div = document.getElementById(id);
  const rows = new Map();
  for (const t of div.data || []) for (const y of Array.from(t.y)) rows.set(y, (rows.get(y) || 0) + 1);
  return { labels: div.layout.yaxis.ticktext || [], barsPerRow: [...rows.entries()].sort((a, b) => a[0] - b[0]).map((e) => e[1]) };
}"""

POINTS = "(id) => (document.getElementById(id).data || []).map((t) => t.x.length)"


def test_submit_through_the_form_and_watch_it_succeed(start_server, page, shoot) -> None:
    server = start_server(workers=1)
    page.set_default_timeout(60000)
    server.sign_in(page)  # through the link the first start printed
    page.goto(f"{server.url}/#/new")
    page.wait_for_selector('#f-model option[value="mlp-digits"]', state="attached")
    page.select_option("#f-model", "mlp-digits")
    page.fill("#f-workers", str(WORKERS))
    page.select_option("#f-schedule", "1f1b")
    page.fill("#f-microbatches", "4")
    # Stop at a target accuracy, validating every 5 steps: several time-to-accuracy points.
    page.select_option("#f-stop-kind", "target")
    page.fill("#f-stop-value", "0.7")
    page.fill("#f-hyper", "eval_every=5")
    page.fill("#f-name", "watch-me")

    # The what-if: the plan it would run, with a predicted Gantt row per worker.
    page.wait_for_selector("#what-if-gantt .point", timeout=90000)
    what_if = page.evaluate(GANTT_ROWS, "what-if-gantt")
    assert len(what_if["labels"]) == WORKERS and all(n > 0 for n in what_if["barsPerRow"])
    assert page.locator("#stat-speedup").is_visible()
    shoot(page, "new-job-what-if")

    # Debounced: a burst of edits makes one new what-if request, for the last value.
    plan_posts = []
    page.on("request", lambda r: plan_posts.append(r.post_data_json) if r.method == "POST" and r.url.endswith("/api/v1/plans") else None)
    for value in ("5", "6", "2"):
        page.fill("#f-microbatches", value)
    for _ in range(100):  # until the debounced request went out (the page's timer, not ours)
        if plan_posts:
            break
        page.wait_for_timeout(100)
    page.wait_for_timeout(700)  # longer than the debounce: no second request follows
    assert [p["microbatches"] for p in plan_posts] == [2]
    page.fill("#f-microbatches", "4")

    page.click("#submit-job")
    page.wait_for_url(re.compile(r"#/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[1])
    page.wait_for_selector("h1 + .badge.status-running", timeout=90000)
    shoot(page, "job-running")
    page.wait_for_selector("h1 + .badge.status-succeeded", timeout=150000)
    # The stream's last batches (timeline, metrics) are drawn once the end arrives.
    page.wait_for_function("() => (document.getElementById('chart-metric').data || []).some((t) => t.x.length > 0)")

    live = page.evaluate(GANTT_ROWS, "gantt-live")
    assert len(live["labels"]) == WORKERS, live
    assert len(live["barsPerRow"]) == WORKERS and all(n > 0 for n in live["barsPerRow"]), live
    predicted = page.evaluate(GANTT_ROWS, "gantt-predicted")
    assert len(predicted["labels"]) == WORKERS
    assert "prediction error" in page.inner_text("#prediction-error")
    # the page shows the server's figures, not its own: the same error, and the correction
    fidelity = server.api("GET", f"/jobs/{job_id}")["fidelity"]
    sign = "+" if fidelity["error"] >= 0 else ""
    assert f"prediction error {sign}{fidelity['error'] * 100:.1f}%" in page.inner_text("#fidelity-apriori")
    if fidelity["corrected_step_s"] is not None:  # a run past its fifth step
        assert f"Corrected after step {fidelity['corrected_after_step']}" in page.inner_text("#fidelity-corrected")
    assert max(page.evaluate(POINTS, "chart-metric")) >= 2  # accuracy at several evaluations
    assert max(page.evaluate(POINTS, "chart-loss")) >= 5
    assert max(page.evaluate(POINTS, "chart-throughput")) >= 1
    stages = len({label.split(" · ")[1].split()[0] for label in live["labels"]})
    assert len(page.evaluate(POINTS, "chart-utilisation")) == stages  # one line per stage
    shoot(page, "job-succeeded")
    assert server.api("GET", f"/jobs/{job_id}")["status"] == "succeeded"

    # A finished job read back from the REST routes (no stream) draws the same rows.
    page.reload()
    page.wait_for_selector("#gantt-live .point", state="attached")
    assert len(page.evaluate(GANTT_ROWS, "gantt-live")["labels"]) == WORKERS

    plan_id = server.api("GET", f"/jobs/{job_id}")["plan_id"]
    if plan_id:
        page.goto(f"{server.url}/#/plans/{plan_id}")
        page.wait_for_selector("#plan-layers .point", state="attached")
        assert sum(page.evaluate(POINTS, "plan-layers")) >= 2  # a bar per layer
        shoot(page, "plan-view")

    page.goto(f"{server.url}/#/compare?ids={job_id}")
    page.wait_for_function("() => (document.getElementById('compare-tta')?.data || []).some((t) => t.x.length >= 2)")
    shoot(page, "compare")
    assert page.errors == []
