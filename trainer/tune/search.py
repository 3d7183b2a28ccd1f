"""The search: every split x schedule x microbatch count x recompute, predicted and ranked.

A microbatch count M applies when it divides the batch size B and a profile was measured at
B / M samples (``schedule.predict``: a simulated microbatch costs what the profile measured for
one of its batches), and when the runtime can lay the run out (``runtime.layout.resolve``: the
same check `pipeboard train` makes). Recompute is tried off everywhere, on everywhere and, under
a cap, on exactly for the stages that would not fit without it (where it lowers their memory);
the search does not enumerate other subsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable

from pipeboard.trainer.profile.schema import Profile
from pipeboard.trainer.schedule import registry
from pipeboard.trainer.schedule.actions import ScheduleError
from pipeboard.trainer.schedule.tied_splits import tied_refusal
from pipeboard.trainer.tune import cost, splits
from pipeboard.trainer.tune.candidate import Candidate, TuneError

DEFAULT_MICROBATCHES = (1, 2, 4, 8, 16)
LOCAL_BANDWIDTH = 5e9  # bytes/s between local worker processes when the profile has no measured link


@dataclass
class TuneResult:
    """Candidates best first: those that fit the cap by predicted (or, verified, measured) time
    per sample, then those that do not by the memory they need; ``skipped``: the combinations
    that cannot run at all, with why."""

    candidates: list[Candidate]
    skipped: list[dict[str, str]] = field(default_factory=list)
    memory_bytes: float | None = None
    verified: int = 0

    @property
    def choice(self) -> Candidate:
        return self.candidates[0]

    def to_dict(self) -> dict[str, Any]:
        return {"choice": self.choice.to_dict(), "candidates": [c.to_dict() for c in self.candidates],
                "skipped": self.skipped, "memory_per_worker_bytes": self.memory_bytes, "verified": self.verified}


def _runnable(split: dict[str, Any], schedule: str, batch_size: int, microbatches: int, chunks: int,
              workers: int) -> str | None:
    """Why the runtime would refuse this layout, or None (its checks read only the shape)."""
    shape = None if registry.is_data_parallel(schedule) else tuple(st["replicas"] for st in split["stages"])
    return _refusal(schedule, batch_size, microbatches, chunks, workers, shape)


def _split_ties(profile: Profile, split: dict[str, Any], schedule: str) -> str | None:
    """Why an asynchronous schedule cannot run this split of a model with tied weights, or None."""
    return tied_refusal(profile.meta.get("tied"), [st["layers"] for st in split["stages"]], schedule)


@lru_cache(maxsize=1024)
def _refusal(schedule: str, batch_size: int, microbatches: int, chunks: int, workers: int,
             replicas: tuple | None) -> str | None:
    from pipeboard.trainer.runtime.run_config import ConfigError, RunConfig
    from pipeboard.trainer.runtime.layout import resolve

    cfg = RunConfig(model="", schedule=schedule, batch_size=batch_size, microbatches=microbatches, chunks=chunks)
    if replicas is None:
        cfg.workers = workers
    else:
        cfg.stages = [[f"layer{k}"] for k in range(len(replicas))]
        cfg.replicas = list(replicas)
    try:
        resolve(cfg).build(microbatches)
    except (ConfigError, ScheduleError, ValueError) as exc:
        return str(exc)
    return None


def _layouts(profile: Profile, workers: int, bandwidth: float, schedules: Iterable[str]):
    """(schedule, chunks, split) for every schedule and every distinct split it can run."""
    pipeline = splits.pipeline_splits(profile, workers, bandwidth) if workers > 1 else []
    chunked: dict[int, list] = {}
    for name in schedules:
        spec = registry.get(name)
        if spec.data_parallel:
            yield name, 1, splits.data_parallel_split(profile, workers, bandwidth)
        elif spec.chunks:
            c = max(2, spec.default_chunks)
            if c not in chunked:
                chunked[c] = splits.pipeline_splits(profile, workers, bandwidth, splits.EVEN_METHODS,
                                                    stages=workers * c)
            for split in chunked[c]:
                yield name, c, split
        else:
            for split in pipeline:
                if spec.replication or all(st["replicas"] == 1 for st in split["stages"]):
                    yield name, 1, split


def _recompute_choices(off: list[int], on: list[int], cap: float | None) -> list[list[bool]]:
    """Off everywhere, on everywhere and, under a cap, on exactly where a stage would not fit
    without it and it lowers that stage's memory (with_recompute's rule)."""
    choices = [[False] * len(off), [True] * len(off)]
    if cap is not None:
        needed = [a > cap and b < a for a, b in zip(off, on)]
        if needed not in choices:
            choices.append(needed)
    return choices


def search(profiles: dict[int, Profile] | list[Profile], *, workers: int, batch_size: int,
           memory_bytes: float | None = None, microbatches: Iterable[int] = DEFAULT_MICROBATCHES,
           schedules: Iterable[str] | None = None, bandwidth: float = LOCAL_BANDWIDTH) -> TuneResult:
    """Rank every candidate (see the module docstring). ``profiles``: the model's profiles, one
    per microbatch size. TuneError naming the field on bad input, and when nothing fits the cap:
    one line with the smallest memory any candidate needs."""
    if isinstance(profiles, (list, tuple)):
        profiles = {p.batch_size: p for p in profiles}
    if not profiles or any(not isinstance(b, int) or b < 1 for b in profiles):
        raise TuneError("profile: every profile must say its batch_size (the microbatch size it was measured at)",
                        field="profile")
    if not isinstance(workers, int) or workers < 1:
        raise TuneError(f"workers: must be a positive integer, got {workers!r}", field="workers")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise TuneError(f"batch_size: must be a positive integer, got {batch_size!r}", field="batch_size")
    if memory_bytes is not None and not memory_bytes > 0:
        raise TuneError(f"memory_bytes: must be a positive number of bytes per worker, got {memory_bytes!r}")
    counts = sorted({int(m) for m in microbatches})
    if not counts or counts[0] < 1:
        raise TuneError(f"microbatches: positive counts, got {list(microbatches)!r}", field="microbatches")
    names = tuple(schedules) if schedules is not None else registry.names()
    unknown = [n for n in names if not registry.known(n)]
    if unknown:
        raise TuneError(f"schedules: {unknown[0]!r} is not a registered schedule", field="schedules")
    usable = [m for m in counts if batch_size % m == 0 and batch_size // m in profiles]
    if not usable:
        sizes = sorted(profiles)
        raise TuneError(f"batch_size: none of the microbatch counts {counts} splits {batch_size} into the "
                        f"microbatch size(s) profiled ({sizes})", field="batch_size")
    found: list[Candidate] = []
    skipped: list[dict[str, str]] = []
    for m in usable:
        profile = profiles[batch_size // m]
        optimizer = cost.optimizer_of(profile)
        longest = profile.at_longest()
        for schedule, chunks, split in _layouts(profile, workers, bandwidth, names):
            label = f"{schedule} {split['method']} mb {m}"
            why = _runnable(split, schedule, batch_size, m, chunks, workers) or _split_ties(profile, split, schedule)
            if why is not None:
                skipped.append({"candidate": label, "why": why})
                continue
            n = len(split["stages"])
            fill = cost.in_flight(longest, split)  # what memory must fit: the longest batch
            try:
                off = cost.predict_memory(fill, schedule, m, chunks, [False] * n, optimizer)
                on = cost.predict_memory(fill, schedule, m, chunks, [True] * n, optimizer)
                for redo in _recompute_choices(off, on, memory_bytes):
                    mem = off if not any(redo) else on if all(redo) else \
                        cost.predict_memory(fill, schedule, m, chunks, redo, optimizer)
                    step = cost.predict_time(profile, split, schedule, m, chunks, redo, bandwidth)
                    peak = max(mem)
                    fits = memory_bytes is None or peak <= memory_bytes
                    found.append(Candidate(
                        plan=split, schedule=schedule, microbatches=m, microbatch_size=batch_size // m, chunks=chunks,
                        recompute=redo, predicted_step_s=step, predicted_memory_bytes=int(peak),
                        stage_memory_bytes=[int(x) for x in mem], fits=fits,
                        why=None if fits else f"needs {int(peak)} bytes on its fullest worker; the cap is "
                                              f"{int(memory_bytes)}"))
            except (ScheduleError, ValueError) as exc:  # PlanError is a ValueError
                skipped.append({"candidate": label, "why": str(exc)})
    if not found:
        first = skipped[0]["why"] if skipped else "no split"
        raise TuneError(f"workers: no schedule can run this model on {workers} workers ({first})", field="workers")
    ranked = rank(found)
    if not ranked[0].fits:
        least = min(found, key=lambda c: c.predicted_memory_bytes)
        raise TuneError(f"memory_bytes: nothing fits in {int(memory_bytes)} bytes per worker; the smallest any "
                        f"candidate needs is {least.predicted_memory_bytes} bytes ({least.label()})")
    return TuneResult(ranked, skipped, memory_bytes)


def rank(candidates: list[Candidate], measured: bool = False) -> list[Candidate]:
    """Fitting ones first, fastest per sample first (by measurement where ``measured``: the
    measured ones ahead of the rest), then the others by the memory they need."""
    def key(c: Candidate):
        if not c.fits:
            return (2, c.predicted_memory_bytes, 0.0)
        if measured and c.measured_step_s is not None:
            return (0, c.measured_step_s / c.batch_size, c.predicted_memory_bytes)
        return (1 if measured else 0, c.predicted_time_per_sample_s, c.predicted_memory_bytes)

    return sorted(candidates, key=key)
