"""Memory per stage: measured every step beside memory_model's prediction; an out-of-memory stage
fails the run in one line naming the stage, the device, the allocation and the figures; action
times from CUDA events on a GPU, the host clock on CPU."""

from __future__ import annotations

import mmap
import time

import pytest
import torch

from pipeboard.trainer.runtime import RunConfig, RunFailed, run_training
from pipeboard.trainer.runtime.instrument import MEMORY_SOURCES, MemoryMeter, Recorder
from pipeboard.trainer.runtime.report import Reporter
from pipeboard.trainer.runtime.stage_memory import error_message, fmt_bytes, out_of_memory_line
from pipeboard.trainer.schedule.actions import Kind
from pipeboard.trainer.sink import ListSink

SMALL = {"depth": 4, "width": 48, "samples": 2048}


def cfg(**kw) -> RunConfig:
    base = dict(model="mlp", model_args=SMALL, schedule="1f1b", batch_size=16, microbatches=4, num_stages=2,
                eval_at_end=False, steps=6)
    return RunConfig(**{**base, **kw})


def test_a_run_reports_each_stages_memory_predicted_beside_measured_and_every_step_summary_has_it():
    sink = ListSink()
    summary = run_training(cfg(), sink)
    assert summary["memory_source"] in MEMORY_SOURCES
    assert [m["stage"] for m in summary["memory"]] == [0, 1]
    for m in summary["memory"]:
        assert m["predicted_bytes"] > 0 and m["measured_bytes"] > 0
    # the prediction is the run's own: stage 0 holds the 4-layer MLP's first half, its parameters at least
    assert summary["memory"][0]["predicted_bytes"] >= 2 * 48 * 48 * 4
    steps = [r for r in sink.metrics if "stages" in r.values]
    assert steps and all(row[4] > 0 for r in steps for row in r.values["stages"])  # memory_bytes column


def test_an_out_of_memory_stage_fails_the_run_in_one_line_with_its_figures():
    with pytest.raises(RunFailed) as err:
        run_training(cfg(steps=50, fail_at={"rank": 1, "step": 2, "mode": "oom"}), ListSink())
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    assert text.startswith("stage 1 (rank 1")
    assert "out of memory on cpu: tried to allocate 1.00 PiB" in text
    assert "predicted peak " in text and "unknown" not in text and "measured peak " in text


def test_a_cuda_out_of_memory_error_becomes_its_line():
    exc = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                 "79.10 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process "
                                 "has 77.80 GiB memory in use.\nOf the allocated memory ...")
    assert out_of_memory_line(exc, "cuda:0") == "out of memory on cuda:0: tried to allocate 2.00 GiB with 1.23 GiB free"
    assert error_message(ValueError("bad\nthing"), "cpu").startswith("ValueError: bad")


def test_the_reporter_adds_the_stages_figures_to_an_out_of_memory_error_and_not_to_others():
    rep = Reporter(ListSink(), 2, 16, "accuracy")
    rep.expect_memory({0: 3 * 2**20, 1: 5 * 2**20}, None, "rss_peak")
    rep.handle(("ready", 1, [1], 0, 123, 0, 10, 10, None, "host"))
    rep.handle(("steps", 1, [(0, 0.1, 0.05, [], 7 * 2**20, [])]))
    rep.handle(("error", 1, [1], "out of memory on cpu: tried to allocate 1.00 GiB", "tb"))
    rep.handle(("error", 0, [0], "ValueError: x", "tb"))
    assert rep.errors[0][2] == ("out of memory on cpu: tried to allocate 1.00 GiB "
                                "(predicted peak 5.00 MiB, measured peak 7.00 MiB before it)")
    assert rep.errors[1][2] == "ValueError: x"
    assert rep.summary(None, True, 1.0)["memory"] == [{"stage": 1, "predicted_bytes": 5 * 2**20,
                                                      "measured_bytes": 7 * 2**20}]
    assert fmt_bytes(None) == "unknown" and fmt_bytes(512) == "512 B"


def test_the_cpu_meter_sees_a_peak_inside_the_step_that_is_gone_at_its_end():
    meter = MemoryMeter(torch.device("cpu"), source="rss_peak")
    if meter.source != "rss_peak":
        pytest.fail(f"this kernel refused to reset the peak ({meter.source}); the test needs Linux 4.0+")
    meter.take()
    before = meter.take()
    # 64 MiB of fresh pages, touched, then unmapped. Not a tensor: in a process whose heap keeps freed memory
    # (trainer/allocator.py, set by any profile run before in this process) a tensor may reuse resident pages.
    block = mmap.mmap(-1, 64 * 2**20)
    block.write(b"\x01" * len(block))
    block.close()
    peak = meter.take()
    assert peak >= before + 60 * 2**20
    assert meter.take() < peak - 60 * 2**20  # the next step's peak no longer has it


def test_cpu_actions_keep_host_clock_times():
    rec = Recorder(10.0)
    t0 = rec.mark()
    t1 = rec.mark()
    assert isinstance(t0, float)
    rec.record(Kind.FORWARD, 0, 0, 11.0, 11.5, 0)
    rec.record(Kind.SEND_ACT, 0, 0, t0, t1, 0)
    events, busy = rec.take()
    assert events[0] == ("F", 0, 0, 1.0, 1.5, 0) and busy == pytest.approx(0.5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_actions_are_timed_by_events_on_the_hosts_clock():
    dev = torch.device("cuda:0")
    rec = Recorder(time.perf_counter(), device=dev)
    a = torch.randn(4096, 4096, device=dev)
    host0 = time.perf_counter()
    t0 = rec.mark()
    for _ in range(20):
        a = a @ a / 4096
    t1 = rec.mark()
    rec.record(Kind.FORWARD, 0, 0, t0, t1, 0)
    events, busy = rec.take()  # waits for the work: the event pair measured the kernels, not the launches
    torch.cuda.synchronize()
    host_done = time.perf_counter() - host0
    (_, _, _, start, end, _), = events
    # on the host's clock (origin subtracted), inside the window the host saw the work in
    assert host0 - rec.origin - 1e-3 <= start <= end <= host0 - rec.origin + host_done + 1e-3
    assert busy == pytest.approx(end - start)
    assert MemoryMeter(dev).source == "cuda_max_allocated"


@pytest.mark.parametrize("schedule,recompute", [("1f1b", None), ("zb-h1", [0, 1]), ("pipedream", None)])
def test_a_cpu_run_counts_its_tensors_and_the_prediction_comes_near(schedule, recompute):
    # counted bytes: the weights at least, and far below the process's resident memory (hundreds of MiB)
    summary = run_training(cfg(schedule=schedule, recompute=recompute, model_args={**SMALL, "width": 256}, steps=2))
    assert summary["memory_source"] == "counted"
    for m in summary["memory"]:
        assert 2 * 256 * 256 * 4 <= m["measured_bytes"] < 16 * 2**20
        assert abs(m["predicted_bytes"] - m["measured_bytes"]) / m["measured_bytes"] < 0.25
