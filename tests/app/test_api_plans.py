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
