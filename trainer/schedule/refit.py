"""Re-fit a prediction to a run's first measured steps: the online correction.

A running job's a-priori prediction is the simulator's steady step under the costs the profile
gave (``predict.stage_costs``). After a few steps the run has measured every kind of action on
every stage, so ``refit`` replaces each predicted per-action cost with the mean of what the run
measured for it, and simulates the steady step again with those costs (``predict.steady_step_s``,
the same simulation the a-priori prediction used). What moved is reported term by term.

The mean, not the median, of the actions of each microbatch (F, B, BI, W): a step's time is the
sum of its actions, and on a machine the run shares, actions the scheduler preempted make a long
tail that is real time, which a median would drop. The median of the terms that come once per
step (the optimizer step, the all-reduce, W(-1), the gaps): the correction sees four steps, and
the first of them can still be warming up. docs/fidelity.md ("The online correction") has the
measured cases for both.

The terms, per stage (one per physical stage, or per virtual stage for interleaved-1f1b):

- ``forward``, ``backward``, ``backward_input``, ``weight``: the means of the measured F, B,
  BI and W spans; a batched W(-1) span counts per microbatch it covers (the worker's forwards of
  that step: a replica runs its share; the simulator charges ``bwd_weight_batched_s`` per
  microbatch);
- ``step`` (the optimizer step) and ``allreduce``: the medians of their spans (once per step);
- ``transfer_act``, ``transfer_grad``: from a send's start to the end of the receive that waited
  for it (only receives that were posted before the send started, so the span is the transfer,
  not the receiver's own lateness);
- ``gaps``: the time a worker spends between recorded actions (the runtime's own Python between
  them, its per-step bookkeeping), per compute action. The simulator places a worker's actions
  back to back, so its a-priori value is 0; the re-fit charges it to every compute action.

A term the run did not measure (a kind the schedule does not have, or too few samples) keeps its
predicted value. No torch, no service: plain data in, plain data out.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from statistics import fmean, median
from typing import Iterable

from pipeboard.trainer.schedule.actions import Kind, TimelineEvent
from pipeboard.trainer.schedule.action_costs import StageCosts
from pipeboard.trainer.schedule.predict import steady_step_s

# a factor within this much of 1 is reported as not moved
MOVED = 0.05

_COMPUTE_TERMS = {Kind.FORWARD.value: "forward", Kind.BACKWARD.value: "backward",
                  Kind.BACKWARD_INPUT.value: "backward_input", Kind.BACKWARD_WEIGHT.value: "weight",
                  Kind.STEP.value: "step", Kind.ALLREDUCE.value: "allreduce"}
_ONCE_PER_STEP = {"step", "allreduce", "weight_batched", "gaps"}
_COMPUTE = (Kind.FORWARD.value, Kind.BACKWARD.value, Kind.BACKWARD_INPUT.value, Kind.BACKWARD_WEIGHT.value)


@dataclass(frozen=True)
class Term:
    """One cost of one stage: predicted and measured seconds per action, and their ratio."""

    name: str
    stage: int
    predicted_s: float
    measured_s: float
    samples: int

    @property
    def factor(self) -> float | None:
        return self.measured_s / self.predicted_s if self.predicted_s > 0 else None

    @property
    def moved(self) -> bool:
        f = self.factor
        return (self.measured_s > 0) if f is None else abs(f - 1) > MOVED

    def to_dict(self) -> dict:
        return {"name": self.name, "stage": self.stage, "predicted_s": self.predicted_s, "measured_s": self.measured_s,
                "factor": self.factor, "moved": self.moved, "samples": self.samples}


@dataclass(frozen=True)
class Refit:
    costs: list[StageCosts]  # the predicted costs with every measured term replaced
    step_s: float  # the simulator's steady step under them
    terms: list[Term]


def _predicted(c: StageCosts, name: str) -> float:
    return {"forward": c.fwd_s, "backward": c.bwd_s, "backward_input": c.bi_s, "weight": c.w_s,
            "weight_batched": c.w_batched_s, "step": c.step_s, "allreduce": c.allreduce_s,
            "transfer_act": c.send_act_s, "transfer_grad": c.send_grad_s, "gaps": 0.0}[name]


def measured_terms(events: Iterable[TimelineEvent], microbatches: int) -> dict[tuple[str, int], list[float]]:
    """{(term, stage): measured seconds per action} from a run's events (see the module docstring)."""
    spans: dict[tuple[str, int], list[float]] = defaultdict(list)
    by_worker: dict[int, list[TimelineEvent]] = defaultdict(list)
    sends: dict[tuple[str, int, int, int], TimelineEvent] = {}
    recvs: list[TimelineEvent] = []
    events = list(events)
    # a replica runs its share of the step's microbatches: its W(-1) covers as many as it forwarded
    forwards: dict[tuple[int, int, int], int] = defaultdict(int)
    for e in events:
        if (e.kind.value if isinstance(e.kind, Kind) else str(e.kind)) == Kind.FORWARD.value:
            forwards[(e.worker, e.stage, e.step)] += 1
    for e in events:
        kind = e.kind.value if isinstance(e.kind, Kind) else str(e.kind)
        by_worker[e.worker].append(e)
        if kind in _COMPUTE_TERMS:
            if kind == Kind.BACKWARD_WEIGHT.value and e.microbatch < 0:  # W(-1): the step's microbatches of this worker
                covered = forwards.get((e.worker, e.stage, e.step)) or microbatches
                spans[("weight_batched", e.stage)].append((e.end - e.start) / covered)
            else:
                spans[(_COMPUTE_TERMS[kind], e.stage)].append(e.end - e.start)
        elif kind in (Kind.SEND_ACT.value, Kind.SEND_GRAD.value):
            sends[(kind, e.stage, e.microbatch, e.step)] = e
        elif kind in (Kind.RECV_ACT.value, Kind.RECV_GRAD.value):
            recvs.append(e)
    for r in recvs:
        kind = r.kind.value if isinstance(r.kind, Kind) else str(r.kind)
        if kind == Kind.RECV_ACT.value:  # stage s receives stage s-1's output
            send, name, sender = sends.get((Kind.SEND_ACT.value, r.stage - 1, r.microbatch, r.step)), "transfer_act", r.stage - 1
        else:  # stage s receives the gradient stage s+1 sent back
            send, name, sender = sends.get((Kind.SEND_GRAD.value, r.stage + 1, r.microbatch, r.step)), "transfer_grad", r.stage + 1
        if send is not None and r.start <= send.start and r.end >= send.start:
            spans[(name, sender)].append(r.end - send.start)  # the sender's stage holds the transfer's cost
    for evs in by_worker.values():
        evs.sort(key=lambda e: (e.start, e.end))
        per_step_gap: dict[int, float] = defaultdict(float)
        per_step_compute: dict[int, int] = defaultdict(int)
        stages: set[int] = set()
        for prev, cur in zip(evs, evs[1:]):
            per_step_gap[cur.step] += max(0.0, cur.start - prev.end)
        for e in evs:
            kind = e.kind.value if isinstance(e.kind, Kind) else str(e.kind)
            if kind in _COMPUTE:
                per_step_compute[e.step] += 1
                stages.add(e.stage)
        for step, n in per_step_compute.items():
            if step in per_step_gap:
                for s in stages:
                    spans[("gaps", s)].append(per_step_gap[step] / n)
    return spans


