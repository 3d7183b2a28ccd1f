"""`pipeboard storage show JOB` and `pipeboard storage prune`: a job's disk use, and reclaiming it.

They work on the configured database directly (run them on the server machine, as `token create`):
pruning deletes finished jobs' action timelines, which no API caller should be able to do in bulk.
Bad input is one line and exit 2.
"""

from __future__ import annotations

import json
from typing import Optional

import typer


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def register(cli: typer.Typer) -> None:
    app = typer.Typer(help="A job's disk use; drop or thin finished jobs' action timelines.", no_args_is_help=True)
    cli.add_typer(app, name="storage")

    @app.command("show")
    def show(job_id: int = typer.Argument(..., help="The job.")) -> None:
        """Rows and bytes per table of one job, and how many of its steps keep their full actions."""
        from pipeboard.app.core.db import get_sessionmaker
        from pipeboard.app.models import Job
        from pipeboard.app.services import storage

        with get_sessionmaker()() as session:
            if session.get(Job, job_id) is None:
                _fail(f"JOB_ID: job {job_id} does not exist")
            report = storage.usage(session, job_id)
            report["database_file_bytes"] = storage.database_file_bytes(session)
        typer.echo(json.dumps(report, indent=2))

    @app.command("prune")
    def prune(
        older_than_days: Optional[float] = typer.Option(None, "--older-than-days", help="Default PIPEBOARD_DETAIL_RETENTION_DAYS."),
        keep_first_steps: int = typer.Option(0, "--keep-first-steps", help="Thin instead of drop: keep each job's first steps."),
        job: Optional[int] = typer.Option(None, "--job", help="Only this finished job, whatever its age."),
        vacuum: bool = typer.Option(False, "--vacuum", help="Give the freed space back to the file system (SQLite)."),
    ) -> None:
        """Drop the action timeline of finished jobs older than the limit; every step's summary stays."""
        from pipeboard.app.core.config import get_settings
        from pipeboard.app.core.db import get_sessionmaker
        from pipeboard.app.services import storage

        days = get_settings().detail_retention_days if older_than_days is None else older_than_days
        if days < 0 or keep_first_steps < 0:
            _fail("--older-than-days and --keep-first-steps: must be 0 or more")
        with get_sessionmaker()() as session:
            if job is not None:
                try:
                    deleted = storage.drop_detail(session, job, keep_first_steps=keep_first_steps)
                except (LookupError, ValueError) as exc:
                    _fail(f"--job: {exc}")
                typer.echo(json.dumps({"jobs": {job: deleted}, "rows_deleted": deleted}))
                return
            typer.echo(json.dumps(storage.prune(session, days, keep_first_steps=keep_first_steps, vacuum=vacuum)))
