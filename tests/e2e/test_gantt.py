"""The Gantt module in real Chromium: one trace per action kind, a row per worker, hover text,
level-of-detail aggregation of big timelines and exact bars again after zooming in, and the
live chart following the newest steps until the user zooms."""

from __future__ import annotations

import pytest

from pipeboard.trainer.schedule import build
from pipeboard.trainer.schedule.action_costs import StageCosts
from pipeboard.trainer.schedule.simulator import simulate

pytestmark = pytest.mark.e2e


def simulated_timeline() -> list[dict]:
    """A real simulated 1F1B timeline: 4 stages, the second replicated twice (5 workers)."""
    schedule = build("1f1b", 4, 8, replicas=[1, 2, 1, 1])
    costs = [StageCosts(fwd_s=0.001, bwd_s=0.002, send_act_s=0.0002, send_grad_s=0.0002)] * 4
    return [e.to_dict() for e in simulate(schedule, costs).timeline]


DRAW = """async (events) => {
  const { drawGantt } = await import('/js/gantt.js');
  const div = document.getElementById('chart');
  await drawGantt(div, events);
  return {
    traces: div.data.map((t) => ({ name: t.name, n: t.x.length, rows: [...new Set(Array.from(t.y))] })),
    ticks: div.layout.yaxis.ticktext,
    bars: div.querySelectorAll('.point').length,
    notes: (div.layout.annotations || []).map((a) => a.text),
  };
}"""


def test_one_trace_per_kind_and_a_row_per_worker(module_page) -> None:
    events = simulated_timeline()
    out = module_page.evaluate(DRAW, events)
    kinds = {e["kind"] for e in events}
    assert len(out["traces"]) == len(kinds)  # one trace per kind, not one per bar
    assert sum(t["n"] for t in out["traces"]) == len(events) == out["bars"]
    assert out["ticks"] == ["w0 · s0 r0", "w1 · s1 r0", "w2 · s1 r1", "w3 · s2 r0", "w4 · s3 r0"]
    forward = next(t for t in out["traces"] if t["name"] == "forward")
    assert sorted(forward["rows"]) == [0, 1, 2, 3, 4]  # every worker has forward bars
    assert out["notes"] == []
    assert module_page.errors == []


def test_hover_names_kind_microbatch_and_times(module_page) -> None:
    module_page.evaluate(DRAW, simulated_timeline())
    bar = module_page.locator("#chart .point path").nth(3)
    bar.hover(force=True)
    label = module_page.locator(".hoverlayer .hovertext").first.text_content(timeout=5000)
    assert "microbatch" in label and " s → " in label


BIG = """async ([n, workers]) => {
  const { GanttChart } = await import('/js/gantt.js');
  const kinds = ['F', 'B', 'send_act', 'recv_grad'];
  const events = [];
  for (let i = 0; i < n; i++) {
    const w = i % workers; const t = Math.floor(i / workers) * 0.001;
    events.push({ worker: w, stage: w, replica: 0, microbatch: i, kind: kinds[i % 4], start: t, end: t + 0.0008, step: Math.floor(i / 1000) });
  }
  const div = document.getElementById('chart');
  const chart = new GanttChart(div, {});
  await chart.setEvents(events);
  const summary = () => ({ bars: div.data.reduce((s, t) => s + t.x.length, 0),
    rows: [...new Set(div.data.flatMap((t) => Array.from(t.y)))].length,
    notes: (div.layout.annotations || []).map((a) => a.text), hover: div.data[0].hovertemplate });
  window.bigChart = { chart, summary };
  return summary();
}"""

ZOOM = """async () => {
  const { chart, summary } = window.bigChart;
  await window.Plotly.relayout(chart.div, { 'xaxis.range[0]': 1.0, 'xaxis.range[1]': 1.02 });
  await chart.drawing;
  return summary();
}"""


def test_big_timeline_is_aggregated_then_exact_when_zoomed(module_page, shoot) -> None:
    before = module_page.evaluate(BIG, [100_000, 8])
    shoot(module_page, "gantt-100k-aggregated")
    after = module_page.evaluate(ZOOM)
    assert before["rows"] == 8  # every worker still shows
    assert before["bars"] < 8 * 2 * 700  # at most rows x lanes x pixel columns, not 100,000
    assert "aggregated per 3-pixel column" in before["notes"][0]
    assert "zoom in for single actions" in before["hover"]
    # 20 ms of 8 workers at one action per ms and worker: ~160 single actions, drawn exactly.
    assert 150 <= after["bars"] <= 200
    assert after["notes"] == []
    assert "microbatch" in after["hover"]
    shoot(module_page, "gantt-zoomed")
    assert module_page.errors == []


