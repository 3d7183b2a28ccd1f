"""One memory formula: the bytes each worker of a schedule holds at its peak, part by part.

The simulator (``simulate``), the planner's memory cap (``trainer.plan.memory_fit``) and the
runtime's per-stage prediction (``trainer.runtime.memory_predict``) all call ``worker_memory``,
so a plan is checked against the same figure a run reports next to its measurement.

Per worker, summed over the (virtual) stages it holds:
- weights: one copy of a stage's parameters per version held at once (pipedream's weight
  stashing keeps several; the synchronous schedules one), read off the action order
  (``stash.peak_versions``);
- gradients: one accumulation buffer the size of one version of the weights, from a stage's
  first backward (or W) of a batch to its update, which lets them go: at the walk's peak they
  may not exist yet (gpipe's peak, every forward done, comes before any gradient);
- optimizer state: ``OPTIMIZER_STATES[optimizer]`` copies of the weights (adam's two moments,
  sgd with momentum's one buffer);
- activations: the walk along the worker's own actions. A forward of microbatch m on stage s
  adds what s saves for its backward; the backward (or, with a split backward, the W that still
  needs the saved inputs) releases it. The peak of that walk, in bytes, not in pairs, since the
  stages of one worker (interleaved, V-shaped) differ. What a forward leaves is more than
  autograd's saved tensors: the stage holds the microbatch's inputs and outputs until the
  gradient comes back, and the last stage the loss's saved tensors. A stage under recompute
  keeps only those (its output and the loss live outside the recomputed call); its backward first rebuilds the whole activation,
  so the walk adds that transient at each of its backwards;
- a split backward (BI, then W): from its BI to its W a microbatch also keeps the gradient of
  each weighted layer's output (the W's dW = g^T x reads it with the saved input); under
  recompute the BI lets the checkpointed graph go and the W replays the stage from its inputs
  (kept until then), so the rebuilt activation is a transient of the W too;
- boundary buffers: what a stage receives. A received input is the forward's input, kept with
  the microbatch (inside ``activation_bytes``, as the runtime's stage holds it); a received output
  gradient (``output_bytes``; none on the last stage) lives while its backward (B or BI) runs, a
  transient of that backward like recompute's rebuild (under recompute with a split backward the
  replay keeps it from BI to its W in place of the outputs the BI lets go, the same size). ``WorkerMemory.boundary`` is the received gradient live
  at the peak. Messages that arrive before their consumer runs (receives posted ahead, a
  shared-memory channel's stash) are neither predicted nor counted: how many there are is the
  transport's timing, not the schedule's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Iterable

from pipeboard.trainer.schedule.actions import Schedule, ScheduleError
from pipeboard.trainer.schedule.stash import B, BI, STEP, F, W, batched_weight_counts, peak_versions, schedule_columns

if TYPE_CHECKING:
    import numpy as np

# copies of the weights an optimizer keeps as state
OPTIMIZER_STATES = {"none": 0, "sgd-plain": 0, "sgd": 1, "rmsprop": 1, "adagrad": 1, "adam": 2, "adamw": 2}


@dataclass(frozen=True)
class StageMemory:
    """What one stage's memory is made of, per microbatch where it scales with microbatches."""

    weight_bytes: int  # one version of the stage's parameters
    activation_bytes: int  # saved between a microbatch's forward and its backward
    input_bytes: int = 0  # the activation arriving at the stage
    output_bytes: int = 0  # the activation leaving it (the size of the gradient that comes back)
    # what a microbatch keeps under recompute: the stage holds its inputs and outputs until the
    # gradient comes (and the last stage the loss's saved tensors); 0: input + output bytes
    recompute_bytes: int = 0
    # what a split backward's BI leaves for its W beyond the saved activations: the gradient of
    # each weighted layer's output (dW = g^T x)
    weight_grad_bytes: int = 0
    # the weighted layers' inputs (x of dW = g^T x): saved anyway without recompute; under
    # recompute the BI rebuilds them and they stay until W
    weight_input_bytes: int = 0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 0:
                raise ScheduleError(f"memory: {name} must be >= 0, got {value}")

    def kept_per_microbatch(self, recompute: bool) -> int:
        if not recompute:
            return self.activation_bytes
        return self.recompute_bytes or self.input_bytes + self.output_bytes


