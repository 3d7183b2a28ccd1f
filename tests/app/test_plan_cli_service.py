"""`pipeboard plan` and `POST /plans` give the same plan and the same prediction for the same input:
both call trainer/choose.py (PipeDream's plan against the baselines under the cost model that
predicts the run), the CLI with --schedule."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeboard.app.cli import cli
from pipeboard.trainer import choose
from pipeboard.trainer.plan import plan as planner_plan
from pipeboard.trainer.profile.schema import Profile
from tests.app.test_api_plans import upload_json, v2_profile
from tests.app.test_services_planning import calibrated_chain
from tests.shared_data import graph_txt

CASES = [  # (profile, workers, method, schedule, microbatches, weight_grads)
    ("chain", 2, "pipedream", "1f1b", 4, "batched"),
    ("chain", 3, "pipedream", "gpipe", 6, "immediate"),
    ("chain", 2, "pipedream", "zb-h1", 4, "batched"),
    ("chain", 2, "pipedream", "pipedream", 4, "batched"),
    ("chain", 2, "uniform", "1f1b", 8, "batched"),
    ("hand", 2, "pipedream", "1f1b", 4, "batched"),
    ("vgg16", 4, "pipedream", "1f1b", 8, "batched"),  # a graph.txt: the plan's own costs
]
COMPARED = ("iteration_time_s", "steady_step_s", "peak_memory_bytes", "bubble_fraction", "cost_model",
            "batch_weight_grads", "speedup_vs_data_parallel", "planner_time_per_minibatch_s")


def profile_of(name: str, tmp_path) -> tuple[dict, bytes, str]:
    if name == "vgg16":
        text = graph_txt("vgg16").read_bytes()
        path = tmp_path / "graph.txt"
        path.write_bytes(text)
        return {}, text, str(path)
    data = calibrated_chain() if name == "chain" else v2_profile()
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return data, b"", str(path)


def stages_of(plan: dict) -> list[tuple[list[str], int]]:
    return [(st["layers"], st["replicas"]) for st in plan["stages"]]


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_the_cli_and_the_service_give_one_plan_and_one_prediction(case, client, tmp_path):
    name, workers, method, schedule, microbatches, weight_grads = case
    data, text, path = profile_of(name, tmp_path)
    if text:
        made = client.post("/api/v1/profiles/upload", files={"file": ("graph.txt", text, "text/plain")})
        assert made.status_code == 201, made.text
        pid = made.json()["id"]
    else:
        pid = upload_json(client, data)
    served = client.post("/api/v1/plans", json={
        "profile_id": pid, "levels": [{"workers": workers, "bandwidth": 5e9}], "method": method,
        "schedule": schedule, "microbatches": microbatches, "weight_grads": weight_grads, "timeline_limit": 0})
    assert served.status_code == 201, served.text
    answer = CliRunner().invoke(cli, ["plan", path, "--workers", str(workers), "--bandwidth", "5e9", "--method", method,
                                      "--schedule", schedule, "--microbatches", str(microbatches),
                                      "--weight-grads", weight_grads, "--json"])
    assert answer.exit_code == 0, answer.output
    printed = json.loads(answer.output)
    assert stages_of(printed) == stages_of(served.json()["plan"])
    for key in COMPARED:
        assert printed["predicted"][key] == served.json()["predicted"][key], key


def test_the_choice_is_the_ranking_not_the_planners_objective_alone():
    """On this profile the ranking picks another plan than PipeDream's own objective, so a CLI that
    planned without it would disagree with the service (what the test above would catch)."""
    data = calibrated_chain()
    levels = [(3, 5e9)]
    planned = planner_plan(Profile.from_dict(data), levels=levels)
    chosen = choose.choose_plan(data, levels, memory_bytes=None, method="pipedream", schedule="gpipe", microbatches=6,
                                weight_grads="immediate")
    ranked = choose.ranked_candidates(data, levels, planned, "gpipe", 6, weight_grads="immediate")
    assert stages_of(chosen.to_dict()) == stages_of(ranked[0][1].to_dict())
    assert stages_of(chosen.to_dict()) != stages_of(planned.to_dict())
    assert len(ranked) >= 2 and [t for t, _ in ranked] == sorted(t for t, _ in ranked)


def test_the_cli_refuses_what_the_service_has_no_field_for(tmp_path):
    _, _, path = profile_of("chain", tmp_path)
    answer = CliRunner().invoke(cli, ["plan", path, "--workers", "2", "--bandwidth", "5e9", "--schedule", "1f1b",
                                      "--straight"])
    assert answer.exit_code == 2 and "--schedule: without --memory" in answer.output
    answer = CliRunner().invoke(cli, ["plan", path, "--workers", "2", "--bandwidth", "5e9", "--schedule", "nope"])
    assert answer.exit_code == 2 and "--schedule: unknown schedule 'nope'" in answer.output
