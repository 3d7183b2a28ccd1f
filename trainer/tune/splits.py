"""The splits the tuner tries: the planner's plans (trainer.plan), deduplicated, as plain stages.

- a pipeline on N workers: PipeDream's plan (which may replicate stages) and the even baselines
  (by layers, time, parameters), each stage with parameters (a stage without any has nothing to
  step);
- a schedule that takes chunks: N x chunks virtual stages of one worker each, from the even
  baselines (PipeDream's may merge or replicate, which chunks cannot);
- data parallel: every layer on one stage, replicated N times.
"""

from __future__ import annotations

from typing import Any

from pipeboard.trainer.plan import PlanError, plan
from pipeboard.trainer.profile.schema import Profile

PIPELINE_METHODS = ("pipedream", "uniform", "time", "params")
EVEN_METHODS = ("uniform", "time", "params")


def _stages(p: Any) -> list[dict[str, Any]]:
    d = p.to_dict()
    return [{"layers": list(st.get("layers") or []), "replicas": int(st.get("replicas") or 1),
             "activation_bytes": int(st.get("activation_bytes") or 0),
             "activation_bytes_out": int(st.get("activation_bytes_out") or 0),
             "parameter_bytes": int(st.get("parameter_bytes") or 0)} for st in d.get("stages") or []]


def _trainable(profile: Profile, stages: list[dict[str, Any]]) -> bool:
    weighted = {layer.name for layer in profile.layers if layer.parameter_bytes > 0}
    return bool(stages) and all(weighted.intersection(st["layers"]) for st in stages)


def pipeline_splits(profile: Profile, workers: int, bandwidth: float, methods=PIPELINE_METHODS,
                    stages: int | None = None) -> list[dict[str, Any]]:
    """Distinct plans ({"method", "stages"}) for ``workers`` workers; with ``stages``, only
    those of exactly that many one-worker stages (chunks)."""
    out, seen = [], set()
    levels = [(stages or workers, float(bandwidth))]
    for method in methods:
        try:
            st = _stages(plan(profile, levels=levels, method=method))
        except PlanError:
            continue  # this method cannot split the model this way: the others may
        key = tuple((tuple(s["layers"]), s["replicas"]) for s in st)
        if key in seen or not _trainable(profile, st):
            continue
        if stages is not None and (len(st) != stages or any(s["replicas"] != 1 for s in st)):
            continue
        seen.add(key)
        out.append({"method": method, "stages": st})
    return out


def data_parallel_split(profile: Profile, workers: int, bandwidth: float) -> dict[str, Any]:
    """The planner's data-parallel plan: every layer on one stage, one replica per worker."""
    return {"method": "dp", "stages": _stages(plan(profile, levels=[(workers, float(bandwidth))], method="dp"))}
