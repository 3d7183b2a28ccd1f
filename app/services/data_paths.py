"""Where a job's or a model's `data` may point: under a configured data root, or inside the
model's own code context.

`data` used to be checked by asking whether the path exists: `/etc/shadow` answered 201 and
`/etc/nonexistent` 422, an oracle for any path on the server. Now every location outside the
roots gets the same answer, decided from the path's text and the roots alone (after resolving
links, so a link inside a root cannot lead out); only inside a root is existence checked.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeboard.app.services.errors import ServiceError


def not_allowed(data: str, field: str, roots: list[Path]) -> ServiceError:
    where = ", ".join(str(r) for r in roots) or "none set"
    return ServiceError(f"{field}: {data!r} is not an allowed data location: give a path under PIPEBOARD_DATA_ROOTS "
                        f"({where}) or, for a model in a code context, a path relative to its project",
                        status=422, field=field)


def check_data_root(data: str, roots: list[Path], field: str = "model.data") -> None:
    """`data` (absolute, or relative to this process's folder) must lie under one of `roots` and
    exist there; one 422 for every path outside them, existing or not."""
    resolved = Path(os.path.realpath(os.path.expanduser(data)))
    if not any(resolved == root or root in resolved.parents for root in roots):
        raise not_allowed(data, field, roots)
    if not resolved.exists():
        raise ServiceError(f"{field}: {data} does not exist", status=422, field=field)
