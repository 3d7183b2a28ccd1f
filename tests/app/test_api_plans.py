"""Plans: the inline what-if on stored profiles; clear 4xx for bad clusters and schedules."""

from __future__ import annotations

import pytest

from tests.shared_data import graph_txt


@pytest.fixture
def profile_id(client) -> int:
    created = client.post("/api/v1/profiles/upload", files={"file": ("graph.txt", graph_txt("vgg16").read_bytes(), "text/plain")})
    assert created.status_code == 201, created.text
    return created.json()["id"]


def plan(client, **body):
    return client.post("/api/v1/plans", json=body)


def test_plan_returns_stages_prediction_and_dp_comparison(client, profile_id):
    made = plan(client, profile_id=profile_id, levels=[{"workers": 4, "bandwidth": 1e9}], schedule="1f1b", microbatches=8)
    assert made.status_code == 201, made.text
    body = made.json()
    stages = body["plan"]["stages"]
    assert sum(s["replicas"] for s in stages) <= 4 and stages[0]["layers"]
    predicted = body["predicted"]
    assert predicted["iteration_time_s"] > 0 and 0 <= predicted["bubble_fraction"] < 1
    assert predicted["speedup_vs_data_parallel"] == pytest.approx(
        predicted["data_parallel_time_per_minibatch_s"] / predicted["planner_time_per_minibatch_s"])
    assert predicted["timeline"] and predicted["timeline_total"] >= len(predicted["timeline"])
    assert {e["worker"] for e in predicted["timeline"]} == set(range(predicted["workers"]))
    assert client.get(f"/api/v1/plans/{body['id']}").json()["plan"] == body["plan"]


def test_methods_and_timeline_limit(client, profile_id):
    levels = [{"workers": 2, "bandwidth": 1e9}]
    uniform = plan(client, profile_id=profile_id, levels=levels, method="uniform", microbatches=16, timeline_limit=10).json()
    assert len(uniform["plan"]["stages"]) == 2 and len(uniform["predicted"]["timeline"]) == 10
    dp = plan(client, profile_id=profile_id, levels=levels, method="dp", schedule="dp", microbatches=4)
    assert dp.status_code == 201 and dp.json()["predicted"]["workers"] == 2
    hierarchical = plan(client, profile_id=profile_id, levels=[{"workers": 2, "bandwidth": 1e10}, {"workers": 2, "bandwidth": 1e9}])
    assert hierarchical.status_code == 201, hierarchical.text


def test_errors_name_the_field(client, profile_id):
    levels = [{"workers": 2, "bandwidth": 1e9}]
    no_workers = plan(client, profile_id=profile_id, levels=[{"workers": 0, "bandwidth": 1e9}])
    assert no_workers.status_code == 422 and "levels.0.workers" in no_workers.json()["detail"]
    bad_bw = plan(client, profile_id=profile_id, levels=[{"workers": 2, "bandwidth": -1}])
    assert bad_bw.status_code == 422 and "bandwidth" in bad_bw.json()["detail"]
    schedule = plan(client, profile_id=profile_id, levels=levels, schedule="zigzag")
    assert schedule.status_code == 422 and "schedule" in schedule.json()["detail"]
    both = plan(client, profile_id=profile_id, model="mlp-digits", levels=levels)
    assert both.status_code == 422 and "profile_id" in both.json()["detail"]
    unknown = plan(client, model="no-such-model", levels=levels)
    assert unknown.status_code == 422 and unknown.json()["detail"].startswith("model:")
    assert plan(client, profile_id=987654, levels=levels).status_code == 404
    huge = plan(client, profile_id=profile_id, levels=[{"workers": 65536, "bandwidth": 1e9}, {"workers": 64, "bandwidth": 1e9}])
    assert huge.status_code == 422 and "levels" in huge.json()["detail"]


# --- the profile cost model -------------------------------------------------------------------

OVERHEAD = {"microbatches": 4, "samples": [
    {"layers": 1, "last": False, "forward_ms": 0.05, "backward_ms": 0.02, "backward_input_ms": 0.04,
     "weight_call_ms": 0.1, "step_ms": 0.01},
    {"layers": 3, "last": False, "forward_ms": 0.09, "backward_ms": 0.04, "backward_input_ms": 0.06,
     "weight_call_ms": 0.3, "step_ms": 0.03},
    {"layers": 1, "last": True, "forward_ms": 0.2, "backward_ms": 0.05, "backward_input_ms": 0.08,
     "weight_call_ms": 0.1, "step_ms": 0.01}]}


def layer(name, f, b, bi, w16, opt, params):
    return {"name": name, "desc": "Linear" if params else "ReLU", "forward_ms": f, "backward_ms": b,
            "backward_input_ms": bi, "weight_batched_ms": w16, "optimizer_ms": opt, "parameter_bytes": params,
            "activation_bytes": 4096.0}


