"""How long a run is, where it pauses (evaluation, checkpoint), and the validation action lists.

A run of ``total`` steps (one step = one batch of ``batch_size`` samples) is cut into segments
ending at evaluation and checkpoint steps. Synchronous schedules flush every step anyway; the
asynchronous ``pipedream`` schedule runs each segment as one schedule and drains at its end, so
segments are capped at ``MAX_SEGMENT`` steps (a drain costs about one pipeline depth of idle
time per segment). Boundaries depend only on the configuration, so a resumed run pauses at the
same steps as an uninterrupted one and follows the same trajectory.
"""

from __future__ import annotations

from pipeboard.trainer.runtime.run_config import RunConfig
from pipeboard.trainer.schedule.actions import Action, Kind

MAX_SEGMENT = 100
TARGET_EPOCH_CAP = 200  # a --target run gives up after this many epochs unless max_steps says otherwise


def total_steps(cfg: RunConfig, steps_per_epoch: int) -> int:
    if cfg.steps is not None:
        return cfg.steps
    if cfg.epochs is not None:
        return max(1, round(cfg.epochs * steps_per_epoch))
    if cfg.target is not None:
        return cfg.max_steps or TARGET_EPOCH_CAP * steps_per_epoch
    return steps_per_epoch


def segment_ends(cfg: RunConfig, start: int, total: int, steps_per_epoch: int) -> list[int]:
    every = [MAX_SEGMENT]
    if cfg.target is not None:
        every.append(cfg.eval_every or steps_per_epoch)
    if cfg.checkpoint_dir and cfg.checkpoint_every:
        every.append(cfg.checkpoint_every)
    ends = sorted({k for e in every for k in range(e, total, e) if k > start} | {total})
    return [k for k in ends if k > start]


def eval_actions(num_stages: int, rank_of_stage: dict[int, int], rank: int, n: int) -> list[Action]:
    """Forward-only pass of ``n`` microbatches through the workers ``rank_of_stage`` names:
    for each microbatch, each stage receives, computes and sends in pipeline order."""
    out: list[Action] = []
    for j in range(n):
        for s in range(num_stages):
            if rank_of_stage[s] != rank:
                continue
            prev = rank_of_stage.get(s - 1)
            if s > 0 and prev != rank:
                out.append(Action(Kind.RECV_ACT, s, j, peer=prev))
            out.append(Action(Kind.FORWARD, s, j))
            nxt = rank_of_stage.get(s + 1)
            if s < num_stages - 1 and nxt != rank:
                out.append(Action(Kind.SEND_ACT, s, j, peer=nxt))
    return out
