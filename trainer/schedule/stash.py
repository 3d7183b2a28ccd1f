"""What each worker keeps in memory, read off its action order alone.

Activations: a (microbatch, stage) pair is in flight from its forward until its backward (or,
with a split backward, until its W, which still needs the stage's saved inputs).

Weight versions: version v of a stage is created by the STEP that produces it (version 0 at the
start) and is held until it is both replaced by the next STEP and no longer used by a later
forward or backward (weight stashing). The count is the most versions held at once.
"""

from __future__ import annotations

from trainer.schedule.actions import Kind, Schedule

FREES = {Kind.BACKWARD, Kind.BACKWARD_WEIGHT}
USES = {Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT}


def peak_in_flight(acts) -> int:
    in_flight = peak = 0
    for a in acts:
        if a.kind is Kind.FORWARD:
            in_flight += 1
            peak = max(peak, in_flight)
        elif a.kind in FREES:
            in_flight -= 1
    return peak


def peak_versions(acts, stage: int) -> int:
    created = {0: -1}
    last_use: dict[int, int] = {}
    for pos, a in enumerate(acts):
        if a.stage != stage:
            continue
        if a.kind in USES:
            last_use[a.version] = pos
        elif a.kind is Kind.STEP:
            created[a.version] = pos
    end = len(acts)
    delta: dict[int, int] = {}
    for v, start in created.items():
        stop = max(last_use.get(v, start) + 1, created.get(v + 1, end))
        delta[start] = delta.get(start, 0) + 1
        delta[stop] = delta.get(stop, 0) - 1
    held = peak = 0
    for pos in sorted(delta):
        held += delta[pos]
        peak = max(peak, held)
    return peak


def memory_profile(schedule: Schedule) -> tuple[list[int], list[int]]:
    """Per worker: peak in-flight (microbatch, stage) pairs, peak weight versions of one stage."""
    activations = [peak_in_flight(acts) for acts in schedule.actions]
    versions = [
        max(peak_versions(acts, s) for s in spec.stages) for spec, acts in zip(schedule.workers, schedule.actions)
    ]
    return activations, versions
