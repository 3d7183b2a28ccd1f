"""Predicted Gantt pictures of a 4-stage 1F1B and a 4-stage PipeDream schedule, as HTML and PNG.

    .venv/bin/python bench/gantt_png.py [--out test-artifacts/gantt]

Stages take F = 1 ms and B = 2 ms per microbatch, 0.2 ms per transfer and 0.1 ms per optimizer
step (so that PipeDream's per-minibatch updates show). The HTML is written
by plotly; the PNG is a screenshot of it by headless Chromium (skipped, with a note, where
Chromium is missing).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from pipeboard.trainer.schedule import build
from pipeboard.trainer.schedule.action_costs import costs_uniform
from pipeboard.trainer.schedule.gantt import figure, write_html
from pipeboard.trainer.schedule.simulator import simulate

CASES = [
    ("1f1b", dict(num_stages=4, microbatches=8), "1F1B (PipeDream-Flush), 4 stages, 8 microbatches"),
    ("pipedream", dict(num_stages=4, microbatches=16), "PipeDream async 1F1B, 4 stages, 16 minibatches"),
    ("zb-h1", dict(num_stages=4, microbatches=8), "ZB-H1, 4 stages, 8 microbatches (BI = W = 1 ms)"),
    ("interleaved-1f1b", dict(num_stages=4, microbatches=8, chunks=2), "Interleaved 1F1B, 4 stages x 2 chunks"),
]


def screenshot(html: Path, png: Path) -> bool:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print(f"no chromium: left {html} only")
        return False
    with tempfile.TemporaryDirectory(prefix="gantt-chromium-") as profile:
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}",
             f"--screenshot={png}", "--window-size=1400,520", "--virtual-time-budget=5000", html.as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    return png.exists()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="test-artifacts/gantt")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, kwargs, title in CASES:
        schedule = build(name, **kwargs)
        result = simulate(schedule, costs_uniform(4, 1e-3, 2e-3, comm_s=2e-4, step_s=1e-4))
        note = "F 1 ms, B 2 ms, transfer 0.2 ms, step 0.1 ms"
        fig = figure(result.timeline, title=f"{title} ({note}): bubble {result.bubble_fraction:.1%}")
        fig.update_layout(width=1380, height=500)
        html = out / f"{name}.html"
        write_html(fig, str(html))
        png = out / f"{name}.png"
        ok = screenshot(html.resolve(), png.resolve())
        print(f"{name}: iteration {result.iteration_time_s * 1e3:.2f} ms, bubble {result.bubble_fraction:.3f}"
              f" -> {png if ok else html}")  # fmt: skip


if __name__ == "__main__":
    main()
