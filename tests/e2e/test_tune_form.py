""""Choose for me" in the new-job form, in real Chromium against `pipeboard up` with a real
worker: the tuner profiles the model at each microbatch size (a worker's profiling jobs), shows the
ranked table with what fits under the memory cap and what does not and why, and a clicked row
fills the form. The screenshot goes to test-artifacts/new-job-tuned.png."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "mlp-digits"
BATCH = 4  # microbatch counts 1, 2, 4: three profiles
TABLE = """() => [...document.querySelectorAll('#tune-table tbody tr')].map((tr) =>
  ({ cells: [...tr.cells].map((td) => td.textContent), fits: tr.classList.contains('tune-fits') }))"""


def test_choose_for_me_shows_the_ranked_table_and_a_row_fills_the_form(start_server, page, shoot) -> None:
    server = start_server(workers=1)
    page.set_default_timeout(60000)
    server.sign_in(page)
    page.goto(f"{server.url}/#/new")
    page.wait_for_selector(f'#f-model option[value="{MODEL}"]', state="attached")
    page.select_option("#f-model", MODEL)
    page.fill("#f-workers", "2")
    page.fill("#f-batch", str(BATCH))
    page.fill("#f-microbatches", "1")
    page.click("#choose-for-me")
    page.wait_for_selector("#tune-table tbody tr", timeout=300000)
    free = page.evaluate(TABLE)
    assert free and all(row["fits"] for row in free)

    # the same search through the API (the profiles are cached now): a cap under the choice's need
    body = {"model": MODEL, "model_args": {}, "workers": 2, "batch_size": BATCH, "microbatches": [1, 2, 4]}
    answer = server.api("POST", "/tune", body)
    assert len(answer["candidates"]) == len(free)
    assert [c["schedule"] for c in answer["candidates"]] == [r["cells"][1].split(" (")[0] for r in free]
    cap = answer["choice"]["predicted_memory_bytes"] - 1
    page.fill("#f-memory", repr(cap / 1e9))
    page.click("#choose-for-me")
    page.wait_for_selector("#tune-table tr.tune-over", timeout=60000)
    capped = page.evaluate(TABLE)
    fits = [row["fits"] for row in capped]
    assert fits[0] and not fits[-1] and fits == sorted(fits, reverse=True)  # what fits first
    assert all(row["cells"][-1].startswith("does not fit: needs ") for row in capped if not row["fits"])
    assert all(row["cells"][-1] == "fits" for row in capped if row["fits"])
    assert "fit under" in page.inner_text("#tune-result")

    # a row fills the form, and the what-if follows it
    second = page.locator("#tune-table tbody tr").nth(1)
    cells = capped[1]["cells"]
    second.click()
    assert page.input_value("#f-schedule") == cells[1].split(" (")[0]
    assert page.input_value("#f-microbatches") == cells[3]
    assert page.input_value("#f-method") == (cells[2].split(" ")[0] if not cells[2].startswith("dp") else "pipedream")
    recompute = page.input_value("#f-recompute")
    assert recompute == cells[4] or recompute == "[" + cells[4] + "]"
    assert "picked" in (second.get_attribute("class") or "")
    # ... and the card's what-if (after its debounce) shows the row's own prediction: one time per
    # step, whether the tuner or the plan gives it
    picked = server.api("POST", "/tune", {**body, "memory_per_worker_bytes": float(page.input_value("#f-memory")) * 1e9})
    row = picked["candidates"][1]
    assert [row["schedule"], str(row["microbatches"])] == [cells[1].split(" (")[0], cells[3]]
    step = page.evaluate("async (s) => (await import('/js/util.js')).fmtSeconds(s)", row["predicted_step_s"])
    page.locator("#stat-step .value", has_text=step).wait_for(timeout=60000)
    shoot(page, "new-job-tuned")
    assert not page.errors, page.errors
