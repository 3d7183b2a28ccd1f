"""A sandboxed run's reports, written to the database from outside its sandbox.

`pipeboard train --job-id N` used to write its steps, metrics and timeline to the database itself
(`DbSink`), so it needed the database URL, which users' code must not have. Under the sandbox the
runner starts this relay instead, outside the sandbox, as the phase's process (its group is the
one cancel, the reaper and the supervisor signal):

    python -m pipeboard.app.services.run_relay --job-id N --attempt A --socket PATH -- bwrap ... pipeboard train ...

The relay listens on a Unix socket in a folder of its own (bound into the sandbox, nowhere else
visible there), starts the sandboxed command in a process group of its own with the sandbox's
environment plus ``PIPEBOARD_RELAY`` (the socket's path), and serves every connection with one
`DbSink` for the job's attempt (the relay's, never one the run names). Each report is one JSON
line and its answer another (``RelaySink``, which the run's `BackgroundSink` calls from its writer
thread): a call returns only once its rows are committed, so a step the run has handed over is in
the database, as before; a write refused because the job moved on comes back as `Superseded`.

Signals: SIGTERM to the relay (a cancel, the time limit, its worker dying: PR_SET_PDEATHSIG, or
DbSink ending its own group once superseded) goes on to every process inside the sandbox (bwrap
passes none on), and the relay keeps writing while `pipeboard train` hands over what its stages
reported; then it exits as the sandboxed command did (a command killed by signal N, which bwrap
reports as 128 + N, ends the relay by the same signal, so the runner sees a killed phase).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

RELAY_VAR = "PIPEBOARD_RELAY"  # the socket's path, in the sandboxed run's environment
MAX_LINE = 256 << 20  # one report's JSON; a timeline batch of a second is a few MB
DRAIN_S = 10.0  # after the command ended, how long its last connection may still be answered


class Superseded(RuntimeError):
    """The job no longer runs this attempt: the relay's DbSink refused the write."""


class RelayLost(RuntimeError):
    """The relay answered nothing (it is gone, or refused the report)."""


def _plain(value: Any) -> Any:
    """numpy scalars and the like as JSON (DbSink makes the rest plain)."""
    return value.item() if hasattr(value, "item") else str(value)


