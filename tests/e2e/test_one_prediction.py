"""One prediction in every view, in real Chromium against `pipeboard up` with a real worker: the
new-job card's what-if and the plan page it links to show one time per step, one memory per
stage and one comparison against data parallelism, the same figures, and the ones POST /plans
answered (trainer/choose.py's prediction). Screenshots go to test-artifacts/ (one-prediction-*)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# the stats of a view: label -> value text
STATS = """(root) => Object.fromEntries([...document.querySelectorAll(root + ' .stat')].map(
  (s) => [s.querySelector('.label').textContent, s.querySelector('.value').textContent]))"""
# what the page's own formatters make of the API's prediction
FORMATTED = """async (p) => {
  const u = await import('/js/util.js');
  return { step: u.fmtSeconds(p.steady_step_s ?? p.iteration_time_s),
           memory: (p.stage_memory_bytes || []).map(u.fmtBytes).join(' · '),
           versus: u.fmtNumber(p.speedup_vs_data_parallel) };
}"""
TIMES = ("time / minibatch", "throughput", "microbatches/s", "minibatches/s")


def one_prediction(stats: dict[str, str], formatted: dict[str, str]) -> None:
    assert [k for k in stats if "time" in k] == ["predicted time / step"], stats
    assert not [k for k in stats if any(t in k for t in TIMES)], stats
    assert stats["predicted time / step"] == formatted["step"]
    assert stats["memory / stage"] == formatted["memory"] and formatted["memory"]
    assert stats["vs data parallel"].startswith(f"{formatted['versus']}×")


def test_the_new_job_card_and_the_plan_page_show_one_prediction(start_server, page, shoot) -> None:
    server = start_server(workers=1)
    server.sign_in(page)
    page.goto(f"{server.url}/#/new")
    page.wait_for_selector('#f-model option[value="mlp-digits"]', state="attached")
    page.select_option("#f-model", "mlp-digits")
    page.fill("#f-workers", "2")
    page.select_option("#f-schedule", "1f1b")
    page.fill("#f-microbatches", "4")
    page.select_option("#f-recompute", "all")
    # the what-if profiles mlp-digits on the worker first (a calibrated profile), then plans
    page.wait_for_selector("#what-if-gantt .point", timeout=240000)
    page.wait_for_selector("#what-if-throughput .point")
    card = page.evaluate(STATS, "#what-if-body")
    link = page.locator("#what-if-body a", has_text="Open the full plan view")
    plan_id = int(link.get_attribute("href").rsplit("/", 1)[1])
    stored = server.api("GET", f"/plans/{plan_id}")
    assert stored["request"]["recompute"] == "all"
    predicted = stored["predicted"]
    assert predicted["cost_model"] == "profile" and predicted["data_parallel_step_s"]
    assert predicted["recompute_stages"] == list(range(len(predicted["stage_memory_bytes"])))
    formatted = page.evaluate(FORMATTED, predicted)
    one_prediction(card, formatted)
    assert card["recompute"].startswith("stage 0")
    shoot(page, "one-prediction-new-job")

    link.click()
    page.wait_for_selector("#plan-throughput .point")
    page.wait_for_selector("#plan-memory .point")
    plan_page = page.evaluate(STATS, "#view")
    one_prediction(plan_page, formatted)
    assert {k: plan_page[k] for k in card} == card  # the card's figures, every one
    # the comparison chart's two bars are the step and data parallel's step, in ms
    bars = page.evaluate("() => Array.from(document.getElementById('plan-throughput').data[0].y)")
    assert bars == pytest.approx([predicted["steady_step_s"] * 1e3, predicted["data_parallel_step_s"] * 1e3])
    memory = page.evaluate("() => Array.from(document.getElementById('plan-memory').data[0].y)")
    assert memory == predicted["stage_memory_bytes"]
    shoot(page, "one-prediction-plan-page")
    assert page.errors == []
