"""`pipeboard token create`, `pipeboard submit`, `pipeboard jobs list|show|cancel|retry`.

These talk to a running server over HTTP (PIPEBOARD_URL / PIPEBOARD_TOKEN, or --url/--token),
except `token create`, which writes to the configured database directly: on the server machine it
needs no token (`pipeboard up` printed the first admin token; this makes more). Errors are one line on stderr and a non-zero exit code, never a traceback:
2 for bad input, 1 for a job that failed or a server that refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

DEFAULT_URL = "http://127.0.0.1:8000"
URL_OPTION = typer.Option(DEFAULT_URL, "--url", envvar="PIPEBOARD_URL", help="Server URL (PIPEBOARD_URL).")
TOKEN_OPTION = typer.Option(None, "--token", envvar="PIPEBOARD_TOKEN", help="API token (PIPEBOARD_TOKEN).")
TERMINAL = ("succeeded", "failed", "cancelled")


def fail(message: str, code: int = 1) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


class Api:
    """A small httpx client: base URL, bearer token, and errors turned into one line."""

    def __init__(self, url: str, token: str | None) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base = url.rstrip("/") + "/api/v1"
        self.client = httpx.Client(headers=headers, timeout=httpx.Timeout(30.0, read=60.0))

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = self.client.request(method, self.base + path, **kwargs)
        except httpx.HTTPError as exc:
            fail(f"cannot reach {self.base}: {exc}")
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            fail(f"{method} {path}: HTTP {response.status_code}: {detail}", 2 if response.status_code in (400, 404, 409, 413, 422) else 1)
        return response.json()

    def exists(self, path: str) -> bool:
        """Whether GET ``path`` finds something (200) rather than nothing (404)."""
        import httpx

        try:
            response = self.client.get(self.base + path)
        except httpx.HTTPError as exc:
            fail(f"cannot reach {self.base}: {exc}")
        if response.status_code == 404:
            return False
        if response.status_code >= 400:
            fail(f"GET {path}: HTTP {response.status_code}: {response.text[:300]}", 2 if response.status_code in (401, 403) else 1)
        return True

    def events(self, job_id: int, last_id: int = 0):
        """Yield SSE messages {id, event, data} of a job until its `end`, reconnecting on drops."""
        import httpx

        from pipeboard.app.services.sse import parse_stream

        attempts = 0
        while True:
            try:
                headers = {"Last-Event-ID": str(last_id)} if last_id else {}
                with self.client.stream("GET", f"{self.base}/jobs/{job_id}/events", headers=headers, timeout=httpx.Timeout(30.0, read=None)) as response:
                    if response.status_code >= 400:
                        fail(f"events of job {job_id}: HTTP {response.status_code}: {response.read().decode(errors='replace')}")
                    for message in parse_stream(response.iter_lines()):
                        attempts = 0
                        if "id" in message and message["id"].isdigit():
                            last_id = int(message["id"])
                        yield message
                        if message.get("event") == "end":
                            return
            except httpx.HTTPError as exc:
                attempts += 1
                if attempts > 5:
                    fail(f"lost the event stream of job {job_id}: {exc}")
                import time

                time.sleep(min(2.0 * attempts, 10.0))


def load_spec(path: Path) -> dict[str, Any]:
    import yaml

    try:
        text = path.read_text()
    except OSError as exc:
        fail(f"{path}: {exc.strerror}", 2)
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        fail(f"{path}: not valid YAML: {str(exc).splitlines()[0]}", 2)
    if not isinstance(spec, dict):
        fail(f"{path}: the top level must be a mapping of job fields", 2)
    if "choice" in spec and "run" in spec:  # a `pipeboard tune --json` result: the job that trains its choice
        from pipeboard.trainer.tune import TuneError
        from pipeboard.trainer.tune.tuned import job_spec

        try:
            spec = job_spec(spec)
        except TuneError as exc:
            fail(f"{path}: {exc}", 2)
    attach_schedule_file(spec, path)
    from pydantic import ValidationError

    from pipeboard.app.schemas import JobSpec

    try:  # the server checks again; this catches typos offline, and sends the spec as version 2
        checked = JobSpec.model_validate(spec)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "spec"
        fail(f"{path}: {where}: {first['msg']}", 2)
    for field, why in checked.problems():
        fail(f"{path}: {field}: {why}", 2)
    return checked.model_dump(mode="json")


def attach_schedule_file(spec: dict[str, Any], path: Path) -> None:
    """A job YAML's ``layout.schedule_file`` on one line is a schedule file's path (relative to the
    YAML): its text is what the job carries (torch's CSV, checked by the server as by the CLI)."""
    layout = spec.get("layout")
    named = layout.get("schedule_file") if isinstance(layout, dict) else None
    if not isinstance(named, str) or "\n" in named.strip():
        return
    csv_path = path.parent / named.strip()
    try:
        layout["schedule_file"] = csv_path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"{path}: layout.schedule_file: cannot read {csv_path}: {getattr(exc, 'strerror', None) or exc}", 2)


