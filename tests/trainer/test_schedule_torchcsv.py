"""torch's schedule files in and out (trainer/schedule/torchcsv.py, `pipeboard schedule`): files
torch's own `_dump_csv` writes load, build, simulate and run in pipeboard; ours load in torch's
`_load_csv` action for action; a broken file is one line naming the rank and the action."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeboard.trainer.schedule import ScheduleError, build, costs_uniform, registry, simulate, validate
from pipeboard.trainer.schedule.torchcsv import dumps, export_rows, parse, read, register_file
from tests.trainer.schedule_runs import runtime_vs_one_process
from pipeboard.trainer.schedule.torch_reference import our_rows, torch_rows, torch_schedule

ROOT = Path(__file__).resolve().parents[2]
PIPEBOARD = [sys.executable, "-c", "from pipeboard.app.cli import main; main()"]


def torch_file(tmp_path, name: str, p: int, m: int, fmt: str = "compute_only") -> Path:
    path = tmp_path / f"{name}{'-comms' if fmt == 'compute_comms' else ''}.csv"
    torch_schedule(name, p, m)._dump_csv(str(path), format=fmt)
    return path


@pytest.fixture
def registered():
    names = []
    yield names
    for name in names:
        registry.unregister(name)


@pytest.mark.parametrize("name", ["interleaved-1f1b", "zbv"])
def test_a_torch_written_file_loads_builds_and_simulates_as_ours(tmp_path, registered, name):
    path = torch_file(tmp_path, name, 4, 8)
    tf = read(path)
    assert (tf.ranks, tf.chunks, tf.microbatches, tf.has_comms) == (4, 2, 8, False)
    assert tf.placement == ("v" if name == "zbv" else "loop")
    spec = register_file(path)
    registered.append(spec.name)
    assert spec.name == f"custom-{path.stem}" and spec.placement == tf.placement
    custom = build(spec.name, 4, 8)
    options = {"batch_weight_grads": False} if name == "interleaved-1f1b" else {}
    ours = build(name, 4, 8, **options)
    assert our_rows(custom) == our_rows(ours) == torch_rows(name, 4, 8)
    validate(custom)
    costs = costs_uniform(4, fwd_s=1.0, bwd_s=2.0)
    assert simulate(custom, costs).iteration_time_s == simulate(ours, costs).iteration_time_s


@pytest.mark.parametrize("name", ["interleaved-1f1b", "zbv", "interleaved-zb", "looped-bfs", "dualpipev"])
def test_a_torch_written_file_with_its_transfers_loads(tmp_path, name):
    tf = read(torch_file(tmp_path, name, 2, 8, "compute_comms"))
    assert tf.has_comms and (tf.ranks, tf.microbatches) == (2, 8)
    assert [[str(x) for x in p] for p in tf.programs] == [[str(x) for x in p] for p in parse(
        [[c for c in row] for row in torch_rows(name, 2, 8)]).programs]


@pytest.mark.parametrize("name", ["interleaved-1f1b", "zbv", "interleaved-zb", "looped-bfs", "dualpipev"])
def test_ours_loads_in_torch_action_for_action(tmp_path, name):
    options = {"batch_weight_grads": False} if name in ("interleaved-1f1b", "looped-bfs") else {}
    ours = build(name, 4, 8, **options)
    path = tmp_path / "ours.csv"
    path.write_text(dumps(export_rows(ours)))
    theirs = torch_schedule(name, 4, 8)
    original = {r: [a for a in acts if a is not None] for r, acts in theirs.pipeline_order.items()}
    theirs._load_csv(str(path))  # torch's own reader and its _validate_schedule
    assert {r: [a for a in acts if a is not None] for r, acts in theirs.pipeline_order.items()} == original
    with_comms = tmp_path / "ours-comms.csv"
    with_comms.write_text(dumps(export_rows(ours, comms=True)))
    theirs._load_csv(str(with_comms), format="compute_comms")
    compute = {r: [a for a in acts if a.is_compute_op] for r, acts in theirs.pipeline_order_with_comms.items()}
    assert compute == original


def rows_of(name: str, p: int, m: int) -> list[list[str]]:
    return [list(r) for r in torch_rows(name, p, m)]


def test_a_broken_file_is_one_line_naming_rank_and_action():
    rows = rows_of("zbv", 2, 4)
    # rank 1 runs its first down forward after the up forward that needs it: a deadlock
    swapped = [rows[0], [rows[1][1], rows[1][0]] + rows[1][2:]]
    with pytest.raises(ScheduleError) as info:
        parse(swapped)
    assert str(info.value) == "deadlock: rank 1 waits at 2F0 for 1F0, which it runs only later"
    missing = [rows[0], [c for c in rows[1] if c != "2W3"]]
    with pytest.raises(ScheduleError, match=r"^rank 1: 2W3 is missing$"):
        parse(missing)
    never = [rows[0][:-6] + rows[0][-5:], rows[1]]  # rank 0 drops a backward that rank 1's chain waits on
    with pytest.raises(ScheduleError) as info:
        parse(never)
    assert "\n" not in str(info.value) and str(info.value).startswith("rank 0: ")
    with pytest.raises(ScheduleError, match=r"^rank 0, column 2: '0X1' is not a torch action"):
        parse([["0F0", "0X1"]])
    with pytest.raises(ScheduleError, match=r"^rank 1: 0F0 runs stage 0, which rank 0 runs too$"):
        parse([["0F0", "0B0"], ["0F0"]])


def test_pipeboard_schedule_import_says_what_is_wrong_in_one_line_and_exit_2(tmp_path):
    rows = rows_of("zbv", 2, 4)
    broken = tmp_path / "broken.csv"
    broken.write_text(dumps([rows[0], [rows[1][1], rows[1][0]] + rows[1][2:]]))
    r = subprocess.run([*PIPEBOARD, "schedule", "import", str(broken)], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: {broken}: deadlock: rank 1 waits at 2F0 for 1F0, which it runs only later"]


def test_pipeboard_schedule_export_then_import_round_trips(tmp_path):
    out = tmp_path / "dualpipev.csv"
    r = subprocess.run([*PIPEBOARD, "schedule", "export", "dualpipev", "--stages", "2", "--microbatches", "8",
                        "--output", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.read_text().splitlines() == [",".join(row) for row in torch_rows("dualpipev", 2, 8)]
    r = subprocess.run([*PIPEBOARD, "schedule", "import", str(out), "--fwd", "1", "--bwd", "2", "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    import json

    got = json.loads(r.stdout)
    assert (got["schedule"], got["ranks"], got["chunks"], got["placement"]) == ("custom-dualpipev", 2, 2, "v")
    assert got["overlapped_pairs"] > 0 and got["iteration_ms"] > 0


def test_batched_weight_gradients_have_no_torch_form():
    with pytest.raises(ScheduleError, match="batched weight gradients \\(W\\(-1\\)\\) have no torch form"):
        export_rows(build("1f1b", 2, 4, batch_weight_grads=True))


def test_a_run_of_torchs_zbv_file_in_spawned_workers_equals_gradient_accumulation(tmp_path, registered, monkeypatch):
    path = torch_file(tmp_path, "zbv", 2, 8)
    monkeypatch.setenv(registry.ENV, str(path))  # the spawned workers register it from there
    registry.load_module(str(path))
    name = f"custom-{path.stem}"
    registered.append(name)
    against_one, trained = runtime_vs_one_process(tmp_path / "run", name, 2, microbatches=8)
    assert trained > 1e-4
    assert against_one < 1e-5
