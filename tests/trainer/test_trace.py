"""Chrome trace export and the Gantt figure, for predicted and measured timelines alike."""

from __future__ import annotations

import json

import pytest

from pipeboard.trainer.schedule import TimelineEvent, build
from pipeboard.trainer.schedule.action_costs import costs_uniform
from pipeboard.trainer.schedule.gantt import COLOURS, figure
from pipeboard.trainer.schedule.simulator import simulate
from pipeboard.trainer.schedule.trace import merge_traces, to_chrome_trace


@pytest.fixture(scope="module")
def result():
    return simulate(build("1f1b", 3, 4, replicas=[1, 2, 1]), costs_uniform(3, 1e-3, 2e-3, comm_s=2e-4))


def test_trace_has_complete_events_in_microseconds(result):
    trace = to_chrome_trace(result.timeline)
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(result.timeline)
    f0 = next(e for e in events if e["name"] == "F0" and e["pid"] == 0)
    src = next(e for e in result.timeline if e.kind == "F" and e.microbatch == 0 and e.worker == 0)
    assert f0["ts"] == pytest.approx(src.start * 1e6) and f0["dur"] == pytest.approx((src.end - src.start) * 1e6)
    assert f0["cat"] == "forward" and f0["tid"] == 0 and f0["args"]["stage"] == 0
    transfers = [e for e in events if e["name"].startswith("send_")]
    assert transfers and all(e["tid"] == 1 and e["cat"] == "communication" for e in transfers)
    json.dumps(trace)  # plain JSON, as Perfetto reads it


def test_trace_names_every_process_and_thread(result):
    trace = to_chrome_trace(result.timeline, label="predicted")
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert sorted(names) == [0, 1, 2, 3]
    assert names[2] == "predicted worker 2 (stage 1, replica 1)"
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert threads[(0, 0)] == "compute" and threads[(0, 1)] == "transfers"


def test_measured_dicts_and_merging():
    measured = [
        {"worker": 0, "stage": 0, "replica": 0, "microbatch": 0, "kind": "F", "start": 0.5, "end": 0.75, "step": 3},
        {"worker": 1, "stage": 1, "replica": 0, "microbatch": 0, "kind": "B", "start": 1.0, "end": 1.5},
    ]
    a = to_chrome_trace(measured, label="measured", metadata={"job": 7})
    assert a["otherData"] == {"job": 7}
    assert [e["args"]["step"] for e in a["traceEvents"] if e["ph"] == "X"] == [3, 0]
    b = to_chrome_trace([TimelineEvent(0, 0, 0, 0, "F", 0.0, 0.1)], label="predicted", pid_offset=100)
    merged = merge_traces(a, b)
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1, 100}


def test_gantt_has_one_trace_per_kind_with_fixed_colours(result):
    fig = figure(result.timeline, title="t")
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"idle", "forward", "backward", "weight", "communication"}
    for name, trace in by_name.items():
        assert trace.marker.color == COLOURS[name]
        assert trace.orientation == "h" and len(trace.base) == len(trace.x) == len(trace.y)
    forwards = [e for e in result.timeline if e.kind == "F"]
    assert len(by_name["forward"].x) == len(forwards)
    assert min(by_name["forward"].base) == pytest.approx(0.0)  # ms from the first event
    assert max(b + x for b, x in zip(by_name["forward"].base, by_name["forward"].x)) <= result.iteration_time_s * 1e3 + 1e-9
    assert "w2 s1 r1" in set(by_name["forward"].y)


def test_gantt_idle_fills_the_gaps(result):
    fig = figure(result.timeline)
    idle = next(t for t in fig.data if t.name == "idle")
    busy = sum((e.end - e.start) for e in result.timeline if e.kind in ("F", "B", "step"))
    span = result.iteration_time_s
    assert sum(idle.x) / 1e3 == pytest.approx(span * 4 - busy)


def test_gantt_of_nothing_is_an_empty_figure():
    assert len(figure([]).data) == 0
