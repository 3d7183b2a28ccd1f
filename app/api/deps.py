"""Dependencies shared by the API routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from sqlalchemy.orm import Session

from pipeboard.app.core.config import Settings, get_settings
from pipeboard.app.core.db import get_session

# Tests override `get_session` (app.dependency_overrides) to run each request in their
# rolled-back transaction; routes only ever ask for `SessionDep`.
SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]

__all__ = ["SessionDep", "SettingsDep", "get_session"]
