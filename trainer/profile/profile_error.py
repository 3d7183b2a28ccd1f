"""ProfileError, the error of every profile reader (JSON and graph.txt), and the number check the
JSON readers share: apart so that schema.py and calibration_records.py both import them and not
each other."""

from __future__ import annotations

import math
from typing import Any


class ProfileError(ValueError):
    """A profile (JSON or graph.txt) that cannot be read; the message names where and what."""


def is_size(x: Any) -> bool:
    """A finite, non-negative number (times and byte counts)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
