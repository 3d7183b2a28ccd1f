"""Time to first paint of a 100,000-action pipeline Gantt in real Chromium (goal: under 2 s).

Serves the dashboard's static files (the same `mount_frontend` the API uses) from a local
uvicorn, opens Debian's /usr/bin/chromium headless through playwright, hands the page a
synthetic 1F1B timeline of N actions, and measures, inside the page, from the call to
`drawGantt` (building the per-kind arrays included) to the first animation frame after Plotly
has drawn. Each size is drawn `--repeat` times in fresh pages; the median is printed.

    .venv/bin/python bench/gantt.py [--actions 100000] [--repeat 3]

Timings on a shared 2-core machine are noisy; compare the ratios, not the third digit.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def one_f_one_b_timeline(actions: int, stages: int = 8, microbatches: int = 16) -> list[dict]:
    """A 1F1B-shaped timeline with about `actions` events (F, B, sends, receives, all-reduce, step).

    Forward 1 ms and backward 2 ms per microbatch per stage, 0.2 ms transfers; the exact timing
    does not matter to drawing cost, the number and mix of bars does.
    """
    fwd, bwd, comm = 0.001, 0.002, 0.0002
    events: list[dict] = []
    step = 0
    t0 = 0.0
    while len(events) < actions:
        for s in range(stages):
            t = t0 + s * (fwd + comm)
            warmup = min(stages - s - 1, microbatches)
            order = [("F", m) for m in range(warmup)]
            f_next, b_next = warmup, 0
            while b_next < microbatches:
                if f_next < microbatches:
                    order.append(("F", f_next)); f_next += 1
                order.append(("B", b_next)); b_next += 1
            for kind, mb in order:
                dur = fwd if kind == "F" else bwd
                if (kind == "F" and s > 0) or (kind == "B" and s < stages - 1):
                    recv = "recv_act" if kind == "F" else "recv_grad"
                    events.append(dict(worker=s, stage=s, replica=0, microbatch=mb, kind=recv, start=t, end=t + comm, step=step))
                    t += comm
                events.append(dict(worker=s, stage=s, replica=0, microbatch=mb, kind=kind, start=t, end=t + dur, step=step))
                t += dur
                if (kind == "F" and s < stages - 1) or (kind == "B" and s > 0):
                    send = "send_act" if kind == "F" else "send_grad"
                    events.append(dict(worker=s, stage=s, replica=0, microbatch=mb, kind=send, start=t, end=t + comm, step=step))
            events.append(dict(worker=s, stage=s, replica=0, microbatch=-1, kind="step", start=t, end=t + comm, step=step))
        t0 = max(e["end"] for e in events[-stages * microbatches:])
        step += 1
    return events[:actions]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_frontend(port: int):
    import uvicorn
    from fastapi import FastAPI

    from pipeboard.app.frontend import mount_frontend

    app = FastAPI()
    mount_frontend(app)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread


BENCH_HTML = """<!doctype html><html><head><meta charset="utf-8">
<script src="{plotly}"></script></head>
<body style="margin:0"><div id="gantt" style="width:1280px"></div></body></html>"""

MEASURE_JS = """async ([events, exact]) => {
  const { drawGantt } = await import('/js/gantt.js');
  const div = document.getElementById('gantt');
  const t0 = performance.now();
  await drawGantt(div, events, { title: 'bench', lodThreshold: exact ? Infinity : undefined });
  await new Promise((resolve) => requestAnimationFrame(() => resolve()));
  const painted = performance.now() - t0;
  return { ms: painted, bars: div.querySelectorAll('.point').length };
}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--actions", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--exact-max", type=int, default=10000,
                        help="also time exact drawing (one SVG bar per action, no aggregation) up to this size")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        sys.exit(f"{CHROMIUM} not found: apt-get install -y chromium")

    from playwright.sync_api import sync_playwright

    from pipeboard.app.frontend import plotly_path

    port = free_port()
    server, thread = serve_frontend(port)
    base = f"http://127.0.0.1:{port}"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            print(f"chromium {browser.version}; 1280x800; median of {args.repeat} fresh pages each")
            print(f"{'actions':>9} {'mode':>10} {'first paint ms':>15} {'bars drawn':>11}  (goal < 2000 ms at 100,000)")
            results = {}
            for n in args.actions:
                events = one_f_one_b_timeline(n)
                for exact in (False, True):
                    if exact and n > args.exact_max:
                        continue
                    times, bars = [], 0
                    for _ in range(args.repeat):
                        page = browser.new_page(viewport={"width": 1280, "height": 800})
                        page.route(f"{base}/bench", lambda route: route.fulfill(
                            content_type="text/html", body=BENCH_HTML.format(plotly=plotly_path())))
                        page.goto(f"{base}/bench")
                        result = page.evaluate(MEASURE_JS, [events, exact])
                        times.append(result["ms"])
                        bars = result["bars"]
                        page.close()
                    mode = "exact" if exact else "default"
                    results[(n, mode)] = statistics.median(times)
                    print(f"{n:>9,} {mode:>10} {results[(n, mode)]:>15.0f} {bars:>11,}")
            default = {n: ms for (n, mode), ms in results.items() if mode == "default"}
            if len(default) > 1:
                small, large = min(default), max(default)
                print(f"default mode, {large:,} vs {small:,} actions: {default[large] / default[small]:.1f}x the time "
                      f"for {large / small:.0f}x the actions (noisy shared machine)")
            browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=5)


if __name__ == "__main__":
    main()