def v2_profile(link=True):
    """A hand-made calibrated profile at 4 samples: two Linear+ReLU pairs, weights timed at 16."""
    return {"format": "pipeboard.profile", "version": 2, "model": "hand", "batch_size": 4, "device": "cpu",
            "layers": [{"name": "x", "desc": "Input", "activation_bytes": 1024.0},
                       layer("fc1", 1.0, 2.0, 0.5, 3.0, 0.4, 4096.0), layer("relu1", 0.2, 0.2, 0.2, 0.05, 0.0, 0.0),
                       layer("fc2", 3.0, 5.0, 2.0, 6.0, 0.6, 8192.0), layer("relu2", 0.1, 0.1, 0.1, 0.0, 0.0, 0.0)],
            "edges": [["x", "fc1"], ["fc1", "relu1"], ["relu1", "fc2"], ["fc2", "relu2"]],
            "link": {"latency_ms": 0.3, "bytes_per_ms": 2048.0, "post_ms": 0.25} if link else None,
            "overhead": OVERHEAD, "weight_batch_size": 16}


def upload_json(client, data) -> int:
    import json

    made = client.post("/api/v1/profiles/upload", files={"file": ("p.json", json.dumps(data).encode(), "application/json")})
    assert made.status_code == 201, made.text
    return made.json()["id"]


def test_a_calibrated_profile_predicts_from_its_measurements(client):
    from pipeboard.app.services import planning
    from pipeboard.trainer.profile.schema import Profile
    from pipeboard.trainer.schedule.predict import profile_overhead, stage_costs, steady_step_s
    from pipeboard.trainer.schedule.simulator import simulate

    data = v2_profile()
    pid = upload_json(client, data)
    made = plan(client, profile_id=pid, levels=[{"workers": 2, "bandwidth": 1e9}], method="uniform", schedule="1f1b",
                microbatches=4, batch_size=16, timeline_limit=1000)
    assert made.status_code == 201, made.text
    body = made.json()
    predicted = body["predicted"]
    assert predicted["cost_model"] == "profile" and predicted["batch_weight_grads"] is True
    stages = [s["layers"] for s in body["plan"]["stages"]]
    assert len(stages) == 2 and stages[0][0] == "x" and stages[1][-1] == "relu2"

    prof = Profile.from_dict(data)
    costs = stage_costs(prof, stages, microbatches=4, overhead=profile_overhead(prof, stages))
    # By hand for the first stage: its layers' times, posting the activation's send, the
    # runtime's overhead of a one-Linear stage; W(-1) from the weights timed at the 16-sample batch.
    first = [lay for lay in data["layers"] if lay["name"] in stages[0]]
    fwd_ms = sum(lay.get("forward_ms", 0.0) for lay in first) + 0.25 + 0.05
    assert costs[0].fwd_s == pytest.approx(fwd_ms / 1e3)
    w16 = sum(lay["weight_batched_ms"] for lay in first if lay.get("parameter_bytes"))  # ReLU: no weights
    assert costs[0].bwd_weight_batched_s == pytest.approx((w16 + 0.1) / 4 / 1e3)
    assert costs[0].step_s == pytest.approx((sum(lay.get("optimizer_ms") or 0.0 for lay in first) + 0.01) / 1e3)
    assert costs[0].send_act_s == pytest.approx((0.3 + 4096.0 / 2048.0) / 1e3)
    sched = planning.runtime_schedule(body["plan"], "1f1b", 4, weight_grads="batched")
    expected = simulate(sched, costs)
    assert predicted["iteration_time_s"] == pytest.approx(expected.iteration_time_s)
    assert predicted["steady_step_s"] == pytest.approx(steady_step_s(costs, "1f1b", 4, batch_weight_grads=True))
    assert {e["kind"] for e in predicted["timeline"]} >= {"F", "BI", "W", "step", "send_act"}


def test_a_profile_without_what_predict_needs_falls_back_to_the_plan(client, profile_id):
    from pipeboard.app.services import planning
    from pipeboard.trainer.schedule.action_costs import costs_from_plan
    from pipeboard.trainer.schedule.simulator import simulate

    levels = [{"workers": 2, "bandwidth": 1e9}]
    for pid in (upload_json(client, v2_profile(link=False)), profile_id):  # no link; an imported graph.txt
        made = plan(client, profile_id=pid, levels=levels, method="uniform", schedule="1f1b", microbatches=4)
        assert made.status_code == 201, made.text
        body = made.json()
        assert body["predicted"]["cost_model"] == "plan" and body["predicted"]["steady_step_s"] is None
        sched = planning.runtime_schedule(body["plan"], "1f1b", 4)
        assert body["predicted"]["iteration_time_s"] == pytest.approx(
            simulate(sched, costs_from_plan(body["plan"])).iteration_time_s)


