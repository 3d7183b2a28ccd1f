"""`pipeboard up`'s supervision, with real (short-lived) child processes and a given clock: a
child that exits is started again after a delay that doubles while it keeps dying soon after its
starts (up to a cap), and from the base delay again once it has run a while; each exit is said
in one line and handed to `on_exit` first."""

from __future__ import annotations

import subprocess

from pipeboard.app.cli.supervise import BASE_DELAY_S, MAX_DELAY_S, STABLE_S, Child, Supervisor, describe_exit


def exits(code: int):
    return lambda: subprocess.Popen(["sh", "-c", f"exit {code}"])


def test_a_child_that_keeps_dying_is_restarted_with_doubling_delays_then_the_base_again():
    lines, exited = [], []
    child = Child("worker w1", exits(3), node="w1")
    supervisor = Supervisor([child], say=lines.append, on_exit=lambda c, code: exited.append((c.node, code)))
    now = 1000.0
    supervisor.start_all()
    child.started_at = now
    delays = []
    for _ in range(9):
        child.process.wait()
        supervisor.check(now + 1)  # noticed a second after its start: a quick failure
        delays.append(child.restart_at - (now + 1))
        now = child.restart_at
        supervisor.check(now)  # due: started again
        assert child.restart_at is None and child.started_at == now
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert delays == [min(MAX_DELAY_S, BASE_DELAY_S * 2 ** i) for i in range(9)]
    assert exited == [("w1", 3)] * 9 and child.restarts == 9
    assert lines[0] == "pipeboard: worker w1 exited with code 3 after 1.0 s; restarting it in 0.5 s (restart 1)"
    child.process.wait()
    supervisor.check(now + STABLE_S + 1)  # it had run a while: the base delay again
    assert child.restart_at - (now + STABLE_S + 1) == BASE_DELAY_S


def test_exit_codes_name_their_signal():
    assert describe_exit(-9) == "code -9 (SIGKILL)" and describe_exit(2) == "code 2"
