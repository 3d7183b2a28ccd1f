"""Two users in the dashboard with reads closed (`pipeboard up`, one real worker): a signed-out
visitor is asked to sign in and sees nothing else; alice and bob each see only their own jobs and
get "not found" on the other's; the admin sees both; alice watches her job run to the end over the
event stream (read with her token in the Authorization header, never in a URL) and downloads its
trace. Screenshots go to test-artifacts/."""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.e2e

SPEC = {"model": "mlp-digits", "workers": 2, "schedule": "1f1b", "microbatches": 2, "stop": {"steps": 4}}


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(workers=1)


@pytest.fixture(scope="module")
def tokens(server) -> dict[str, str]:
    """Write tokens of alice and bob, minted over HTTP with the admin token the first start printed."""
    return {who: server.api("POST", "/tokens", {"name": f"{who}-browser", "scope": "write", "user": who})["token"]
            for who in ("alice", "bob")}


@pytest.fixture(scope="module")
def jobs(server, tokens) -> dict[str, int]:
    return {who: server.api("POST", "/jobs", {**SPEC, "name": f"{who}s-job"}, token=tokens[who])["id"]
            for who in ("alice", "bob")}


def sign_in_as(page, server, token: str, label: str) -> None:
    page.goto(f"{server.url}/#token={token}")
    page.locator("#auth-status", has_text=label).wait_for()


def listed_jobs(page) -> set[int]:
    page.wait_for_selector("#jobs-table tbody tr")
    return {int(i) for i in page.eval_on_selector_all("#jobs-table tbody tr", "rows => rows.map(r => r.dataset.jobId)")}


def test_a_signed_out_visitor_is_asked_to_sign_in_and_sees_no_work(browser, server, jobs, shoot) -> None:
    context = browser.new_context()
    page = context.new_page()
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(f"{server.url}/#/jobs/{jobs['alice']}")
    page.locator("#signin-form").wait_for()
    assert "signed-in users" in page.inner_text("#signin-why")
    assert re.search(r"#/signin\?next=", page.url)
    assert not any(re.search(r"/api/v1/jobs", u) for u in requests)  # nothing asked for that would be refused
    shoot(page, "closed-reads-sign-in")
    context.close()


def test_each_user_sees_only_their_own_jobs_and_admin_sees_all(page, server, tokens, jobs, shoot) -> None:
    sign_in_as(page, server, tokens["alice"], "alice: token alice-browser (write)")
    assert listed_jobs(page) == {jobs["alice"]}
    shoot(page, "alice-sees-her-own")

    sign_in_as(page, server, tokens["bob"], "bob: token bob-browser (write)")
    assert listed_jobs(page) == {jobs["bob"]}
    shoot(page, "bob-sees-his-own")
    page.goto(f"{server.url}/#/jobs/{jobs['alice']}")
    page.locator(".notice-error", has_text=f"Could not load job {jobs['alice']}: job {jobs['alice']} not found").wait_for()
    shoot(page, "bob-on-alices-job")

    sign_in_as(page, server, server.token, "admin (admin)")
    assert listed_jobs(page) == {jobs["alice"], jobs["bob"]}
    shoot(page, "admin-sees-all")
    assert page.errors == [] or all("404" in e or "401" in e for e in page.errors), page.errors


def test_alice_watches_her_job_live_and_downloads_its_trace(page, server, tokens, shoot) -> None:
    stream_requests = []
    page.on("request", lambda r: stream_requests.append((r.url, r.headers.get("authorization", "")))
            if r.url.endswith("/events") or "/events?" in r.url else None)
    sign_in_as(page, server, tokens["alice"], "alice: token alice-browser")
    job = server.api("POST", "/jobs", {**SPEC, "name": "alice-live"}, token=tokens["alice"])["id"]
    page.goto(f"{server.url}/#/jobs/{job}")  # open while it is queued: what follows comes over the stream
    page.wait_for_selector("h1 + .badge.status-succeeded", timeout=240_000)
    page.wait_for_selector("#gantt-live .point", state="attached")
    shoot(page, "alice-watched-her-job")
    assert stream_requests, "the page read the event stream"
    for url, authorization in stream_requests:
        assert "token" not in url and tokens["alice"] not in url
        assert authorization == f"Bearer {tokens['alice']}"
    with page.expect_download() as download_info:
        page.click("#download-trace")
    with open(download_info.value.path()) as downloaded:
        trace = json.load(downloaded)
    assert trace == server.api("GET", f"/jobs/{job}/trace", token=tokens["alice"])
    assert len(trace["traceEvents"]) > 0