@pytest.mark.parametrize(("change", "field"), [
    ({"timeline_limit": False}, "timeline_limit"),
    ({"microbatches": True}, "microbatches"),
    ({"chunks": "2"}, "chunks"),
    ({"batch_size": 32.0}, "batch_size"),
    ({"levels": [{"workers": True, "bandwidth": 1e9}]}, "levels.0.workers"),
    ({"levels": [{"workers": 2, "bandwidth": True}]}, "levels.0.bandwidth"),
])
def test_booleans_and_strings_are_not_numbers(client, change, field):
    body = {"profile_id": 424242, "levels": [{"workers": 2, "bandwidth": 1e9}], "timeline_limit": 10, **change}
    refused = plan(client, **body)
    assert refused.status_code == 422 and refused.json()["detail"].startswith(f"{field}: "), refused.text
    assert plan(client, **{**body, **{"timeline_limit": 0, "microbatches": 4, "chunks": 1, "batch_size": 32,
                                      "levels": [{"workers": 2, "bandwidth": 1e9}]}}).status_code == 404  # valid: no such profile


def test_the_openapi_describes_the_plan_the_prediction_and_the_jobs_spec_and_summary(client):
    """No free-form object where the main payloads are: each is a schema with its properties, and
    so is every object inside them (a model's own arguments aside)."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]

    def resolve(node: dict) -> dict:
        while "$ref" in node:
            node = schemas[node["$ref"].rsplit("/", 1)[1]]
        return node

    def free_form(node: dict, path: str, seen: set[str]) -> list[str]:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[1]
            if name in seen:
                return []
            return free_form(schemas[name], path, seen | {name})
        found = []
        for key in ("anyOf", "oneOf", "allOf"):
            for i, option in enumerate(node.get(key, [])):
                found += free_form(option, path, seen)
        if "items" in node:
            found += free_form(node["items"], f"{path}[]", seen)
        for i, item in enumerate(node.get("prefixItems", [])):
            found += free_form(item, f"{path}[{i}]", seen)
        values = node.get("additionalProperties")
        if isinstance(values, dict) and values:  # a map whose values have a schema (fidelity terms by name)
            found += free_form(values, f"{path}{{}}", seen)
        elif node.get("type") == "object" and not node.get("properties") and not path.endswith(("args", "model_args")):
            found.append(path)
        for name, prop in node.get("properties", {}).items():
            found += free_form(prop, f"{path}.{name}", seen)
        return found

    payloads = {"JobPublic.spec": schemas["JobPublic"]["properties"]["spec"],
                "JobPublic.summary": schemas["JobPublic"]["properties"]["summary"],
                "PlanPublic.plan": schemas["PlanPublic"]["properties"]["plan"],
                "PlanPublic.predicted": schemas["PlanPublic"]["properties"]["predicted"],
                "TimelinePublic": {"$ref": "#/components/schemas/TimelinePublic"}}
    for where, node in payloads.items():
        assert free_form(node, where, set()) == [], where
    prediction = resolve(schemas["PlanPublic"]["properties"]["predicted"])
    assert "iteration_time_s" in prediction["properties"] and "timeline" in prediction["properties"]
    assert "stages" in resolve(schemas["PlanPublic"]["properties"]["plan"])["properties"]


# --- a model without a cached profile: profiled on a worker, never in the API process ----------

WHAT_IF = {"model": "mlp-digits", "model_args": {"hidden": 12}, "batch_size": 16, "microbatches": 2,
           "levels": [{"workers": 2, "bandwidth": 1e9}], "method": "time"}


def test_a_what_if_without_a_cached_profile_answers_202_with_one_profiling_job(client):
    first = client.post("/api/v1/plans", json=WHAT_IF)
    assert first.status_code == 202, first.text
    job = first.json()["job"]
    assert first.json()["status"] == "profiling" and job["status"] == "queued"
    spec = job["spec"]
    assert spec["calibrate_for"] == {"workers": 2, "batch_size": 16, "microbatches": 2, "weight_grads": "batched"}
    assert spec["model"]["batch_size"] == 8 and spec["model"]["args"] == {"hidden": 12}
    again = client.post("/api/v1/plans", json=WHAT_IF)  # the same run: the same job, not a second
    assert again.status_code == 202 and again.json()["job"]["id"] == job["id"]
    other = client.post("/api/v1/plans", json={**WHAT_IF, "microbatches": 4})
    assert other.status_code == 202 and other.json()["job"]["id"] != job["id"]


def test_a_registered_model_is_profiled_only_once_ready(client, session):
    from sqlalchemy import select

    from pipeboard.app.models import Model, ModelStatus, User

    owner = session.scalar(select(User.id).where(User.name == "admin"))  # the client's token's user: the model is its own
    session.add(Model(name="mine", source="pipeboard.trainer.zoo.digits:mlp_digits", kind="import",
                      status=ModelStatus.VALIDATING, config={}, owner_id=owner))
    session.flush()
    refused = client.post("/api/v1/plans", json={**WHAT_IF, "model": "mine", "model_args": {}})
    assert refused.status_code == 422 and refused.json()["detail"].startswith("model: 'mine' is still being validated")
    assert client.get("/api/v1/jobs", params={"kind": "profile"}).json()["count"] == 0


def test_a_what_if_plans_from_a_profile_calibrated_for_more(client, session, profile_id):
    """A profile whose batched weight gradients were timed too serves an immediate run: the
    profiling job reuses it (stores none of its own), so the what-if must find it, not ask again."""
    from pipeboard.app.models import Profile
    from pipeboard.app.schemas import PlanCreate
    from pipeboard.app.services import plans, profiles

    spec = plans.profile_spec(PlanCreate(**WHAT_IF, weight_grads="batched"))
    run = spec.calibrate_for
    _, _, default_args, _ = profiles.resolve_model(session, WHAT_IF["model"])
    batched = profiles.cache_key(WHAT_IF["model"], {**default_args, **WHAT_IF["model_args"]}, spec.model.batch_size,
                                 calibration=profiles.calibration_args(run.workers, run.batch_size, "batched",
                                                                       microbatches=run.microbatches))
    row = session.get(Profile, profile_id)
    row.name, row.origin = batched, "profiled"  # as the batched what-if's profiling job stored it
    session.commit()
    answer = client.post("/api/v1/plans", json={**WHAT_IF, "weight_grads": "immediate"})
    assert answer.status_code == 201, answer.text
    assert answer.json()["profile_id"] == profile_id


def test_the_comparison_against_data_parallel_is_the_steps_own_cost_model(client):
    """Under the profile cost model, data parallelism is predicted as its own run would be (the
    whole model replicated, schedule dp), and the one comparison is the ratio of the two steps."""
    from pipeboard.trainer import choose
    from tests.app.test_services_planning import calibrated_chain

    data = calibrated_chain()
    pid = upload_json(client, data)
    made = plan(client, profile_id=pid, levels=[{"workers": 2, "bandwidth": 5e9}], schedule="gpipe", microbatches=4,
                method="uniform", timeline_limit=0)
    assert made.status_code == 201, made.text
    predicted = made.json()["predicted"]
    assert predicted["cost_model"] == "profile"
    dp_plan = choose.choose_plan(data, [(2, 5e9)], memory_bytes=None, method="uniform")
    _, dp = choose.simulate_plan(dp_plan, "dp", 4, profile_data=data)
    assert dp.cost_model == "profile" and predicted["data_parallel_step_s"] == dp.steady_step_s
    assert predicted["speedup_vs_data_parallel"] == pytest.approx(dp.steady_step_s / predicted["steady_step_s"])
    assert predicted["speedup_vs_data_parallel"] != pytest.approx(
        predicted["data_parallel_time_per_minibatch_s"] / predicted["planner_time_per_minibatch_s"])


def test_an_interleaved_plan_is_set_against_data_parallelism_on_the_runs_workers(client):
    """An interleaved plan's stages sit on virtual workers (chunks on each of the run's): the
    comparison is data parallelism on the run's 2 workers, not on its 4 virtual ones."""
    from pipeboard.trainer import choose
    from tests.app.test_services_planning import calibrated_chain

    data = calibrated_chain(4)
    pid = upload_json(client, data)
    made = plan(client, profile_id=pid, levels=[{"workers": 2, "bandwidth": 5e9}], schedule="interleaved-1f1b",
                microbatches=4, chunks=2, timeline_limit=0)
    assert made.status_code == 201, made.text
    predicted = made.json()["predicted"]
    dp_plan = choose.choose_plan(data, [(2, 5e9)], memory_bytes=None, method="uniform")
    _, on_two = choose.simulate_plan(dp_plan, "dp", 4, profile_data=data)
    _, on_four = choose.simulate_plan(choose.choose_plan(data, [(4, 5e9)], memory_bytes=None, method="uniform"),
                                      "dp", 4, profile_data=data)
    assert on_two.steady_step_s != pytest.approx(on_four.steady_step_s)  # the two would tell apart
    assert predicted["data_parallel_step_s"] == pytest.approx(on_two.steady_step_s)
