"""Run one worker's action list, in order, exactly as the schedule wrote it.

Each action maps to one small operation:

- ``RECV_ACT`` / ``RECV_GRAD`` post a receive (on a transport that matches by tag, receives are
  also posted up to ``window`` ahead; under NCCL, which matches in issue order, each at its own
  action: runtime/posting.py); the consuming ``F``/``B`` waits for it, so the transfer overlaps
  whatever computation runs in between.
- ``F``, ``B`` compute on the stage, against the weight version the action names; ``BI`` is a
  backward for the input gradients only, and ``W`` computes the weight gradients it left pending
  (``W(-1)``: those of every pending microbatch at once).
- ``SEND_ACT`` / ``SEND_GRAD`` post an ``isend`` and move on.
- ``ALLREDUCE`` sums the stage's gradients over its replica group (each microbatch's loss is
  scaled by 1/M, so the sum is the batch's mean gradient); ``STEP`` updates the weights.

Data for a microbatch (inputs on the first stage, targets on the last) comes from a callable, so
the same executor runs training, validation and the test emulations.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from pipeboard.trainer.runtime.comm import P2P, PendingRecv
from pipeboard.trainer.runtime.instrument import Heartbeat, Recorder
from pipeboard.trainer.runtime.posting import TAGGED_LOOKAHEAD, receive_posts
from pipeboard.trainer.runtime.stage import Stage
from pipeboard.trainer.schedule.actions import Action, Kind
from pipeboard.trainer.schedule.stash import steps_keeping_version, version_last_use

RECV = (Kind.RECV_ACT, Kind.RECV_GRAD)


class _NoRecord:
    def mark(self) -> float:
        return 0.0

    def record(self, *args) -> None:
        pass


_NO_RECORD = _NoRecord()


class Executor:
    def __init__(
        self,
        rank: int,
        stages: dict[int, Stage],
        num_stages: int,
        p2p: P2P,
        rank_of: Callable[[int, int], int],
        groups: dict[tuple[int, ...], object],
        recorder: Recorder,
        heartbeat: Heartbeat,
        window: int = TAGGED_LOOKAHEAD,
    ) -> None:
        self.rank = rank
        self.stages = stages
        self.num_stages = num_stages
        self.p2p = p2p
        self.rank_of = rank_of
        self.groups = groups
        self.recorder = recorder
        self.heartbeat = heartbeat
        self.window = window

    def run(
        self,
        actions: list[Action],
        data: Callable[[int], tuple[torch.Tensor | None, torch.Tensor | None]],
        *,
        step_of: Callable[[int], int],
        on_step_done: Callable[[int], None] | None = None,
        train: bool = True,
        ddp_sync: set[int] | None = None,
        event_mb: Callable[[int], int] | None = None,
        rank_of: Callable[[int, int], int] | None = None,
        record: bool = True,
    ) -> None:
        """Execute ``actions``. ``data(mb)`` gives (input, target) of microbatch ``mb``;
        ``step_of(mb)`` the training step (iteration) it belongs to; ``on_step_done(k)`` runs
        after the last action of step ``k``; ``ddp_sync``: microbatches whose backward
        all-reduces (DistributedDataParallel), None for all; ``event_mb(mb)`` the microbatch
        number events carry (global numbering); ``rank_of`` overrides the stage placement."""
        hb, p2p = self.heartbeat, self.p2p
        rec = self.recorder if record else _NO_RECORD
        rank_of = rank_of or self.rank_of
        event_mb = event_mb or (lambda mb: mb)
        last_stage = self.num_stages - 1
        inbox: dict[tuple[int, int, int], list[torch.Tensor]] = {}
        outbox: dict[tuple[int, int, int], tuple | list] = {}
        posted: dict[tuple[int, int, int], PendingRecv] = {}

        # Where each weight version is used for the last time, and each step's last action.
        last_use, releases = version_last_use(actions)
        keeping = steps_keeping_version(actions, last_use)
        step_end: dict[int, int] = {}
        step_at: list[int] = []  # W(-1), ALLREDUCE, STEP belong to the step of the work before them
        current_step = step_of(0)
        for i, a in enumerate(actions):
            if a.kind in RECV:  # posted early, ahead of their step, and never executed in place
                step_at.append(current_step)
                continue
            if a.microbatch >= 0:
                current_step = step_of(a.microbatch)
            step_at.append(current_step)
            step_end[current_step] = i
        done_at = {i: k for k, i in step_end.items()}

        posts = receive_posts(actions, self.window)

        def recv_key(a: Action) -> tuple[int, int, int]:
            return (0 if a.kind is Kind.RECV_ACT else 1, a.stage, a.microbatch)

        def post(a: Action) -> None:
            key = recv_key(a)
            if key in posted or key in inbox:
                return
            is_grad = a.kind is Kind.RECV_GRAD
            boundary = a.stage if is_grad else a.stage - 1
            posted[key] = p2p.post_recv(boundary, a.microbatch, is_grad, a.peer)

        def take(kind: int, stage: int, mb: int) -> list[torch.Tensor]:
            key = (kind, stage, mb)
            if key in inbox:
                return inbox.pop(key)
            pending = posted.pop(key, None)
            if pending is None:
                raise RuntimeError(f"worker {self.rank}: stage {stage} needs {'gradient' if kind else 'input'} of "
                                   f"microbatch {mb} but no receive was scheduled")
            t0 = time.perf_counter()
            hb.waiting(True)
            tensors = pending.wait()
            hb.waiting(False)
            rec.record(Kind.RECV_GRAD if kind else Kind.RECV_ACT, stage, event_mb(mb), t0, time.perf_counter(), step_of(mb))
            return tensors

        for i, a in enumerate(actions):
            kind, s, mb = a.kind, a.stage, a.microbatch
            for j in posts.get(i, ()):  # this action's receive, and those posted `window` ahead
                post(actions[j])
            if kind in RECV:
                continue  # posted above; the consumer waits for it
            t0 = rec.mark()  # an action's times: host clock on CPU, CUDA events on a GPU (instrument.py)
            stage = self.stages.get(s)
            if kind is Kind.FORWARD:
                x, y = data(mb)
                inputs = (list(x) if isinstance(x, (tuple, list)) else [x]) if s == 0 else take(0, s, mb)
                t0 = rec.mark()  # the wait for the input is its own (recv) event
                if train:
                    sync = ddp_sync is None or mb in ddp_sync
                    out = stage.forward(mb, a.version, inputs, y if s == last_stage else None, sync_grads=sync)
                else:
                    out = stage.evaluate(inputs)
                    if s == last_stage:
                        out = ()
                if s < last_stage:
                    if rank_of(s + 1, mb) == self.rank:
                        inbox[(0, s + 1, mb)] = [o.detach() for o in out]
                    else:
                        outbox[(0, s, mb)] = out
            elif kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
                grads = None if s == last_stage else take(1, s, mb)
                t0 = rec.mark()
                in_grads = stage.backward(mb, grads, weights=kind is Kind.BACKWARD)
                if s > 0:
                    if rank_of(s - 1, mb) == self.rank:
                        inbox[(1, s - 1, mb)] = in_grads
                    else:
                        outbox[(1, s, mb)] = in_grads
            elif kind is Kind.BACKWARD_WEIGHT:
                stage.backward_weight(mb)
            elif kind is Kind.SEND_ACT:
                p2p.send(list(outbox.pop((0, s, mb))), s, mb, False, a.peer)
            elif kind is Kind.SEND_GRAD:
                p2p.send(list(outbox.pop((1, s, mb))), s - 1, mb, True, a.peer)
            elif kind is Kind.ALLREDUCE:
                hb.waiting(True)
                stage.allreduce(self.groups[tuple(a.group)])
                hb.waiting(False)
            elif kind is Kind.STEP:
                stage.step(a.version, i in keeping)
            rec.record(kind, s, event_mb(mb) if mb >= 0 else -1, t0, rec.mark(), step_at[i])
            for stage_index, version in releases.get(i, ()):
                self.stages[stage_index].versions.release(version)
            hb.beat()
            if on_step_done is not None and i in done_at:
                on_step_done(done_at[i])
        p2p.flush()
        if posted or inbox:
            left = sorted(list(posted) + list(inbox))[:4]
            raise RuntimeError(f"worker {self.rank}: received data that no action consumed: {left}")

