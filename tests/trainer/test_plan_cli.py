"""`pipeboard plan PROFILE --workers N [N ...] --bandwidth B [B ...] ...`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeboard.app.cli import cli
from pipeboard.app.cli.common import text_table
from pipeboard.app.cli.plan import spread_multi_values
from tests.shared_data import graph_txt
from pipeboard.trainer.plan import Plan


@pytest.fixture()
def run():
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(cli, ["plan", *args])

    return invoke


def test_multi_value_options_are_spread():
    assert spread_multi_values(["p.txt", "--workers", "4", "4", "--bandwidth", "1e9", "2e9", "--json"]) == [
        "p.txt", "--workers", "4", "--workers", "4", "--bandwidth", "1e9", "--bandwidth", "2e9", "--json"]
    # A profile path after the list stays positional.
    assert spread_multi_values(["-n", "2", "2", "model.json"]) == ["-n", "2", "-n", "2", "model.json"]


def test_json_output_for_two_levels(run, tmp_path):
    out = tmp_path / "plan.json"
    result = run(str(graph_txt("alexnet")), "--workers", "4", "4", "--bandwidth", "10e9", "1.25e9", "--json",
                 "-o", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["predicted_time_s"] == pytest.approx(0.0150994944, rel=1e-12)
    assert data["single_worker_time_s"] == pytest.approx(0.085321, rel=1e-12)
    assert data["data_parallel_time_s"] > data["predicted_time_s"]
    assert [lv["level"] for lv in data["levels"]] == [1, 2]
    assert set(data["levels"][0]["stages"][0]) >= {"start", "end", "replicas"}
    assert data["levels"][1]["stages"][-1]["end"] == 22
    assert Plan.load(out).to_dict() == data


def test_table_says_which_state_graph(run):
    result = run(str(graph_txt("inception_v3")), "--workers", "4", "--bandwidth", "1e9", "--max-states", "300")
    assert result.exit_code == 0, result.output
    assert "linearised topological order" in result.output and "stages" in result.output
    result = run(str(graph_txt("resnet18")), "-n", "4", "-b", "1e9", "--straight")
    assert result.exit_code == 0 and "exact antichain states" in result.output
    lines = result.output.splitlines()
    header = lines.index("stages (times in ms per minibatch)") + 1
    assert lines[header].split() == ["#", "layers", "states", "x", "workers", "compute", "allreduce", "send", "time",
                                     "mem", "GB"]
    rows = lines[header + 1:header + 5]  # a straight pipeline on 4 workers: 4 stages, one worker each
    assert [row.split()[0] for row in rows] == ["0", "1", "2", "3"]
    assert [row.split()[-7:-5] for row in rows] == [["1", "0"], ["1", "1"], ["1", "2"], ["1", "3"]]  # x, workers
    # numbers right-aligned under their headings: each row as long as the header's line
    assert {len(row) for row in rows} == {len(lines[header])}
    assert lines[header + 5] == "" and lines[header + 6].startswith("level 1 (4 @ 1 GB/s): [0,")


def test_text_table_pads_columns_to_their_widest_cell():
    assert text_table("t", ["name", "n"], [["a", "1"], ["bbb", "22"]], left={"name"}) == [
        "t",
        "name   n",
        "a      1",
        "bbb   22",
    ]


def test_options_reach_the_planner(run):
    base = [str(graph_txt("resnet18")), "--workers", "4", "--bandwidth", "1e9", "--json"]
    straight = json.loads(run(*base, "--straight").output)
    assert straight["predicted_time_s"] == pytest.approx(0.201601, rel=1e-12)
    assert all(s["replicas"] == 1 for s in straight["stages"])
    mem = json.loads(run(*base, "--memory-constraint", "--memory", "16e9").output)
    assert mem["options"]["memory_constraint"] is True and mem["options"]["memory_bytes"] == 16e9
    fewer = json.loads(run(*base, "--fewer-workers", "--activation-compression", "2").output)
    assert fewer["options"]["fewer_workers"] is True and fewer["options"]["activation_compression"] == 2.0
    uniform = json.loads(run(*base, "--method", "uniform").output)
    assert uniform["method"] == "uniform" and len(uniform["stages"]) == 4


def test_compare_prints_a_throughput_table(run):
    result = run(str(graph_txt("vgg16")), "--workers", "4", "--bandwidth", "1e9", "--compare")
    assert result.exit_code == 0, result.output
    for method in ("pipedream", "uniform", "time", "params", "dp"):
        assert method in result.output
    data = json.loads(run(str(graph_txt("vgg16")), "-n", "4", "-b", "1e9", "--compare", "--json").output)
    assert [row["method"] for row in data["comparison"]] == ["pipedream", "uniform", "time", "params", "dp"]


@pytest.mark.parametrize("args,message", [
    (["--workers", "4", "4", "--bandwidth", "1e9"], "--bandwidth has 1"),
    (["--workers", "0", "--bandwidth", "1e9"], "workers (level 1): must be at least 1"),
    (["--workers", "four", "--bandwidth", "1e9"], "workers: 'four' is not a number"),
    (["--workers", "2.5", "--bandwidth", "1e9"], "workers: '2.5' is not a whole number"),
    (["--workers", "4", "--bandwidth", "-1e9"], "bandwidth (level 1): must be positive"),
    (["--workers", "4", "--bandwidth", "1e9", "--method", "magic"], "method: must be one of"),
    (["--workers", "4", "--bandwidth", "1e9", "--activation-compression", "0"], "activation_compression"),
    (["--workers", "8", "--bandwidth", "1e9", "--straight", "--memory-constraint", "--memory", "1e3"],
     "smallest memory per worker that fits"),
])
def test_bad_input_is_one_line_and_exit_code_2(run, args, message):
    result = run(str(graph_txt("alexnet")), *args)
    assert result.exit_code == 2
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.output


def test_missing_and_unreadable_profiles(run, tmp_path):
    result = run(str(tmp_path / "none.txt"), "--workers", "2", "--bandwidth", "1e9")
    assert result.exit_code == 2 and "no such file" in result.output
    bad = tmp_path / "bad.txt"
    bad.write_text("node1 -- X -- nonsense\n")
    result = run(str(bad), "--workers", "2", "--bandwidth", "1e9")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
