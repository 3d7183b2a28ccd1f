"""Where a worker runs and what it keeps where: devices from LOCAL_RANK, checkpoints that load
anywhere, validation data streamed, losses read once per step. No GPU here: torch reports zero,
and the CUDA paths are checked for what they do with that."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from pipeboard.trainer.runtime import checkpoint
from pipeboard.trainer.runtime.run_config import ConfigError
from pipeboard.trainer.runtime.data import ValStream
from pipeboard.trainer.runtime.instrument import Recorder, StepReports
from pipeboard.trainer.runtime.stage import Stage
from pipeboard.trainer.runtime.torchrun_entry import check_local_gpus
from pipeboard.trainer.runtime.worker_process import run_device
from pipeboard.trainer.zoo import get as zoo_get


def test_a_cpu_run_is_on_the_cpu_whatever_local_rank_says(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert run_device("cpu", 5) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer where torch sees no GPU")
def test_a_cuda_run_where_torch_sees_no_gpu_fails_in_one_line(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(RuntimeError) as err:
        run_device("cuda", 0)
    assert "\n" not in str(err.value)
    assert "device cuda: torch sees no GPU" in str(err.value) and "CUDA_VISIBLE_DEVICES=" in str(err.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_cuda_run_takes_the_gpu_of_its_local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert run_device("cuda", 7) == torch.device("cuda:0")


def test_torchrun_refuses_more_workers_on_a_host_than_it_has_gpus():
    check_local_gpus("cuda", 2, 2)
    check_local_gpus("cpu", 4, 0)
    with pytest.raises(ConfigError, match=r"^device: cuda needs one GPU per worker on a host; torchrun started 4 "
                                          r"worker\(s\) here and torch sees 1 GPU\(s\)"):
        check_local_gpus("cuda", 4, 1)


def test_a_checkpoint_loads_onto_the_cpu_and_restores_the_random_state(tmp_path):
    torch.manual_seed(11)
    state = {"step": 3, **checkpoint.rng_state(torch.device("cpu")), "stages": {0: {"w": torch.ones(2)}}}
    assert "cuda_rng" not in state  # a CPU run has no GPU generator to save
    checkpoint.save_rank(tmp_path, 3, 0, state)
    expected = torch.rand(4)
    torch.manual_seed(99)
    loaded = checkpoint.load_rank(tmp_path, 3, 0)
    assert loaded["stages"][0]["w"].device.type == "cpu"
    checkpoint.restore_rng(loaded, torch.device("cpu"))
    assert torch.equal(torch.rand(4), expected)


def test_validation_data_stays_on_the_host_until_a_microbatch_is_asked_for():
    task = zoo_get("mlp")
    val = ValStream(task, 8, torch.device("cpu"))
    assert len(val) == -(-task.val_size // 8) and val.parts
    x, y = val.microbatch(0)
    assert x.shape[0] == y.shape[0] == 8
    # each part is the host copy; the device copy is made per request (on a CPU run, the same tensor)
    assert all(p[0].device.type == "cpu" and not p[0].is_pinned() for p in val.parts)


def test_the_last_stage_keeps_losses_as_tensors_and_the_step_report_reads_them_once():
    mod = torch.nn.Linear(3, 1)
    stage = Stage(0, mod, torch.optim.SGD(mod.parameters(), lr=0.1), is_first=True, is_last=True,
                  loss_fn=torch.nn.functional.mse_loss, stash=False, loss_scale=0.5)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    for mb in range(2):
        stage.forward(mb, 0, [x], y)
    assert len(stage.losses) == 2 and all(isinstance(v, torch.Tensor) for v in stage.losses)
    expected = float(torch.nn.functional.mse_loss(mod(x), y).detach())
    queue = multiprocessing.get_context("fork").Queue()
    try:
        StepReports(queue, 0).step_done(0, Recorder(0.0), stage, now=True)
        batch = queue.get(timeout=10)
    finally:
        queue.cancel_join_thread()
        queue.close()
    kind, rank, reports = batch
    assert (kind, rank, len(reports)) == ("steps", 0, 1) and stage.losses == []
    losses = reports[0][3]  # (step, time, busy, losses, memory, events)
    assert losses == pytest.approx([expected, expected]) and all(type(v) is float for v in losses)
