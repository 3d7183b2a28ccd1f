"""`pipeboard profile --calibrate` measures what a job's profiling child measures (both run
trainer.calibrate.calibrated_profile with the flags profiles.calibration_args writes): its
profile carries the same calibration fields, and `pipeboard plan` predicts from it with the
profile cost model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeboard.app.cli import cli
from pipeboard.app.services import profile_run, profiles

WORKERS, MICRO, MICROBATCHES = 2, 4, 2


def present(d: dict | None) -> set[str]:
    return {k for k, v in (d or {}).items() if v is not None}


@pytest.mark.slow
@pytest.mark.timeout(600)  # two calibrated profiles with pilot runs: minutes on a loaded machine
def test_the_cli_calibrates_as_the_service_does(tmp_path):
    served = tmp_path / "served.json"
    flags = profiles.calibration_args(WORKERS, MICRO * MICROBATCHES, "batched", microbatches=MICROBATCHES)
    assert profile_run.main(["--source", "mlp-digits", "--batch-size", str(MICRO), "--repeats", "2",
                             "-o", str(served), *flags]) == 0
    printed = tmp_path / "cli.json"
    answer = CliRunner().invoke(cli, ["profile", "mlp-digits", "--batch-size", str(MICRO), "--repeats", "2",
                                      "--warmup", "2", "--calibrate", "--workers", str(WORKERS),
                                      "--microbatches", str(MICROBATCHES), "-o", str(printed)])
    assert answer.exit_code == 0, answer.output
    service, mine = json.loads(served.read_text()), json.loads(printed.read_text())
    for field in ("link", "overhead", "pilot"):
        assert mine.get(field) and service.get(field), field
    assert present(mine["link"]) == present(service["link"])
    assert present(mine["overhead"]) == present(service["overhead"])
    assert present(mine["pilot"]) == present(service["pilot"])
    assert (mine["pilot"]["batch_size"], mine["pilot"]["microbatches"]) == (MICRO * MICROBATCHES, MICROBATCHES)
    assert mine["weight_batch_size"] == service["weight_batch_size"] == MICRO * MICROBATCHES
    assert all(layer.get("weight_batched_ms") is not None for layer in mine["layers"] if layer.get("parameter_bytes"))
    assert mine["meta"]["cores"] == service["meta"]["cores"]
    assert {"machine_calibration"} <= set(mine["meta"]) & set(service["meta"])
    planned = CliRunner().invoke(cli, ["plan", str(printed), "--workers", "2", "--bandwidth", "5e9", "--schedule",
                                       "1f1b", "--microbatches", str(MICROBATCHES), "--json"])
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.output)["predicted"]["cost_model"] == "profile"


def test_calibrate_needs_the_microbatch_and_sane_counts():
    for extra, message in ((["--calibrate"], "--calibrate: give --batch-size"),
                           (["--calibrate", "--batch-size", "4", "--workers", "0"], "--workers and --microbatches"),
                           (["--calibrate", "--batch-size", "4", "--weight-grads", "x"], "--weight-grads")):
        answer = CliRunner().invoke(cli, ["profile", "mlp-digits", *extra])
        assert answer.exit_code == 2 and message in answer.output, answer.output
        assert len(answer.output.strip().splitlines()) == 1