def refit(costs: list[StageCosts], events: Iterable[TimelineEvent], *, schedule: str, microbatches: int,
          batch_weight_grads: bool = False, replicas: list[int] | None = None, chunks: int = 1) -> Refit:
    """``costs`` (one per physical stage, or per virtual stage with ``chunks`` > 1) with each term
    the ``events`` measured replaced by its mean (the median for the terms that come once per
    step), and the steady step simulated under them."""
    spans = measured_terms(events, microbatches)
    terms: list[Term] = []
    fitted = []
    for k, c in enumerate(costs):
        got: dict[str, float] = {}
        for name in ("forward", "backward", "backward_input", "weight", "weight_batched", "step", "allreduce",
                     "transfer_act", "transfer_grad", "gaps"):
            values = spans.get((name, k))
            if not values:
                continue
            # one sample per step (the step, the all-reduce, W(-1), the gaps): over the few steps
            # a correction sees, one warm-up step would decide a mean
            got[name] = median(values) if name in _ONCE_PER_STEP else fmean(values)
            terms.append(Term(name, k, _predicted(c, name), got[name], len(values)))
        gap = got.get("gaps", 0.0)
        fwd = got.get("forward", c.fwd_s) + gap
        bi = got.get("backward_input", c.bi_s) + gap
        w = got.get("weight", c.w_s) + gap
        bwd = got.get("backward", c.bwd_s) + gap
        w_batched = got.get("weight_batched", c.w_batched_s) + gap / microbatches
        fitted.append(replace(c, fwd_s=fwd, bwd_s=bwd, bwd_input_s=bi, bwd_weight_s=w, bwd_weight_batched_s=w_batched,
                              step_s=got.get("step", c.step_s), allreduce_s=got.get("allreduce", c.allreduce_s),
                              send_act_s=got.get("transfer_act", c.send_act_s),
                              send_grad_s=got.get("transfer_grad", c.send_grad_s)))
    step_s = steady_step_s(fitted, schedule, microbatches, batch_weight_grads=batch_weight_grads, replicas=replicas,
                           chunks=chunks)
    return Refit(fitted, step_s, terms)


def moved_terms(terms: list[Term]) -> dict[str, dict]:
    """Per term name, over stages: the median factor (None where predicted 0), the median
    measured seconds, and whether any stage's term moved: what the dashboard lists."""
    by_name: dict[str, list[Term]] = defaultdict(list)
    for t in terms:
        by_name[t.name].append(t)
    out = {}
    for name, ts in by_name.items():
        factors = [t.factor for t in ts if t.factor is not None]
        out[name] = {"factor": median(factors) if factors else None,
                     "predicted_s": median(t.predicted_s for t in ts), "measured_s": median(t.measured_s for t in ts),
                     "moved": any(t.moved for t in ts), "stages": [t.to_dict() for t in ts]}
    return out
