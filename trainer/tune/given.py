"""A Plan of a split given as stages (a job's ``layout.split``, a tuner's choice): the layers and
replicas per stage as they are, costed as the planner costs its own stages, so that a job trains
exactly the split it names rather than planning again.

The split is the shape of a plan's and a tune candidate's stages: ``[{"layers": [names],
"replicas": n}, ...]`` in pipeline order. It must name every layer of the profile once, and no
layer may take its input from a later stage (for a chain of layers: contiguous ranges in order).
"""

from __future__ import annotations

import math
from typing import Any

from pipeboard.trainer.plan.baselines import _cut_level, _first_machines
from pipeboard.trainer.plan.formulas import data_parallel_s
from pipeboard.trainer.plan.flat_stages import Leaf, build_stages
from pipeboard.trainer.plan.plan_format import Level, LevelStage, Plan, timing_fields
from pipeboard.trainer.plan.states import state_chain
from pipeboard.trainer.profile.schema import Profile
from pipeboard.trainer.tune.candidate import TuneError

GIVEN_METHOD = "split"  # a plan's method when its stages were given, not planned


def _fail(message: str) -> TuneError:
    return TuneError(f"split: {message}", field="split")


def stage_of(profile: Profile, split: list[dict[str, Any]]) -> dict[str, int]:
    """Each layer's stage; TuneError naming ``split`` when a layer is unknown, repeated, missing,
    or fed from a later stage."""
    names = profile.layer_names()
    known = set(names)
    where: dict[str, int] = {}
    for s, st in enumerate(split):
        for name in st["layers"]:
            if name not in known:
                raise _fail(f"stage {s}: {name!r} is not a layer of {profile.model or 'the model'}")
            if name in where:
                raise _fail(f"{name!r} is on stage {where[name]} and stage {s}")
            where[name] = s
    missing = [n for n in names if n not in where]
    if missing:
        raise _fail(f"{len(missing)} layer(s) on no stage: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    for a, b in profile.edges:
        if where[a] > where[b]:
            raise _fail(f"{b!r} (stage {where[b]}) takes its input from {a!r} on the later stage {where[a]}: "
                        "stages must be contiguous ranges in model order")
    return where


def split_plan(profile: Profile, split: list[dict[str, Any]], workers: int, bandwidth: float) -> Plan:
    """The Plan of ``split`` on ``workers`` local processes over ``bandwidth`` bytes/s: the
    planner's per-stage costs over the linearised state chain, each stage's layers as given."""
    where = stage_of(profile, split)
    replicas = [int(st["replicas"]) for st in split]
    if sum(replicas) != workers:
        raise _fail(f"its replicas sum to {sum(replicas)}; the job has {workers} worker processes")
    levels = [(workers, float(bandwidth))]
    chain = state_chain(profile, linearise=True)
    names = profile.layer_names()
    # a state's stage: that of the layers it adds (the chain's order is topological, so a valid
    # split's states run in stage order)
    state_stage = []
    for k in range(chain.size):
        added = chain.layers_between(k, k + 1)
        state_stage.append(max((where[names[u]] for u in added), default=state_stage[-1] if state_stage else 0))
    bounds = []
    for s in range(len(split)):
        ks = [k for k, t in enumerate(state_stage) if t == s]
        if not ks:
            raise _fail(f"stage {s} has no layer the planner costs (only inputs): merge it with a neighbour")
        bounds.append((ks[0], ks[-1] + 1))
    n, at, leaves = chain.size, 0, []
    for s, (start, end) in enumerate(bounds):
        if start != at:
            raise _fail(f"stage {s} is not a contiguous range of the model's layers")
        at = end
        first = sum(replicas[:s])  # its replicas take the next ranks
        leaves.append(Leaf(start, end, [replicas[s]], _first_machines(first, levels),
                           -1 if end == n else _cut_level(first + replicas[s] - 1, levels)))
    stages = build_stages(chain, leaves, levels, profile, 1.0)
    for st, given in zip(stages, split):  # exactly the names given (inputs the chain leaves out included)
        st.layers = list(given["layers"])
    single = chain.compute_s[-1]
    dp_time = data_parallel_s(single, chain.parameters[-1], levels)
    best = max(st.time_s for st in stages)
    return Plan(method=GIVEN_METHOD, model=profile.model, state_graph=chain.kind, states=n, cluster=levels,
                total_workers=workers, workers_used=workers, **timing_fields(best, single, dp_time),
                noam=math.ceil(workers / stages[0].replicas),
                levels=[Level(1, workers, float(bandwidth), [LevelStage(st.start_state, st.end_state, st.replicas,
                                                                        st.compute_s, list(st.layers)) for st in stages])],
                stages=stages, options={"activation_compression": 1.0, "flat": True, "split": "given"})
