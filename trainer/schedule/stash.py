"""What each worker keeps in memory, read off its action order alone.

Activations: a (microbatch, stage) pair is in flight from its forward until its backward (or,
with a split backward, until its W, which still needs the stage's saved inputs; a ``W(-1)``
ends every pair of its stage whose BI ran since the stage's last W).

Weight versions: version v of a stage is created by the STEP that produces it (version 0 at the
start) and is held until it is both replaced by the next STEP and no longer used by a later
forward or backward (weight stashing). The count is the most versions held at once.

Vectorised with numpy: the simulator calls this on schedules of 10^5 - 10^6 actions. numpy is
imported inside the functions that use it, so that importing ``pipeboard.trainer.schedule`` (the schedule
registry, read by every `pipeboard` command's help) does not load it.
"""

from __future__ import annotations

from collections import defaultdict
from operator import attrgetter
from typing import TYPE_CHECKING

from pipeboard.trainer.schedule.actions import Action, Kind, Schedule

if TYPE_CHECKING:
    import numpy as np

CODES = {kind: i for i, kind in enumerate(Kind)}
F, B, BI, W = (CODES[k] for k in (Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT))
STEP = CODES[Kind.STEP]
COMPUTE = (Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT)


def columns(acts: list[Action]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(kind code, stage, microbatch, version) of each action, as int arrays (map: C speed)."""
    import numpy as np
    n = len(acts)
    code = np.fromiter(map(CODES.__getitem__, map(attrgetter("kind"), acts)), np.int64, n)
    rest = (np.fromiter(map(attrgetter(name), acts), np.int64, n) for name in ("stage", "microbatch", "version"))
    return (code, *rest)  # type: ignore[return-value]


def schedule_columns(schedule: Schedule) -> tuple[list[tuple], list]:
    """Per worker, ``columns`` of its actions, and what holds the Action at each index where the
    simulator needs one (an all-reduce's group): the build's columns while the schedule's lists
    have not been read (``Schedule.columns``), else the lists."""
    table = schedule.columns()
    if table is None:
        return [columns(acts) for acts in schedule.actions], schedule.actions
    import numpy as np
    cols = [tuple(np.array(c, np.int64) for c in (t.code, t.stage, t.microbatch, t.version)) for t in table]
    return cols, [t.source for t in table]


def peak_in_flight(code: np.ndarray, stage: np.ndarray | None = None, mb: np.ndarray | None = None) -> int:
    import numpy as np
    delta = (code == F).astype(np.int64) - ((code == B) | (code == W))
    if mb is not None:
        for i, n in batched_weight_counts(code, stage, mb).items():
            delta[i] = -n
    return int(np.cumsum(delta).max(initial=0))


def batched_weight_counts(code: np.ndarray, stage: np.ndarray, mb: np.ndarray) -> dict[int, int]:
    """Position of each ``W(-1)`` -> how many microbatches it covers: the BIs of its stage since
    that stage's previous ``W(-1)``, less those that had their own ``W``."""
    import numpy as np
    batched = np.flatnonzero((code == W) & (mb < 0))
    if not len(batched):
        return {}
    out = {}
    for s in np.unique(stage[batched]):
        mine = stage == s
        pending = np.cumsum((mine & (code == BI)).astype(np.int64) - (mine & (code == W) & (mb >= 0)))
        before = 0
        for i in batched[stage[batched] == s]:
            out[int(i)] = int(pending[i] - before)
            before = int(pending[i])
    return out


def peak_versions(code: np.ndarray, stage: np.ndarray, version: np.ndarray, s: int) -> int:
    import numpy as np
    mine = stage == s
    uses = mine & (code <= W)
    steps = np.flatnonzero(mine & (code == STEP))
    top = int(max(version[uses].max(initial=0), version[steps].max(initial=0)))
    created = np.full(top + 2, len(code), dtype=np.int64)  # version top+1 never comes
    created[0] = -1
    created[version[steps]] = steps
    last_use = np.full(top + 1, -1, dtype=np.int64)
    np.maximum.at(last_use, version[uses], np.flatnonzero(uses))
    start = created[: top + 1]
    stop = np.maximum(np.maximum(last_use, start) + 1, created[1:])
    alive = start < len(code)  # versions never produced are never held
    points = np.concatenate([start[alive], stop[alive]])
    change = np.concatenate([np.ones(alive.sum(), np.int64), -np.ones(alive.sum(), np.int64)])
    order = np.lexsort((change, points))  # at equal positions release before acquiring
    return int(np.cumsum(change[order]).max(initial=0))


def memory_profile(schedule: Schedule, cols: list[tuple] | None = None) -> tuple[list[int], list[int]]:
    """Per worker: peak in-flight (microbatch, stage) pairs, peak weight versions of one stage."""
    cols = cols or [columns(acts) for acts in schedule.actions]
    activations = [peak_in_flight(c[0], c[1], c[2]) for c in cols]
    versions = [
        max(peak_versions(c[0], c[1], c[3], s) for s in spec.stages) for spec, c in zip(schedule.workers, cols)
    ]
    return activations, versions


def version_last_use(actions: list[Action]) -> tuple[dict[tuple[int, int], int], dict[int, list[tuple[int, int]]]]:
    """Where each (stage, weight version) is used for the last time, and the versions whose last
    use each position is. A W(-1) uses the versions of every BI it completes: their weight
    gradients land on those versions' tensors."""
    last_use: dict[tuple[int, int], int] = {}
    awaiting_w: dict[int, set[int]] = defaultdict(set)  # stage -> versions of BIs since its last W(-1)
    for i, a in enumerate(actions):
        if a is not None and a.kind in COMPUTE:
            last_use[(a.stage, a.version)] = i
            if a.kind is Kind.BACKWARD_INPUT:
                awaiting_w[a.stage].add(a.version)
            elif a.kind is Kind.BACKWARD_WEIGHT and a.microbatch < 0:
                for v in awaiting_w.pop(a.stage, ()):
                    last_use[(a.stage, v)] = i
    releases: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for key, i in last_use.items():
        releases[i].append(key)
    return last_use, releases


def steps_keeping_version(actions: list[Action | None],
                          last_use: dict[tuple[int, int], int] | None = None) -> set[int]:
    """Positions of the STEPs after which the version they replace (the one before the version
    they produce) is still used by a later action: the runtime must keep it unchanged, so with
    weight stashing it moves the parameters to fresh storage first (runtime/versions.py: a copy
    of the stage's weights that the cost model charges). ``actions``: one worker's, in order
    (None where a column holds no Action: a transfer); ``last_use``: ``version_last_use``'s."""
    if last_use is None:
        last_use = version_last_use(actions)[0]
    return {i for i, a in enumerate(actions)
            if a is not None and a.kind is Kind.STEP and last_use.get((a.stage, a.version - 1), -1) > i}
