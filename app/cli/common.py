"""Helpers the `pipeboard` commands share: one-line errors and `--model-arg k=v` parsing."""

from __future__ import annotations

from typing import Any, NoReturn

import typer


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one line on stderr and exit with `code` (2: bad input), never a traceback."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def parse_model_args(pairs: list[str]) -> dict[str, Any]:
    """`k=v` strings to keyword arguments; values become int, float or bool where they read so."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--model-arg {pair!r}: expected key=value")
        value: Any = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            for cast in (int, float):
                try:
                    value = cast(raw)
                    break
                except ValueError:
                    pass
        out[key.strip()] = value
    return out
