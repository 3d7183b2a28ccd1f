"""A long-ish job in Chromium against `pipeboard up`: the job page says which steps have their full
actions, "Record the next 20 steps" while it runs adds a window, and the Gantt shows a chosen
window. Screenshots `job-record-detail.png`, `job-detail-window.png`."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# small windows, so that a few thousand steps show several; the run reads these from its environment
DETAIL_ENV = {"PIPEBOARD_DETAIL_FIRST_STEPS": "5", "PIPEBOARD_DETAIL_EVERY": "500", "PIPEBOARD_DETAIL_WIDTH": "3"}
SPEC = {"model": "mlp-digits", "workers": 2, "schedule": "1f1b", "microbatches": 4, "stop": {"steps": 3000}, "name": "long"}


def test_a_window_requested_while_the_job_runs_is_recorded_and_shown(start_server, page, shoot) -> None:
    server = start_server(workers=1, extra_env=DETAIL_ENV)
    page.set_default_timeout(120000)
    job = server.api("POST", "/jobs", SPEC)
    server.sign_in(page)
    page.goto(f"{server.url}/#/jobs/{job['id']}")
    page.wait_for_selector("h1 + .badge.status-running", timeout=150000)
    page.locator("#record-detail").wait_for(state="visible")
    page.wait_for_function("() => /steps 0–4/.test(document.getElementById('detail-windows').textContent)")
    page.click("#record-detail")
    page.locator("#detail-windows", has_text="Asked").wait_for()
    shoot(page, "job-record-detail")
    page.wait_for_selector("h1 + .badge.status-succeeded", timeout=300000)
    windows = server.api("GET", f"/jobs/{job['id']}/steps?limit=1")["detail_steps"]
    # the requested 20 steps, one window with a periodic one where they meet (a loaded machine
    # may run the job slowly enough that the click lands on step 500)
    requested = [r for r in windows if r[1] - r[0] + 1 >= 20]
    assert windows[0] == [0, 4] and requested, windows  # the opening window and the requested 20 steps
    assert all(any(a <= k and k + 2 <= b for a, b in windows) for k in range(500, 3000, 500)), windows
    page.reload()
    page.locator("#detail-window option", has_text=f"steps {requested[0][0]}").wait_for(state="attached")
    page.select_option("#detail-window", f"{requested[0][0]}:{requested[0][1]}")
    page.wait_for_function(f"() => (document.getElementById('gantt-live').data || []).some((t) => t.x.length > 0)")
    shoot(page, "job-detail-window")
    steps = server.api("GET", f"/jobs/{job['id']}/steps?limit=5000")
    plan_id = server.api("GET", f"/jobs/{job['id']}")["plan_id"]
    plan = server.api("GET", f"/plans/{plan_id}")
    stages = len(plan["plan"]["stages"])  # the planner's choice for the job's workers
    assert steps["total"] == 3000 and len(steps["stages"][-1]) == stages, (stages, steps["stages"][-1])
    disk = server.api("GET", f"/jobs/{job['id']}/storage")
    assert disk["detail_steps"] == sum(b - a + 1 for a, b in windows)
