"""`weight_grads` ("batched" | "immediate", as `pipeboard train --weight-grads`) through the service:
the job and what-if fields (default, explicit, refused values), the predicted timeline built with
the same choice, the run configuration a job runs with, and `pipeboard simulate --weight-grads`."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import update
from typer.testing import CliRunner

from pipeboard.app.cli import cli
from pipeboard.app.models import Job
from pipeboard.app.schemas import JobSpec
from pipeboard.app.services import planning
from pipeboard.app.services.runner import run_config
from tests.app.test_services_planning import calibrated_chain
from tests.shared_data import graph_txt

JOB = {"model": "mlp-digits", "workers": 2, "schedule": "1f1b", "microbatches": 4, "batch_size": 16, "stop": {"steps": 3}}
LEVELS = [{"workers": 2, "bandwidth": 1e9}]


def submit(client, **overrides):
    return client.post("/api/v1/jobs", json={**JOB, **overrides})


@pytest.fixture
def profile_id(client) -> int:
    created = client.post("/api/v1/profiles/upload", files={"file": ("graph.txt", graph_txt("vgg16").read_bytes(), "text/plain")})
    assert created.status_code == 201, created.text
    return created.json()["id"]


def compute_kinds(timeline: list[dict]) -> Counter:
    return Counter(e["kind"] for e in timeline if e["kind"] in ("F", "B", "BI", "W", "step"))


# --- jobs -------------------------------------------------------------------------------------


def test_a_job_defaults_to_batched_and_keeps_an_explicit_choice(client):
    default = submit(client)
    assert default.status_code == 201, default.text
    assert default.json()["spec"]["layout"]["weight_grads"] == "batched"
    chosen = submit(client, weight_grads="immediate")
    assert chosen.status_code == 201, chosen.text
    assert client.get(f"/api/v1/jobs/{chosen.json()['id']}").json()["spec"]["layout"]["weight_grads"] == "immediate"


@pytest.mark.parametrize("bad", ["lazy", "", 1, None])
def test_a_job_refuses_other_values_naming_the_field(client, bad):
    refused = submit(client, weight_grads=bad)
    assert refused.status_code == 422
    detail = refused.json()["detail"]
    assert detail.startswith("layout.weight_grads") and "batched" in detail and "immediate" in detail, detail


def test_openapi_describes_the_field(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for name in ("LayoutSection", "PlanCreate"):
        prop = schemas[name]["properties"]["weight_grads"]
        assert prop["default"] == "batched" and prop["enum"] == ["batched", "immediate"], prop
        assert "input gradients" in prop["description"] and "zb-h1" in prop["description"]


def plan_of(spec: JobSpec) -> dict:
    return planning.make_plan(calibrated_chain(), planning.levels_of(None, spec.layout.workers), memory_bytes=None,
                              method="uniform").to_dict()


def test_a_job_stored_without_the_field_reads_retries_and_trains_batched(client, session):
    job = submit(client).json()
    spec = {**job["spec"], "layout": {k: v for k, v in job["spec"]["layout"].items() if k != "weight_grads"}}
    session.execute(update(Job).where(Job.id == job["id"]).values(spec=spec))
    session.commit()
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["spec"]["layout"]["weight_grads"] == "batched"
    client.post(f"/api/v1/jobs/{job['id']}/cancel")
    retried = client.post(f"/api/v1/jobs/{job['id']}/retry")
    assert retried.status_code == 200 and retried.json()["status"] == "queued", retried.text
    typed = JobSpec.model_validate(spec)
    assert run_config(typed, plan_of(typed))["weight_grads"] == "batched"


# --- the command a job runs -------------------------------------------------------------------


@pytest.mark.parametrize("choice", ["batched", "immediate"])
def test_the_run_configuration_carries_the_choice(choice):
    from pipeboard.trainer.runtime.run_config import RunConfig

    spec = JobSpec.model_validate({**JOB, "method": "pipedream", "weight_grads": choice, "hyperparameters": {"seed": 3}})
    cfg = RunConfig.from_dict(run_config(spec, plan_of(spec)))
    assert cfg.weight_grads == choice
    assert (cfg.schedule, cfg.microbatches, cfg.seed) == ("1f1b", 4, 3)


# --- the what-if ------------------------------------------------------------------------------


def test_the_what_if_simulates_what_the_runtime_runs(client, profile_id):
    def what_if(**body):
        made = client.post("/api/v1/plans", json={"profile_id": profile_id, "levels": LEVELS, "method": "uniform",
                                                  "schedule": "1f1b", "microbatches": 4, **body})
        assert made.status_code == 201, made.text
        return made.json()

    default, immediate = what_if(), what_if(weight_grads="immediate")
    assert default["request"]["weight_grads"] == "batched" and immediate["request"]["weight_grads"] == "immediate"
    assert default["predicted"]["batch_weight_grads"] is True and immediate["predicted"]["batch_weight_grads"] is False
    # Batched: every backward is input gradients only, and each of the 2 workers runs one weight
    # pass for all 4 microbatches right before its step; immediate: full backwards, no W.
    assert compute_kinds(default["predicted"]["timeline"]) == Counter({"F": 8, "BI": 8, "W": 2, "step": 2})
    assert compute_kinds(immediate["predicted"]["timeline"]) == Counter({"F": 8, "B": 8, "step": 2})
    steps = [e for e in default["predicted"]["timeline"] if e["kind"] == "step"]
    for step in steps:  # the W of a worker ends before its step starts
        (w,) = [e for e in default["predicted"]["timeline"] if e["kind"] == "W" and e["worker"] == step["worker"]]
        assert w["end"] <= step["start"]
    # zb-h1 places its W one per microbatch and dp reduces inside the backward: both ignore it.
    for schedule in ("zb-h1", "dp"):
        batched = what_if(schedule=schedule, method="dp" if schedule == "dp" else "uniform")
        assert batched["predicted"]["batch_weight_grads"] is False
        plain = what_if(schedule=schedule, method="dp" if schedule == "dp" else "uniform", weight_grads="immediate")
        assert batched["predicted"]["timeline"] == plain["predicted"]["timeline"]


def test_the_what_if_refuses_other_values_naming_the_field(client, profile_id):
    refused = client.post("/api/v1/plans", json={"profile_id": profile_id, "levels": LEVELS, "weight_grads": "sometimes"})
    assert refused.status_code == 422 and refused.json()["detail"].startswith("weight_grads"), refused.text


# --- pipeboard simulate -----------------------------------------------------------------------


def simulate(*args: str):
    return CliRunner().invoke(cli, ["simulate", "--stages", "2", "--fwd", "1", "--bwd", "2", "--microbatches", "4", *args])


def simulated_kinds(tmp_path: Path, *args: str) -> tuple[dict, Counter]:
    trace = tmp_path / "trace.json"
    res = simulate(*args, "--trace", str(trace), "--json")
    assert res.exit_code == 0, res.output
    events = json.loads(trace.read_text())["traceEvents"]
    return json.loads(res.stdout), Counter(e["name"].rstrip("0123456789") for e in events if e.get("ph") == "X")


def test_simulate_defaults_to_batched_like_train(tmp_path):
    default, kinds = simulated_kinds(tmp_path, "--schedule", "1f1b")
    explicit, _ = simulated_kinds(tmp_path, "--schedule", "1f1b", "--weight-grads", "batched")
    immediate, plain_kinds = simulated_kinds(tmp_path, "--schedule", "1f1b", "--weight-grads", "immediate")
    assert default == explicit and default["batch_weight_grads"] is True
    assert immediate["batch_weight_grads"] is False
    assert default["iteration_time_s"] != immediate["iteration_time_s"]
    assert kinds["BI"] == 8 and kinds["W"] == 2 and kinds["B"] == 0
    assert plain_kinds["B"] == 8 and plain_kinds["BI"] == 0 and plain_kinds["W"] == 0
    human = simulate("--schedule", "pipedream")
    assert human.exit_code == 0 and "weight gradients batched before each update" in human.stdout


@pytest.mark.parametrize("schedule", ["zb-h1", "dp"])
def test_simulate_ignores_it_for_zb_h1_and_dp(tmp_path, schedule):
    batched, kinds = simulated_kinds(tmp_path, "--schedule", schedule, "--weight-grads", "batched")
    immediate, plain = simulated_kinds(tmp_path, "--schedule", schedule, "--weight-grads", "immediate")
    assert batched == immediate and kinds == plain and batched["batch_weight_grads"] is False


def test_simulate_split_backward_means_immediate_and_bad_values_are_named(tmp_path):
    split, kinds = simulated_kinds(tmp_path, "--schedule", "1f1b", "--split-backward")
    assert split["batch_weight_grads"] is False and kinds["W"] == 8  # one W per microbatch
    both = simulate("--schedule", "1f1b", "--split-backward", "--weight-grads", "batched")
    assert both.exit_code == 2 and "split_backward" in both.stderr
    bad = simulate("--schedule", "1f1b", "--weight-grads", "lazy")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --weight-grads:"), bad.stderr


# --- the predicted step is the run's step -----------------------------------------------------


def run_actions(plan: dict, schedule: str, microbatches: int, weight_grads: str) -> list[list[tuple]]:
    """Compute actions per worker of the step `pipeboard train --plan` runs (its layout, built as
    the workers build it)."""
    from pipeboard.trainer.runtime.run_config import RunConfig
    from pipeboard.trainer.runtime.layout import resolve

    cfg = RunConfig(model="mlp-digits", schedule=schedule, batch_size=8 * microbatches, microbatches=microbatches,
                    stages=[s["layers"] for s in plan["stages"]], replicas=[s["replicas"] for s in plan["stages"]],
                    weight_grads=weight_grads)
    built = resolve(cfg).build(microbatches)
    return [[(a.kind.value, a.microbatch) for a in acts if a.kind.value in ("F", "B", "BI", "W", "step")]
            for acts in built.actions]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "pipedream"])
@pytest.mark.parametrize("weight_grads", ["batched", "immediate"])
def test_the_predicted_timeline_runs_the_actions_of_a_run(client, profile_id, schedule, weight_grads):
    made = client.post("/api/v1/plans", json={"profile_id": profile_id, "levels": [{"workers": 4, "bandwidth": 1e9}],
                                              "method": "uniform", "schedule": schedule, "microbatches": 4,
                                              "weight_grads": weight_grads})
    assert made.status_code == 201, made.text
    body = made.json()
    expected = run_actions(body["plan"], schedule, 4, weight_grads)
    timeline = sorted(body["predicted"]["timeline"], key=lambda e: (e["worker"], e["start"], e["end"]))
    predicted = [[(e["kind"], e["microbatch"]) for e in timeline if e["worker"] == w and e["kind"] in ("F", "B", "BI", "W", "step")]
                 for w in range(len(expected))]
    assert predicted == expected
    if schedule == "pipedream":  # one update per batch of 4 microbatches, as the runtime does
        assert all(sum(kind == "step" for kind, _ in acts) == 1 for acts in predicted)
