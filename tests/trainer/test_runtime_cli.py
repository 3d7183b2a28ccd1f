"""`pipeboard train` end to end: JSON summary, JSON-lines reports, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

PIPEBOARD = [sys.executable, "-c", "from pipeboard.app.cli import main; main()"]
BASE = ["train", "--model", "mlp", "--model-arg", "depth=2", "--model-arg", "width=32", "--model-arg", "samples=512",
        "--batch-size", "16", "--microbatches", "4"]


def pipeboard(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*PIPEBOARD, *args], capture_output=True, text=True, timeout=timeout)


def test_train_json_summary_and_events_jsonl(tmp_path: Path):
    log = tmp_path / "events.jsonl"
    r = pipeboard(*BASE, "--stages", "2", "--schedule", "1f1b", "--steps", "6", "--json", "--events-jsonl", str(log))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 6 and summary["wall_s"] > 0 and summary["samples_per_s"] > 0
    assert summary["final_metric"] is not None and summary["metric_name"] == "mse"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [c["call"] for c in calls]
    assert kinds[0] == "on_status" and kinds[-1] == "on_status" and "on_summary" in kinds
    events = [e for c in calls if c["call"] == "on_events" for e in c["events"]]
    # every microbatch's forward and backward on both stages, on one clock
    for stage in (0, 1):
        for kinds in (("F",), ("B", "BI")):  # BI: batched weight gradients, the default
            assert len([e for e in events if e["stage"] == stage and e["kind"] in kinds]) == 6 * 4
    fwd0 = {(e["step"], e["microbatch"]): e for e in events if e["stage"] == 0 and e["kind"] == "F"}
    fwd1 = {(e["step"], e["microbatch"]): e for e in events if e["stage"] == 1 and e["kind"] == "F"}
    assert all(fwd1[k]["start"] >= fwd0[k]["end"] - 1e-3 for k in fwd0)  # stage 1 runs after stage 0
    records = [r for c in calls if c["call"] == "on_metrics" for r in c["records"]]
    assert [r["step"] for r in records if "loss" in r["values"]] == list(range(1, 7))
    assert any("utilization.1" in r["values"] and "memory_bytes.0" in r["values"] for r in records)


@pytest.mark.parametrize("m", [4, 1])
def test_pipedream_events_and_metrics_count_batches(tmp_path: Path, m: int):
    """A pipedream step is one batch and one weight update: events carry the batch as their step,
    and every step is reported (with M=1 a step's last action is followed by the next one's
    early-posted receive)."""
    log = tmp_path / "events.jsonl"
    args = [a if a != "4" else str(m) for a in BASE]
    r = pipeboard(*args, "--stages", "2", "--schedule", "pipedream", "--steps", "5", "--json", "--events-jsonl", str(log))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["steps"] == 5
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    events = [e for c in calls if c["call"] == "on_events" for e in c["events"]]
    for stage in (0, 1):
        fwd = [e for e in events if e["stage"] == stage and e["kind"] == "F"]
        assert sorted(e["microbatch"] for e in fwd) == list(range(5 * m))
        assert all(e["step"] == e["microbatch"] // m for e in fwd)
        steps = [e for e in events if e["stage"] == stage and e["kind"] == "step"]
        assert sorted(e["step"] for e in steps) == list(range(5))  # one update per batch
        kinds = [e["kind"] for e in events if e["stage"] == stage]
        assert "B" not in kinds and kinds.count("BI") == 5 * m  # batched weight gradients (the default):
        assert sorted(e["step"] for e in events if e["stage"] == stage and e["kind"] == "W") == list(range(5))
    records = [r for c in calls if c["call"] == "on_metrics" for r in c["records"]]
    assert [r["step"] for r in records if "loss" in r["values"]] == list(range(1, 6))


def in_process(*args: str):
    """The same command through typer's runner, in this process (no interpreter start-up)."""
    from typer.testing import CliRunner

    from pipeboard.app.cli import cli

    return CliRunner().invoke(cli, list(args))


def test_train_summary_line_with_target():
    r = in_process(*BASE, "--stages", "2", "--schedule", "pipedream", "--target", "5.0", "--eval-every", "2")
    assert r.exit_code == 0, r.output
    assert "target reached" in r.stdout and "samples/s" in r.stdout


