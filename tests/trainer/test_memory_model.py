"""memory_model: the one memory formula, part by part, against hand counts of small schedules."""

import pytest

from pipeboard.trainer.schedule.actions import ScheduleError
from pipeboard.trainer.schedule.builder import build
from pipeboard.trainer.schedule.memory_model import StageMemory, worker_memory

ONE = StageMemory(weight_bytes=1000, activation_bytes=100, input_bytes=10, output_bytes=10)


def test_gpipe_keeps_every_microbatch_and_one_version():
    parts = worker_memory(build("gpipe", 2, 4), [ONE, ONE], optimizer="adam")
    for w, got in zip(parts, (10, 0)):
        assert (w.weights, w.gradients, w.optimizer) == (1000, 1000, 2000)
        # boundary: stage 0's first backward holds the output gradient it received (10 bytes) on
        # top of every microbatch kept; the last stage receives no gradient
        assert w.activations == 4 * 100 and w.in_flight == 4 and w.boundary == got
        assert w.total == 1000 + 1000 + 2000 + 400 + got


def test_1f1b_keeps_fewer_on_later_stages_and_pipedream_stashes_versions():
    one_f_one_b = worker_memory(build("1f1b", 4, 8), [ONE] * 4, optimizer="sgd")
    assert [w.in_flight for w in one_f_one_b] == [4, 3, 2, 1]
    assert [w.activations for w in one_f_one_b] == [400, 300, 200, 100]
    pipedream = worker_memory(build("pipedream", 4, 12), [ONE] * 4, optimizer="sgd")
    assert [w.versions for w in pipedream] == [4, 3, 2, 1]
    assert [w.weights for w in pipedream] == [4000, 3000, 2000, 1000]
    assert all(w.optimizer == 1000 for w in pipedream)


def test_recompute_keeps_inputs_and_rebuilds_one_stage_in_its_backward():
    off = worker_memory(build("gpipe", 2, 4), [ONE, ONE], optimizer="sgd")
    on = worker_memory(build("gpipe", 2, 4), [ONE, ONE], optimizer="sgd", recompute=[0])
    # stage 0: 4 microbatches' inputs and outputs kept (the stage holds both until the gradient
    # comes), and during a backward one full activation rebuilt on top of them (the backward's own
    # are released at its end)
    assert on[0].activations == 4 * (10 + 10) + 100
    assert on[1].activations == off[1].activations == 400
    assert on[0].total < off[0].total


def test_recompute_keeps_what_the_stage_counted_it_holds():
    counted = StageMemory(weight_bytes=1000, activation_bytes=100, input_bytes=10, output_bytes=10, recompute_bytes=35)
    on = worker_memory(build("gpipe", 2, 4), [counted, ONE], optimizer="sgd", recompute=[0])
    assert on[0].activations == 4 * 35 + 100


def test_a_split_backward_keeps_its_output_gradients_until_w():
    grads = StageMemory(weight_bytes=1000, activation_bytes=100, input_bytes=10, output_bytes=10, weight_grad_bytes=30,
                        weight_input_bytes=40)
    plain = worker_memory(build("zb-h1", 2, 4), [ONE, ONE], optimizer="sgd")
    held = worker_memory(build("zb-h1", 2, 4), [grads, grads], optimizer="sgd")
    assert all(h.activations > p.activations for h, p in zip(held, plain))
    # gpipe with batched weight gradients: all 4 BIs before the one W(-1): 4 activations + 4 gradients
    batched = worker_memory(build("gpipe", 2, 4, batch_weight_grads=True), [grads, grads], optimizer="sgd")
    assert batched[0].activations == 4 * (100 + 30)
    # under recompute a BI lets its rebuilt graph go and W replays the stage from the kept inputs
    # and the received output gradient (kept from BI to W in place of the outputs, the same size):
    # the rebuilt 100 lives during one BI or one microbatch's W at a time, on top of the 4
    # microbatches' 20 kept, and at the W beside the gradients it makes
    redone = worker_memory(build("gpipe", 2, 4, batch_weight_grads=True), [grads, grads], optimizer="sgd",
                           recompute=[0])
    assert (redone[0].activations, redone[0].gradients) == (4 * 20 + 100, 1000)


def test_gradients_exist_from_a_stages_first_backward_to_its_update():
    big = StageMemory(weight_bytes=1000, activation_bytes=400)
    # 1f1b on 2 stages, 4 microbatches: stage 0 runs F0 F1 before its first B; that B makes the
    # gradients while both microbatches' activations are held, and later levels stay lower
    parts = worker_memory(build("1f1b", 2, 4), [big, big], optimizer="sgd")
    assert (parts[0].activations, parts[0].gradients) == (800, 1000)
    # with no backward in the actions, no gradient would exist: a schedule's forward-only prefix
    # (every forward of gpipe) peaks beside the gradients only once its first backward runs
    gpipe = worker_memory(build("gpipe", 2, 4), [big, big], optimizer="sgd")
    assert all((w.activations, w.gradients) == (1600, 1000) for w in gpipe)


def test_split_backward_holds_activations_until_w():
    parts = worker_memory(build("zb-h1", 2, 4), [ONE, ONE], optimizer="sgd")
    assert all(w.activations == w.in_flight * 100 for w in parts)
    assert parts[0].in_flight >= 2


def test_interleaved_weights_count_each_chunk_once():
    sched = build("interleaved-1f1b", 2, 4, chunks=2)
    half = StageMemory(weight_bytes=500, activation_bytes=50)
    parts = worker_memory(sched, [half] * sched.num_stages, optimizer="sgd-plain")
    assert all(w.weights == 1000 and w.gradients == 1000 and w.optimizer == 0 for w in parts)
    assert all(w.activations == w.in_flight * 50 for w in parts)


def test_bad_inputs_say_what_is_wrong():
    with pytest.raises(ScheduleError, match="optimizer"):
        worker_memory(build("gpipe", 2, 2), [ONE, ONE], optimizer="lion")
    with pytest.raises(ScheduleError, match="recompute: stage 5"):
        worker_memory(build("gpipe", 2, 2), [ONE, ONE], recompute=[5])
    with pytest.raises(ScheduleError, match="1 stages given; the schedule has 2"):
        worker_memory(build("gpipe", 2, 2), [ONE], optimizer="sgd")
    with pytest.raises(ScheduleError, match="weight_bytes"):
        StageMemory(weight_bytes=-1, activation_bytes=0)
