"""Pilot runs: the runtime itself, a few steps of the model on this machine, to calibrate what the
per-layer profile cannot see.

A profile times each layer alone (with other processes training beside it). A run's stage walks
its layers one after the other, in processes that share the cores and their caches with the other
stages, the launcher and one another's optimizer steps; a replicated stage's all-reduce also waits
for the slower replica. None of that is a property of one layer, and all of it depends on the
model and the machine; so instead of guessing it, the profile phase runs the model:

- a **pipeline** pilot: ``min(workers, cores)`` stages of about equal profiled time, 1F1B with the
  job's microbatches and batched weight gradients;
- a **replicated** pilot: the whole model as one stage on ``min(workers, cores)`` replicas;
- with more workers than cores, an **oversubscribed** pilot: ``workers`` stages (fewer where too
  few layers have parameters, as long as they outnumber the cores), whose measured
  steady step over its prediction (the pipeline pilot's figures applied, the cores' busy-time
  bound included) is what the OS's taking turns adds (``Pilot.step_factor``); and the whole model
  on ``workers`` replicas, the same for data parallelism (the replicated pilot's figures applied),
  whose replicas hand nothing on between all-reduces and so take turns unlike a pipeline's stages.
  Which process the OS runs next is a matter of chance, so one oversubscribed run's steady step
  is noisy: each oversubscribed pilot runs OVERSUBSCRIBED_RUNS times and keeps the median step
  (docs/profile-format.md, ``pilot``, has the figures).

Each pilot's events over its second half (``pipeboard.trainer.schedule.refit.measured_terms``)
are set against the same stages' predicted costs (``predict.stage_costs`` without a pilot): per
action kind, the factor by which the measured spans exceed the prediction (summed over stages),
the runtime's time between recorded actions per compute action (``gaps``), and for the replicated
pilot the all-reduce's time beyond its predicted transfer (``allreduce_wait``: the replicas
waiting for each other). ``predict.stage_costs`` applies the pipeline pilot to stages of one
replica and the replicated pilot to replicated stages
(``pipeboard.trainer.profile.calibration_records.Pilot``).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import replace
from statistics import fmean, median
from typing import Any

from pipeboard.trainer.profile.calibration_records import Pilot, PilotKind
from pipeboard.trainer.profile.schema import Profile
from pipeboard.trainer.runtime.run_config import RunConfig
from pipeboard.trainer.schedule.predict import profile_overhead, stage_costs, steady_step_s
from pipeboard.trainer.schedule.refit import measured_terms
from pipeboard.trainer.sink import ListSink

log = logging.getLogger(__name__)

PILOT_STEPS = 16  # at least; the second half is measured: past the first allocations and the fill
PILOT_SECONDS = 0.5  # a pilot runs about this long (its predicted steps)
MAX_PILOT_STEPS = 200
DETAIL_FIRST_STEPS = "PIPEBOARD_DETAIL_FIRST_STEPS"  # runtime/detail.py's setting
OVERSUBSCRIBED_RUNS = 3  # an oversubscribed pilot's runs; their median step is kept

# measured term -> the StageCosts field it is set against
_TERMS = {"forward": "fwd_s", "backward": "bwd_s", "backward_input": "bwd_input_s", "weight": "bwd_weight_s",
          "weight_batched": "bwd_weight_batched_s", "step": "step_s"}


def even_stages(profile: Profile, count: int) -> list[list[str]]:
    """The profile's layers cut into at most ``count`` contiguous stages of about equal forward
    plus backward time, each with parameters to train (a layer without any goes with the next
    layer that has some; the last ones with the last stage): fewer when too few layers have any."""
    units: list[list[int]] = [[]]
    for i, layer in enumerate(profile.layers):
        units[-1].append(i)
        if layer.parameter_bytes > 0:
            units.append([])
    if not units[-1]:
        units.pop()
    elif len(units) > 1 and not any(profile.layers[i].parameter_bytes > 0 for i in units[-1]):
        units[-2].extend(units.pop())
    count = max(1, min(count, len(units)))
    cost = [sum(max(1e-9, profile.layers[i].forward_ms + profile.layers[i].backward_ms) for i in u) for u in units]
    total, out, acc = sum(cost), [[]], 0.0
    for j, unit in enumerate(units):
        left = len(units) - j  # units not placed yet, this one included
        need = count - len(out)  # stages still to open after the current one
        if out[-1] and need > 0 and (acc >= total * len(out) / count or left <= need):
            out.append([])
        out[-1].extend(profile.layers[i].name for i in unit)
        acc += cost[j]
    return out


def factors(profile: Profile, stages: list[list[str]], replicas: list[int], events: list[Any], microbatches: int,
            steps: int, measured_step_s: float | None = None) -> PilotKind:
    """The pilot's figures: measured against predicted per kind of action (see the module
    docstring); with the run's ``measured_step_s``, what its step took beyond the prediction
    with those figures (``step_factor``)."""
    costs = stage_costs(profile, stages, microbatches=microbatches, replicas=replicas,
                        overhead=profile_overhead(profile, stages), pilot=False)
    steady = [e for e in events if e.step >= steps // 2]
    spans = measured_terms(steady, microbatches)
    out: dict[str, float] = {}
    for name, field in _TERMS.items():
        measured = predicted = 0.0
        for k, c in enumerate(costs):
            values = spans.get((name, k))
            pred = getattr(c, field)
            if values and pred:
                measured += fmean(values)
                predicted += pred
        if predicted > 0:
            out[name] = measured / predicted
    gaps = [fmean(spans[("gaps", k)]) for k in range(len(costs)) if spans.get(("gaps", k))]
    wait = None
    if any(r > 1 for r in replicas):
        waits = [fmean(spans[("allreduce", k)]) - c.allreduce_s for k, c in enumerate(costs) if spans.get(("allreduce", k))]
        wait = max(0.0, fmean(waits)) * 1e3 if waits else None
    kind = PilotKind(stages=len(stages), replicas=max(replicas), factors=out,
                     gaps_ms=fmean(gaps) * 1e3 if gaps else 0.0, allreduce_wait_ms=wait)
    if measured_step_s:
        predicted = predicted_step_s(profile, kind, stages, replicas, microbatches)
        kind.step_factor = measured_step_s / predicted if predicted > 0 else None
    return kind


def predicted_step_s(profile: Profile, kind: PilotKind | None, stages: list[list[str]], replicas: list[int],
                     microbatches: int, cores: int | None = None) -> float:
    """The steady step a pilot of ``stages`` x ``replicas`` is predicted to take (1F1B, batched
    weight gradients) with ``kind``'s figures applied (None: without any)."""
    replicated = any(r > 1 for r in replicas)
    pilot = None if kind is None else Pilot(pipeline=None if replicated else kind, replicated=kind if replicated else None,
                                            batch_size=1, microbatches=1, steps=1)
    costs = stage_costs(replace(profile, pilot=pilot), stages, microbatches=microbatches, replicas=replicas,
                        overhead=profile_overhead(profile, stages))
    return steady_step_s(costs, "1f1b", microbatches, batch_weight_grads=True, replicas=replicas, cores=cores)


