"""`pipeboard` commands of this area (filled in by its issue)."""

from __future__ import annotations

import typer


def register(cli: typer.Typer) -> None:
    """Add this module's commands to the `pipeboard` app."""
