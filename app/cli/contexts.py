"""`pipeboard submit --context DIR`: pack a project, upload it (once per content), register its task
factory as a model and wait until a worker has validated it; the job then trains that model."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Any

import typer

from pipeboard.app.cli.common import fail

VALIDATION_TIMEOUT_S = 900.0


def model_name(source: str, digest: str) -> str:
    """One registered model per (factory, content): ``ctx-<sha256[:12]>-<function>``."""
    function = re.sub(r"[^A-Za-z0-9_.-]", "-", source.rpartition(":")[2])[:60]
    return f"ctx-{digest[:12]}-{function}"


def ensure_context(api: Any, folder: Path) -> str:
    """The SHA-256 of ``folder`` packed; uploaded unless the server already has it."""
    from pipeboard.app.services.contexts import pack

    if not folder.is_dir():
        fail(f"--context: {folder} is not a folder", 2)
    content = pack(folder)
    digest = hashlib.sha256(content).hexdigest()
    if api.exists(f"/contexts/{digest}"):
        typer.echo(f"context {digest[:12]} already on the server ({len(content)} bytes packed)", err=True)
        return digest
    stored = api.call("POST", "/contexts", files={"file": (f"{folder.name or 'context'}.tar.gz", content, "application/gzip")})
    typer.echo(f"context {stored['sha256'][:12]} uploaded: {stored['files']} files, {stored['size']} bytes", err=True)
    return digest


def register_model(api: Any, spec: dict[str, Any], digest: str, quiet: bool = False) -> str:
    """The name of the model for the spec's task factory in context ``digest``, registered if new,
    once a worker has validated it (exit 2 with its message if validation failed)."""
    source = spec["model"]["name"]  # a job specification (app/schemas/jobspec.py)
    name = model_name(source, digest)
    if not api.exists(f"/models/{name}"):
        body = {"name": name, "source": source, "context": digest, "config": spec["model"]["args"]}
        if spec["model"]["data"]:
            body["data"] = spec["model"]["data"]
        api.call("POST", "/models", json=body)
        if not quiet:
            typer.echo(f"model {name} registered; a worker is validating it", err=True)
    deadline = time.monotonic() + VALIDATION_TIMEOUT_S
    while True:
        model = api.call("GET", f"/models/{name}")
        if model["status"] == "ready":
            if not quiet:
                typer.echo(f"model {name} ready: {model.get('message', '')}", err=True)
            return name
        if model["status"] == "failed":
            fail(f"model {name} failed validation: {model.get('message', '')}", 2)
        if time.monotonic() > deadline:
            fail(f"model {name} still validating after {VALIDATION_TIMEOUT_S:.0f} s (is a worker running?)", 1)
        time.sleep(1.0)