def _run(cfg: RunConfig) -> tuple[list[Any], dict[str, Any]] | None:
    """The run's events and summary; None when it failed (its prediction then goes without it)."""
    from pipeboard.trainer.runtime.launch import RunFailed, run_training

    sink = ListSink()
    # The factors read the actions of the steady second half, but a run keeps full actions only
    # in detail windows (runtime/detail.py: the first 50 steps by default); a pilot of up to
    # MAX_PILOT_STEPS keeps them all. The policy is read from the environment in every worker.
    saved = os.environ.get(DETAIL_FIRST_STEPS)
    os.environ[DETAIL_FIRST_STEPS] = str(max(cfg.steps or 0, int(saved or 0)))
    try:
        summary = run_training(cfg, sink)
    except (RunFailed, ValueError, RuntimeError) as exc:
        log.warning("pilot run of %s (%d stage(s), replicas %s) failed: %s", cfg.model, len(cfg.stages or []),
                    cfg.replicas, exc)
        return None
    finally:
        if saved is None:
            os.environ.pop(DETAIL_FIRST_STEPS, None)
        else:
            os.environ[DETAIL_FIRST_STEPS] = saved
    return sink.events, summary


def oversubscribed_factor(profile: Profile, kind: PilotKind, stages: list[list[str]], microbatches: int,
                          cores: int, measured_step_s: float | None, replicas: list[int] | None = None) -> float | None:
    """A run of ``stages`` x ``replicas`` (default one each; more processes than ``cores``)
    measured ``measured_step_s`` a step: over the prediction with ``kind``'s figures (the pipeline
    or the replicated pilot's) and the busy-time bound of ``cores``."""
    if not measured_step_s:
        return None
    predicted = predicted_step_s(profile, kind, stages, replicas or [1] * len(stages), microbatches, cores)
    return measured_step_s / predicted if predicted > 0 else None


