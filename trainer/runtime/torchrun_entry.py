"""The runtime under torchrun (several nodes): the same worker code, rendezvous from the environment.

    torchrun --nnodes N --nproc-per-node K ... -m pipeboard.trainer.runtime.torchrun_entry run.json [--events-jsonl PATH]

``run.json`` holds ``RunConfig`` fields (``pipeboard train --torchrun`` builds the same from its
options and calls ``run`` with its sinks: that is how the service runs a job on several hosts). torchrun supplies RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT; the world size must equal the layout's worker count. Workers' reports reach rank 0
through a mailbox under a key prefix of the store on MASTER_PORT (a connection of its own, apart
from the training process group's, so reporting never waits on a pipeline transfer; no second
port, which something else on the host could hold); rank 0 feeds them to a Reporter and prints the
summary as one JSON line. Failure handling across nodes is torchrun's (it tears the job down when
a worker exits non-zero); a hung peer surfaces as the process group's timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from pipeboard.trainer.runtime import stage_modules
from pipeboard.trainer.runtime.run_config import ConfigError, RunConfig
from pipeboard.trainer.runtime.instrument import memory_source
from pipeboard.trainer.runtime.layout import resolve
from pipeboard.trainer.runtime.report import LAST_MESSAGE_GRACE_S, Reporter
from pipeboard.trainer.runtime.sinks import JsonlSink
from pipeboard.trainer.runtime.worker_process import WorkerEnv, worker_main
from pipeboard.trainer.sink import NullSink, Sink


class StoreChannel:
    """Messages of rank ``rank`` under keys ``msg/<rank>/<seq>``; rank 0 drains them in order."""

    def __init__(self, store, rank: int) -> None:
        self.store, self.rank, self.seq = store, rank, 0

    def put(self, message) -> None:
        self.store.set(f"msg/{self.rank}/{self.seq}", pickle.dumps(message))
        self.seq += 1


def drain(store, world: int, reporter: Reporter, stop: threading.Event) -> None:
    """Feed every rank's messages to ``reporter`` in order until ``stop`` is set and then every
    rank has sent its last, or LAST_MESSAGE_GRACE_S after ``stop``: the others may finish after
    rank 0, and their last step reports come just before their ends."""
    next_seq = [0] * world
    stopped_at: float | None = None
    while True:
        got = False
        for r in range(world):
            key = f"msg/{r}/{next_seq[r]}"
            if store.check([key]):
                reporter.handle(pickle.loads(store.get(key)))
                store.delete_key(key)
                next_seq[r] += 1
                got = True
        if not got:
            if stop.is_set():
                stopped_at = stopped_at or time.monotonic()
                if len(reporter.ended()) >= world or time.monotonic() - stopped_at > LAST_MESSAGE_GRACE_S:
                    return
            time.sleep(0.05)


def mailbox_store(rank: int, world: int, timeout: timedelta) -> dist.Store:
    """The reports' mailbox: the store on MASTER_ADDR:MASTER_PORT under a prefix of its own. Under
    torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE) the agent hosts it and every rank is a
    client, as torch's own env:// rendezvous is; otherwise rank 0 hosts it, multi-tenant, so the
    process group's rendezvous on rank 0 shares its server rather than bind the port again."""
    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent_hosts_it, timeout=timeout, multi_tenant=True)
    return dist.PrefixStore("pipeboard/reports/", store)


def check_local_gpus(device: str, local_workers: int, gpus: int) -> None:
    """Before any rendezvous: on ``cuda`` each of this host's workers needs a GPU of its own
    (``cuda:LOCAL_RANK``; NCCL refuses two ranks of one group on one device). ConfigError names
    ``device`` with what torchrun started and what torch sees."""
    if device == "cuda" and gpus < local_workers:
        raise ConfigError(f"device: cuda needs one GPU per worker on a host; torchrun started {local_workers} "
                          f"worker(s) here and torch sees {gpus} GPU(s) (CUDA_VISIBLE_DEVICES="
                          f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')})")


def run(cfg: RunConfig, sink: Sink | None = None) -> dict | None:
    """This process's rank of a torchrun launch of ``cfg``; rank 0 reports to ``sink`` (the
    others' reports reach it through the store) and returns the summary, the others None."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cfg.validate()
    task = stage_modules.load_task(cfg)
    layout = resolve(cfg)
    cfg = cfg.with_(stages=stage_modules.stage_layers(cfg, task, layout.virtual_stages), num_stages=None)
    layout = resolve(cfg)
    if layout.world != world:
        raise ConfigError(f"workers: the layout needs {layout.world} workers, torchrun started {world}")
    check_local_gpus(cfg.device, int(os.environ.get("LOCAL_WORLD_SIZE", world)), torch.cuda.device_count())
    store = mailbox_store(rank, world, timedelta(seconds=cfg.hang_timeout_s + 60))
    channel = StoreChannel(store, rank)
    reporter = thread = None
    stop = threading.Event()
    if rank == 0:
        sink = sink or NullSink()
        sink.on_status("starting", f"{world} workers over torchrun, schedule {cfg.schedule}", workers=world, **layout.describe())
        reporter = Reporter(sink, world, cfg.batch_size, task.metric_name)
        # measured per stage as under the local launcher; this entry builds no stages to predict from
        reporter.expect_memory(None, "not predicted under torchrun (rank 0 builds no stages to count)",
                               memory_source(cfg.device))
        thread = threading.Thread(target=drain, args=(store, world, reporter, stop), daemon=True)
        thread.start()
    wall0 = time.monotonic()
    try:
        worker_main(cfg, WorkerEnv(rank, world, "env://", None, channel, None))
    finally:
        if rank == 0:
            stop.set()
            thread.join(10)
            reporter.maybe_flush(force=True)
    if rank != 0:
        return None
    summary = reporter.summary(cfg.target, task.metric_higher_is_better, time.monotonic() - wall0)
    summary.update({"schedule": cfg.schedule, "model": cfg.model, "workers": world, "precision": cfg.precision,
                    "batch_size": cfg.batch_size, "microbatches": cfg.microbatches, **layout.describe()})
    reporter.sink.on_summary(summary)
    reporter.sink.on_status("done", f"{summary['steps']} steps over torchrun")
    return summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="pipeboard.trainer.runtime.torchrun_entry")
    ap.add_argument("config")
    ap.add_argument("--events-jsonl")
    args = ap.parse_args(argv)
    with open(args.config) as f:
        cfg = RunConfig(**json.load(f))
    sink = JsonlSink(args.events_jsonl) if args.events_jsonl and int(os.environ["RANK"]) == 0 else None
    try:
        summary = run(cfg, sink)
    except ConfigError as exc:  # one line and exit 2, as every pipeboard command
        print(f"pipeboard: {exc}", file=sys.stderr)
        sys.exit(2)
    if summary is not None:
        print(json.dumps(summary, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