@dataclass(frozen=True)
class WorkerMemory:
    """Peak bytes of one worker, by part; ``total`` is what a cap is checked against."""

    weights: int
    gradients: int  # at the peak (0 where the peak comes before a stage's first backward)
    # activations: at the peak, on top of the gradients then
    optimizer: int
    activations: int
    boundary: int  # received output gradients live at the peak (during a backward)
    versions: int  # most weight versions of one stage held at once
    in_flight: int  # most (microbatch, stage) pairs in flight at once

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.boundary

    def as_dict(self) -> dict[str, int]:
        return asdict(self) | {"total": self.total}


def optimizer_copies(optimizer: str) -> int:
    try:
        return OPTIMIZER_STATES[optimizer]
    except KeyError:
        raise ScheduleError(f"optimizer: one of {', '.join(sorted(OPTIMIZER_STATES))}, got {optimizer!r}") from None


def activation_walk(code: np.ndarray, stage: np.ndarray, mb: np.ndarray, kept: list[int], rebuilt: list[int],
                    split: list[int] | None = None, grads: list[int] | None = None,
                    received: list[int] | None = None) -> tuple[int, int, int, int]:
    """(peak bytes, peak pairs, gradients' bytes at that peak, received gradients' bytes at that
    peak) along one worker's action columns.
    ``kept[s]``: bytes a forward of stage s leaves until its backward; ``rebuilt[s]``: bytes a
    backward of s (and under a split backward its W) rebuilds on top of that for its own duration
    (recompute), 0 otherwise; ``split[s]``: bytes an input-gradient backward (BI) of s adds until
    its W releases them with the rest; ``grads[s]``: stage s's gradients, made by its first
    backward (B or W) and let go at its update; ``received[s]``: the output gradient a backward
    (B or BI) of s receives, live for that backward's duration."""
    import numpy as np
    kept_a = np.asarray(kept, np.int64)[np.clip(stage, 0, None)]
    split_a = np.asarray(split if split is not None else [0] * len(kept), np.int64)[np.clip(stage, 0, None)]
    fwd = code == F
    release = (code == B) | (code == W)
    pairs = fwd.astype(np.int64) - release
    for i, n in batched_weight_counts(code, stage, mb).items():
        pairs[i] = -n
    delta = (np.where(fwd, kept_a, 0) - np.where(code == B, kept_a, 0) + np.where(code == BI, split_a, 0)
             - np.where(code == W, kept_a + split_a, 0))
    for i, n in batched_weight_counts(code, stage, mb).items():
        delta[i] = -n * (kept_a[i] + split_a[i])
    grad_delta = np.zeros(len(code), np.int64)
    for s, size in enumerate(grads or ()):
        made = False
        for i in np.flatnonzero(stage == s):
            if code[i] in (B, W) and not made:
                grad_delta[i], made = size, True
            elif code[i] == STEP and made:
                grad_delta[i], made = -size, False
    level = np.cumsum(delta)
    grad_level = np.cumsum(grad_delta)
    # a backward's rebuilt activation exists while it runs: before its own release is applied
    # (its gradients are made during it)
    before = level - delta + grad_level
    at_stage = np.clip(stage, 0, None)
    got = np.where((code == B) | (code == BI),
                   np.asarray(received if received is not None else [0] * len(kept), np.int64)[at_stage], 0)
    transient = np.where((code == B) | (code == BI) | (code == W), np.asarray(rebuilt, np.int64)[at_stage], 0) + got
    total = level + grad_level
    at = int(np.argmax(total)) if len(total) else 0
    peak, grads_at, got_at = (int(total[at]), int(grad_level[at]), 0) if len(total) and total[at] > 0 else (0, 0, 0)
    i = int(np.argmax(before + transient)) if len(code) else 0
    if len(code) and int(before[i] + transient[i]) > peak:
        peak, grads_at, got_at = int(before[i] + transient[i]), int(grad_level[i]), int(got[i])
    return peak, int(np.cumsum(pairs).max(initial=0)), grads_at, got_at