def describe_event(message: dict[str, Any]) -> str | None:
    try:
        data = json.loads(message.get("data", "{}"))
    except ValueError:
        return None
    kind = message.get("event")
    if kind in ("status", "progress"):
        text = data.get("status") or data.get("phase") or ""
        return f"[{kind}] {text}: {data.get('message', '')}".rstrip(": ")
    if kind == "attempt":  # a (resumed) attempt's training begins
        return f"[attempt] {data.get('message', '')}"
    if kind == "metrics" and data.get("points"):
        latest: dict[str, float] = {}  # a batch mixes training points and evaluations
        for point in data["points"]:
            # a point's scalars only: a step summary also carries per-stage rows (lists)
            latest.update({k: v for k, v in point.get("values", {}).items()
                           if "." not in k and isinstance(v, (int, float))})
        values = ", ".join(f"{k}={v:.4g}" for k, v in latest.items())
        return f"[metrics] step {data['points'][-1].get('step')}: {values}"
    return None  # the summary is printed once, at the end


def wait_for(api: Api, job_id: int, quiet: bool = False, after: int = 0) -> dict[str, Any]:
    for message in api.events(job_id, after):
        line = describe_event(message)
        if line and not quiet:
            typer.echo(line)
    return api.call("GET", f"/jobs/{job_id}")


def finish_with(job: dict[str, Any]) -> None:
    status = job["status"]
    if status == "succeeded":
        summary = job.get("summary") or {}
        keys = ("steps", "samples_per_s", "metric_name", "final_metric", "final_loss", "wall_s", "stopped_by", "profile_id")
        shown = ", ".join(f"{k}={_short(summary[k])}" for k in keys if summary.get(k) is not None)
        typer.echo(f"job {job['id']} succeeded" + (f": {shown}" if shown else ""))
        return
    fail(f"job {job['id']} {status}" + (f": {job['error']}" if job.get("error") else ""), 1)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_table(rows: list[dict[str, Any]], count: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "name", "status", "queue", "priority", "attempt", "created", "error")
    for j in rows:
        table.add_row(str(j["id"]), j["name"], j["status"], str(j.get("queue_position") or ""), str(j["priority"]),
                      str(j["attempt"]), (j.get("created_at") or "")[:19], (j.get("error") or "")[:60])
    Console().print(table)
    typer.echo(f"{len(rows)} of {count} job(s)")