FOLLOW = """async () => {
  const { GanttChart } = await import('/js/gantt.js');
  const div = document.getElementById('chart');
  const changes = [];
  const chart = new GanttChart(div, { windowSteps: 2, following: true, onFollowChange: (on) => changes.push(on) });
  const step = (s) => [0, 1].map((w) => ({ worker: w, stage: w, replica: 0, microbatch: 0, kind: 'F', start: s + w * 0.1, end: s + w * 0.1 + 0.5, step: s }));
  for (let s = 0; s < 5; s++) await chart.add(step(s));
  const followed = [...div.layout.xaxis.range];
  await window.Plotly.relayout(div, { 'xaxis.range[0]': 0, 'xaxis.range[1]': 1 });
  await chart.drawing;
  await chart.add(step(5));
  const paused = [...div.layout.xaxis.range];
  await chart.follow(true);
  return { followed, paused, resumed: [...div.layout.xaxis.range], following: chart.following, changes };
}"""


def test_live_chart_follows_newest_steps_until_the_user_zooms(module_page) -> None:
    out = module_page.evaluate(FOLLOW)
    assert out["followed"][0] == pytest.approx(3.0) and out["followed"][1] == pytest.approx(4.6)  # steps 3 and 4
    assert out["paused"] == [0, 1]  # a new step does not move the user's zoom
    assert out["resumed"][0] == pytest.approx(4.0) and out["resumed"][1] == pytest.approx(5.6)
    assert out["following"] is True
    assert out["changes"] == [False, True]


LOD = """async () => {
  const { KIND_INDEX, KINDS, OTHER_KIND } = await import('/js/gantt.js');
  const { aggregateByPixel } = await import('/js/gantt_lod.js');
  const laneOf = [...KINDS, OTHER_KIND].map((k) => (k.lane === 'comm' ? 1 : 0));
  const events = [];
  // One worker: 100 forwards in [0, 1), a bubble in [1, 2), 100 backwards in [2, 3),
  // and a transfer under the backwards (communication lane).
  for (let i = 0; i < 100; i++) events.push({ worker: 0, kind: 'F', start: i / 100, end: (i + 0.9) / 100 });
  for (let i = 0; i < 100; i++) events.push({ worker: 0, kind: 'B', start: 2 + i / 100, end: 2 + (i + 0.9) / 100 });
  events.push({ worker: 0, kind: 'send_grad', start: 2, end: 3 });
  const bars = aggregateByPixel(events, [{ worker: 0, index: 0 }], [0, 3], 30, KIND_INDEX, laneOf);
  return bars.map((b) => [KINDS[b.kind].kind, Math.round(b.start * 10) / 10, Math.round(b.end * 10) / 10, b.count]);
}"""


def test_aggregation_keeps_bubbles_and_counts_actions(module_page) -> None:
    bars = module_page.evaluate(LOD)
    assert bars == [["F", 0.0, 1.0, 100], ["B", 2.0, 3.0, 100], ["send_grad", 2.0, 3.0, 1]]


V_DRAW = """async (events) => {
  const { drawGantt } = await import('/js/gantt.js');
  const div = document.getElementById('chart');
  await drawGantt(div, events);
  const forward = div.data.find((t) => t.name === 'forward');
  const bars = Array.from(forward.y).map((row, i) => ({ row, stage: forward.customdata[i][4], shape: forward.marker.pattern.shape[i] }));
  return { ticks: div.layout.yaxis.ticktext, bars,
           key: [...div.previousElementSibling.querySelectorAll('span')].map((s) => s.textContent),
           hatched: div.previousElementSibling.querySelectorAll('i.later-chunk').length,
           hover: forward.hovertemplate };
}"""


def test_a_v_placed_schedule_draws_both_legs_of_the_v_on_each_worker(module_page, shoot) -> None:
    """zbv on 4 workers: worker w holds stage w (down) and 7 - w (back up); its later chunk, the
    way back up, is hatched, so the V shows on every row."""
    schedule = build("zbv", 4, 8)
    costs = [StageCosts(fwd_s=0.001, bwd_s=0.002, send_act_s=0.0001, send_grad_s=0.0001)] * 4
    events = [e.to_dict() for e in simulate(schedule, costs).timeline]
    out = module_page.evaluate(V_DRAW, events)
    assert out["ticks"] == ["w0 · s0,7 r0", "w1 · s1,6 r0", "w2 · s2,5 r0", "w3 · s3,4 r0"]
    for row in range(4):
        mine = [b for b in out["bars"] if b["row"] == row]
        assert {b["stage"] for b in mine if b["shape"] == ""} == {row}  # the way down: plain
        assert {b["stage"] for b in mine if b["shape"] == "/"} == {7 - row}  # the way back up: hatched
    assert out["hatched"] == 1 and "a worker's later chunks (hatched)" in out["key"]
    assert "stage %{customdata[4]}, chunk %{customdata[5]}" in out["hover"]
    shoot(module_page, "gantt-zbv-v-placement")
    assert module_page.errors == []


def test_one_chunk_per_worker_draws_no_pattern(module_page) -> None:
    out = module_page.evaluate("""async (events) => {
      const { drawGantt } = await import('/js/gantt.js');
      const div = document.getElementById('chart');
      await drawGantt(div, events);
      return { patterns: div.data.map((t) => t.marker.pattern || null),
               hatched: div.previousElementSibling.querySelectorAll('i.later-chunk').length };
    }""", simulated_timeline())
    assert all(p is None for p in out["patterns"]) and out["hatched"] == 0