def pilot_steps(profile: Profile, stages: list[list[str]], replicas: list[int], microbatches: int,
                cores: int | None = None) -> int:
    """Steps a pilot runs: about PILOT_SECONDS of its predicted steps, PILOT_STEPS at least (a 3 ms
    step's second half of 8 steps is 12 ms, which one wake-up of another process can move)."""
    step = predicted_step_s(profile, None, stages, replicas, microbatches, cores)
    n = PILOT_STEPS if step <= 0 else min(MAX_PILOT_STEPS, max(PILOT_STEPS, math.ceil(PILOT_SECONDS / step)))
    return n + n % 2


def measure(profile: Profile, source: str, model_args: dict[str, Any], *, batch_size: int, microbatches: int,
            workers: int, cores: int, data: str | None = None, threads: int | None = None,
            optimizer: str | None = None) -> Pilot:
    """The pilots of ``source`` for runs of ``batch_size`` samples in ``microbatches`` on
    ``workers`` local processes sharing ``cores`` (a one-worker run has no replicated pilot; a
    one-layer model no pipeline pilot)."""
    width = max(1, min(workers, cores))
    base = dict(model=source, model_args=dict(model_args), data=data, schedule="1f1b", batch_size=batch_size,
                microbatches=microbatches, weight_grads="batched", threads=threads, optimizer=optimizer,
                eval_at_end=False)
    t0 = time.monotonic()
    runs: list[int] = []

    def run(stages: list[list[str]], replicas: list[int], over: int | None = None):
        steps = pilot_steps(profile, stages, replicas, microbatches, over)
        runs.append(steps)
        ran = _run(RunConfig(**base, steps=steps, stages=stages, replicas=replicas))
        return (ran[0], ran[1].get("step_s"), steps) if ran else None

    def median_step(stages: list[list[str]], replicas: list[int]) -> float | None:
        """The median steady step of OVERSUBSCRIBED_RUNS runs; None at the first that fails."""
        steps_s = []
        for _ in range(OVERSUBSCRIBED_RUNS):
            ran = run(stages, replicas, cores)
            if not (ran and ran[1]):
                return None
            steps_s.append(ran[1])
        return median(steps_s)

    pipeline = replicated = None
    whole = [[layer.name for layer in profile.layers]]
    stages = even_stages(profile, width)
    if len(stages) > 1 or width == 1:
        ran = run(stages, [1] * len(stages))
        if ran:
            pipeline = factors(profile, stages, [1] * len(stages), ran[0], microbatches, ran[2], ran[1])
    if width > 1:
        ran = run(whole, [width])
        if ran:
            replicated = factors(profile, whole, [width], ran[0], microbatches, ran[2], ran[1])
    over_workers = over_factor = over_replicated = None
    many = even_stages(profile, workers)
    if len(many) > cores and pipeline is not None:  # as many workers as stages with parameters allow
        over_factor = oversubscribed_factor(profile, pipeline, many, microbatches, cores,
                                            median_step(many, [1] * len(many)))
        over_workers = len(many) if over_factor else None
    if workers > cores and replicated is not None:  # data parallelism on more processes than cores
        over_replicated = oversubscribed_factor(profile, replicated, whole, microbatches, cores,
                                                median_step(whole, [workers]), [workers])
    return Pilot(pipeline=pipeline, replicated=replicated, batch_size=batch_size, microbatches=microbatches,
                 steps=max(runs, default=PILOT_STEPS), wall_s=round(time.monotonic() - t0, 3),
                 oversubscribed_workers=over_workers, oversubscribed_factor=over_factor,
                 oversubscribed_replicated_factor=over_replicated)
