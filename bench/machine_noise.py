"""How steady this machine is: the same fixed work on every core, timed in short windows.

A prediction of a run's time per step is made from a profile measured seconds or minutes earlier,
and it is judged against 15 steps of a 30-step job (bench/fidelity.py): both are short samples of
the machine's speed. This bench measures that speed alone, without pipeboard: one process per core,
each multiplying the same two float32 matrices in one thread, timing every batch of products;
per process, the median batch time in each window of --window seconds. It prints the windows,
their max / min and the floor that spread sets on a prediction (as bench/fidelity.py's
repeatability part: (max - min) / (max + min)).

    .venv/bin/python bench/machine_noise.py [--seconds 20] [--window 0.5] [--processes N]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402

SIZE = 256  # float32 matrices of 256 KiB each: in a core's own cache, so no core waits on another's
PRODUCTS = 20  # per timed batch: about 10 ms on the machines measured so far


def work(seconds: float, window: float, out: mp.Queue) -> None:
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
    start = time.perf_counter()
    windows: list[list[float]] = []
    while (now := time.perf_counter()) - start < seconds:
        for _ in range(PRODUCTS):
            a @ b
        k = int((now - start) / window)
        while len(windows) <= k:
            windows.append([])
        windows[k].append(time.perf_counter() - now)
    out.put([statistics.median(w) * 1e3 for w in windows if w])


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def steal_jiffies() -> int:
    return int(Path("/proc/stat").read_text().splitlines()[0].split()[8])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--window", type=float, default=0.5, help="seconds per window (a 30-step job's tail: 0.05-3 s)")
    ap.add_argument("--processes", type=int, default=len(os.sched_getaffinity(0)))
    a = ap.parse_args()
    if a.seconds <= 0 or a.window <= 0 or a.processes < 1:
        ap.error("--seconds and --window must be > 0, --processes >= 1")
    print(f"processor: {cpu_name()}, {len(os.sched_getaffinity(0))} CPUs; load average at start {load()}", flush=True)
    print(f"{a.processes} process(es), {PRODUCTS} products of {SIZE}x{SIZE} float32 matrices per batch, "
          f"median batch ms per {a.window} s window, {a.seconds} s", flush=True)
    queue: mp.Queue = mp.Queue()
    steal0 = steal_jiffies()
    procs = [mp.Process(target=work, args=(a.seconds, a.window, queue)) for _ in range(a.processes)]
    for p in procs:
        p.start()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    floors = []
    for i, windows in enumerate(results):
        windows = windows[1:]  # the first window holds the start-up
        lo, hi = min(windows), max(windows)
        floors.append((hi - lo) / (hi + lo))
        print(f"process {i}: " + " ".join(f"{w:.2f}" for w in windows), flush=True)
        print(f"process {i}: median {statistics.median(windows):.2f} ms, min {lo:.2f}, max {hi:.2f}, "
              f"max/min {hi / lo:.2f}, floor {floors[-1] * 100:.1f}%", flush=True)
    print(f"steal: {steal_jiffies() - steal0} jiffies; load average at the end {load()}", flush=True)


if __name__ == "__main__":
    main()