def register(cli: typer.Typer) -> None:
    """Add this module's commands to the `pipeboard` app."""
    token_app = typer.Typer(help="API tokens.", no_args_is_help=True)
    jobs_app = typer.Typer(help="List, inspect, cancel and retry jobs on a server.", no_args_is_help=True)
    cli.add_typer(token_app, name="token")
    cli.add_typer(jobs_app, name="jobs")

    @token_app.command("create")
    def token_create(
        name: Optional[str] = typer.Argument(None, help="What the token is for, e.g. ci."),
        name_option: Optional[str] = typer.Option(None, "--name", help="The same as NAME."),
        scope: str = typer.Option("read", "--scope", help="read (GET routes), write (all but token management) or admin (everything)."),
        expires_in: Optional[str] = typer.Option(None, "--expires-in", help="Stop working after this long: 30d, 12h, 90m, 45s, 2w (default: never)."),
        user: str = typer.Option("admin", "--user", help="Whose token it is (created if new): what it submits, "
                                 "registers and uploads is that user's, and it sees only that user's work (everyone's "
                                 "with --scope admin). Default: the admin user."),
    ) -> None:
        """Create a token in the configured database and print it (shown once). Run it on the server
        machine (an admin's way to make users' tokens): it writes the database directly, so it needs no token."""
        import re
        from datetime import timedelta

        from pipeboard.app.schemas import NAME_PATTERN
        from pipeboard.app.services.tokens import SCOPES, parse_duration, utcnow

        if (name is None) == (name_option is None):
            fail("give the token's NAME (or --name NAME), once", 2)
        name = name or name_option
        if not re.match(NAME_PATTERN, name):
            fail(f"NAME {name!r}: letters, digits and _.:- or spaces, at most 120, starting with a letter or digit", 2)
        if scope not in SCOPES:
            fail(f"--scope must be one of {', '.join(SCOPES)}, got {scope!r}", 2)
        if not re.match(NAME_PATTERN, user) or len(user) > 120:
            fail(f"--user {user!r}: letters, digits and _.:- or spaces, at most 120, starting with a letter or digit", 2)
        try:
            expires_at = utcnow() + timedelta(seconds=parse_duration(expires_in)) if expires_in is not None else None
        except ValueError as exc:
            fail(f"--expires-in: {exc}", 2)
        from sqlalchemy.exc import SQLAlchemyError

        from pipeboard.app.core.db import get_sessionmaker
        from pipeboard.app.services.tokens import create_token

        try:
            with get_sessionmaker()() as session:
                row, secret = create_token(session, name, scope, expires_at=expires_at, user=user)
                session.commit()
        except SQLAlchemyError as exc:
            fail(f"cannot write the token to the database (run `pipeboard migrate`?): {str(exc).splitlines()[0]}")
        typer.echo(secret)
        until = f", expires {expires_at.isoformat(timespec='seconds')}" if expires_at else ""
        typer.echo(f"token {row.id} {name!r} of user {user!r} scope={scope}{until}; store it now, it is not shown again",
                   err=True)

    @cli.command("submit")
    def submit(
        spec_file: Path = typer.Argument(..., help=(
            "Job spec (YAML), see examples/job.yaml. A one-line layout.schedule_file names a torch schedule CSV "
            "(relative to the YAML), sent as the job's own schedule (layout.schedule: custom). Or a `pipeboard tune "
            "--json` result: the job that trains its choice.")),
        wait: bool = typer.Option(False, "--wait", help="Follow live progress; exit 0 only if the job succeeds."),
        context: Optional[Path] = typer.Option(
            None, "--context", help="Your project folder: packed, uploaded (once per content) and registered, its "
            "task factory the spec's `model` (e.g. task.py:make_task); waits until a worker has validated it."),
        url: str = URL_OPTION,
        token: Optional[str] = TOKEN_OPTION,
        quiet: bool = typer.Option(False, "--quiet", "-q", help="With --wait: only the final line."),
    ) -> None:
        """Submit a job; with --wait follow it to the end (for CI)."""
        spec = load_spec(spec_file)
        api = Api(url, token)
        if context is not None:
            from pipeboard.app.cli.contexts import ensure_context, register_model

            spec["model"]["name"] = register_model(api, spec, ensure_context(api, context), quiet)
        job = api.call("POST", "/jobs", json=spec)
        typer.echo(f"job {job['id']} queued (position {job.get('queue_position')})")
        if wait:
            finish_with(wait_for(api, job["id"], quiet))

    @jobs_app.command("list")
    def jobs_list(
        status: Optional[str] = typer.Option(None, "--status", help="queued, running, succeeded, failed or cancelled."),
        limit: int = typer.Option(20, "--limit", min=1, max=1000),
        offset: int = typer.Option(0, "--offset", min=0),
        as_json: bool = typer.Option(False, "--json"),
        url: str = URL_OPTION,
        token: Optional[str] = TOKEN_OPTION,
    ) -> None:
        """List jobs, newest first."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if status:
            params["status"] = status
        page = Api(url, token).call("GET", "/jobs", params=params)
        if as_json:
            typer.echo(json.dumps(page, indent=1))
        else:
            print_table(page["data"], page["count"])

    @jobs_app.command("show")
    def jobs_show(job_id: int, url: str = URL_OPTION, token: Optional[str] = TOKEN_OPTION) -> None:
        """Print one job as JSON."""
        typer.echo(json.dumps(Api(url, token).call("GET", f"/jobs/{job_id}"), indent=1))

    @jobs_app.command("cancel")
    def jobs_cancel(job_id: int, url: str = URL_OPTION, token: Optional[str] = TOKEN_OPTION) -> None:
        """Cancel a queued or running job (its processes end)."""
        job = Api(url, token).call("POST", f"/jobs/{job_id}/cancel")
        typer.echo(f"job {job['id']} {job['status']}")

    @jobs_app.command("retry")
    def jobs_retry(
        job_id: int,
        wait: bool = typer.Option(False, "--wait"),
        url: str = URL_OPTION,
        token: Optional[str] = TOKEN_OPTION,
    ) -> None:
        """Queue a failed or cancelled job again: a new attempt, resuming from its newest checkpoint."""
        api = Api(url, token)
        job = api.call("POST", f"/jobs/{job_id}/retry")
        typer.echo(f"job {job['id']} {job['status']} (attempt {job['attempt']})")
        if wait:
            # From the retry on: the previous attempt's `end` is already in the log.
            finish_with(wait_for(api, job_id, after=max(0, job["last_event_seq"] - 1)))

