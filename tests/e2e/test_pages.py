"""Dashboard pages against the real API (`pipeboard up` with no Celery worker, so submitted jobs
stay queued and every state is deterministic): empty and error states, the live jobs table with
filters, cancel and retry, a failed job's error, keyboard reach and a narrow window. The new-job
form (field errors, its what-if profiled on a worker, then submission) has a server with a worker.
Screenshots go to test-artifacts/."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.e2e

SPEC = {"model": "mlp-digits", "workers": 2, "schedule": "1f1b", "microbatches": 4, "stop": {"steps": 5}}


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(workers=0)


@pytest.fixture(scope="module")
def write_token(server) -> str:
    """A write token, minted over HTTP with the admin token the first start printed."""
    return server.api("POST", "/tokens", {"name": "browser", "scope": "write"})["token"]


def test_the_first_start_sign_in_link_signs_in_and_leaves_the_address_bar(server, page, shoot) -> None:
    page.goto(f"{server.url}/#token={server.token}")
    page.locator("#auth-status", has_text="admin (admin)").wait_for()
    assert page.url == f"{server.url}/#/jobs" and "token" not in page.evaluate("() => location.href")
    assert page.evaluate("() => localStorage.getItem('pipeboard.token')") == server.token
    page.get_by_text("No jobs yet.").wait_for()
    shoot(page, "signed-in-from-the-link")
    assert page.errors == []
    page.go_back()  # the link's entry was replaced, not pushed: Back leaves the dashboard
    assert page.url == "about:blank"


def test_jobs_page_empty_state(server, page, shoot) -> None:
    page.goto(f"{server.url}/#/jobs")
    page.get_by_text("No jobs yet.").wait_for()
    assert page.get_by_role("link", name="Submit the first one.").get_attribute("href") == "#/new"
    shoot(page, "jobs-empty")
    assert page.errors == []


def test_jobs_page_error_state_and_recovery(server, page) -> None:
    # The network fails (the route is aborted in the browser): an error with a way to try again.
    page.route("**/api/v1/jobs?*", lambda route: route.abort())
    page.goto(f"{server.url}/#/jobs")
    page.locator(".notice-error", has_text="cannot reach the server").wait_for()
    page.unroute("**/api/v1/jobs?*")
    page.get_by_role("button", name="Try again").click()
    page.get_by_text("No jobs yet.").wait_for()
    assert all("ERR_FAILED" in e for e in page.errors)


def test_jobs_table_filters_cancels_and_retries(server, page, shoot) -> None:
    first = server.api("POST", "/jobs", {**SPEC, "name": "table-a"})
    second = server.api("POST", "/jobs", {**SPEC, "name": "table-b", "schedule": "gpipe"})
    server.sign_in(page)  # cancel and retry are writes
    page.goto(f"{server.url}/#/jobs")
    row_a = page.locator(f'tr[data-job-id="{first["id"]}"]')
    row_b = page.locator(f'tr[data-job-id="{second["id"]}"]')
    row_a.wait_for()
    assert row_a.get_attribute("data-status") == "queued"
    assert "gpipe" in row_b.inner_text()

    page.fill("#filter-text", "table-b")
    row_a.wait_for(state="detached")
    assert row_b.is_visible()
    page.fill("#filter-text", "")

    page.get_by_role("button", name=f"Cancel job {first['id']}").click()
    page.wait_for_selector(f'tr[data-job-id="{first["id"]}"][data-status="cancelled"]')
    page.select_option("#filter-status", "cancelled")
    page.wait_for_selector(f'tr[data-job-id="{second["id"]}"]', state="detached")
    shoot(page, "jobs-filtered-cancelled")
    page.get_by_role("button", name=f"Retry job {first['id']}").click()
    page.get_by_text("No cancelled jobs.").wait_for()  # the retried job is queued again
    assert server.api("GET", f"/jobs/{first['id']}")["status"] == "queued"
    assert page.errors == []


@pytest.fixture(scope="module")
def server_with_worker(start_server):
    """A what-if for a model without a cached profile is profiled by a worker: the form needs one."""
    return start_server(workers=1)


# Every text the what-if panel shows while its model is profiled (it may be short-lived: the form
# moves on to the plan as soon as the worker's job ends).
RECORD_PROFILING = """window.profilingSeen = [];
new MutationObserver(() => {
  const text = document.getElementById('what-if-body')?.textContent || '';
  if (text.includes('Profiling') && !window.profilingSeen.includes(text)) window.profilingSeen.push(text);
}).observe(document, { subtree: true, childList: true, characterData: true });"""


@pytest.mark.timeout(900)  # each weight_grads value is profiled once on the worker before its plan shows
def test_new_job_form_names_bad_fields_then_submits(server_with_worker, page, shoot) -> None:
    server = server_with_worker
    page.add_init_script(RECORD_PROFILING)
    server.sign_in(page)  # the what-if and the submission are writes
    page.goto(f"{server.url}/#/new")
    page.wait_for_selector('#f-model option[value="mlp-digits"]', state="attached")
    page.select_option("#f-cluster-mode", "levels")
    page.fill("#f-levels", "4 fast")
    page.locator("#what-if-body .notice-error").filter(has_text="levels: line 1").wait_for()

    page.select_option("#f-cluster-mode", "local")
    page.fill("#f-microbatches", "0")
    page.click("#submit-job")
    error = page.locator("#form-error")
    page.wait_for_function("() => document.querySelector('#form-error').textContent.includes('microbatches')")
    assert "Not submitted" in error.inner_text()
    assert page.get_attribute("#f-microbatches", "aria-invalid") == "true"
    assert page.evaluate("() => document.activeElement.id") == "f-microbatches"
    shoot(page, "new-job-error")

    page.fill("#f-microbatches", "4")
    page.fill("#f-name", "from-the-form")
    # No cached profile yet: the form says the worker is profiling the model, then shows the plan
    # (as a user would, it waits; the test fails here if the plan never comes).
    page.locator("#stat-weight-grads", has_text="batched").wait_for(timeout=200000)
    seen = page.evaluate("() => window.profilingSeen")
    assert any(re.search(r"Profiling mlp-digits on a worker \(job #\d+, (queued|running)", t) for t in seen), seen
    # Weight gradients: the what-if asks for what the select says and shows what was simulated.
    assert page.inner_text("#f-weight-grads-hint") == "one weight pass per update"
    shoot(page, "new-job-weight-grads-batched")
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/api/v1/plans")) as what_if:
        page.select_option("#f-weight-grads", "immediate")
    assert what_if.value.post_data_json["weight_grads"] == "immediate"
    # a run with immediate weight gradients is measured apart: profiled again, then planned
    page.locator("#stat-weight-grads", has_text="per backward").wait_for(timeout=200000)
    assert page.inner_text("#f-weight-grads-hint") == "in every backward"
    page.wait_for_selector("#what-if-gantt .point", state="attached")
    shoot(page, "new-job-weight-grads-immediate")
    # Device and precision: cuda is refused naming machine.device while no worker reports a GPU
    page.select_option("#f-device", "cuda")
    page.click("#submit-job")
    page.wait_for_function("() => document.querySelector('#form-error').textContent.includes('machine.device')")
    assert page.get_attribute("#f-device", "aria-invalid") == "true"
    page.select_option("#f-device", "cpu")
    page.select_option("#f-precision", "bf16")
    page.select_option("#f-recompute", "all")  # layout.recompute: every stage of the job's plan
    page.click("#submit-job")
    page.wait_for_url(re.compile(r"#/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[1])
    job = server.api("GET", f"/jobs/{job_id}")
    assert job["name"] == "from-the-form" and job["spec"]["layout"]["weight_grads"] == "immediate"
    assert job["spec"]["machine"] == {"device": "cpu", "precision": "bf16", "gpus_per_host": None}  # a GPU each (cuda only)
    assert job["spec"]["layout"]["recompute"] == "all"
    page.locator("h1", has_text="from-the-form").wait_for()  # queued or already on the worker
    shoot(page, "job-submitted")
    # The form's 422 is an API answer, not a console error; nothing else may be logged.
    assert [e for e in page.errors if "422" not in e] == []


def test_failed_job_shows_its_error_and_trace_download(server, page) -> None:
    job = server.api("POST", "/jobs", {**SPEC, "name": "to-fail"})
    server.api("POST", f"/jobs/{job['id']}/cancel")
    page.goto(f"{server.url}/#/jobs/{job['id']}")
    page.locator(".badge", has_text="cancelled").wait_for()
    assert page.get_by_role("button", name="Retry").is_visible()
    with page.expect_download() as download:
        page.click("#download-trace")
    assert download.value.suggested_filename == f"job-{job['id']}.trace.json"
    assert page.errors == []


# ui.perfetto.dev is out of reach here: this page plays its side of the documented hand-off
# (answer PING with PONG, then take {perfetto: {buffer, title}}) so the dashboard's side is real.
PERFETTO_STAND_IN = """<!doctype html><title>perfetto</title><script>
window.addEventListener('message', (e) => {
  if (e.data === 'PING') { e.source.postMessage('PONG', e.origin); return; }
  if (e.data && e.data.perfetto) {
    const p = e.data.perfetto;
    document.title = 'got ' + p.title;
    window.received = new TextDecoder().decode(new Uint8Array(p.buffer));
  }
});
</script>"""


def test_open_in_perfetto_hands_over_the_trace(server, page, browser_context) -> None:
    job = server.api("POST", "/jobs", {**SPEC, "name": "perfetto"})
    server.api("POST", f"/jobs/{job['id']}/cancel")
    browser_context.route("https://ui.perfetto.dev/**", lambda route: route.fulfill(content_type="text/html", body=PERFETTO_STAND_IN))
    try:
        page.goto(f"{server.url}/#/jobs/{job['id']}")
        with page.expect_popup() as popup_info:
            page.click("#open-perfetto")
        popup = popup_info.value
        popup.wait_for_function("() => document.title.startsWith('got ')")
        assert popup.title() == f"got pipeboard job {job['id']}"
        import json

        received = json.loads(popup.evaluate("() => window.received"))
        expected = server.api("GET", f"/jobs/{job['id']}/trace")  # with the token: reads need one
        assert received == expected
        assert page.errors == []
    finally:
        browser_context.unroute("https://ui.perfetto.dev/**")


def test_unknown_page_and_unknown_job(server, page) -> None:
    page.goto(f"{server.url}/#/nowhere")
    page.get_by_text("No page at /nowhere").wait_for()
    page.goto(f"{server.url}/#/jobs/987654")
    page.locator(".notice-error", has_text="987654").wait_for()
    assert all("404" in e for e in page.errors)  # the API's 404, logged by the browser as a failed fetch


def test_keyboard_reaches_navigation_and_form(server, page) -> None:
    server.sign_in(page)
    page.goto(f"{server.url}/#/new")
    page.wait_for_selector('#f-model option[value="mlp-digits"]', state="attached")
    reached = []
    for _ in range(40):
        page.keyboard.press("Tab")
        reached.append(page.evaluate("() => document.activeElement.id || document.activeElement.textContent.trim()"))
    for wanted in ("Jobs", "New job", "Compare", "f-model", "f-workers", "f-schedule", "submit-job"):
        assert wanted in reached, f"{wanted} not reachable by Tab: {reached}"


def test_narrow_window_has_no_horizontal_scroll(server, page, shoot) -> None:
    server.api("POST", "/jobs", {**SPEC, "name": "profile mlp-digits for a what-if with a long name"})  # wraps, never widens
    page.set_viewport_size({"width": 390, "height": 800})
    server.sign_in(page)
    for route in ("jobs", "new", "compare"):
        page.goto(f"{server.url}/#/{route}")
        page.locator("main h1").first.wait_for()
        page.wait_for_timeout(300)
        width = page.evaluate("() => document.documentElement.scrollWidth")
        shoot(page, f"narrow-{route}")
        assert width <= 392, f"#{route} is {width}px wide in a 390px window"
        if route == "jobs":  # the row actions stay on screen, not behind a horizontal scroll
            right = page.evaluate("() => Math.max(0, ...[...document.querySelectorAll('#jobs-table button')].map((b) => b.getBoundingClientRect().right))")
            assert 0 < right <= 390


STREAM = """async ([url, resume]) => {
  const { openStream } = await import('/js/sse.js');
  return await new Promise((resolve) => {
    const batches = [];
    openStream(url, {
      lastEventId: resume,
      onBatch: (messages) => batches.push(messages.map((m) => [m.type, m.id])),
      isTerminal: (m) => m.type === 'end',
      onState: (state) => { if (state === 'closed') resolve(batches); },
    });
  });
}"""


@pytest.mark.parametrize("with_token", [False, True], ids=["eventsource", "fetch-with-token"])
def test_event_stream_batches_messages_and_resumes_after_an_id(server, page, request, with_token) -> None:
    job = server.api("POST", "/jobs", {**SPEC, "name": f"stream-{with_token}"})
    server.api("POST", f"/jobs/{job['id']}/cancel")
    last = server.api("GET", f"/jobs/{job['id']}")["last_event_seq"]
    page.goto(f"{server.url}/#/compare")
    if with_token:  # EventSource cannot send Authorization: the fetch transport does
        token = request.getfixturevalue("write_token")
        page.evaluate("(t) => localStorage.setItem('pipeboard.token', t)", token)
    url = f"/api/v1/jobs/{job['id']}/events"
    batches = page.evaluate(STREAM, [url, None])
    messages = [m for batch in batches for m in batch]
    ids = [int(i) for _, i in messages if i]
    assert [t for t, _ in messages if t != "open"][-1] == "end"
    assert ids == sorted(ids) and ids[-1] == last
    assert len(batches) < len(messages)  # delivered in batches, not one call per message
    resumed = [m for batch in page.evaluate(STREAM, [url, "1"]) for m in batch if m[0] != "open"]
    assert int(resumed[0][1]) == 2 and resumed[-1][0] == "end"  # nothing before id 2 again


def test_sign_in_when_the_api_answers_401(server, write_token, page, shoot) -> None:
    # Writes need a token from the first start (reads stay open by default).
    token = write_token
    page.goto(f"{server.url}/#/jobs")
    page.evaluate("() => localStorage.clear()")  # the pages of this module share one browser context
    page.goto(f"{server.url}/#/new")
    # the what-if POST answered 401 (whether or not the model list, a read, arrived before it)
    page.wait_for_url(re.compile(r"#/signin\?next=(/|%2F)new$"))
    page.fill("#token", "not-a-token")
    page.click("#signin-form button[type=submit]")
    page.locator("#signin-message", has_text="Not signed in").wait_for()
    page.fill("#token", token)
    page.click("#signin-form button[type=submit]")
    page.wait_for_url(re.compile(r"#/new$"))
    page.locator("#auth-status", has_text="browser (write)").wait_for()
    page.wait_for_selector('#f-model option[value="mlp-digits"]', state="attached")
    page.fill("#f-name", "signed-in-job")
    page.click("#submit-job")
    page.wait_for_url(re.compile(r"#/jobs/\d+$"))
    shoot(page, "signed-in")
    assert page.evaluate("() => localStorage.getItem('pipeboard.token')") == token
    assert all("401" in e for e in page.errors)


# A job whose first attempt was lost and whose second resumed from step 2 on another host, made
# through the service's own code (claim, the run's sink, the retry policy) in a process of the
# server's deployment: the page must show the attempts and mark the second on the charts.
RESUMED_JOB = """
import sys
from pipeboard.app.core.db import get_sessionmaker
from pipeboard.app.models import JobStatus
from pipeboard.app.services import jobs, runner
from pipeboard.app.services.run_sink import DbSink
from pipeboard.trainer.schedule.actions import TimelineEvent
from pipeboard.trainer.sink import MetricRecord

