"""The same-host shared-memory transport: matching by header, back-pressure, dtypes, ownership of
received tensors, choice of transport, and nothing left in /dev/shm."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
import torch

from pipeboard.trainer.runtime import RunConfig, run_training, shm
from pipeboard.trainer.runtime.checkpoint import assemble_model
from pipeboard.trainer.runtime.reference import train_sync

pytestmark = pytest.mark.skipif(not shm.supported(), reason="shared memory transport needs Linux x86_64")

SHAPES = {  # boundary -> (activations, gradients): several tensors and dtypes, integers included
    0: ([((4, 3), torch.float32), ((4,), torch.int64), ((2, 2), torch.bool)], [((4, 3), torch.float32)]),
    1: ([((5,), torch.float64), ((3, 2), torch.int32)], [((5,), torch.float64)]),
}


def shapes_of(boundary: int, is_grad: bool):
    return SHAPES[boundary][int(is_grad)]


def message(boundary: int, mb: int, is_grad: bool) -> list[torch.Tensor]:
    """Distinct contents per (boundary, mb, direction), so a mix-up shows."""
    out = []
    for i, (shape, dtype) in enumerate(shapes_of(boundary, is_grad)):
        base = torch.arange(int(torch.Size(shape).numel())).reshape(shape) + 1000 * mb + 100 * boundary + 10 * i
        base = base + 7 if is_grad else base
        out.append((base % 2).to(dtype) if dtype is torch.bool else base.to(dtype))
    return out


def slot_bytes() -> int:
    return max(shm.packed_bytes(s) for pair in SHAPES.values() for s in pair)


@pytest.fixture
def pair(tmp_path):
    """A sender and a receiver on one channel in this process (the futex works between threads too)."""
    prefix = f"pipeboard-test-{os.getpid()}-{tmp_path.name}"
    made = []

    def make(slots: int):
        path = shm.channel_path(prefix, 0, 1)
        tx = shm.Channel(path, slots, slot_bytes(), True, 1, timeout_s=30)
        rx = shm.Channel(path, slots, slot_bytes(), False, 0, timeout_s=30)
        os.unlink(path)
        made.extend([tx, rx])
        return tx, rx

    yield make
    for ch in made:
        ch.close()
    shm.remove_prefix(prefix)


def test_out_of_order_receives_match_by_header_beyond_the_slot_count(pair):
    tx, rx = pair(slots=3)
    keys = [(b, mb, g) for mb in range(10) for b in (0, 1) for g in (False, True)]  # 40 messages, 3 slots

    def send_all():
        for b, mb, g in keys:
            tx.send(message(b, mb, g), b, mb, g)

    t = threading.Thread(target=send_all)
    t.start()
    for b, mb, g in reversed(keys):  # the last sent first: every other message waits in the stash
        got = rx.take(b, mb, g, shapes_of)
        want = message(b, mb, g)
        assert [x.dtype for x in got] == [x.dtype for x in want]
        for x, y in zip(got, want):
            assert torch.equal(x, y), (b, mb, g)
    t.join(30)
    assert not t.is_alive() and not rx.stash


def test_a_slow_receiver_holds_the_sender_back(pair):
    tx, rx = pair(slots=2)
    sent = []

    def send_all():
        for mb in range(6):
            tx.send(message(0, mb, False), 0, mb, False)
            sent.append(mb)

    t = threading.Thread(target=send_all)
    t.start()
    deadline = time.monotonic() + 10
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # room for a (wrong) third send to land
    assert len(sent) == 2  # both slots full, nothing taken yet: the third send waits
    assert t.is_alive()
    for mb in range(6):
        assert torch.equal(rx.take(0, mb, False, shapes_of)[0], message(0, mb, False)[0])
    t.join(30)
    assert sent == list(range(6))


def test_a_received_tensor_is_the_receivers_own(pair):
    tx, rx = pair(slots=1)
    tx.send(message(0, 0, False), 0, 0, False)
    first = rx.take(0, 0, False, shapes_of)
    tx.send(message(0, 1, False), 0, 1, False)  # reuses the only slot
    second = rx.take(0, 1, False, shapes_of)
    assert torch.equal(first[0], message(0, 0, False)[0])
    assert torch.equal(second[0], message(0, 1, False)[0])
    first[0].add_(1)  # writable, and no business of the channel's
    tx.send(message(0, 2, False), 0, 2, False)
    assert torch.equal(rx.take(0, 2, False, shapes_of)[0], message(0, 2, False)[0])


def _create_then_die(prefix: str) -> None:
    shm.Channel(shm.channel_path(prefix, 0, 1), 2, 64, True, 1, timeout_s=1)
    os.kill(os.getpid(), signal.SIGKILL)


def test_the_launchers_cleanup_removes_a_killed_creators_channel():
    prefix = f"pipeboard-test-killed-{os.getpid()}"
    p = multiprocessing.get_context("fork").Process(target=_create_then_die, args=(prefix,))
    p.start()
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    assert os.path.exists(shm.channel_path(prefix, 0, 1))  # what a worker killed during set-up leaves
    assert shm.remove_prefix(prefix) == [shm.channel_path(prefix, 0, 1)]
    assert not leftovers(prefix)


def leftovers(prefix: str = "pipeboard-") -> list[str]:
    return sorted(n for n in os.listdir(shm.SHM_DIR) if n.startswith(prefix))


class ChannelLog:
    """Records every channel a (forked) worker maps, by appending to a file."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def install(self, monkeypatch) -> None:
        original = shm.Channel.__init__
        path = self.path

        def logged(ch, file, slots, slot_bytes, create, peer, timeout_s):
            original(ch, file, slots, slot_bytes, create, peer, timeout_s)
            with open(path, "a") as f:
                f.write(f"{os.getpid()} {'create' if create else 'open'} {os.path.basename(file)}\n")

        monkeypatch.setattr(shm.Channel, "__init__", logged)

    def lines(self) -> list[str]:
        return open(self.path).read().splitlines() if os.path.exists(self.path) else []


