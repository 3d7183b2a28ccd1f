"""A Gantt chart of a timeline (predicted or measured) as a plotly figure; no torch needed.

One row per worker and one bar trace per kind with fixed colours, so that pictures of different
schedules read the same way: forward, backward (B or BI), weight (W and the optimizer step),
communication (transfers and all-reduces, drawn as a thin bar under the row, since they run
beside computation) and idle (gaps in a worker's computation).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from pipeboard.trainer.schedule.actions import TimelineEvent
from pipeboard.trainer.schedule.trace import CATEGORY

COLOURS = {
    "forward": "#4C78A8",
    "backward": "#F58518",
    "weight": "#54A24B",
    "communication": "#B279A2",
    "idle": "#D9D9D9",
}
ORDER = ("idle", "forward", "backward", "weight", "communication")
LABEL_LIMIT = 1500  # above this many bars, microbatch numbers are left out to keep the page light


def _rows(events: list[TimelineEvent], worker_labels: Mapping[int, str] | None) -> dict[int, str]:
    stages: dict[int, set[int]] = {}
    replica: dict[int, int] = {}
    for e in events:
        stages.setdefault(e.worker, set()).add(e.stage)
        replica.setdefault(e.worker, e.replica)
    rows = {}
    for w in sorted(stages):
        name = f"w{w} s" + "+".join(str(s) for s in sorted(stages[w])) + (f" r{replica[w]}" if replica[w] else "")
        rows[w] = (worker_labels or {}).get(w) or name
    return rows


def _idle(events: list[TimelineEvent], t0: float, t1: float) -> dict[int, list[tuple[float, float]]]:
    busy: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        if CATEGORY.get(e.kind) in ("forward", "backward", "weight") or e.kind == "allreduce":
            busy.setdefault(e.worker, []).append((e.start, e.end))
    gaps: dict[int, list[tuple[float, float]]] = {}
    for w, spans in busy.items():
        t = t0
        for start, end in sorted(spans):
            if start > t:
                gaps.setdefault(w, []).append((t, start))
            t = max(t, end)
        if t < t1:
            gaps.setdefault(w, []).append((t, t1))
    return gaps


def figure(
    events: Iterable[TimelineEvent | Mapping[str, Any]],
    *,
    title: str = "",
    worker_labels: Mapping[int, str] | None = None,
    show_idle: bool = True,
    time_unit: str | None = None,
):
    """The Gantt figure; ``time_unit`` 's' or 'ms' (default: ms when the span is under 10 s)."""
    import plotly.graph_objects as go

    evs = [e if isinstance(e, TimelineEvent) else TimelineEvent.from_dict(dict(e)) for e in events]
    fig = go.Figure()
    if not evs:
        fig.update_layout(title=title or "empty timeline")
        return fig
    t0 = min(e.start for e in evs)
    t1 = max(e.end for e in evs)
    unit = time_unit or ("ms" if t1 - t0 < 10 else "s")
    scale = 1000.0 if unit == "ms" else 1.0
    rows = _rows(evs, worker_labels)
    labels = len(evs) <= LABEL_LIMIT
    groups: dict[str, list[tuple[str, float, float, str, str]]] = {k: [] for k in ORDER}
    for e in evs:
        cat = CATEGORY.get(e.kind, "communication")
        text = str(e.microbatch) if e.microbatch >= 0 and cat != "communication" else ""
        hover = f"{e.kind} mb {e.microbatch} stage {e.stage}" if e.microbatch >= 0 else f"{e.kind} stage {e.stage}"
        groups[cat].append((rows[e.worker], e.start - t0, e.end - e.start, text, hover))
    if show_idle:
        for w, gaps in _idle(evs, t0, t1).items():
            groups["idle"] += [(rows[w], a - t0, b - a, "", "idle") for a, b in gaps]
    for cat in ORDER:
        bars = groups[cat]
        if not bars:
            continue
        thin = cat == "communication"
        fig.add_trace(
            go.Bar(
                name=cat,
                orientation="h",
                y=[b[0] for b in bars],
                base=[b[1] * scale for b in bars],
                x=[b[2] * scale for b in bars],
                text=[b[3] for b in bars] if labels else None,
                textposition="inside",
                insidetextanchor="middle",
                hovertext=[b[4] for b in bars],
                hoverinfo="text+x",
                marker={"color": COLOURS[cat], "line": {"width": 0.5 if labels else 0, "color": "white"}},
                width=0.22 if thin else 0.7,
                offset=0.25 if thin else -0.35,
            )
        )
    fig.update_layout(
        title=title,
        barmode="overlay",
        xaxis_title=f"time ({unit})",
        yaxis={"autorange": "reversed", "categoryorder": "array", "categoryarray": list(rows.values())},
        legend={"orientation": "h", "y": -0.15},
        plot_bgcolor="white",
        bargap=0.1,
        margin={"l": 70, "r": 20, "t": 50, "b": 60},
    )
    fig.update_xaxes(showgrid=True, gridcolor="#eeeeee", rangemode="tozero")
    return fig


def write_html(fig, path: str, *, inline_js: bool = True) -> None:
    """A self-contained page (plotly.js inlined, so it opens without network)."""
    fig.write_html(path, include_plotlyjs=True if inline_js else "cdn", full_html=True)
