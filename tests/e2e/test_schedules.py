"""The schedule registry in real Chromium against `pipeboard up` with a schedule added in one file
(tests/schedule_plugin.py, named in PIPEBOARD_SCHEDULES): the OpenAPI and GET /schedules list it,
the new-job form's select is filled from GET /schedules (the added schedule too) and shows the
chunks and vertical-sync fields for the schedules that take them, the what-if plans the added
schedule, and a job submitted with it runs to success on the service's worker."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from pipeboard.trainer.schedule import registry

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PLUGIN = Path(__file__).resolve().parents[1] / "schedule_plugin.py"
TWIN = "gpipe-twin"
OPTIONS = "() => [...document.querySelectorAll('#f-schedule option')].map((o) => o.value)"


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(workers=1, extra_env={"PIPEBOARD_SCHEDULES": str(PLUGIN)})


def test_the_api_lists_the_added_schedule(server) -> None:
    listed = server.api("GET", "/schedules")
    names = [s["name"] for s in listed["data"]]
    # the registry's own schedules (registry.py's and trainer/schedule/library's), then the one file's
    assert names == [*registry.names(), TWIN]
    assert listed["count"] == len(names)
    schemas = httpx.get(f"{server.url}/openapi.json", timeout=30).json()["components"]["schemas"]
    # a job may also name `custom`, its own layout.schedule_file: a choice only with that file, so
    # the job's enum lists it last and GET /schedules (and a plan's enum) do not
    assert schemas["LayoutSection"]["properties"]["schedule"]["enum"] == [*names, "custom"]
    assert schemas["PlanCreate"]["properties"]["schedule"]["enum"] == names


def test_the_form_lists_the_registry_and_shows_what_each_schedule_takes(server, page, shoot) -> None:
    listed = server.api("GET", "/schedules")["data"]
    names = [s["name"] for s in listed]
    ignoring = [s["name"] for s in listed if not s["weight_grads"]]
    server.sign_in(page)  # the what-if is a write
    page.goto(f"{server.url}/#/new")
    page.wait_for_selector(f'#f-schedule option[value="{TWIN}"]', state="attached")
    assert page.evaluate(OPTIONS) == names
    assert page.input_value("#f-schedule") == "1f1b"  # the registry's default
    assert not page.is_visible("#f-chunks") and not page.is_visible("#f-vertical-sync")

    page.wait_for_selector('#f-model option[value="mlp-digits"]', state="attached")
    page.locator("#stat-weight-grads").wait_for(timeout=90000)  # the first what-if (profiles the model)
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/api/v1/plans")) as what_if:
        page.select_option("#f-schedule", "interleaved-1f1b")
    assert page.is_visible("#f-chunks") and page.input_value("#f-chunks") == "2"  # its default_chunks
    assert not page.is_visible("#f-vertical-sync")
    assert what_if.value.post_data_json["schedule"] == "interleaved-1f1b" and what_if.value.post_data_json["chunks"] == 2
    shoot(page, "new-job-interleaved-chunks")

    page.select_option("#f-schedule", "pipedream")
    assert page.is_visible("#f-vertical-sync") and not page.is_visible("#f-chunks")
    shoot(page, "new-job-pipedream-vertical-sync")
    ignore = f"{', '.join(ignoring[:-1])} and {ignoring[-1]} ignore it."  # "zb-h1, dp, ... and zbv ignore it."
    assert ignore in page.get_attribute("#f-weight-grads", "title")
    assert "weight stashing" in page.get_attribute("#f-schedule", "title")  # its description
    # (interleaved-1f1b cannot run the one-stage plan two local workers get: a 422 the what-if shows)
    assert [e for e in page.errors if "422" not in e] == []


def test_a_job_with_the_added_schedule_plans_and_runs(server, page, shoot) -> None:
    page.set_default_timeout(60000)
    server.sign_in(page)
    page.goto(f"{server.url}/#/new")
    page.wait_for_selector('#f-model option[value="mlp-digits"]', state="attached")
    page.wait_for_selector(f'#f-schedule option[value="{TWIN}"]', state="attached")
    page.fill("#f-name", "twin-job")
    page.fill("#f-stop-value", "3")
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/api/v1/plans")) as what_if:
        page.select_option("#f-schedule", TWIN)
    assert what_if.value.post_data_json["schedule"] == TWIN
    page.wait_for_selector("#what-if-gantt .point", state="attached", timeout=90000)
    assert page.locator("#what-if-body .notice-error").count() == 0
    shoot(page, "new-job-added-schedule")
    page.click("#submit-job")
    page.wait_for_url(lambda url: "#/jobs/" in url)
    job_id = int(page.url.rsplit("/", 1)[1])
    job = server.api("GET", f"/jobs/{job_id}")
    assert job["spec"]["layout"]["schedule"] == TWIN and job["spec"]["layout"]["chunks"] == 1
    page.wait_for_selector("h1 + .badge.status-succeeded", timeout=150000)
    assert server.api("GET", f"/jobs/{job_id}")["summary"]["steps"] == 3
    assert [e for e in page.errors if "404" not in e] == []
