"""Users' code as a process tree that ends whole: every process it started, ``setsid`` ones too.

A process group is not enough: a factory that calls ``setsid`` (or double-forks into a new
session) leaves the group, and ``killpg`` never reaches it; a pipe it inherited keeps
``communicate()`` waiting for good. So a tree started here is found three ways, each of which
such a child cannot shed alone:

- its process group (the leader's pid: cancel and the reaper still use it);
- a mark in the environment every member inherits (``PIPEBOARD_TREE``, a fresh random value per
  tree; ``/proc/PID/environ`` keeps what a process was started with, whatever it later does to
  ``os.environ``);
- parentage: every descendant of a member. The spawning process becomes a child subreaper
  (``prctl(PR_SET_CHILD_SUBREAPER)``), so an orphan is re-parented to it rather than to init: it
  stays a descendant, and its zombie is reaped here.

``end(proc)`` kills the tree and waits for it, bounded: SIGKILL to every member, again, until
none is left or ``deadline_s`` passes; nothing here waits without a timeout.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable

log = logging.getLogger(__name__)

MARK_VAR = "PIPEBOARD_TREE"
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
END_DEADLINE_S = 5.0

_subreaper_lock = threading.Lock()
_subreaper: bool | None = None


def become_subreaper() -> bool:
    """Make this process the child subreaper of everything it starts (once); False where the
    kernel refuses (not Linux): orphans then go to init, and are still found by their mark."""
    global _subreaper
    with _subreaper_lock:
        if _subreaper is None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                _subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            except (OSError, AttributeError):
                _subreaper = False
        return _subreaper


def spawn(cmd: list[str], *, env: dict[str, str], cwd: str, stdout, preexec_fn: Callable[[], None] | None = None
          ) -> subprocess.Popen:
    """``cmd`` started as the leader of a new session and of a marked tree (stderr with stdout,
    no stdin). ``proc.tree_mark`` is the mark its members carry."""
    become_subreaper()
    mark = uuid.uuid4().hex
    proc = subprocess.Popen(cmd, cwd=cwd, env={**env, MARK_VAR: mark}, stdout=stdout, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=preexec_fn)
    proc.tree_mark = mark
    return proc


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of ``pid``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name in parentheses may hold spaces
    return fields[0], int(fields[1]), int(fields[2])


def _has_mark(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return needle in fh.read()
    except OSError:  # gone, a zombie's, or another user's
        return False


def members(proc: subprocess.Popen, *, zombies: bool = False) -> list[int]:
    """The tree's processes now (not this one), living ones only unless ``zombies``."""
    me = os.getpid()
    table: dict[int, tuple[str, int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            info = _stat(int(entry))
            if info is not None:
                table[int(entry)] = info
    needle = f"{MARK_VAR}={proc.tree_mark}\0".encode()
    found = {pid for pid, (_, _, pgid) in table.items() if pgid == proc.pid}
    found |= {pid for pid in table if pid not in found and _has_mark(pid, needle)}
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    stack = list(found)
    while stack:  # every descendant of a member is a member
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return sorted(pid for pid in found if zombies or table[pid][0] != "Z")


def _reap(pids: set[int]) -> None:
    """Reap those of ``pids`` that are this process's zombie children: the tree's orphans,
    re-parented here. Only pids seen alive in the tree: another Popen's child is left to it."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not a child of this process (re-parented to init, or gone)
            pass


def signal_tree(proc: subprocess.Popen, sig: int) -> list[int]:
    """Send ``sig`` to the group and to every member found; the members."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    found = members(proc)
    for pid in found:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    return found


def end(proc: subprocess.Popen, *, deadline_s: float = END_DEADLINE_S) -> int:
    """Kill the whole tree and reap it; the number of its processes still alive after
    ``deadline_s`` (0 but for one stuck in the kernel, which is logged)."""
    deadline = time.monotonic() + deadline_s
    seen: set[int] = set()
    while True:
        seen.update(signal_tree(proc, signal.SIGKILL))
        try:
            proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass
        # zombies too: members that died on their own, re-parented here (the leader is its Popen's
        # to reap, with its exit code)
        _reap((seen | set(members(proc, zombies=True))) - {proc.pid})
        left = members(proc)
        if not left and proc.poll() is not None:
            return 0
        if time.monotonic() > deadline:
            log.warning("process tree of %s: %s still alive %.0f s after SIGKILL", proc.pid, left, deadline_s)
            return len(left) + (proc.poll() is None)
