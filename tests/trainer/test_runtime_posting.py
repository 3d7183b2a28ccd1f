"""Transfers posted so that no schedule can deadlock under NCCL's in-order pairing.

NCCL ignores tags: between two ranks the k-th send/receive of one pairs with the k-th of the
other (runtime/posting.py). The model (``nccl_outcome``) replays each worker's issue order under
those rules. Over every registered schedule, 2-4 stages and 1-8 microbatches, the old order
(receives posted 8 ahead) deadlocks every pipeline, and each receive at its own action (what
the executor issues under NCCL) deadlocks none. The last tests run the real executor on real
stages in two threads and check that what it issues is what the model was given.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from pipeboard.trainer.runtime.comm import P2P, BoundarySpec, TensorSpec
from pipeboard.trainer.runtime.executor import Executor
from pipeboard.trainer.runtime.instrument import Heartbeat, Recorder
from pipeboard.trainer.runtime.posting import (NCCL_LOOKAHEAD, TAGGED_LOOKAHEAD, Issued, issued_transfers,
                                               lookahead_for, nccl_outcome, receive_posts, run_lookahead)
from pipeboard.trainer.runtime.stage import Stage
from pipeboard.trainer.runtime.worker_process import template_rank_of
from pipeboard.trainer.schedule import registry
from pipeboard.trainer.schedule.actions import Kind, ScheduleError
from pipeboard.trainer.schedule.builder import build


def _pipelines():
    """(name, stages, microbatches, schedule) of every registered schedule that builds there and
    moves data between workers."""
    out = []
    for name in registry.names():
        for p in (2, 3, 4):
            for m in range(1, 9):
                try:
                    s = build(name, p, m)
                except ScheduleError:  # e.g. interleaving needs microbatches a multiple of stages
                    continue
                if any(a.kind is Kind.SEND_ACT for acts in s.actions for a in acts):
                    out.append((name, p, m, s))
    return out


PIPELINES = _pipelines()


def _outcome(schedule, lookahead: int) -> str:
    return nccl_outcome([issued_transfers(acts, lookahead) for acts in schedule.actions])


def test_every_registered_pipeline_schedule_is_covered():
    covered = {name for name, *_ in PIPELINES}
    pipelines = {n for n in registry.names() if not registry.get(n).data_parallel}
    assert covered == pipelines, pipelines - covered
    assert len(PIPELINES) >= 100


def test_receives_posted_ahead_deadlock_every_pipeline():
    """Today's order before the fix: 8 receives ahead of their actions, under NCCL's pairing."""
    outcomes = {(name, p, m): _outcome(s, TAGGED_LOOKAHEAD) for name, p, m, s in PIPELINES}
    assert set(outcomes.values()) == {"deadlock"}, {k: v for k, v in outcomes.items() if v != "deadlock"}


def test_each_receive_at_its_own_action_never_deadlocks():
    outcomes = {(name, p, m): _outcome(s, NCCL_LOOKAHEAD) for name, p, m, s in PIPELINES}
    assert set(outcomes.values()) == {"ok"}, {k: v for k, v in outcomes.items() if v != "ok"}


def test_nccl_runs_without_lookahead_and_tagged_transports_with_it():
    assert lookahead_for("nccl") == 0
    assert lookahead_for("gloo") == TAGGED_LOOKAHEAD > 0


def test_the_model_pairs_in_order_whatever_the_tags():
    a, b = (0, 0, 0), (0, 0, 1)
    send_then_recv = [[Issued("send", 1, a), Issued("compute"), Issued("recv", 1, b)],
                      [Issued("recv", 0, a), Issued("compute", needs=(a,)), Issued("send", 0, b)]]
    assert nccl_outcome(send_then_recv) == "ok"
    both_receive_first = [[Issued("recv", 1, b), Issued("send", 1, a)], [Issued("recv", 0, a), Issued("send", 0, b)]]
    assert nccl_outcome(both_receive_first) == "deadlock"
    out_of_order = [[Issued("send", 1, a), Issued("send", 1, b)], [Issued("recv", 0, b), Issued("recv", 0, a)]]
    assert nccl_outcome(out_of_order) == "mismatch"  # a tag-matching transport would deliver these


def test_a_send_waits_for_the_computes_issued_before_it():
    """A send's stream waits on the compute stream: a compute stuck on a receive holds back a
    send issued after it, even to another peer; without a compute between them, transfers to
    different peers run on different streams and do not wait for each other."""
    def ring(computes: bool):  # worker w receives from w-1, then sends to w+1, around three
        programs = []
        for w in range(3):
            got, sent = (0, (w - 1) % 3, 0), (0, w, 0)
            between = [Issued("compute", needs=(got,))] if computes else []
            programs.append([Issued("recv", (w - 1) % 3, got), *between, Issued("send", (w + 1) % 3, sent)])
        return programs

    assert nccl_outcome(ring(computes=True)) == "deadlock"
    assert nccl_outcome(ring(computes=False)) == "ok"


def test_receive_posts_post_each_receive_by_its_own_position():
    s = build("1f1b", 2, 4)
    for acts in s.actions:
        recvs = [i for i, a in enumerate(acts) if a.kind in (Kind.RECV_ACT, Kind.RECV_GRAD)]
        at_own = receive_posts(acts, 0)
        assert at_own == {i: [i] for i in recvs}
        ahead = receive_posts(acts, 8)
        posted_at = {j: i for i, js in ahead.items() for j in js}
        assert sorted(posted_at) == recvs and all(posted_at[j] <= j for j in recvs)
        assert any(posted_at[j] < j for j in recvs)


class _Mailbox:
    """Messages between threads matched by (source, destination, message), as gloo matches by
    tag: whatever order the two executors issue, the data arrives, so the run always ends and its
    issue order can be read and judged."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.box: dict = {}