def worker_memory(schedule: Schedule, stages: list[StageMemory], *, optimizer: str = "sgd",
                  recompute: Iterable[int] = (), cols: list[tuple] | None = None) -> list[WorkerMemory]:
    """Peak memory of each worker of ``schedule``; ``stages`` has one entry per virtual stage,
    ``recompute`` names the virtual stages whose activations are recomputed in the backward."""
    if len(stages) != schedule.num_stages:
        raise ScheduleError(f"memory: {len(stages)} stages given; the schedule has {schedule.num_stages}")
    redo = set(recompute)
    bad = sorted(s for s in redo if not 0 <= s < schedule.num_stages)
    if bad:
        raise ScheduleError(f"recompute: stage {bad[0]} is not a stage of this schedule (0..{schedule.num_stages - 1})")
    copies = optimizer_copies(optimizer)
    if cols is None:
        cols, _ = schedule_columns(schedule)
    kept = [st.kept_per_microbatch(s in redo) for s, st in enumerate(stages)]
    rebuilt = [st.activation_bytes if s in redo else 0 for s, st in enumerate(stages)]
    # a BI leaves its output gradients for W. Under recompute W replays from the kept inputs and
    # the received output gradient: the BI lets the stage's outputs go and the gradient, the same
    # size, takes their place in what the microbatch keeps, so nothing is added
    split = [0 if s in redo else st.weight_grad_bytes for s, st in enumerate(stages)]
    # the last stage receives no gradient: it computes its loss
    received = [st.output_bytes if s < len(stages) - 1 else 0 for s, st in enumerate(stages)]
    out = []
    for spec, (code, stage, mb, version) in zip(schedule.workers, cols):
        versions = {s: peak_versions(code, stage, version, s) for s in spec.stages}
        weights = sum(versions[s] * stages[s].weight_bytes for s in spec.stages)
        one = sum(stages[s].weight_bytes for s in spec.stages)
        grads = [stages[s].weight_bytes if s in spec.stages else 0 for s in range(len(stages))]
        peak, pairs, grads_at, got_at = activation_walk(code, stage, mb, kept, rebuilt, split, grads, received)
        out.append(WorkerMemory(weights=weights, gradients=grads_at, optimizer=copies * one,
                                activations=peak - grads_at - got_at, boundary=got_at, versions=max(versions.values(), default=0), in_flight=pairs))
    return out


def stage_memory_from_costs(per_stage) -> list[StageMemory]:
    """The memory inputs a list of simulator ``StageCosts`` carries (no boundary sizes)."""
    return [StageMemory(weight_bytes=c.weight_bytes, activation_bytes=c.activation_bytes,
                        weight_grad_bytes=c.weight_grad_bytes, weight_input_bytes=c.weight_input_bytes)
            for c in per_stage]


ASYNC_BATCHES = 4  # an asynchronous schedule's batches a memory walk spans: its steady state


def run_schedule(name: str, stages: int, microbatches: int, *, replicas: list[int] | None = None, chunks: int = 1,
                 weight_grads: str = "batched", batches: int = ASYNC_BATCHES) -> Schedule:
    """The action lists whose memory a run of ``name`` holds, built as the runtime builds them:
    one batch of a synchronous schedule; ``batches`` of an asynchronous one (pipedream: its first
    batch holds one weight version where later ones hold several), an update after each; the
    weight pass batched where the schedule honours ``weight_grads`` (the runtime's default is
    batched: BI per microbatch, one W(-1) per update, which keeps every microbatch's weighted
    outputs' gradients and inputs until then). ``stages``: workers (physical stages)."""
    from pipeboard.trainer.schedule import registry
    from pipeboard.trainer.schedule.builder import build

    spec = registry.get(name)
    batched = weight_grads == "batched" and "batched" in spec.weight_grads
    if not spec.synchronous:
        return build(name, stages, microbatches * batches, replicas=replicas, per_update=microbatches,
                     batch_weight_grads=batched)
    if chunks > 1:
        return build(name, stages, microbatches, chunks=chunks, batch_weight_grads=batched)
    return build(name, stages, microbatches, replicas=replicas, batch_weight_grads=batched)
