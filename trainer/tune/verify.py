"""``--verify K``: the best K candidates that fit, run for a few steps by the real runtime
(``trainer.runtime.launch.run_training``, as `pipeboard train` runs them), re-ranked by the
measured steady time per step (the run's own samples/s). Repeats alternate between the
candidates so that a slow spell of the machine falls on all of them; each candidate's figure is
the median of its repeats."""

from __future__ import annotations

import statistics
from typing import Any, Callable

from pipeboard.trainer.tune.candidate import Candidate
from pipeboard.trainer.tune.search import TuneResult, rank
from pipeboard.trainer.tune.tuned import run_fields


def measure(candidate: Candidate, run: dict[str, Any], *, steps: int, device: str = "cpu") -> tuple[float, int | None]:
    """(seconds per step, the most bytes a stage held) of one short run of ``candidate``
    (RunFailed or ConfigError if it cannot run)."""
    from pipeboard.trainer.runtime.run_config import RunConfig
    from pipeboard.trainer.runtime.launch import run_training

    cfg = RunConfig(**run_fields(candidate, run), steps=steps, eval_at_end=False, device=device)
    summary = run_training(cfg)
    sps = summary.get("samples_per_s")
    if not sps:
        raise RuntimeError(f"{candidate.label()}: the run measured no steady step in {steps} steps")
    held = [m.get("measured_bytes") for m in summary.get("memory") or [] if m.get("measured_bytes")]
    return candidate.batch_size / sps, max(held) if held else None


def verify(result: TuneResult, run: dict[str, Any], k: int, *, steps: int = 6, repeats: int = 1,
           device: str = "cpu", progress: Callable[[str], None] | None = None) -> TuneResult:
    """The result with its first ``k`` fitting candidates measured and everything re-ranked."""
    top = [c for c in result.candidates if c.fits][:k]
    times: dict[int, list[float]] = {i: [] for i in range(len(top))}
    held: dict[int, list[int]] = {i: [] for i in range(len(top))}
    for r in range(repeats):
        for i, cand in enumerate(top):
            if progress is not None:
                progress(f"verify {r * len(top) + i + 1}/{repeats * len(top)}: {cand.label()}")
            step_s, peak = measure(cand, run, steps=steps, device=device)
            times[i].append(step_s)
            if peak is not None:
                held[i].append(peak)
    for i, cand in enumerate(top):
        cand.measured_step_s = statistics.median(times[i])
        cand.measured_spread_s = max(times[i]) - min(times[i])
        cand.measured_memory_bytes = max(held[i]) if held[i] else None
    return TuneResult(rank(result.candidates, measured=True), result.skipped, result.memory_bytes, verified=len(top))
