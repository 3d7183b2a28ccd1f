"""Users' code ends whole: every process a validation or a phase started, setsid children too."""

from __future__ import annotations

import os
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from pipeboard.app.core.config import get_settings
from pipeboard.app.services import model_checks, proctree, sandbox

# A child that leaves the process group and the session (setsid) and never exits; its pid is
# written to CHILD_PID so the test can look for it afterwards.
ESCAPING_CHILD = textwrap.dedent('''
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"],
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.environ["CHILD_PID"], "w") as fh:
        fh.write(str(child.pid))
''')


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_end_kills_a_setsid_grandchild_the_group_cannot_reach(tmp_path: Path):
    pid_file = tmp_path / "child.pid"
    script = ESCAPING_CHILD + "time.sleep(600)\n"
    with open(tmp_path / "out.log", "wb") as out:
        proc = proctree.spawn([sys.executable, "-c", script], env={**os.environ, "CHILD_PID": str(pid_file)},
                              cwd=str(tmp_path), stdout=out)
    while not pid_file.exists() or not pid_file.read_text():
        assert proc.poll() is None, (tmp_path / "out.log").read_text()
        time.sleep(0.01)
    child = int(pid_file.read_text())
    assert os.getpgid(child) != proc.pid  # out of the group: killpg alone would miss it
    assert set(proctree.members(proc)) >= {proc.pid, child}
    assert proctree.end(proc) == 0
    assert not alive(child) and not alive(proc.pid) and proc.returncode == -9
    assert proctree.members(proc, zombies=True) == []


def test_an_orphaned_setsid_child_is_still_found_by_its_mark(tmp_path: Path):
    pid_file = tmp_path / "child.pid"
    with open(tmp_path / "out.log", "wb") as out:  # the leader exits at once: its child is an orphan
        proc = proctree.spawn([sys.executable, "-c", ESCAPING_CHILD], env={**os.environ, "CHILD_PID": str(pid_file)},
                              cwd=str(tmp_path), stdout=out)
        assert proc.wait(timeout=60) == 0
    child = int(pid_file.read_text())
    assert alive(child) and proctree.members(proc) == [child]
    assert proctree.end(proc) == 0 and not alive(child)


def running_with(token: str) -> list[int]:
    """Living processes whose command line holds ``token`` (pids differ inside a sandbox's own
    process namespace, so a factory's child is found by what it runs)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if token.encode() in fh.read() and alive(int(entry)):
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def write_factory(folder: Path, body: str) -> str:
    """A factory whose setsid child never exits; the token its child's command line holds."""
    token = f"never-exits-{uuid.uuid4().hex}"
    (folder / "factory.py").write_text(textwrap.dedent(f'''
        import os, subprocess, sys, time

        def make_task(**kwargs):
            child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)  # {token}"],
                                     start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.pid"), "w") as fh:
                fh.write(str(child.pid))
            {body}
    '''))
    return token


@pytest.fixture(params=["off", "on"])
def sandbox_mode(request, monkeypatch):
    """Each validation test with the sandbox off and on (on needs bubblewrap working here)."""
    if request.param == "on" and sandbox.probe() is not None:
        pytest.skip(sandbox.probe())
    monkeypatch.setenv("PIPEBOARD_SANDBOX", request.param)
    get_settings.cache_clear()
    yield request.param
    get_settings.cache_clear()


def test_a_validation_whose_setsid_child_never_exits_fails_at_its_limit_with_nothing_left(tmp_path: Path, sandbox_mode):
    token = write_factory(tmp_path, "time.sleep(600)")
    result = model_checks.run_validation("factory.py:make_task", {}, None, tmp_path, time_limit_s=20,
                                         memory_bytes=4 << 30)
    assert not result["ok"] and "longer than 20 s" in result["message"], result
    assert (tmp_path / "child.pid").exists()  # the child was started (the limit leaves time to import torch)
    assert running_with(token) == []


def test_a_failed_validation_leaves_no_setsid_child_either(tmp_path: Path, sandbox_mode):
    token = write_factory(tmp_path, "raise RuntimeError('no task here')")
    result = model_checks.run_validation("factory.py:make_task", {}, None, tmp_path, time_limit_s=120,
                                         memory_bytes=4 << 30)
    assert not result["ok"] and "no task here" in result["message"], result
    assert (tmp_path / "child.pid").exists() and running_with(token) == []