job_id = int(sys.argv[1])

def train(start, stop, hosts):
    sink = DbSink(job_id, own_group=False)
    sink.on_status("running", start_step=start, hosts=hosts)
    sink.on_events([TimelineEvent(w, w, 0, 0, "F", 0.01 * k + 0.002 * w, 0.01 * k + 0.006, step=k)
                    for k in range(start, stop) for w in (0, 1)])
    sink.on_metrics([MetricRecord(step=k + 1, wall_s=0.01 * (k + 1), values={"loss": 2.0 / (k + 1)}) for k in range(start, stop)])

assert runner.claim_next(None, "seed@a") == job_id
train(0, 3, {0: "host-a", 1: "host-a"})
with get_sessionmaker()() as s:
    assert jobs.fail_or_retry(s, job_id, 1, "stage 1 (rank 1) was killed by SIGKILL", retryable=True)
assert runner.claim_next(None, "seed@b") == job_id
train(2, 5, {0: "host-b", 1: "host-a"})
with get_sessionmaker()() as s:
    assert jobs.finish(s, job_id, JobStatus.SUCCEEDED, expected=(JobStatus.RUNNING,))
"""


def test_a_resumed_job_lists_its_attempts_and_marks_them_on_the_charts(server, page, shoot) -> None:
    import subprocess
    import sys

    job = server.api("POST", "/jobs", {**SPEC, "name": "resumed", "priority": 100})  # claimed before the queued others
    seeded = subprocess.run([sys.executable, "-c", RESUMED_JOB, str(job["id"])], env=server.env, capture_output=True, text=True,
                            timeout=120)
    assert seeded.returncode == 0, seeded.stderr
    offset = server.api("GET", f"/jobs/{job['id']}")["attempts"][1]["offset_s"]
    page.goto(f"{server.url}/#/jobs/{job['id']}")
    page.locator(".badge", has_text="succeeded").wait_for()
    attempts = page.locator("#job-attempts")
    attempts.locator("[data-attempt='2']").wait_for()
    text = attempts.inner_text()
    assert "1 failed, from the start" in text and "stage 1 (rank 1) was killed by SIGKILL" in text
    assert "2 (automatic retry) succeeded, from step 2" in text
    page.wait_for_function("() => document.getElementById('chart-loss').data?.[0]?.x.length === 6")
    loss = page.evaluate("""() => { const c = document.getElementById('chart-loss');
        return {x: Array.from(c.data[0].x), y: Array.from(c.data[0].y), shapes: c.layout.shapes.map((s) => s.x0),
                notes: c.layout.annotations.map((a) => a.text)}; }""")
    assert loss["shapes"] == [pytest.approx(offset)] and loss["notes"] == ["attempt 2 · from step 2"]
    # attempt 1's steps 1 and 2, a break, attempt 2's steps 3 to 5 (attempt 1's step 3 was measured again)
    assert loss["x"][:2] == pytest.approx([0.01, 0.02]) and loss["y"][2] is None and loss["x"][3] > offset
    assert loss["y"][3:] == pytest.approx([2 / 3, 2 / 4, 2 / 5])
    # the live Gantt draws once its timeline arrives, after the loss chart under load
    page.wait_for_function("() => (document.getElementById('gantt-live').layout?.yaxis?.ticktext || []).length > 0")
    rows = page.evaluate("() => document.getElementById('gantt-live').layout.yaxis.ticktext")
    assert rows == ["w0 · s0 r0 · host-a/host-b", "w1 · s1 r0 · host-a"]
    shoot(page, "job-resumed")
    assert page.errors == []
