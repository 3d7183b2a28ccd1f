"""A cuda job predicted from figures measured on CPU says so in its fidelity (app/services/fidelity.py,
trainer/runtime/machine.py device_note), and a CPU job from a CPU profile says nothing."""

from __future__ import annotations

from sqlalchemy.orm import Session

from pipeboard.app.models import Job, JobStatus
from pipeboard.app.services import fidelity, profiles


def _job(session: Session, device: str, profile_data: dict) -> Job:
    prof = profiles.store(session, profile_data, name=f"p-{device}", origin="profiled")
    job = Job(name="j", spec={"model": {"name": "mlp-digits"}, "machine": {"device": device}}, status=JobStatus.QUEUED,
              attempt=1, profile_id=prof.id)
    session.add(job)
    session.flush()
    return job


def test_a_cuda_job_predicted_from_a_cpu_profile_says_so_and_a_cpu_job_does_not(session: Session):
    cpu_profile = {"device": "cpu", "batch_size": 8, "layers": [],
                   "meta": {"machine_calibration": {"device": "cpu", "measured_on": "cpu"}}}
    assert fidelity.device_note(session, _job(session, "cpu", cpu_profile)) is None
    note = fidelity.device_note(session, _job(session, "cuda", cpu_profile))
    assert note == "predicted from a profile timed on cpu, for a run on cuda: its figures are not this device's"
    out = fidelity.figures({"steady_step_s": 0.1}, 0.12, 10, None, live=True, note=note)
    assert out["device_note"] == note and out["predicted_step_s"] == 0.1
