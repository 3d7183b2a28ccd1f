"""The runtime under torchrun's environment (what a job on several hosts runs): every rank's
reports reach rank 0 through the store on MASTER_PORT, whether torchrun's agent hosts that store
or rank 0 does, and no second port is taken (one that something else on the host holds)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import free_port

RUN = {"model": "mlp", "model_args": {"depth": 2, "width": 8, "samples": 64}, "schedule": "1f1b", "batch_size": 8,
       "microbatches": 2, "num_stages": 2, "steps": 4, "eval_at_end": False}
ENTRY = "pipeboard.trainer.runtime.torchrun_entry"


def write_run(tmp_path: Path) -> Path:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(RUN))
    return path


def check_summary(stdout: str, events: Path) -> None:
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["steps"] == RUN["steps"] and summary["workers"] == 2, summary
    # the loss is the last stage's (rank 1's) report: it came through the mailbox
    records = [r for line in events.read_text().splitlines() if (call := json.loads(line))["call"] == "on_metrics"
               for r in call["records"]]
    assert sorted(r["step"] for r in records if "loss" in r["values"]) == list(range(1, RUN["steps"] + 1)), records


def test_rank_0_hosts_the_store_on_master_port_and_the_next_port_may_be_taken(tmp_path: Path) -> None:
    held = socket.socket()
    while True:  # a free port whose next one this test can hold
        port = free_port()
        try:
            held.bind(("127.0.0.1", port + 1))
            break
        except OSError:
            continue
    held.listen(1)
    run, events = write_run(tmp_path), tmp_path / "events.jsonl"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    ranks = [subprocess.Popen([sys.executable, "-m", ENTRY, str(run), "--events-jsonl", str(events)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        outputs = [p.communicate(timeout=180) for p in ranks]
    finally:
        for p in ranks:
            p.kill()
        held.close()
    for p, (_, err) in zip(ranks, outputs):
        assert p.returncode == 0, err[-3000:]
    check_summary(outputs[0][0], events)


def test_under_torchrun_every_rank_reports_through_the_agents_store(tmp_path: Path) -> None:
    run, events = write_run(tmp_path), tmp_path / "events.jsonl"
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             "--max-restarts=0", "-m", ENTRY, str(run), "--events-jsonl", str(events)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    check_summary(result.stdout, events)
