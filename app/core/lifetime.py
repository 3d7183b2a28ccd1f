"""A process the service starts ends with the worker that started it, and says what it measured
on the way out."""

from __future__ import annotations

import os
import signal
from pathlib import Path


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


class Terminated(BaseException):
    """SIGTERM arrived: the worker that started this run died (see above) or stopped the job.
    Raised in the main thread, not an Exception, so that the run stops its stage processes and
    hands what they reported to its sink (launch.run_training's cleanup) before it exits."""


def raise_on_sigterm() -> None:
    """The next SIGTERM raises ``Terminated``; later ones are ignored while it hands over (the
    worker's death and its supervisor's SIGTERM to the run's group both send one; SIGKILL, after
    the supervisor's grace, is the hard stop)."""

    def handler(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated("stopped by SIGTERM (its service worker ended, or the job was stopped)")

    signal.signal(signal.SIGTERM, handler)


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``; zombies, which have ended and only wait to be
    reaped (an orphan's parent may never do so), are not."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(stat.parent.name))
    return out


def group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))