class _Received:
    def __init__(self, mailbox: _Mailbox, key) -> None:
        self.mailbox, self.key = mailbox, key

    def wait(self) -> list[torch.Tensor]:
        deadline = time.monotonic() + 30
        with self.mailbox.cond:
            while self.key not in self.mailbox.box:
                assert self.mailbox.cond.wait(timeout=max(0.0, deadline - time.monotonic())), f"no message {self.key}"
            return self.mailbox.box.pop(self.key)


class _LoggingP2P(P2P):
    """The executor's transport with every post and send logged in issue order."""

    def __init__(self, specs, rank: int, mailbox: _Mailbox) -> None:
        super().__init__(specs, torch.device("cpu"))
        self.rank, self.mailbox, self.log = rank, mailbox, []

    def post_recv(self, boundary, mb, is_grad, peer):
        key = (int(is_grad), boundary, mb)
        self.log.append(Issued("recv", peer, key))
        return _Received(self.mailbox, (peer, self.rank, key))

    def send(self, tensors, boundary, mb, is_grad, peer):
        key = (int(is_grad), boundary, mb)
        self.log.append(Issued("send", peer, key))
        with self.mailbox.cond:
            self.mailbox.box[(self.rank, peer, key)] = [t.detach().clone() for t in tensors]
            self.mailbox.cond.notify_all()

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("name", ["1f1b", "pipedream", "zb-h1"])
@pytest.mark.parametrize("window", [NCCL_LOOKAHEAD, TAGGED_LOOKAHEAD])
def test_the_executor_issues_transfers_in_the_order_the_model_judged(name, window, one_thread):
    m, width = 4, 6
    schedule = build(name, 2, m)
    specs = [BoundarySpec((TensorSpec((2, width), torch.float32),))]
    mailbox = _Mailbox()
    rank_of = template_rank_of(schedule)
    torch.manual_seed(0)
    x, y = torch.randn(2, width), torch.randn(2, width)
    transports, errors = [], []

    def worker(rank: int) -> None:
        mod = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())
        stage = Stage(rank, mod, torch.optim.SGD(mod.parameters(), lr=0.01), is_first=rank == 0, is_last=rank == 1,
                      loss_fn=torch.nn.functional.mse_loss, stash=not registry.get(name).synchronous,
                      loss_scale=1 / m, layer_calls=True)
        p2p = _LoggingP2P(specs, rank, mailbox)
        transports.append((rank, p2p))
        ex = Executor(rank, {rank: stage}, 2, p2p, rank_of, {}, Recorder(time.perf_counter()), Heartbeat(),
                      window=window)
        try:
            ex.run(schedule.actions[rank], lambda mb: (x, y), step_of=lambda mb: 0)
        except BaseException as exc:  # reported to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    issued = {rank: p2p.log for rank, p2p in transports}
    expected = {r: [op for op in issued_transfers(schedule.actions[r], window) if op.op != "compute"] for r in (0, 1)}
    assert issued == expected
    judged = nccl_outcome([issued_transfers(schedule.actions[r], window) for r in (0, 1)])
    assert judged == ("ok" if window == NCCL_LOOKAHEAD else "deadlock")


