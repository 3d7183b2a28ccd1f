"""A process the service starts ends with the worker that started it."""

from __future__ import annotations

import os
import signal


def die_with_parent_if_asked() -> None:
    """Under a service worker (``$PIPEBOARD_PARENT_PID`` names it, and it is still our parent):
    get SIGTERM when it dies (Linux PR_SET_PDEATHSIG), so a run whose worker was killed ends at
    once instead of training on unobserved; its process group is its own, out of the worker's."""
    parent = os.environ.get("PIPEBOARD_PARENT_PID")
    if not parent:
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != parent:  # the worker died before the line above
        os.kill(os.getpid(), signal.SIGTERM)
