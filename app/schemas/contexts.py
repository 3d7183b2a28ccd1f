"""Code contexts: the uploaded projects models live in."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class ContextPublic(BaseModel):
    sha256: str = Field(description="SHA-256 of the archive's bytes: its id.")
    filename: str
    kind: Literal["tar.gz", "zip"]
    size: int = Field(description="Archive bytes.")
    files: int = Field(description="Regular files in it.")
    unpacked_bytes: int
    created_at: datetime | None = None
