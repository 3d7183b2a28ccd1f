"""POST /tune: the tuner over stored profiles; 4xx naming the field; a cap nothing fits."""

from __future__ import annotations

import pytest

from tests.trainer.tune_profiles import profiles


@pytest.fixture
def profile_ids(client) -> list[int]:
    ids = []
    for prof in profiles(32, counts=(2, 4, 8)):
        made = client.post("/api/v1/profiles/upload",
                           files={"file": (f"p{prof.batch_size}.json", prof.to_json().encode(), "application/json")})
        assert made.status_code == 201, made.text
        ids.append(made.json()["id"])
    return ids


def tune(client, **body):
    return client.post("/api/v1/tune", json=body)


def test_tune_ranks_every_candidate_and_gives_the_choice_as_a_job_layout(client, profile_ids):
    made = tune(client, profile_ids=profile_ids, workers=2, batch_size=32, microbatches=[2, 4, 8])
    assert made.status_code == 200, made.text
    body = made.json()
    assert body["choice"] == body["candidates"][0] and body["profile_ids"] == profile_ids
    times = [c["predicted_time_per_sample_s"] for c in body["candidates"]]
    assert times == sorted(times)
    assert {c["microbatches"] for c in body["candidates"]} == {2, 4, 8}
    layout = body["job_layout"]
    assert layout["schedule"] == body["choice"]["schedule"] and layout["microbatches"] == body["choice"]["microbatches"]
    assert body["run"]["model"] == "mlp" and body["run"]["workers"] == 2


def test_a_cap_marks_what_does_not_fit_and_why(client, profile_ids):
    free = tune(client, profile_ids=profile_ids, workers=2, batch_size=32, microbatches=[2, 4, 8]).json()
    cap = free["choice"]["predicted_memory_bytes"] - 1
    body = tune(client, profile_ids=profile_ids, workers=2, batch_size=32, microbatches=[2, 4, 8],
                memory_per_worker_bytes=cap).json()
    assert body["choice"]["fits"] and body["choice"]["predicted_memory_bytes"] <= cap
    over = [c for c in body["candidates"] if not c["fits"]]
    assert over and all(str(cap) in c["why"] for c in over)


def test_a_cap_nothing_fits_is_a_422_naming_the_smallest_need(client, profile_ids):
    made = tune(client, profile_ids=profile_ids, workers=2, batch_size=32, memory_per_worker_bytes=1000)
    assert made.status_code == 422
    detail = made.json()["detail"]
    assert detail.startswith("memory_per_worker_bytes: nothing fits in 1000 bytes per worker; the smallest any "
                             "candidate needs is ")


@pytest.mark.parametrize("change, field", [
    ({"workers": 0}, "workers"), ({"batch_size": 0}, "batch_size"), ({"schedules": ["zigzag"]}, "schedules"),
    ({"microbatches": [3]}, "batch_size"), ({"memory_per_worker_bytes": -1}, "memory_per_worker_bytes"),
    ({"model": "mlp"}, "profile_ids"),
])
def test_errors_name_the_field(client, profile_ids, change, field):
    made = tune(client, **({"profile_ids": profile_ids, "workers": 2, "batch_size": 32} | change))
    assert made.status_code == 422 and field in made.json()["detail"], made.text


def test_a_missing_profile_is_a_404(client):
    assert tune(client, profile_ids=[987654], workers=2, batch_size=32).status_code == 404


def test_a_model_without_a_cached_profile_gets_its_profiling_job(client):
    made = tune(client, model="mlp", workers=2, batch_size=32, microbatches=[4])
    assert made.status_code == 202, made.text
    job = made.json()["job"]
    assert job["spec"]["model"]["batch_size"] == 8 and job["spec"]["model"]["name"] == "mlp"
    # asked again, the same job
    assert tune(client, model="mlp", workers=2, batch_size=32, microbatches=[4]).json()["job"]["id"] == job["id"]
