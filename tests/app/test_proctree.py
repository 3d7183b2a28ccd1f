"""Users' code ends whole: every process a validation or a phase started, setsid children too."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

from pipeboard.app.services import model_checks, proctree

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


def write_factory(folder: Path, body: str) -> None:
    (folder / "factory.py").write_text(textwrap.dedent(f'''
        import os, subprocess, sys, time

        def make_task(**kwargs):
            child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"],
                                     start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.pid"), "w") as fh:
                fh.write(str(child.pid))
            {body}
    '''))


def test_a_validation_whose_setsid_child_never_exits_fails_at_its_limit_with_nothing_left(tmp_path: Path):
    write_factory(tmp_path, "time.sleep(600)")
    result = model_checks.run_validation("factory.py:make_task", {}, None, tmp_path, time_limit_s=5,
                                         memory_bytes=4 << 30)
    assert not result["ok"] and "longer than 5 s" in result["message"], result
    child = int((tmp_path / "child.pid").read_text())
    assert not alive(child)


def test_a_failed_validation_leaves_no_setsid_child_either(tmp_path: Path):
    write_factory(tmp_path, "raise RuntimeError('no task here')")
    result = model_checks.run_validation("factory.py:make_task", {}, None, tmp_path, time_limit_s=120,
                                         memory_bytes=4 << 30)
    assert not result["ok"] and "no task here" in result["message"], result
    assert not alive(int((tmp_path / "child.pid").read_text()))

