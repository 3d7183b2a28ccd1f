"""`pipeboard tune` and `pipeboard train --tuned`: the ranked table and JSON, the cap nothing
fits (one line, exit 2), a real model tuned, verified by a short run and trained from the file."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeboard.app.cli import cli
from tests.trainer.tune_profiles import profiles


@pytest.fixture()
def profile_files(tmp_path):
    paths = []
    for prof in profiles(32, counts=(2, 4, 8)):
        path = tmp_path / f"profile{prof.batch_size}.json"
        prof.save(path)
        paths.append(str(path))
    return paths


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_json_has_the_choice_and_every_candidate(profile_files):
    result = invoke("tune", *profile_files, "--workers", "2", "--batch-size", "32", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["choice"] == doc["candidates"][0]
    for c in doc["candidates"]:
        assert {"plan", "schedule", "microbatches", "recompute", "predicted_step_s", "predicted_memory_bytes",
                "measured_step_s"} <= set(c)
        assert c["measured_step_s"] is None
    assert {c["microbatches"] for c in doc["candidates"]} == {2, 4, 8}
    assert doc["run"]["model"] == "mlp" and doc["run"]["workers"] == 2


def test_the_table_ends_with_the_choice(profile_files):
    result = invoke("tune", *profile_files, "--workers", "2", "--batch-size", "32", "--schedule", "1f1b",
                    "--schedule", "gpipe")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[-1].startswith("choice: ") and "fits" in result.output
    assert all(("1f1b" in line or "gpipe" in line) for line in lines[3:-1])


def test_a_cap_nothing_fits_is_one_line_naming_the_smallest_need(profile_files):
    result = invoke("tune", *profile_files, "--workers", "2", "--batch-size", "32", "--memory-per-worker", "1000")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: --memory-per-worker: nothing fits in 1000 bytes per worker; "
                               "the smallest any candidate needs is ")


@pytest.mark.parametrize("args, word", [
    (["--workers", "0"], "--workers"), (["--microbatches", "x"], "--microbatches"),
    (["--schedule", "nope"], "--schedule"), (["--memory-per-worker", "-5"], "--memory-per-worker"),
    (["--microbatches", "3"], "--batch-size"),
])
def test_bad_input_is_one_line_naming_the_option(profile_files, args, word):
    base = {"--workers": "2", "--batch-size": "32"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    flat = [x for kv in base.items() for x in kv]
    result = invoke("tune", *profile_files, *flat)
    assert result.exit_code == 2 and result.output.startswith(f"error: {word}"), result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_model_is_tuned_verified_and_trained_from_the_file(tmp_path):
    out = tmp_path / "tune.json"
    result = invoke("tune", "mlp", "--model-arg", "depth=2", "--model-arg", "width=16", "--workers", "2",
                    "--batch-size", "8", "--microbatches", "2", "--schedule", "1f1b", "--schedule", "gpipe",
                    "--no-calibrate", "--verify", "2", "--verify-steps", "4", "--json", "-o", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    measured = [c for c in doc["candidates"] if c["measured_step_s"] is not None]
    assert len(measured) == 2 and doc["verified"] == 2 and all(c["measured_step_s"] > 0 for c in measured)
    # re-ranked by measurement: the measured ones first, fastest first
    assert doc["candidates"][:2] == sorted(measured, key=lambda c: c["measured_step_s"])
    assert doc["choice"] == doc["candidates"][0]
    trained = invoke("train", "--tuned", str(out), "--steps", "3", "--json")
    assert trained.exit_code == 0, trained.output
    summary = json.loads(trained.output.strip().splitlines()[-1])
    assert summary["steps"] == 3
    assert summary.get("schedule", doc["choice"]["schedule"]) == doc["choice"]["schedule"]


def test_tuned_refuses_layout_options_and_files_that_are_not_tune_results(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"choice": {}}))
    result = invoke("train", "--tuned", str(bad), "--steps", "2")
    assert result.exit_code == 2 and result.output.startswith("error: --tuned: "), result.output
    result = invoke("train", "--tuned", str(bad), "--schedule", "gpipe", "--steps", "2")
    assert result.exit_code == 2 and "--schedule: with --tuned" in result.output


def test_a_tune_file_is_submitted_as_the_job_that_trains_its_choice(profile_files, tmp_path):
    from pipeboard.app.cli.jobs import load_spec

    out = tmp_path / "tune.json"
    result = invoke("tune", *profile_files, "--workers", "2", "--batch-size", "32", "--schedule", "1f1b",
                    "--memory-per-worker", "1e9", "-o", str(out))
    assert result.exit_code == 0, result.output
    choice = json.loads(out.read_text())["choice"]
    spec = load_spec(out)  # what `pipeboard submit tune.json` sends
    assert spec["model"]["name"] == "mlp" and spec["model"]["batch_size"] == 32
    layout = spec["layout"]
    assert (layout["schedule"], layout["microbatches"], layout["workers"]) == ("1f1b", choice["microbatches"], 2)
    assert layout["split"] == [{"layers": st["layers"], "replicas": st["replicas"]} for st in choice["plan"]["stages"]]
    assert layout["recompute"] == ("all" if all(choice["recompute"]) else "none" if not any(choice["recompute"])
                                   else [i for i, on in enumerate(choice["recompute"]) if on])


def test_a_spec_is_profiled_with_the_calibration_the_services_tuner_reads(monkeypatch):
    """`pipeboard tune SPEC` asks each microbatch size for the calibrated profile that POST /tune
    finds cached: the what-if profiling job's own flags for that run."""
    from pipeboard.app.cli import profile as cli_profile
    from pipeboard.app.schemas import PlanCreate
    from pipeboard.app.services import plans, profile_run, profiles as profile_service

    asked: dict[int, dict] = {}
    canned = {p.batch_size: p for p in profiles(32, counts=(2, 4))}

    def fake_measure(spec, *, batch_size, calibration, **_):
        asked[batch_size] = calibration
        return canned[batch_size]

    monkeypatch.setattr(cli_profile, "measure", fake_measure)
    result = invoke("tune", "mlp", "--workers", "2", "--batch-size", "32", "--microbatches", "2,4", "--json")
    assert result.exit_code == 0, result.output
    assert sorted(asked) == [8, 16]
    for size, calibration in asked.items():
        body = PlanCreate(model="mlp", batch_size=32, levels=[{"workers": 2, "bandwidth": 5e9}], microbatches=32 // size)
        run = plans.profile_spec(body).calibrate_for
        flags = profile_service.calibration_args(run.workers, run.batch_size, run.weight_grads,
                                                 microbatches=run.microbatches)
        service = profile_run.options_of(profile_run.parser().parse_args(["--source", "mlp", "-o", "-", *flags]))
        where = ("machine_cache", "machine_max_age_s", "data")  # where figures are kept, not what they are
        assert {k: v for k, v in calibration.items() if k not in where} == \
            {k: v for k, v in service.items() if k not in where}
        assert calibration["pilot_workers"] == 2 and calibration["pilot_microbatches"] == 32 // size
