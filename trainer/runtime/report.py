"""The launcher's side of reporting: worker messages in, batched sink calls out.

Workers send small tuples (``ready``, ``step`` or several steps' at once, ``steps``, ``pause``
before an evaluation or a checkpoint, ``eval``, ``finished``, ``exit``, ``error``); this class turns them into ``TimelineEvent`` batches, one ``MetricRecord`` per completed step (loss,
samples/s, per-stage utilisation and memory), evaluation records for time-to-accuracy, and the
final summary. Sink calls are batched (at most every ``flush_s``) so a slow sink cannot slow the
run: workers never wait for it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from pipeboard.trainer.runtime.detail import DetailPolicy, DetailWindows, step_summary
from pipeboard.trainer.runtime.stage_memory import OOM_PREFIX, figures, memory_entries
from pipeboard.trainer.schedule.actions import TimelineEvent
from pipeboard.trainer.schedule.measured import AFTER_PAUSE, steady_step_s
from pipeboard.trainer.sink import MetricRecord, Sink


# Once the workers are done, how long to wait for each rank's last message: a rank's final step
# reports can still be on their way when its process (or rank 0's training) ends.
LAST_MESSAGE_GRACE_S = 5.0


class Reporter:
    def __init__(self, sink: Sink, world: int, batch_size: int, metric_name: str, flush_s: float = 0.5,
                 detail: DetailPolicy | None = None) -> None:
        self.sink = sink
        self.world = world
        self.batch_size = batch_size
        self.metric_name = metric_name
        self.flush_s = flush_s
        self.workers: dict[int, dict[str, Any]] = {}
        self.events: list[TimelineEvent] = []  # the actions of steps in a detail window, to write
        self.step_events: dict[int, list[TimelineEvent]] = defaultdict(list)  # step -> its actions until it completes
        self.windows = DetailWindows(detail if detail is not None else DetailPolicy.from_env())
        self.records: list[MetricRecord] = []
        self.partial: dict[int, dict[int, tuple]] = defaultdict(dict)  # step -> rank -> stats
        self.step_time: dict[int, float] = {}  # step -> when its last worker finished it
        self.pauses: set[int] = set()  # steps that complete after a pause (a checkpoint, an evaluation)
        self.losses: dict[int, float] = {}
        self.evals: list[tuple[int, float, float]] = []  # (step, wall_s, metric)
        self.errors: list[tuple[int, list[int], str, str]] = []
        self.exited: set[int] = set()
        self.finished: dict[int, tuple] = {}
        self.start_step = 0
        self.total_steps = 0
        self.steps_per_epoch = 1
        self.time_to_target: float | None = None
        self._last_flush = time.monotonic()
        self._last_busy: dict[int, float] = {}
        # memory per stage: predicted by the launcher (stage_memory.predict), the peak measured over the run
        self.predicted_memory: dict[int, int] | None = None
        self.predicted_memory_error: str | None = None
        self.memory_source: str | None = None  # instrument.MEMORY_SOURCES
        self.measured_memory: dict[int, int] = {}
        self.step_tokens: dict[int, int] = {}  # step -> its batch's non-padding tokens, where counted

    def expect_memory(self, predicted: dict[int, int] | None, why_not: str | None, source: str) -> None:
        self.predicted_memory, self.predicted_memory_error, self.memory_source = predicted, why_not, source

    def memory_note(self, stages: list[int]) -> str:
        """The predicted and measured peaks of a worker's stages, for a failure line."""
        return figures(stages, self.predicted_memory, self.measured_memory)

    # -- messages --------------------------------------------------------------------------

    def ended(self) -> set[int]:
        """The ranks that sent their last message: "exit", or an "error"."""
        return self.exited | {rank for rank, *_ in self.errors}

    def handle(self, msg: tuple) -> None:
        kind, rank = msg[0], msg[1]
        if kind == "ready":
            _, _, stages, replica, pid, start, total, spe, matmul, host = msg
            self.workers[rank] = {"stages": stages, "replica": replica, "pid": pid, "cpu_matmul": matmul, "host": host}
            self.start_step, self.total_steps, self.steps_per_epoch = start, total, spe
            self.windows.start_step = start
            if len(self.workers) == self.world:
                pids = {r: w["pid"] for r, w in sorted(self.workers.items())}
                hosts = {r: w["host"] for r, w in sorted(self.workers.items())}
                self.sink.on_status("running", f"{self.world} workers running from step {start} of {total}",
                                    pids=pids, hosts=hosts, start_step=start, total_steps=total)
        elif kind == "step":
            self._on_step(rank, *msg[2:])
        elif kind == "steps":  # a worker's batch of step reports (worker.StepReports)
            for report in msg[2]:
                self._on_step(rank, *report)
        elif kind == "pause":  # the run pauses before step msg[2]: its completion comes after it
            self.pauses.add(msg[2])
        elif kind == "eval":
            _, _, step, wall, metric = msg
            if metric is not None:
                self.evals.append((step, wall, metric))
                self.records.append(MetricRecord(step=step, wall_s=wall, epoch=step / self.steps_per_epoch,
                                                 values={"metric": metric, self.metric_name: metric}))
        elif kind == "finished":
            self.finished[rank] = msg[2:]
        elif kind == "exit":
            self.exited.add(rank)
        elif kind == "error":
            message = msg[3]
            if message.startswith(OOM_PREFIX):  # one line: the stage's figures beside what it tried to allocate
                message = f"{message} ({self.memory_note(list(msg[2]))})"
            self.errors.append((rank, msg[2], message, msg[4]))
            self.events.extend(self.windows.on_failure())  # the steps before the failure keep their detail
            for step in sorted(self.step_events):  # and the step(s) it failed in, never completed
                self.events.extend(self.windows.admit(step, self.step_events.pop(step)))
        self.maybe_flush()

    def _on_step(self, rank: int, step: int, wall: float, busy: float, losses: list[float], mem: int, events: list,
                 tokens: int | None = None) -> None:
        info = self.workers.get(rank, {"stages": [], "replica": 0})
        replica = info["replica"]
        for kind, stage, mb, t0, t1, k in events:
            self.step_events[k].append(TimelineEvent(rank, stage, replica, mb, kind, t0, t1, k))
        self.partial[step][rank] = (wall, busy, losses, mem)
        if tokens is not None:  # the first stage's count of the step's batch (data.token_counter)
            self.step_tokens[step] = self.step_tokens.get(step, 0) + int(tokens)
        for s in info["stages"]:  # a worker's peak is each of its stages' (they share the process)
            self.measured_memory[s] = max(self.measured_memory.get(s, 0), int(mem))
        if len(self.partial[step]) < self.world:
            return
        parts = self.partial.pop(step)
        done = max(p[0] for p in parts.values())
        self.step_time[step] = done
        prev = self.step_time.get(step - 1)
        values: dict[str, float] = {}
        all_losses = [x for p in parts.values() for x in p[2]]
        if all_losses:
            values["loss"] = self.losses[step] = sum(all_losses) / len(all_losses)
        if step in self.pauses:
            values[AFTER_PAUSE] = 1.0
        window = [k for k in range(step - 4, step + 1) if k in self.step_time and k - 1 in self.step_time]
        if window:
            span = self.step_time[window[-1]] - self.step_time[window[0] - 1]
            if span > 0:
                values["samples_per_s"] = self.batch_size * len(window) / span
                counted = [self.step_tokens[k] for k in window if k in self.step_tokens]
                if len(counted) == len(window):  # the same window as samples/s
                    values["tokens_per_s"] = sum(counted) / span
        if step in self.step_tokens:
            values["tokens"] = float(self.step_tokens[step])
        if prev is not None and done > prev:
            per_stage: dict[int, list[float]] = defaultdict(list)
            mem_stage: dict[int, list[int]] = defaultdict(list)
            for r, (_, b, _, m) in parts.items():
                for s in self.workers.get(r, {"stages": []})["stages"]:
                    per_stage[s].append(b / (done - prev) / max(1, len(self.workers[r]["stages"])))
                    mem_stage[s].append(m)
            for s in sorted(per_stage):
                values[f"utilization.{s}"] = min(1.0, sum(per_stage[s]) / len(per_stage[s]))
                values[f"memory_bytes.{s}"] = float(max(mem_stage[s]))
        step_events = self.step_events.pop(step, [])
        stages = sorted({s for w in self.workers.values() for s in w["stages"]})
        memory = {s: float(w_mem) for r, (_, _, _, w_mem) in parts.items() for s in self.workers.get(r, {"stages": []})["stages"]}
        begin = prev if prev is not None else min((e.start for e in step_events), default=done)
        # the step's compact summary: one row per stage (detail.SUMMARY_COLUMNS), kept for every step
        values["stages"] = step_summary(step_events, stages, begin, done, memory)  # type: ignore[assignment]
        self.events.extend(self.windows.take(step, step_events))
        self.records.append(MetricRecord(step=step + 1, wall_s=done, epoch=(step + 1) / self.steps_per_epoch,
                                         values=values))

    # -- output ------------------------------------------------------------------------------

    def maybe_flush(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._last_flush < self.flush_s:
            return
        self._last_flush = time.monotonic()
        if self.events:
            events, self.events = self.events, []
            events.sort(key=lambda e: e.start)
            self.sink.on_events(events)
            self.windows.written(len(events))
        pending = getattr(self.sink, "pending_events", None)
        backlog = pending() if callable(pending) else None
        if backlog is not None:  # a background writer: its backlog is the queue detail is measured against
            self.windows.queued = backlog
        if self.records:
            records, self.records = self.records, []
            self.sink.on_metrics(records)
        self._poll_detail_requests()

    def _poll_detail_requests(self) -> None:
        """Steps of detail asked for while the job runs (the job page's "record the next N steps"):
        a sink that can hear them (DbSink reads them from the job's event log) says how many."""
        poll = getattr(self.sink, "detail_requested", None)
        steps = poll() if callable(poll) else 0
        if steps:
            self.windows.request(steps, max(self.step_time, default=self.start_step - 1))

    def steady_samples_per_s(self) -> float | None:
        """Samples/s in the steady state: the batch over the measured time per step."""
        step_s = steady_step_s(self.step_time, self.pauses)
        return self.batch_size / step_s if step_s else None

    def steady_tokens_per_s(self) -> float | None:
        """Tokens/s in the steady state: the mean tokens per counted step over the measured time
        per step (None where no step's tokens were counted)."""
        step_s = steady_step_s(self.step_time, self.pauses)
        if not step_s or not self.step_tokens:
            return None
        return sum(self.step_tokens.values()) / len(self.step_tokens) / step_s

    def _onednn_products(self) -> int | None:
        counts = [f[3] for f in self.finished.values() if f[3] is not None]
        return sum(counts) if counts else None

    def summary(self, target: float | None, higher_is_better: bool, wall_s: float) -> dict[str, Any]:
        steps_done = max(self.step_time, default=self.start_step - 1) + 1
        final_metric = self.evals[-1][2] if self.evals else None
        if target is not None:
            for step, wall, metric in self.evals:
                if (metric >= target) if higher_is_better else (metric <= target):
                    self.time_to_target = wall
                    break
        final_loss = self.losses[max(self.losses)] if self.losses else None
        metrics = [m for _, _, m in self.evals]
        best_metric = (max if higher_is_better else min)(metrics) if metrics else None
        return {
            "samples_per_s": self.steady_samples_per_s(),
            "step_s": steady_step_s(self.step_time, self.pauses),
            # tasks with a sequence dimension (data.token_counter): their non-padding tokens per second
            **({"tokens_per_s": self.steady_tokens_per_s()} if self.step_tokens else {}),
            "final_metric": final_metric,
            "metric_name": self.metric_name,
            "higher_is_better": higher_is_better,
            "best_metric": best_metric,
            "final_loss": final_loss,
            "steps": steps_done,
            "start_step": self.start_step,
            "epochs": steps_done / self.steps_per_epoch,
            "wall_s": wall_s,
            "train_s": max(self.step_time.values()) if self.step_time else None,
            "target": target,
            "time_to_target_s": self.time_to_target,
            "reached_target": self.time_to_target is not None if target is not None else None,
            "evaluations": [{"step": s, "wall_s": w, "metric": m} for s, w, m in self.evals],
            # the kernels the CPU workers computed float32 matrix products with (trainer/cpu_matmul.py),
            # and how many products oneDNN computed in all (None: no worker had its kernels)
            "cpu_matmul": ",".join(sorted({w["cpu_matmul"] for w in self.workers.values() if w["cpu_matmul"]})) or None,
            "onednn_products": self._onednn_products(),
            # which steps kept their full action timeline, and the actions dropped because the writer lagged
            "detail_steps": step_ranges(sorted(self.windows.kept_steps)),
            "detail_dropped_actions": self.windows.dropped_actions,
            # per stage, memory_model's peak beside the peak measured over the run (memory_source says how)
            "memory": memory_entries(sorted({s for w in self.workers.values() for s in w["stages"]}),
                                     self.predicted_memory, self.measured_memory),
            "memory_source": self.memory_source,
            **({"memory_predicted_error": self.predicted_memory_error} if self.predicted_memory_error else {}),
        }


def step_ranges(steps: list[int]) -> list[list[int]]:
    """[[first, last], ...] of consecutive steps: a compact list of the windows."""
    out: list[list[int]] = []
    for step in steps:
        if out and step == out[-1][1] + 1:
            out[-1][1] = step
        else:
            out.append([step, step])
    return out
