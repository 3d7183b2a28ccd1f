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

CASES = [  # (profile, workers, method, schedule, microbatches, weight_grads, recompute, memory cap)
    ("chain", 2, "pipedream", "1f1b", 4, "batched", "none", None),
    ("chain", 3, "pipedream", "gpipe", 6, "immediate", "none", None),
    ("chain", 2, "pipedream", "zb-h1", 4, "batched", "none", None),
    ("chain", 2, "pipedream", "pipedream", 4, "batched", "none", None),
    ("chain", 2, "uniform", "1f1b", 8, "batched", "none", None),
    ("hand", 2, "pipedream", "1f1b", 4, "batched", "none", None),
    ("vgg16", 4, "pipedream", "1f1b", 8, "batched", "none", None),  # a graph.txt: the plan's own costs
    ("chain", 2, "pipedream", "1f1b", 4, "batched", "all", None),
    ("chain", 2, "uniform", "gpipe", 4, "batched", [1], None),
    ("chain", 2, "pipedream", "1f1b", 4, "batched", "none", 51456.0),  # a cap the choice meets by recompute
    ("vgg16", 4, "pipedream", "gpipe", 8, "batched", "none", 2e10),
]
COMPARED = ("iteration_time_s", "steady_step_s", "peak_memory_bytes", "bubble_fraction", "cost_model",
            "batch_weight_grads", "speedup_vs_data_parallel", "planner_time_per_minibatch_s", "data_parallel_step_s",
            "stage_memory_bytes", "recompute_stages")


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
    name, workers, method, schedule, microbatches, weight_grads, recompute, cap = case
    data, text, path = profile_of(name, tmp_path)
    if text:
        made = client.post("/api/v1/profiles/upload", files={"file": ("graph.txt", text, "text/plain")})
        assert made.status_code == 201, made.text
        pid = made.json()["id"]
    else:
        pid = upload_json(client, data)
    served = client.post("/api/v1/plans", json={
        "profile_id": pid, "levels": [{"workers": workers, "bandwidth": 5e9}], "method": method,
        "schedule": schedule, "microbatches": microbatches, "weight_grads": weight_grads, "timeline_limit": 0,
        "recompute": recompute, **({"memory_bytes": cap} if cap else {})})
    assert served.status_code == 201, served.text
    flag = recompute if isinstance(recompute, str) else ",".join(map(str, recompute))
    answer = CliRunner().invoke(cli, ["plan", path, "--workers", str(workers), "--bandwidth", "5e9", "--method", method,
                                      "--schedule", schedule, "--microbatches", str(microbatches),
                                      "--weight-grads", weight_grads, "--recompute", flag, "--json",
                                      *(["--memory", str(cap)] if cap else [])])
    assert answer.exit_code == 0, answer.output
    printed = json.loads(answer.output)
    assert stages_of(printed) == stages_of(served.json()["plan"])
    assert printed.get("options", {}).get("recompute") == served.json()["plan"]["options"].get("recompute")
    for key in COMPARED:
        assert printed["predicted"][key] == served.json()["predicted"][key], key
    predicted = served.json()["predicted"]
    if recompute != "none":  # what was asked recomputes
        asked = list(range(len(predicted["stage_memory_bytes"]))) if recompute == "all" else recompute
        assert set(asked) <= set(predicted["recompute_stages"])
    if cap:
        assert max(predicted["stage_memory_bytes"]) <= cap


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
    assert answer.exit_code == 2 and "--schedule: give it without" in answer.output
    answer = CliRunner().invoke(cli, ["plan", path, "--workers", "2", "--bandwidth", "5e9", "--schedule", "nope"])
    assert answer.exit_code == 2 and "--schedule: unknown schedule 'nope'" in answer.output


def test_a_cap_turns_recompute_on_where_a_stage_would_not_fit(client):
    """Under a cap between the plan's memory with and without recompute, the service's plan
    recomputes, its memory per stage fits, and a cap nothing fits is a 422 naming memory_bytes
    and the smallest need."""
    pid = upload_json(client, calibrated_chain())
    body = {"profile_id": pid, "levels": [{"workers": 2, "bandwidth": 5e9}], "schedule": "1f1b", "microbatches": 4,
            "timeline_limit": 0}
    plain = client.post("/api/v1/plans", json=body).json()["predicted"]
    redone = client.post("/api/v1/plans", json={**body, "recompute": "all"}).json()["predicted"]
    assert plain["recompute_stages"] == [] and max(redone["stage_memory_bytes"]) < max(plain["stage_memory_bytes"])
    assert redone["steady_step_s"] > plain["steady_step_s"]  # the replayed forward costs time
    cap = (max(plain["stage_memory_bytes"]) + max(redone["stage_memory_bytes"])) / 2
    capped = client.post("/api/v1/plans", json={**body, "memory_bytes": cap})
    assert capped.status_code == 201, capped.text
    assert capped.json()["predicted"]["recompute_stages"] and max(capped.json()["predicted"]["stage_memory_bytes"]) <= cap
    assert any(capped.json()["plan"]["options"]["recompute"])
    refused = client.post("/api/v1/plans", json={**body, "memory_bytes": 1000})
    assert refused.status_code == 422 and "memory_bytes" in refused.text and "smallest any plan needs" in refused.text


@pytest.mark.parametrize("recompute, field", [("some", "recompute"), ([-1], "recompute"), ([0, 0], "recompute"),
                                              ([7], "recompute"), (True, "recompute")])
def test_bad_recompute_is_a_422_naming_the_field(client, recompute, field):
    pid = upload_json(client, calibrated_chain())
    answer = client.post("/api/v1/plans", json={"profile_id": pid, "levels": [{"workers": 2, "bandwidth": 5e9}],
                                                "schedule": "1f1b", "microbatches": 4, "recompute": recompute})
    assert answer.status_code == 422, answer.text
    assert field in answer.text and "Traceback" not in answer.text


def test_the_cli_refuses_bad_recompute_in_one_line(tmp_path):
    _, _, path = profile_of("chain", tmp_path)
    answer = CliRunner().invoke(cli, ["plan", path, "--workers", "2", "--bandwidth", "5e9", "--schedule", "1f1b",
                                      "--recompute", "some"])
    assert answer.exit_code == 2 and answer.output.strip().startswith("error: --recompute:")
    assert len(answer.output.strip().splitlines()) == 1
