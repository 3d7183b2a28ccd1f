"""The sandbox's cost, for bench/sandbox.py: first its start cost alone (a bare `python -c pass` and a
validation of mlp-digits, off and on, in this process), then alternating pairs (off, on) of a job
on two deployments (mlp-digits, 2 stages, 1f1b, 300 steps; a new batch size per pair, so each job
profiles: the sandboxed phase): job start (POST to its first measured step) and samples/s."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from bench.sandbox_deploy import SMALL_JOB, deployment, seconds_to_first_step, spread
from bench.service_probe import Served, finished


def timed(command: list[str], env: dict[str, str], cwd: Path) -> float:
    began = time.monotonic()
    subprocess.run(command, env=env, cwd=cwd, check=True)
    return time.monotonic() - began


def validation_seconds(folder: Path) -> float:
    from pipeboard.app.services import model_checks

    began = time.monotonic()
    result = model_checks.run_validation("mlp-digits", {}, None, folder, time_limit_s=300, memory_bytes=8 << 30)
    assert result["ok"], result
    return time.monotonic() - began


@contextmanager
def this_process_settings(**values: str) -> Iterator[None]:
    """PIPEBOARD_<NAME>=value in this process's environment for the block: the settings the sandbox
    module and a validation run in this process read."""
    from pipeboard.app.core.config import get_settings

    names = {f"PIPEBOARD_{key.upper()}": value for key, value in values.items()}
    before = {name: os.environ.get(name) for name in names}
    os.environ.update(names)
    get_settings.cache_clear()
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
        get_settings.cache_clear()


def start_pairs(tmp: Path, pairs: int) -> None:
    """The sandbox's own start cost, without a deployment's noise: a bare `python -c pass` and a
    validation of mlp-digits (torch imported, the model built, checked and split), off and on; a
    data folder of its own (the sandbox hides the data folder, which must not be this checkout's)."""
    from pipeboard.app.services import sandbox

    folder = tmp / "start"
    folder.mkdir()
    timings: dict[str, dict[str, list[float]]] = {"python -c pass": {"off": [], "on": []},
                                                  "validation of mlp-digits": {"off": [], "on": []}}
    for _ in range(pairs):
        for mode in ("off", "on"):
            with this_process_settings(sandbox=mode, data_dir=str(tmp / "start-data")):
                command, env = [sys.executable, "-c", "pass"], dict(os.environ)
                if mode == "on":
                    command, env = sandbox.command(command, env, cwd=str(folder), writable=[folder])
                timings["python -c pass"][mode].append(timed(command, env, folder))
                timings["validation of mlp-digits"][mode].append(validation_seconds(folder))
    for what, by_mode in timings.items():
        extra = [on - off for on, off in zip(by_mode["on"], by_mode["off"])]
        print(f"- {what}: on {spread(by_mode['on'])} s, off {spread(by_mode['off'])} s; per pair on - off "
              f"{spread(extra)} s")


def timed_job(server: Served, batch: int) -> tuple[float, float]:
    """(seconds from POST to the first measured step, samples/s) of one 300-step job."""
    job_id, start = seconds_to_first_step(server, {**SMALL_JOB, "batch_size": batch, "microbatches": 4,
                                                   "stop": {"steps": 300}})
    done = finished(server.http, job_id)
    assert done["status"] == "succeeded", done
    return start, float(done["summary"]["samples_per_s"])


def cost_part(tmp: Path, pairs: int) -> None:
    print(f"\n## The sandbox's start cost alone: {pairs} alternating pairs (off, on) in this process")
    start_pairs(tmp, pairs)
    print(f"\n## The sandbox's cost: {pairs} alternating pairs (off, on); mlp-digits, 2 stages, 1f1b, 300 steps")
    results: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    with ExitStack() as stack:
        servers = {mode: stack.enter_context(deployment(tmp, f"cost-{mode}", sandbox=mode, calibration_max_age_s="0"))
                   for mode in ("off", "on")}
        for pair in range(pairs):
            batch = 64 + 8 * pair  # a new profile each pair, in both: the profile phase is what runs sandboxed
            for mode in ("off", "on"):
                results[mode].append(timed_job(servers[mode], batch))
                start, sps = results[mode][-1]
                print(f"- pair {pair + 1}, batch {batch}, sandbox {mode}: start {start:.2f} s, {sps:.1f} samples/s")
    starts = {mode: [r[0] for r in runs] for mode, runs in results.items()}
    rates = {mode: [r[1] for r in runs] for mode, runs in results.items()}
    print(f"\n- job start: on {spread(starts['on'])} s, off {spread(starts['off'])} s; per pair on - off: "
          f"{spread([on - off for on, off in zip(starts['on'], starts['off'])])} s (goal: under 0.5 s more)")
    ratios = [on / off for on, off in zip(rates["on"], rates["off"])]
    own = (max(rates["off"]) - min(rates["off"])) / statistics.median(rates["off"])
    print(f"- samples/s: on / off per pair {spread(ratios)}; the unsandboxed runs' own spread is {own:.1%} of their "
          "median (each job's profile and training run sandboxed in `on`: docs/sandbox.md)")
