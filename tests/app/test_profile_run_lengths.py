"""The service's profile of a text task padded per batch is measured at its data's lengths
(trainer.calibrate.length_batches -> profile_at_lengths), and the service's plan is predicted from
them and says which it assumed."""

from __future__ import annotations

import json

import pytest

from pipeboard.app.services import planning, profile_run
from pipeboard.trainer.profile.schema import Profile

SOURCE = "pipeboard.trainer.zoo.varlen_text:causal_lm"
ARGS = {"lo": 4, "hi": 160, "samples": 64, "layers": 1, "dim": 32, "skew": True}  # mostly short, as text is


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "served.json"
    assert profile_run.main(["--source", SOURCE, "--model-args", json.dumps(ARGS), "--batch-size", "4",
                             "--repeats", "2", "--threads", "1", "-o", str(out)]) == 0
    return json.loads(out.read_text())


def test_service_profile_of_varying_lengths_carries_them(served):
    lengths = served["lengths"]
    assert lengths is not None
    assert lengths["dim"] == 1
    assert len(lengths["measured"]) > 1  # several lengths measured, not the example's one
    assert lengths["batch_size"] == 8  # the run's batches (the task's batch_size), cut to microbatches of 4
    assert sum(lengths["histogram"]["counts"]) == 64 // 8
    assert min(lengths["measured"]) < max(lengths["measured"]) <= ARGS["hi"]


def test_fixed_length_task_has_no_lengths(tmp_path):
    out = tmp_path / "fixed.json"
    args = {**ARGS, "padding": "max", "declare": False}
    assert profile_run.main(["--source", SOURCE, "--model-args", json.dumps(args), "--batch-size", "4",
                             "--repeats", "1", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["lengths"] is None


def test_service_plan_is_predicted_from_the_lengths(served):
    levels = [(2, 1e9)]
    made = planning.make_plan(served, levels, memory_bytes=None, method="pipedream")
    profile = Profile.from_dict(served)
    assert made.to_dict()["options"]["lengths"] == profile.lengths.assumed()
    # the plan's time is the expected cost over the data's lengths: a weighted mean of the times at the measured
    # lengths, so within their range and none of them (compared as measured, not as "longer is slower": with
    # this tiny model a longer batch's measured time can come out below a shorter one's on a busy machine)
    at_each = []
    for length in profile.lengths.measured:
        fixed = profile.at_length(length).to_dict()
        fixed["lengths"] = None
        at_each.append(planning.make_plan(fixed, levels, memory_bytes=None, method="pipedream").single_worker_time_s)
    assert min(at_each) <= made.single_worker_time_s <= max(at_each), (made.single_worker_time_s, at_each)
    assert all(made.single_worker_time_s != pytest.approx(t, rel=1e-9) for t in at_each), (made.single_worker_time_s, at_each)


def test_public_schemas_say_which_lengths(served):
    from pipeboard.app.models import Profile as Row
    from pipeboard.app.schemas.plans import PlanData, PlanOptions
    from pipeboard.app.schemas.profiles import ProfilePublic
    from pipeboard.app.services.profiles import to_public

    public = to_public(Row(id=1, name="varlen", data=served, batch_size=4))
    assert public.lengths["measured"] == served["lengths"]["measured"]
    assert public.lengths["histogram"] == served["lengths"]["histogram"]
    assert "layers" not in public.lengths  # the summary, not the per-layer costs
    made = planning.make_plan(served, [(2, 1e9)], memory_bytes=None, method="pipedream").to_dict()
    answered = PlanData.model_validate(made).model_dump()
    assert answered["options"]["lengths"]["measured"] == served["lengths"]["measured"]
    for model in (PlanOptions, ProfilePublic):
        assert "histogram" in model.model_json_schema()["properties"]["lengths"]["description"]


def test_the_cli_profiles_at_the_data_s_lengths_as_the_service_does(served, tmp_path):
    from typer.testing import CliRunner

    from pipeboard.app.cli import cli

    out = tmp_path / "cli.json"
    model_args = [flag for k, v in ARGS.items() for flag in ("--model-arg", f"{k}={json.dumps(v)}")]
    answer = CliRunner().invoke(cli, ["profile", SOURCE, *model_args, "--batch-size", "4", "--repeats", "1",
                                      "--warmup", "1", "-o", str(out)])
    assert answer.exit_code == 0, answer.output
    mine = json.loads(out.read_text())["lengths"]
    assert mine is not None and len(mine["measured"]) > 1
    # the same batches of the same data: the same lengths and histogram as the service's profile
    assert (mine["dim"], mine["measured"], mine["histogram"]) == \
        (served["lengths"]["dim"], served["lengths"]["measured"], served["lengths"]["histogram"])
