"""Serving the dashboard (static files in `frontend/`) from the API."""

from fastapi import FastAPI


def mount_frontend(app: FastAPI) -> None:
    """Mount the dashboard at `/` (filled in by the dashboard issue)."""