def test_bad_input_is_one_line_and_exit_code_2():
    for args, field in [
        (["--stages", "2", "--schedule", "nope", "--steps", "1"], "schedule"),
        (["--stages", "2", "--schedule", "1f1b", "--steps", "1", "--epochs", "2"], "epochs"),
        (["--stages", "2", "--schedule", "1f1b", "--steps", "1", "--resume"], "resume"),
        (["--stages", "2", "--schedule", "1f1b", "--steps", "1", "--plan", "/nonexistent.json"], "--plan"),
        (["--stages", "2", "--schedule", "1f1b", "--steps", "1", "--device", "tpu"], "device"),
        (["--stages", "2", "--schedule", "1f1b", "--steps", "1", "--cpu-matmul", "mkl"], "cpu_matmul"),
    ]:
        r = in_process(*BASE, *args)
        assert r.exit_code == 2, (args, r.output)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and field in lines[0], r.stderr
        assert r.exception is None or isinstance(r.exception, SystemExit)  # no traceback
    r = in_process(*BASE, "--stages", "2", "--schedule", "1f1b", "--steps", "1", "--cpu-matmul", "mkl")
    assert r.stderr.strip() == "error: cpu_matmul: must be one of default, onednn, got 'mkl'"  # quotes intact


@pytest.mark.parametrize("higher_is_better, best", [(True, 0.9), (False, 0.2)])
def test_summary_reports_the_best_metric_in_the_metric_s_own_direction(higher_is_better: bool, best: float):
    from pipeboard.trainer.runtime.report import Reporter
    from pipeboard.trainer.sink import NullSink

    reporter = Reporter(NullSink(), world=1, batch_size=4, metric_name="m")
    reporter.evals += [(1, 0.1, 0.5), (2, 0.2, 0.9), (3, 0.3, 0.2)]
    summary = reporter.summary(None, higher_is_better, 1.0)
    assert summary["best_metric"] == best and summary["higher_is_better"] is higher_is_better


def test_cuda_training_checks_the_machine_s_gpus_before_starting(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = in_process(*BASE, "--stages", "2", "--schedule", "1f1b", "--steps", "1", "--device", "cuda")
    assert r.exit_code == 2 and r.stderr.strip() == "error: device cuda: CUDA is not available on this machine", r.output
    # two stage processes share the one GPU where their predicted memory fits (each with its CUDA
    # context's 512 MiB): a 700 MiB GPU holds one, and the run is refused naming the other
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=700 * 2**20))
    r = in_process(*BASE, "--stages", "2", "--schedule", "1f1b", "--steps", "1", "--device", "cuda")
    assert r.exit_code == 2 and "device cuda: 2 stage processes on 1 GPU(s): stage process " in r.stderr, r.output
    assert "the most any GPU has left is" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output


def test_train_asks_for_huge_pages_before_torch_allocates(monkeypatch):
    """`pipeboard train` sets THP_MEM_ALLOC_ENABLE (unless given) as its first act, and the pinned
    torch honours it: the memory of a 4 MiB tensor is marked for huge pages (``hg`` in its
    mapping's VmFlags: madvise(MADV_HUGEPAGE)); without the variable it is not."""
    from typer.testing import CliRunner

    from pipeboard.app.cli import cli
    from pipeboard.trainer.allocator import VARIABLE

    monkeypatch.delenv(VARIABLE, raising=False)
    r = CliRunner().invoke(cli, [*BASE, "--plan", "p.json", "--stages", "2", "--schedule", "1f1b"])
    assert r.exit_code == 2 and os.environ.get(VARIABLE) == "1"
    monkeypatch.setenv(VARIABLE, "0")
    CliRunner().invoke(cli, [*BASE, "--plan", "p.json", "--stages", "2", "--schedule", "1f1b"])
    assert os.environ[VARIABLE] == "0"  # an explicit choice stays
    probe = """
import sys
if sys.argv[1] == "ask":
    from pipeboard.trainer.allocator import prefer_huge_pages
    prefer_huge_pages()
import torch
t = torch.empty(1 << 20)
p, inside = t.data_ptr(), False
for line in open("/proc/self/smaps"):
    head = line.split()[0]
    if "-" in head and not head.endswith(":"):
        lo, hi = (int(x, 16) for x in head.split("-"))
        inside = lo <= p < hi
    elif inside and head == "VmFlags:":
        print("hg" in line.split())
"""
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    for mode, want in (("ask", "True"), ("plain", "False")):
        out = subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == want, mode
