"""Chrome trace JSON (the Trace Event Format that chrome://tracing and Perfetto open).

One process per worker, named after the stage and replica it runs; thread 0 holds computation
(F, B, BI, W, step, all-reduce) and thread 1 the transfers, which run beside computation.
The same function exports predicted and measured timelines; ``label`` tells them apart and
``pid_offset`` lets two timelines share one file.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from pipeboard.trainer.schedule.actions import TimelineEvent

CATEGORY = {
    "F": "forward",
    "B": "backward",
    "BI": "backward",
    "W": "weight",
    "step": "weight",
    "allreduce": "communication",
    "send_act": "communication",
    "recv_act": "communication",
    "send_grad": "communication",
    "recv_grad": "communication",
}
TRANSFERS = {"send_act", "recv_act", "send_grad", "recv_grad"}


def _event(e: TimelineEvent | Mapping[str, Any]) -> TimelineEvent:
    return e if isinstance(e, TimelineEvent) else TimelineEvent.from_dict(dict(e))


def to_chrome_trace(
    events: Iterable[TimelineEvent | Mapping[str, Any]],
    *,
    label: str = "",
    pid_offset: int = 0,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``{"traceEvents": [...]}`` with complete ("X") events in microseconds and name metadata."""
    trace: list[dict[str, Any]] = []
    workers: dict[int, tuple[int, int]] = {}
    for raw in events:
        e = _event(raw)
        workers.setdefault(e.worker, (e.stage, e.replica))
        name = e.kind if e.microbatch < 0 else f"{e.kind}{e.microbatch}"
        trace.append(
            {
                "name": name,
                "cat": CATEGORY.get(e.kind, "other"),
                "ph": "X",
                "ts": e.start * 1e6,
                "dur": max(e.end - e.start, 0.0) * 1e6,
                "pid": pid_offset + e.worker,
                "tid": 1 if e.kind in TRANSFERS else 0,
                "args": {"stage": e.stage, "replica": e.replica, "microbatch": e.microbatch, "step": e.step},
            }
        )
    prefix = f"{label} " if label else ""
    for w in sorted(workers):
        stage, replica = workers[w]
        pid = pid_offset + w
        trace += [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
             "args": {"name": f"{prefix}worker {w} (stage {stage}, replica {replica})"}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "compute"}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "transfers"}},
        ]  # fmt: skip
    out: dict[str, Any] = {"traceEvents": trace, "displayTimeUnit": "ms"}
    if metadata:
        out["otherData"] = dict(metadata)
    return out


def merge_traces(*traces: dict[str, Any]) -> dict[str, Any]:
    """One trace holding several (e.g. predicted and measured, exported with distinct pid_offset)."""
    merged: list[dict[str, Any]] = []
    for t in traces:
        merged += t["traceEvents"]
    return {"traceEvents": merged, "displayTimeUnit": "ms"}
