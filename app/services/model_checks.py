"""Validating a registered model, on a worker: its task built, checked and split in a subprocess.

The API only stores the registration (status ``validating``) and queues ``pipeboard.validate_model``;
the worker unpacks the model's code context (if any) and runs ``python -m pipeboard.trainer.validate_spec``
there, as a process tree that ends whole (app/services/proctree.py: ``setsid`` children too), with a
wall-clock limit and an address-space limit (RLIMIT_AS), in the sandbox where one is on
(app/services/sandbox.py: its own folder, the installed environment and its data), so a factory that raises, hangs,
allocates without end, crashes or leaves children behind ends as ``failed`` with its message at
the limit, and the API (and the worker) keep answering.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from pipeboard.app.core.config import get_settings
from pipeboard.app.models import Model, ModelStatus
from pipeboard.app.services import contexts, proctree, sandbox
from pipeboard.app.services.tx import begin_write

OUTPUT_LIMIT = 64 * 1024  # bytes of the child's output kept for the message


def workdir_of(session: Session, row: Model) -> Path:
    """Where the model's code runs: its unpacked context, or the worker's data folder."""
    data_dir = get_settings().data_dir
    if row.context_sha256:
        return contexts.unpack(session, row.context_sha256, data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    return data_dir


def _limits(memory_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_validation(source: str, config: dict[str, Any], data: str | None, workdir: Path, *,
                   time_limit_s: float, memory_bytes: int) -> dict[str, Any]:
    """``{"ok": bool, "message": str, "layers": int?}`` of validating ``source`` in ``workdir``."""
    cmd = [sys.executable, "-m", "pipeboard.trainer.validate_spec", source, "--model-args", json.dumps(config)]
    if data:
        cmd += ["--data", data]
    # PYTHONSAFEPATH: `-m` must not put the context folder first on sys.path, where a project's
    # `profile.py` would replace the standard library's (the factory's folder goes last instead).
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONSAFEPATH="1")
    try:
        sandboxed = sandbox.enabled()
    except sandbox.SandboxUnavailable as exc:
        return {"ok": False, "message": f"validation could not run: {exc.message}"}
    with tempfile.TemporaryDirectory(prefix="pipeboard-validate-") as scratch:
        if sandboxed:
            # Its own folder only: a model without a context runs in an empty one, never in the
            # worker's data folder (every user's contexts, the database).
            own = Path(scratch) if Path(workdir).resolve() == get_settings().data_dir else Path(workdir)
            cmd, env = sandbox.command(cmd, env, cwd=str(own), writable=[own],
                                       readable=sandbox.data_paths([data], str(own)) + sandbox.schedule_files())
            workdir = own
        return _run(cmd, env, workdir, time_limit_s=time_limit_s, memory_bytes=memory_bytes)


def _run(cmd: list[str], env: dict[str, str], workdir: Path, *, time_limit_s: float, memory_bytes: int
         ) -> dict[str, Any]:
    # Output to a file, not a pipe: a child that outlives the check (setsid) would hold a pipe open
    # and keep a reader waiting; the tree ends whole at the limit (app/services/proctree.py).
    with tempfile.TemporaryFile() as output:
        proc = proctree.spawn(cmd, cwd=str(workdir), env=env, stdout=output, preexec_fn=_limits(memory_bytes))
        try:
            proc.wait(timeout=time_limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            proctree.end(proc)  # nothing the factory started outlives the check
        if timed_out:
            return {"ok": False, "message": f"validation took longer than {time_limit_s:g} s (the factory, the data "
                                            "or the model's forward did not finish); stopped"}
        output.seek(max(0, output.seek(0, os.SEEK_END) - OUTPUT_LIMIT))
        out = output.read()
    text = out[-OUTPUT_LIMIT:].decode("utf-8", "replace")
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                result = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(result, dict) and "ok" in result:
                return result
    tail = " | ".join(text.strip().splitlines()[-3:]) or "no output"
    if proc.returncode and proc.returncode < 0:
        why = f"killed by signal {-proc.returncode}"
        if -proc.returncode in (signal.SIGKILL, signal.SIGSEGV):
            why += f" (out of memory? the limit is {memory_bytes // 2**20} MiB)"
        return {"ok": False, "message": f"validation {why}: {tail}"}
    if "MemoryError" in text:
        return {"ok": False, "message": f"validation ran out of memory (limit {memory_bytes // 2**20} MiB): {tail}"}
    return {"ok": False, "message": f"validation failed (exit code {proc.returncode}): {tail}"}


def validate_model(session: Session, model_id: int) -> ModelStatus | None:
    """Validate model ``model_id`` and store the outcome; None when there is no such model."""
    row = session.get(Model, model_id)
    if row is None:
        return None
    settings = get_settings()
    try:
        workdir = workdir_of(session, row)
        result = run_validation(row.source, dict(row.config or {}), row.data, workdir,
                                time_limit_s=settings.validation_time_limit_s,
                                memory_bytes=settings.validation_memory_bytes)
    except Exception as exc:  # the context could not be unpacked, the child not started
        result = {"ok": False, "message": f"validation could not run: {type(exc).__name__}: {exc}"}
    status = ModelStatus.READY if result.get("ok") else ModelStatus.FAILED
    message = str(result.get("message") or "")[:4000]
    begin_write(session)
    session.execute(update(Model).where(Model.id == model_id).values(
        status=status, message=message, layers=result.get("layers") if result.get("ok") else None))
    session.commit()
    return status
