"""The online correction: costs re-fitted to measured events recover known factors."""

from dataclasses import replace

import pytest

from pipeboard.trainer.schedule.actions import TimelineEvent
from pipeboard.trainer.schedule.builder import build
from pipeboard.trainer.schedule.action_costs import costs_uniform
from pipeboard.trainer.schedule.predict import repeat_iterations, steady_step_s
from pipeboard.trainer.schedule.refit import measured_terms, moved_terms, refit
from pipeboard.trainer.schedule.simulator import simulate

M = 4
STEPS = 6


def as_recorded(costs, schedule="1f1b", p=2, batch_weight_grads=False):
    """What a run would record under ``costs``: the simulated actions of STEPS iterations, each
    worker's waits as receives (the runtime records a wait as the receive it waits in), with
    each event's step."""
    one = build(schedule, p, M, batch_weight_grads=batch_weight_grads)
    sim = simulate(repeat_iterations(one, STEPS), costs)
    out = []
    for w in {e.worker for e in sim.timeline}:
        # a zero-cost step still ends the worker's iteration
        evs = sorted((e for e in sim.timeline if e.worker == w and (e.end > e.start or e.kind == "step")),
                     key=lambda e: (e.start, e.end))
        steps, k = [], 0
        for e in evs:  # a worker's iteration ends with its optimizer step
            steps.append(replace(e, step=k))
            k += getattr(e.kind, "value", e.kind) == "step"
        evs = steps
        for prev, cur in zip(evs, evs[1:]):
            if cur.start > prev.end:
                out.append(TimelineEvent(w, cur.stage, 0, -2, "recv_act", prev.end, cur.start, cur.step))
        out.extend(evs)
    return out


def test_refit_recovers_scaled_compute_and_its_steady_step():
    predicted = costs_uniform(2, 0.010, 0.020, step_s=0.001)
    run = [replace(c, fwd_s=c.fwd_s * 1.5, bwd_s=c.bwd_s * 1.2, step_s=0.004) for c in predicted]
    fit = refit(predicted, as_recorded(run), schedule="1f1b", microbatches=M)
    terms = moved_terms(fit.terms)
    assert terms["forward"]["factor"] == pytest.approx(1.5)
    assert terms["backward"]["factor"] == pytest.approx(1.2)
    assert terms["step"]["factor"] == pytest.approx(4.0)
    assert terms["gaps"]["measured_s"] == pytest.approx(0.0, abs=1e-12)
    assert terms["forward"]["moved"] and not terms["gaps"]["moved"]
    assert fit.step_s == pytest.approx(steady_step_s(run, "1f1b", M))
    assert fit.step_s > steady_step_s(predicted, "1f1b", M) * 1.2


def test_refit_batched_weight_pass_counts_per_microbatch():
    predicted = costs_uniform(2, 0.010, 0.020, bwd_input_s=0.010, bwd_weight_s=0.010, bwd_weight_batched_s=0.005)
    run = [replace(c, bwd_weight_batched_s=0.008) for c in predicted]
    fit = refit(predicted, as_recorded(run, batch_weight_grads=True), schedule="1f1b", microbatches=M,
                batch_weight_grads=True)
    terms = moved_terms(fit.terms)
    assert terms["weight_batched"]["measured_s"] == pytest.approx(0.008)
    assert terms["weight_batched"]["factor"] == pytest.approx(1.6)
    assert fit.step_s == pytest.approx(steady_step_s(run, "1f1b", M, batch_weight_grads=True))


def test_unmeasured_terms_keep_their_prediction():
    predicted = costs_uniform(2, 0.010, 0.020)
    fit = refit(predicted, [], schedule="1f1b", microbatches=M)
    assert fit.terms == []
    assert fit.step_s == pytest.approx(steady_step_s(predicted, "1f1b", M))


def test_gaps_between_actions_are_charged_per_compute_action():
    ev = lambda kind, t0, t1, step=1, stage=0, mb=0: TimelineEvent(0, stage, 0, mb, kind, t0, t1, step)  # noqa: E731
    # one worker, one step: F, 0.5 s nothing, B, 0.1 s nothing, step: 0.6 s over 2 compute actions
    spans = measured_terms([ev("F", 0, 1), ev("B", 1.5, 3.5), ev("step", 3.6, 3.7, mb=-1)], M)
    assert spans[("gaps", 0)] == [pytest.approx(0.3)]
    predicted = costs_uniform(1, 1.0, 2.0, step_s=0.1)
    fit = refit(predicted, [ev("F", 0, 1), ev("B", 1.5, 3.5), ev("step", 3.6, 3.7, mb=-1)], schedule="1f1b",
                microbatches=1)
    assert fit.costs[0].fwd_s == pytest.approx(1.3) and fit.costs[0].bwd_s == pytest.approx(2.3)


def test_transfer_is_send_start_to_the_waiting_receive_end():
    events = [
        TimelineEvent(0, 0, 0, 0, "send_act", 1.0, 1.01, 0), TimelineEvent(1, 1, 0, 0, "recv_act", 0.5, 1.3, 0),
        # a receive posted after the send started measures its own lateness, not the transfer
        TimelineEvent(0, 0, 0, 1, "send_act", 2.0, 2.01, 0), TimelineEvent(1, 1, 0, 1, "recv_act", 2.5, 2.6, 0),
        TimelineEvent(1, 1, 0, 0, "send_grad", 3.0, 3.01, 0), TimelineEvent(0, 0, 0, 0, "recv_grad", 2.9, 3.2, 0),
    ]
    spans = measured_terms(events, M)
    assert spans[("transfer_act", 0)] == [pytest.approx(0.3)]
    assert spans[("transfer_grad", 1)] == [pytest.approx(0.2)]