SMALL = {"depth": 4, "width": 48, "samples": 512}


def run(tmp_path, **kw):
    cfg = RunConfig(model="mlp", model_args=SMALL, batch_size=16, microbatches=4, num_stages=2, steps=3,
                    checkpoint_dir=str(tmp_path / "ckpt"), eval_at_end=True, start_method="fork", **kw)
    summary = run_training(cfg)
    trained, _ = assemble_model(cfg, tmp_path / "ckpt")
    return cfg, summary, trained


@pytest.mark.parametrize("p2p,schedule", [("auto", "1f1b"), ("shm", "pipedream"), ("gloo", "1f1b"), (None, "1f1b")])
def test_runs_choose_their_transport_train_the_same_and_leave_no_shared_memory(tmp_path, monkeypatch, p2p,
                                                                                schedule):
    log = ChannelLog(tmp_path / "channels.log")
    log.install(monkeypatch)
    monkeypatch.delenv("PIPEBOARD_P2P", raising=False)
    cfg, summary, trained = run(tmp_path, p2p=p2p, schedule=schedule)
    assert summary["steps"] == 3
    created = sorted(line.split()[2] for line in log.lines() if " create " in line)
    if p2p == "gloo":
        assert created == []
    else:  # auto is the default: one channel each way between the two stages' workers
        assert [c.rsplit("-", 2)[1:] for c in created] == [["0", "1"], ["1", "0"]]
    if schedule == "1f1b":
        ref = train_sync(cfg, 3)
        diff = max(float((a - b).detach().abs().max()) for a, b in zip(trained.parameters(), ref.parameters()))
        assert diff < 1e-5
    assert leftovers(f"pipeboard-{os.getpid()}-") == []  # the launcher's prefix: this process's pid


@pytest.mark.parametrize("schedule,stages", [("gpipe", 3), ("zb-h1", 2), ("interleaved-1f1b", 2)])
def test_an_environment_variable_chooses_shared_memory(tmp_path, monkeypatch, schedule, stages):
    log = ChannelLog(tmp_path / "channels.log")
    log.install(monkeypatch)
    monkeypatch.setenv("PIPEBOARD_P2P", "auto")
    cfg = RunConfig(model="mlp", model_args=SMALL, batch_size=16, microbatches=4, num_stages=stages, steps=3,
                    checkpoint_dir=str(tmp_path / "ckpt"), eval_at_end=True, start_method="fork", schedule=schedule)
    run_training(cfg)
    trained, _ = assemble_model(cfg, tmp_path / "ckpt")
    assert [line for line in log.lines() if " create " in line]
    ref = train_sync(cfg, 3)
    assert max(float((a - b).detach().abs().max()) for a, b in zip(trained.parameters(), ref.parameters())) < 1e-5


def test_an_environment_variable_keeps_gloo(tmp_path, monkeypatch):
    log = ChannelLog(tmp_path / "channels.log")
    log.install(monkeypatch)
    monkeypatch.setenv("PIPEBOARD_P2P", "gloo")
    _, summary, _ = run(tmp_path, schedule="1f1b")
    assert summary["steps"] == 3
    assert [line for line in log.lines() if " create " in line] == []


def test_too_little_free_shared_memory_keeps_auto_on_gloo_and_fails_shm_clearly(tmp_path, monkeypatch):
    log = ChannelLog(tmp_path / "channels.log")
    log.install(monkeypatch)
    monkeypatch.setattr(shm, "free_bytes", lambda: 4096)  # the workers are forked: they see it too
    _, summary, _ = run(tmp_path, p2p="auto", schedule="1f1b")
    assert summary["steps"] == 3
    assert [line for line in log.lines() if " create " in line] == []
    with pytest.raises(Exception, match="shm_size"):
        run(tmp_path / "shm", p2p="shm", schedule="1f1b")


def test_an_unknown_transport_is_a_config_error():
    from pipeboard.trainer.runtime.run_config import ConfigError

    with pytest.raises(ConfigError, match="p2p"):
        RunConfig(model="mlp", schedule="1f1b", batch_size=16, microbatches=4, p2p="tcp").validate()
