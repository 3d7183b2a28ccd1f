"""The machine's calibration figures (link, per-action overhead) are measured once per machine and
kept for a while: a second calibrated profile reuses them, an old or foreign file is measured again."""

from __future__ import annotations

import json
import os

import pytest

from pipeboard.trainer.profile.calibration_records import Link, Overhead
from pipeboard.trainer.runtime import machine


@pytest.fixture
def measured(monkeypatch):
    """machine.measure, counted; the real measurements, at fewer repeats."""
    from pipeboard.trainer.runtime.links import measure_link
    from pipeboard.trainer.runtime.overhead import calibrate

    calls = []

    def measure():
        calls.append(1)
        return measure_link(repeats=2, rounds=1), calibrate(layer_counts=(1,), microbatches=2, rounds=2)

    monkeypatch.setattr(machine, "measure", measure)
    return calls


def test_a_second_calibration_reuses_the_machines_figures_until_they_are_too_old(tmp_path, measured):
    link, over, first = machine.calibration(tmp_path, max_age_s=3600)
    assert isinstance(link, Link) and isinstance(over, Overhead) and first["reused"] is False and len(measured) == 1
    again_link, again_over, again = machine.calibration(tmp_path, max_age_s=3600)
    assert again == {**first, "reused": True} and len(measured) == 1
    assert again_link == link and again_over == over
    # older than allowed: measured again, and kept anew
    (path,) = tmp_path.glob("machine-*.json")
    kept = json.loads(path.read_text())
    kept["measured_at"] -= 7200
    path.write_text(json.dumps(kept))
    _, _, third = machine.calibration(tmp_path, max_age_s=3600)
    assert third["reused"] is False and len(measured) == 2
    # max age 0: always measured
    machine.calibration(tmp_path, max_age_s=0)
    assert len(measured) == 3


def test_another_machine_or_a_damaged_file_is_measured_again(tmp_path, measured, monkeypatch):
    machine.calibration(tmp_path, max_age_s=3600)
    (path,) = tmp_path.glob("machine-*.json")
    # the kept file says another machine (a hash collision, or a copied folder): not used
    kept = json.loads(path.read_text())
    path.write_text(json.dumps({**kept, "key": {**kept["key"], "processor": "another"}}))
    assert machine.calibration(tmp_path, max_age_s=3600)[2]["reused"] is False
    path.write_text("{not json")
    assert machine.calibration(tmp_path, max_age_s=3600)[2]["reused"] is False and len(measured) == 3
    # other kernels are another machine: a file of its own
    monkeypatch.setattr(machine, "machine_key", lambda device="cpu": {**kept["key"], "matmul": "other"})
    machine.calibration(tmp_path, max_age_s=3600)
    assert len(list(tmp_path.glob("machine-*.json"))) == 2 and len(measured) == 4
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary file left


def test_calibrations_are_kept_per_device_and_say_what_they_measured(tmp_path, measured):
    _, _, cpu = machine.calibration(tmp_path, max_age_s=3600)
    assert cpu["device"] == "cpu" and cpu["measured_on"] == "cpu" and "note" not in cpu
    _, _, gpu = machine.calibration(tmp_path, max_age_s=3600, device="cuda")
    assert gpu["reused"] is False and len(measured) == 2  # the CPU's kept figures are not a GPU's
    assert gpu["device"].startswith("cuda") and gpu["measured_on"] == "cpu"
    assert gpu["note"].startswith("link and per-action overhead measured between cpu processes, not on cuda")
    assert len(list(tmp_path.glob("machine-*.json"))) == 2
    assert machine.calibration(tmp_path, max_age_s=3600, device="cuda")[2]["reused"] is True and len(measured) == 2


def test_a_profile_predicting_a_run_on_another_device_says_so_in_one_line():
    cpu_profile = {"device": "cpu", "link": {}, "meta": {"machine_calibration": {"device": "cpu", "measured_on": "cpu"}}}
    assert machine.device_note(cpu_profile, "cpu") is None
    assert machine.device_note(None, "cuda") is None
    note = machine.device_note(cpu_profile, "cuda")
    assert note == "predicted from a profile timed on cpu, for a run on cuda: its figures are not this device's"
    gpu_timed = {"device": "cuda", "link": {}, "meta": {"machine_calibration": {"device": "cuda: X (9.0)",
                                                                               "measured_on": "cpu"}}}
    assert machine.device_note(gpu_timed, "cuda").startswith(
        "predicted with a link and per-action overhead measured on cpu, for a run on cuda")
    assert machine.device_note({"device": "cuda"}, "cuda") is None  # uncalibrated: no transfer figures to blame