def _shared(schedule, devices, lookahead: int) -> str:
    """The model for a run whose worker w is on GPU devices[w]: same-GPU pairs through host memory."""
    n = len(schedule.actions)
    tagged = {frozenset((a, b)) for a in range(n) for b in range(n) if a != b and devices[a] == devices[b]}
    return nccl_outcome([issued_transfers(acts, lookahead) for acts in schedule.actions], tagged)


def _pairs(schedule):
    return {(w, a.peer) for w, acts in enumerate(schedule.actions) for a in acts if a.peer is not None}


def test_every_stage_on_one_gpu_posts_ahead_and_never_deadlocks():
    """Every pair through host memory (matched by message): receives may run ahead, and the run's
    lookahead says so."""
    outcomes = {}
    for name, p, m, s in PIPELINES:
        devices = [0] * len(s.actions)
        assert run_lookahead(devices, _pairs(s)) == TAGGED_LOOKAHEAD
        outcomes[(name, p, m)] = _shared(s, devices, TAGGED_LOOKAHEAD)
    assert set(outcomes.values()) == {"ok"}, {k: v for k, v in outcomes.items() if v != "ok"}


def test_stages_sharing_two_gpus_post_at_their_actions_and_never_deadlock():
    """Some pairs over NCCL (in order), some through host memory: the run's lookahead is 0 for
    every worker, and no registered schedule deadlocks."""
    outcomes, ahead = {}, {}
    for name, p, m, s in PIPELINES:
        n = len(s.actions)
        if n < 3:
            continue
        devices = [w * 2 // n for w in range(n)]  # [0, 0, 1] or [0, 0, 1, 1]
        assert run_lookahead(devices, _pairs(s)) == NCCL_LOOKAHEAD
        outcomes[(name, p, m)] = _shared(s, devices, NCCL_LOOKAHEAD)
        ahead[(name, p, m)] = _shared(s, devices, TAGGED_LOOKAHEAD)
    assert len(outcomes) >= 50
    assert set(outcomes.values()) == {"ok"}, {k: v for k, v in outcomes.items() if v != "ok"}
    # posting ahead there deadlocks: the NCCL pairs' in-order pairing still holds
    assert "deadlock" in set(ahead.values())


def test_a_run_posts_ahead_only_without_any_nccl_pair():
    assert run_lookahead(None, {(0, 1)}) == TAGGED_LOOKAHEAD
    assert run_lookahead([0, 1], {(0, 1), (1, 0)}) == NCCL_LOOKAHEAD
    assert run_lookahead([0, 0, 1], {(0, 1), (1, 0)}) == TAGGED_LOOKAHEAD  # the pair that transfers shares GPU 0
    assert run_lookahead([0, 0, 1], {(0, 1), (1, 2)}) == NCCL_LOOKAHEAD


def test_the_model_matches_host_staged_pairs_by_message():
    a, b = (0, 0, 0), (0, 0, 1)
    out_of_order = [[Issued("send", 1, a), Issued("send", 1, b)], [Issued("recv", 0, b), Issued("recv", 0, a)]]
    assert nccl_outcome(out_of_order, {frozenset((0, 1))}) == "ok"
    both_receive_first = [[Issued("recv", 1, b), Issued("send", 1, a)], [Issued("recv", 0, a), Issued("send", 0, b)]]
    assert nccl_outcome(both_receive_first, {frozenset((0, 1))}) == "ok"
    never_sent = [[Issued("recv", 1, a)], [Issued("compute")]]
    assert nccl_outcome(never_sent, {frozenset((0, 1))}) == "deadlock"
