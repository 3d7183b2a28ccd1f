"""`pipeboard simulate`: the exact command form other scripts call, its JSON, files and errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeboard.app.cli import cli

runner = CliRunner()


def run(*args: str):
    return runner.invoke(cli, ["simulate", *args])


def test_json_gives_the_analytic_numbers():
    res = run("--stages", "4", "--fwd", "1", "--bwd", "2", "--schedule", "1f1b", "--microbatches", "8",
              "--weight-grads", "immediate", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["iteration_time_s"] == pytest.approx(0.033)
    assert data["bubble_fraction"] == pytest.approx(3 / 11)
    assert data["peak_activations"] == [4, 3, 2, 1]
    assert data["throughput"] == pytest.approx(8 / 0.033) and data["throughput_unit"] == "microbatches/s"
    assert len(data["utilization"]) == 4


def test_shared_links_slow_a_communication_bound_pipeline():
    args = ["--stages", "2", "--fwd", "0.1", "--bwd", "0.1", "--comm", "1", "--schedule", "gpipe", "--microbatches", "4"]
    free = json.loads(run(*args, "--json").stdout)
    shared = json.loads(run(*args, "--shared-links", "--json").stdout)
    assert shared["iteration_time_s"] > free["iteration_time_s"]


def test_interleaved_comm_and_human_output():
    res = run("--stages", "2", "--fwd", "1", "--bwd", "2", "--schedule", "interleaved-1f1b", "--chunks", "2",
              "--microbatches", "4", "--comm", "0.5")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "interleaved-1f1b: 2 stages x 2 chunks, 2 workers, 4 microbatches" in res.stdout
    assert "bubble" in res.stdout and "worker  stage" in res.stdout


def test_trace_and_gantt_files(tmp_path):
    trace, gantt = tmp_path / "t.json", tmp_path / "g.html"
    res = run("--stages", "3", "--fwd", "1", "--bwd", "2", "--schedule", "pipedream", "--microbatches", "6",
              "--weight-grads", "immediate", "--trace", str(trace), "--gantt", str(gantt), "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(trace.read_text())
    assert sum(e["ph"] == "X" for e in doc["traceEvents"]) == 3 * 6 * 2 + 3 * 6  # F, B and steps
    assert doc["otherData"]["schedule"] == "pipedream"
    assert "plotly" in gantt.read_text()[:200000].lower()


def test_a_plan_file(tmp_path):
    plan = {"format": "pipeboard.plan", "stages": [
        {"forward_s": 0.001, "backward_s": 0.002, "send_s": 0.0, "replicas": 1},
        {"forward_s": 0.002, "backward_s": 0.004, "send_s": 0.0, "replicas": 2},
    ]}  # fmt: skip
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    res = run(str(path), "--schedule", "gpipe", "--microbatches", "4", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["workers"] == 3 and len(data["utilization"]) == 3
    res = run(str(path), "--schedule", "dp", "--microbatches", "6", "--json")
    assert json.loads(res.stdout)["iteration_time_s"] == pytest.approx(2 * 0.009)  # 6 over 3 workers


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--stages", "4", "--fwd", "x", "--bwd", "2", "--schedule", "1f1b", "--microbatches", "8"], "--fwd"),
        (["--stages", "4", "--fwd", "1", "--bwd", "2", "--schedule", "nope", "--microbatches", "8"], "--schedule"),
        (["--stages", "4", "--fwd", "1", "--bwd", "2", "--microbatches", "8"], "--schedule: required"),
        (["--stages", "4", "--fwd", "1", "--bwd", "2", "--schedule", "1f1b"], "--microbatches: required"),
        (["--stages", "4", "--fwd", "1", "--schedule", "1f1b", "--microbatches", "8"], "--bwd: required"),
        (["--stages", "0", "--fwd", "1", "--bwd", "2", "--schedule", "1f1b", "--microbatches", "8"], "--stages"),
        (["--stages", "4", "--fwd", "-1", "--bwd", "2", "--schedule", "1f1b", "--microbatches", "8"], "--fwd"),
        (["--stages", "4", "--fwd", "1", "--bwd", "2", "--schedule", "1f1b", "--microbatches", "2.5"], "--microbatches"),
        (["--stages", "2", "--fwd", "1", "--bwd", "2", "--schedule", "1f1b", "--microbatches", "4", "--replicas", "1,x"], "--replicas"),
        (["--stages", "4", "--fwd", "1", "--bwd", "2", "--schedule", "interleaved-1f1b", "--chunks", "2",
          "--microbatches", "6"], "microbatches"),
        (["/no/such/plan.json", "--schedule", "1f1b", "--microbatches", "4"], "PLAN"),
        (["--stages", "4", "--fwd", "1", "--bwd", "2", "--schedule", "1f1b", "--microbatches", "8",
          "--trace", "/no/such/dir/t.json"], "cannot write"),
        (["--stages", "3", "--fwd", "1", "--bwd", "2", "--schedule", "1f1b", "--microbatches", "8",
          "--per-update", "4"], "--per-update: pipedream only"),
        (["--stages", "3", "--fwd", "1", "--bwd", "2", "--schedule", "pipedream", "--microbatches", "8",
          "--per-update", "0"], "--per-update"),
        (["--stages", "3", "--fwd", "1", "--bwd", "2", "--schedule", "pipedream", "--microbatches", "10",
          "--per-update", "4"], "whole number of batches of 4"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    res = run(*args)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in res.output


def test_a_plan_that_is_not_json(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("{nope")
    res = run(str(path), "--schedule", "1f1b", "--microbatches", "4")
    assert res.exit_code == 2 and "not JSON" in res.stderr
    path.write_text(json.dumps({"stages": []}))
    res = run(str(path), "--schedule", "1f1b", "--microbatches", "4")
    assert res.exit_code == 2 and "stages" in res.stderr
    res = run(str(path), "--stages", "2", "--schedule", "1f1b", "--microbatches", "4")
    assert res.exit_code == 2 and "not both" in res.stderr


def test_help_lists_the_schedules_the_builder_knows():
    from pipeboard.trainer.schedule import registry

    res = runner.invoke(cli, ["simulate", "--help"], env={"COLUMNS": "400"})
    assert res.exit_code == 0
    for spec in registry.specs():
        assert spec.name in res.stdout and spec.description in res.stdout


def test_pipedream_per_update_mirrors_train_batches(tmp_path):
    """--per-update K --microbatches K*N predicts `train --schedule pipedream --microbatches K` over N
    batches: the schedule build("pipedream", per_update=K) makes, its steps numbered by batch."""
    from pipeboard.trainer.schedule import build
    from pipeboard.trainer.schedule.action_costs import costs_uniform
    from pipeboard.trainer.schedule.simulator import simulate

    trace = tmp_path / "t.json"
    res = run("--stages", "3", "--fwd", "1", "--bwd", "2", "--schedule", "pipedream", "--microbatches", "12",
              "--per-update", "4", "--trace", str(trace), "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["per_update"] == 4 and data["batch_weight_grads"] is True
    expected = simulate(build("pipedream", 3, 12, per_update=4, batch_weight_grads=True),
                        costs_uniform(3, 1e-3, 2e-3))
    assert data["iteration_time_s"] == pytest.approx(expected.iteration_time_s)
    per_minibatch = json.loads(run("--stages", "3", "--fwd", "1", "--bwd", "2", "--schedule", "pipedream",
                                   "--microbatches", "12", "--json").stdout)
    assert per_minibatch["per_update"] == 1
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert sum(e["name"] == "step" for e in events) == 3 * 3  # one update per batch per stage
    assert {e["args"]["step"] for e in events} == {0, 1, 2}
    assert all(e["args"]["step"] == e["args"]["microbatch"] // 4 for e in events if e["args"]["microbatch"] >= 0)
    human = run("--stages", "3", "--fwd", "1", "--bwd", "2", "--schedule", "pipedream", "--microbatches", "12",
                "--per-update", "4")
    assert "12 microbatches, 4 per update" in human.stdout


def test_help_says_how_to_mirror_train():
    res = runner.invoke(cli, ["simulate", "--help"], env={"COLUMNS": "400"})
    assert res.exit_code == 0
    text = " ".join(res.stdout.split())
    assert "--per-update" in text and "pipeboard train --schedule pipedream --microbatches K" in text
    assert "minibatches/microbatches in total" in text