class RelaySink:
    """The sink a sandboxed run reports through (the `pipeboard.trainer.sink.Sink` protocol plus
    ``detail_requested`` and ``close``): each call one round trip to the relay."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.file = self.sock.makefile("rwb")
        self.lock = threading.Lock()
        self._call("hello")  # the relay opens its DbSink: a job that does not exist fails here, as DbSink did

    def _call(self, op: str, **payload: Any) -> dict[str, Any]:
        line = json.dumps({"op": op, **payload}, default=_plain).encode() + b"\n"
        with self.lock:
            self.file.write(line)
            self.file.flush()
            answer = self.file.readline(MAX_LINE)
        if not answer:
            raise RelayLost("the run's relay to the database closed its socket")
        reply = json.loads(answer)
        error = reply.get("error")
        if error == "Superseded":
            raise Superseded(reply["message"])
        if error == "ValueError":
            raise ValueError(reply["message"])
        if error:
            raise RelayLost(f"the relay could not record a report: {error}: {reply['message']}")
        return reply

    def on_status(self, phase: str, message: str = "", **fields: Any) -> None:
        self._call("status", phase=phase, message=message, fields=fields)

    def on_events(self, events: Sequence[Any]) -> None:
        if events:
            self._call("events", events=[e.to_dict() for e in events])

    def on_metrics(self, records: Sequence[Any]) -> None:
        if records:
            self._call("metrics", records=[{"step": r.step, "wall_s": r.wall_s, "epoch": r.epoch, "values": r.values}
                                           for r in records])

    def on_summary(self, summary: dict[str, Any]) -> None:
        self._call("summary", summary=summary)

    def detail_requested(self) -> int:
        return int(self._call("detail").get("steps", 0))

    def close(self) -> None:
        try:
            self.file.close()
        finally:
            self.sock.close()


class Relay:
    """The relay's side: one DbSink for the job's attempt, shared by every connection in turn."""

    def __init__(self, job_id: int, attempt: int | None) -> None:
        self.job_id, self.attempt = job_id, attempt
        self.sink = None
        self.root: int | None = None  # bwrap's pid, once started
        self.lock = threading.Lock()
        self.connections: list[socket.socket] = []
        self.threads: list[threading.Thread] = []

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        from pipeboard.app.services.run_sink import DbSink
        from pipeboard.trainer.schedule.actions import TimelineEvent
        from pipeboard.trainer.sink import MetricRecord

        op = message.get("op")
        with self.lock:
            if self.sink is None:
                self.sink = DbSink(self.job_id, attempt=self.attempt)
            if op == "hello":
                return {}
            if op == "status":
                fields = dict(message.get("fields", {}))
                if isinstance(fields.get("pids"), dict):  # the stage processes' pids as this host knows them
                    fields["pids"] = self.host_pids(fields["pids"], fields.get("hosts"))
                self.sink.on_status(str(message["phase"]), str(message.get("message", "")), **fields)
            elif op == "events":
                self.sink.on_events([TimelineEvent.from_dict(e) for e in message["events"]])
            elif op == "metrics":
                self.sink.on_metrics([MetricRecord(int(r["step"]), float(r["wall_s"]), float(r["epoch"]), dict(r["values"]))
                                      for r in message["records"]])
            elif op == "summary":
                self.sink.on_summary(dict(message["summary"]))
            elif op == "detail":
                return {"steps": self.sink.detail_requested()}
            else:
                raise ValueError(f"op: unknown report {op!r}")
        return {}

    def host_pids(self, pids: dict[str, Any], hosts: Any) -> dict[str, Any]:
        """``pids`` (rank: pid in the sandbox's process namespace) as this host's pids, for the
        ranks on this host (``hosts``: rank: node name); another host's ranks stay as they came."""
        if self.root is None:
            return pids
        here = os.environ.get("PIPEBOARD_NODE_NAME") or socket.gethostname()
        outer: dict[int, int] = {}
        for pid in _inside(self.root):
            try:
                with open(f"/proc/{pid}/status") as fh:
                    line = next((ln for ln in fh if ln.startswith("NSpid:")), "")
            except OSError:
                continue
            levels = line.split()[1:]
            if len(levels) > 1:
                outer[int(levels[-1])] = int(levels[0])
        mine = {str(r) for r, host in (hosts or {}).items() if host == here} if isinstance(hosts, dict) else None
        return {r: outer.get(int(p), p) if (mine is None or str(r) in mine) and isinstance(p, int) else p
                for r, p in pids.items()}

    def serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            while True:
                line = reader.readline(MAX_LINE)
                if not line:
                    return
                try:
                    reply = self.handle(json.loads(line))
                except Exception as exc:  # answered: the run raises it where DbSink would have
                    reply = {"error": type(exc).__name__, "message": str(exc)}
                conn.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            return
        finally:
            reader.close()
            conn.close()

    def accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the command ended
                return
            self.connections.append(conn)
            thread = threading.Thread(target=self.serve, args=(conn,), name="relay-connection", daemon=True)
            thread.start()
            self.threads.append(thread)

    def finish(self, listener: socket.socket) -> None:
        """After the command ended: no new connection; the open ones end at their EOF (the
        sandbox's processes are gone), bounded; then the DbSink's session closes."""
        listener.close()
        deadline = time.monotonic() + DRAIN_S
        for thread in list(self.threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        for conn in self.connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self.lock:
            if self.sink is not None:
                self.sink.close()


def _inside(root: int) -> list[int]:
    """The processes under ``root`` (bwrap) that are not bwrap itself: the sandbox's own."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    text = fh.read().decode("ascii", "replace")
            except OSError:
                continue
            children.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(entry))
    bwrap = os.path.realpath(shutil.which("bwrap") or "/usr/bin/bwrap")
    found, stack = [], [root]
    while stack:
        for pid in children.get(stack.pop(), ()):
            stack.append(pid)
            try:
                if os.path.realpath(f"/proc/{pid}/exe") != bwrap:
                    found.append(pid)
            except OSError:
                found.append(pid)
    return found


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m pipeboard.app.services.run_relay", description=__doc__.splitlines()[0])
    parser.add_argument("--job-id", type=int, required=True)
    parser.add_argument("--attempt", type=int)
    parser.add_argument("--socket", required=True, help="the Unix socket to listen on (its folder is the relay's)")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        parser.error("the command to run comes after --")

    from pipeboard.app.core.lifetime import die_with_parent_if_asked
    from pipeboard.app.services.sandbox import inner_env

    child: subprocess.Popen | None = None
    early: list[int] = []

    def forward(signum, frame) -> None:  # bwrap passes no signal on: send it to the sandbox's processes
        if child is None:
            early.append(signum)
        else:
            for pid in _inside(child.pid):
                try:
                    os.kill(pid, signum)
                except OSError:
                    pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    die_with_parent_if_asked()  # SIGTERM when the worker dies: the run hands over through us, then ends
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket)
    listener.listen(4)
    relay = Relay(args.job_id, args.attempt)
    threading.Thread(target=relay.accept, args=(listener,), name="relay-accept", daemon=True).start()
    if early:  # the worker died before the run started: nothing to hand over
        shutil.rmtree(Path(args.socket).parent, ignore_errors=True)
        sys.exit(128 + early[0])
    try:
        # its own group: a SIGTERM to the relay's group must not reach bwrap, which would end the
        # sandbox at once (--die-with-parent) before the run handed over its reports
        child = subprocess.Popen(command, env={**inner_env(dict(os.environ)), RELAY_VAR: args.socket},
                                 stdin=subprocess.DEVNULL, process_group=0)
        relay.root = child.pid
        if early:  # a signal came while it started: it is the run's now
            forward(early[-1], None)
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:
                continue
        relay.finish(listener)
    finally:
        shutil.rmtree(Path(args.socket).parent, ignore_errors=True)
    if 128 < code < 128 + signal.NSIG:  # bwrap's way of saying the command was killed by signal code - 128
        try:
            signal.signal(code - 128, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL's cannot be set, nor needs to be
            pass
        os.kill(os.getpid(), code - 128)
    sys.exit(code)


if __name__ == "__main__":
    main()
