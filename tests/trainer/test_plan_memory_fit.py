"""memory_fit: a plan under a memory cap turns recompute on where a stage does not fit, and a
cap nothing fits gets one line naming the smallest need."""

import pytest

from pipeboard.trainer.plan.plan_error import PlanError
from pipeboard.trainer.plan.memory_fit import choose_under_cap, least_memory, plan_memory, with_recompute
from pipeboard.trainer.schedule.builder import build
from pipeboard.trainer.schedule.memory_model import StageMemory, run_schedule, worker_memory


def two_stage_plan(method="pipedream", first_act=1000, params=100):
    return {"method": method, "stages": [
        {"replicas": 1, "parameter_bytes": params, "activation_bytes": first_act, "activation_bytes_out": 10},
        {"replicas": 1, "parameter_bytes": params, "activation_bytes": 50, "activation_bytes_out": 0},
    ]}


def test_plan_memory_is_memory_model_per_stage():
    fit = plan_memory(two_stage_plan(), "1f1b", 4, optimizer="sgd")
    stages = [StageMemory(100, 1000, 0, 10), StageMemory(100, 50, 10, 0)]
    expected = [w.total for w in worker_memory(run_schedule("1f1b", 2, 4), stages, optimizer="sgd")]
    assert fit.memory_bytes == expected and fit.recompute == [False, False]
    # 1f1b as a run builds it, its weight pass batched: stage 0 keeps every microbatch's
    # activations until the one W(-1), plus weights, gradients and momentum
    assert fit.memory_bytes[0] == 4 * 1000 + 3 * 100
    # with the weight pass per microbatch: 2 microbatches in flight and the received gradient
    immediate = [w.total for w in worker_memory(build("1f1b", 2, 4), stages, optimizer="sgd")]
    assert immediate[0] == 2 * 1000 + 3 * 100 + 10


def test_a_stage_over_the_cap_recomputes_and_the_other_does_not():
    plain = plan_memory(two_stage_plan(), "1f1b", 4, optimizer="sgd")
    cap = plain.memory_bytes[0] - 1
    fit = with_recompute(two_stage_plan(), "1f1b", 4, cap, optimizer="sgd")
    assert fit.recompute == [True, False]
    assert fit.memory_bytes[0] <= cap and fit.memory_bytes[1] == plain.memory_bytes[1]


def test_the_first_candidate_that_fits_is_chosen():
    big, small = two_stage_plan("pipedream", params=10_000), two_stage_plan("uniform", params=100)
    cap = least_memory(small, "gpipe", 4) + 1
    chosen, fit = choose_under_cap([big, small], "gpipe", 4, cap)
    assert chosen is small and fit.peak <= cap


def test_a_cap_nothing_fits_names_the_smallest_need():
    plans = [two_stage_plan("pipedream", params=10_000), two_stage_plan("uniform", params=100)]
    need = least_memory(plans[1], "gpipe", 4)
    with pytest.raises(PlanError) as info:
        choose_under_cap(plans, "gpipe", 4, 10)
    message = str(info.value)
    assert "\n" not in message and f"smallest any plan needs is {need} bytes (uniform" in message


def test_bad_recompute_and_schedule_are_plan_errors():
    with pytest.raises(PlanError, match="recompute: 1 entries"):
        plan_memory(two_stage_plan(), "gpipe", 2, recompute=[True])
    with pytest.raises(PlanError):
        plan_memory(two_stage_plan(), "no-such-schedule", 2)


def test_pipeboard_plan_under_a_cap_recomputes_or_names_the_smallest_need(tmp_path):
    import json

    from typer.testing import CliRunner

    from pipeboard.app.cli import cli
    from pipeboard.trainer.plan import Plan
    from pipeboard.trainer.runtime.run_config import RunConfig
    from tests.shared_data import graph_txt

    def plan(*extra):
        return CliRunner().invoke(cli, ["plan", str(graph_txt("alexnet")), "--workers", "2", "--bandwidth", "10e9",
                                        "--straight", "--schedule", "gpipe", "--microbatches", "8", *extra])

    roomy = plan("--memory", "1e15", "--json")
    assert roomy.exit_code == 0, roomy.output
    options = json.loads(roomy.output)["options"]
    assert options["recompute"] == [False, False]
    fullest = max(options["stage_memory_bytes"])
    out = tmp_path / "plan.json"
    tight = plan("--memory", str(fullest - 1), "--json", "-o", str(out))
    assert tight.exit_code == 0, tight.output
    options = json.loads(tight.output)["options"]
    assert any(options["recompute"]) and max(options["stage_memory_bytes"]) <= fullest - 1
    cfg = RunConfig(model="mlp", schedule="gpipe", batch_size=8, microbatches=8).with_plan(Plan.load(out))
    assert cfg.recompute == [s for s, on in enumerate(options["recompute"]) if on]
    nothing = plan("--memory", "1000")
    assert nothing.exit_code == 2 and "smallest any plan needs is" in nothing.output
    assert len(nothing.output.strip().splitlines()) == 1
