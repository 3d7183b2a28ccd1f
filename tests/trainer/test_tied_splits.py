"""Tied weights under an asynchronous schedule: the runtime refuses a split that puts layers
sharing a parameter on two stages, so neither the planner's choice nor the tuner offers one."""

from pipeboard.trainer import choose
from pipeboard.trainer.schedule.tied_splits import tied_refusal
from tests.trainer.tune_profiles import chain_profile

TIED = [["l0", "l7"]]  # the first and last layers share a parameter, as an embedding and its head


def test_only_an_asynchronous_schedule_refuses_tied_layers_on_two_stages():
    apart, together = [["l0", "l1"], ["l2", "l7"]], [["l0", "l7"], ["l1", "l2"]]
    assert "l0, l7" in tied_refusal(TIED, apart, "pipedream") and "stages 0, 1" in tied_refusal(TIED, apart, "pipedream")
    assert tied_refusal(TIED, together, "pipedream") is None
    assert tied_refusal(TIED, apart, "1f1b") is None and tied_refusal(None, apart, "pipedream") is None


def test_the_planners_choice_keeps_tied_layers_together_under_pipedream_only():
    prof = chain_profile(8, params=4e6)  # weights whose all-reduce makes data parallelism the slower
    prof.meta["tied"] = TIED
    data = prof.to_dict()

    def stages(schedule):
        made = choose.choose_plan(data, [(2, 5e9)], memory_bytes=None, method="pipedream", schedule=schedule,
                                  microbatches=4)
        return [st["layers"] for st in made.to_dict()["stages"]]

    assert len(stages("1f1b")) == 2  # a split is the fastest here: the tie is what changes the choice
    assert tied_refusal(TIED, stages("pipedream"), "pipedream") is None
