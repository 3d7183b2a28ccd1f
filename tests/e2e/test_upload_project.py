"""In real Chromium against `pipeboard up` with a real worker: upload README's example project as
a .zip from the new-job form, name its task factory, watch the worker validate it, pick it, submit
a job for it and watch the job succeed; a broken archive shows its validation error. The jobs table
and the job page say who submitted it."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from tests.app.test_e2e_contexts import write_project

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def zipped(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(folder).as_posix())
    return buffer.getvalue()


def register_through_the_form(page, name: str, archive: Path, factory: str) -> None:
    page.select_option("#f-model", "__import__")
    page.fill("#f-import-name", name)
    page.set_input_files("#f-import-archive", str(archive))
    page.fill("#f-import-path", factory)
    page.fill("#f-data", "tokens.txt")
    page.click("#register-model")


def watch_register_status(page) -> None:
    """Keep every text #register-status shows: a step that lasts one poll is not missed."""
    page.evaluate("""() => {
      const el = document.getElementById('register-status');
      window.registerTexts = [];
      new MutationObserver(() => window.registerTexts.push(el.textContent))
        .observe(el, { childList: true, characterData: true, subtree: true });
    }""")


def wait_registered(page) -> list[str]:
    """Wait until the form says the model is ready or why not (failing with its words); the
    status texts shown on the way."""
    page.locator("#register-status:has-text('is ready'), #form-error:not(:empty)").first.wait_for()
    shown = page.evaluate("window.registerTexts")
    error = page.inner_text("#form-error")
    assert not error, f"registering failed: {error} (the status showed {shown})"
    return shown


def test_upload_a_project_submit_it_and_watch_it_succeed(start_server, page, shoot, tmp_path) -> None:
    server = start_server(workers=1)
    page.set_default_timeout(120000)
    server.sign_in(page)
    assert page.locator("#auth-status button", has_text="Sign out").count() == 1  # drawn once, not per event
    project = write_project(tmp_path / "project")
    archive = tmp_path / "project.zip"
    archive.write_bytes(zipped(project))

    page.goto(f"{server.url}/#/new")
    page.wait_for_selector('#f-model option[value="__import__"]', state="attached")
    assert page.locator("#auth-status button").count() == 1
    watch_register_status(page)
    register_through_the_form(page, "my-task", archive, "my_task.py:make_task")
    shown = wait_registered(page)
    # "validating" while a worker checks it; a worker that finishes before the answer is read may skip it
    assert shown[-1].startswith("my-task is ready"), shown
    assert page.eval_on_selector("#f-model", "el => el.value") == "my-task"
    shoot(page, "upload-project-ready")

    page.fill("#f-workers", "2")
    page.select_option("#f-schedule", "1f1b")
    page.fill("#f-microbatches", "4")
    page.fill("#f-batch", "64")
    page.select_option("#f-stop-kind", "steps")
    page.fill("#f-stop-value", "4")
    page.fill("#f-name", "uploaded")
    page.click("#submit-job")
    page.wait_for_url("**/#/jobs/*")
    page.locator(".badge", has_text="succeeded").first.wait_for(timeout=300000)
    assert "submitted by admin" in page.inner_text("#job-subtitle")
    shoot(page, "upload-project-job")

    page.goto(f"{server.url}/#/jobs")
    row = page.locator("#jobs-table tbody tr", has_text="uploaded")
    row.wait_for()
    assert "admin" in row.inner_text()

    # A project whose factory raises: the form says why, the model is not selectable.
    (project / "my_task.py").write_text((project / "my_task.py").read_text()
                                        + "\n\ndef make_broken(data=None):\n    raise ValueError('tokens file is corrupt')\n")
    archive.write_bytes(zipped(project))
    page.goto(f"{server.url}/#/new")
    page.wait_for_selector('#f-model option[value="__import__"]', state="attached")
    register_through_the_form(page, "broken-task", archive, "my_task.py:make_broken")
    page.locator("#form-error", has_text="tokens file is corrupt").wait_for()
    shoot(page, "upload-project-failed")
    assert not page.errors, page.errors
