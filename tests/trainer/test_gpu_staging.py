"""Several stages on one GPU, what a machine without one can check: the rank -> GPU mapping the
launcher hands its workers, and the staging path (peers on the same GPU go through host memory
over the real CPU transport, never the NCCL group) sending and receiving the right tensors."""

from __future__ import annotations

import multiprocessing
import os
import traceback
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from pipeboard.trainer.runtime import shm
from pipeboard.trainer.runtime.comm import P2P, BoundarySpec, TensorSpec, open_channels
from pipeboard.trainer.runtime.run_config import ConfigError
from pipeboard.trainer.runtime.launch import free_port, gpu_devices

GIB = 2**30
SPECS = [BoundarySpec((TensorSpec((4, 6), torch.float32, dynamic=(1,)), TensorSpec((4,), torch.int64)))]


def _payload(mb: int, is_grad: bool) -> list[torch.Tensor]:
    width = 3 + mb % 4  # a dynamic size, different per microbatch
    x = torch.arange(4 * width, dtype=torch.float32).reshape(4, width) + 100 * mb + (0.5 if is_grad else 0)
    return [x] if is_grad else [x, torch.arange(4) + mb]


class _Counting:
    """Stands for the NCCL group: counts what goes through it (over the real world group)."""

    def __init__(self, pg):
        self.pg, self.calls = pg, 0

    def send(self, *a):
        self.calls += 1
        return self.pg.send(*a)

    def recv(self, *a):
        self.calls += 1
        return self.pg.recv(*a)


def _rank(rank: int, port: int, mode: str, staged: bool, out) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        peer = 1 - rank
        chans = open_channels(mode, rank, 2, {(0, 1), (1, 0)}, SPECS, 8, f"pipeboard-t{port}", 30) \
            if staged else ({}, {})
        nccl = _Counting(dist.group.WORLD)
        p2p = P2P(SPECS, torch.device("cpu"), *chans, staged=frozenset({peer}) if staged else frozenset(), nccl_group=nccl)
        got = []
        if rank == 0:
            for mb in range(4):
                p2p.send(_payload(mb, False), 0, mb, False, peer)
            posted = {mb: p2p.post_recv(0, mb, True, peer) for mb in (3, 1, 0, 2)}  # out of order
            got = [[t.tolist() for t in posted[mb].wait()] for mb in range(4)]
            try:
                p2p.send([torch.zeros(4, 6, dtype=torch.float64), torch.arange(4)], 0, 9, False, peer)
                got.append("no error")
            except ValueError as exc:
                got.append(str(exc))
        else:
            posted = {mb: p2p.post_recv(0, mb, False, peer) for mb in (2, 0, 3, 1)}
            for mb in range(4):
                got.append([t.tolist() for t in posted[mb].wait()])
                p2p.send(_payload(mb, True), 0, mb, True, peer)
        p2p.flush()
        dist.barrier()
        p2p.close()
        out.put((rank, got, nccl.calls, sorted(chans[0]), sorted(chans[1])))
    except BaseException:
        out.put((rank, traceback.format_exc(), -1, [], []))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(mode: str, staged: bool):
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, mode, staged, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        res = {r: (got, calls, o, i) for r, got, calls, o, i in (out.get(timeout=120) for _ in procs)}
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    for r in (0, 1):
        assert not isinstance(res[r][0], str), res[r][0]
    return res


@pytest.mark.parametrize("mode", ["gloo", pytest.param("shm", marks=pytest.mark.skipif(
    not shm.supported(), reason="shared memory transport needs Linux x86_64"))])
def test_same_gpu_peers_exchange_through_host_memory_over_the_cpu_transport(mode):
    res = _run(mode, staged=True)
    assert res[1][0] == [[t.tolist() for t in _payload(mb, False)] for mb in range(4)]
    assert res[0][0][:4] == [[t.tolist() for t in _payload(mb, True)] for mb in range(4)]
    assert res[0][1] == 0 and res[1][1] == 0  # nothing went through the NCCL group
    assert (res[0][2], res[0][3]) == (([1], [1]) if mode == "shm" else ([], []))  # shm: a channel each way


def test_peers_on_other_gpus_go_through_the_nccl_group():
    res = _run("gloo", staged=False)
    assert res[1][0] == [[t.tolist() for t in _payload(mb, False)] for mb in range(4)]
    assert res[0][1] > 0 and res[1][1] > 0


def test_a_send_that_differs_from_its_spec_is_refused_in_one_line():
    res = _run("gloo", staged=True)
    assert res[0][0][4] == ("boundary 0 tensor 0: sent (4, 6) torch.float64, its spec is (4, 6) torch.float32")


def _layout(world: int, stages_of):
    return SimpleNamespace(world=world, stages_of=lambda r: stages_of[r])


def _gpus(monkeypatch, count: int, total: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=total))


def test_the_launcher_gives_each_rank_a_gpu_or_packs_them_onto_fewer(monkeypatch):
    assert gpu_devices("cpu", _layout(2, [(0,), (1,)]), None) is None
    _gpus(monkeypatch, 4, 80 * GIB)
    assert gpu_devices("cuda", _layout(2, [(0,), (1,)]), {0: GIB, 1: GIB}) == (0, 1)
    _gpus(monkeypatch, 1, 80 * GIB)
    assert gpu_devices("cuda", _layout(4, [(0,), (1,), (2,), (3,)]), {s: GIB for s in range(4)}) == (0, 0, 0, 0)
    _gpus(monkeypatch, 2, 80 * GIB)
    # interleaved: a worker holds two virtual stages, whose figure is its worker's (counted once)
    assert gpu_devices("cuda", _layout(4, [(0, 4), (1, 5), (2, 6), (3, 7)]),
                       {0: 40 * GIB, 4: 40 * GIB, 1: 10 * GIB, 5: 10 * GIB, 2: 20 * GIB, 6: 20 * GIB,
                        3: 30 * GIB, 7: 30 * GIB}) == (0, 0, 1, 1)


def test_stages_whose_memory_cannot_fit_the_gpus_are_refused_before_anything_starts(monkeypatch):
    _gpus(monkeypatch, 1, 16 * GIB)
    with pytest.raises(ConfigError) as err:
        gpu_devices("cuda", _layout(3, [(0,), (1,), (2,)]), {0: 6 * GIB, 1: 6 * GIB, 2: 6 * GIB})
    assert str(err.value).startswith("device cuda: 3 stage processes on 1 GPU(s): stage process ")
    assert "\n" not in str(err.value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="CUDA is not available"):
        gpu_devices("cuda", _layout(1, [(0,)]), None)


def test_a_worker_takes_the_gpu_the_launcher_assigned_else_its_local_rank(monkeypatch):
    from pipeboard.trainer.runtime.worker_process import run_device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert run_device("cuda", 3, (0, 0, 1, 1)) == torch.device("cuda:1")
    assert run_device("cuda", 1, (0, 0, 1, 1)) == torch.device("cuda:0")
    assert run_device("cuda", 1, None) == torch.device("cuda:1")  # torchrun: LOCAL_RANK 3 of 2 GPUs
    assert run_device("cpu", 1, (0, 0, 1, 1)) == torch.device("cpu")
