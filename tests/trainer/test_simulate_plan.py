"""Simulating a real plan: the planner's output feeds the schedule builder and the simulator."""

from __future__ import annotations

import pytest

from tests.shared_data import graph_txt
from pipeboard.trainer.schedule import build
from pipeboard.trainer.schedule.action_costs import costs_from_plan, data_parallel_costs_from_plan, plan_replicas
from pipeboard.trainer.schedule.simulator import simulate
from pipeboard.trainer.schedule.validator import validate
from pipeboard.trainer.profile.files import load_profile


@pytest.fixture(scope="module")
def vgg_plan():
    plan_mod = pytest.importorskip("pipeboard.trainer.plan")

    return plan_mod.plan(load_profile(graph_txt("vgg16")), levels=[(4, 1e9)])


def test_plan_runs_as_pipedream_and_1f1b(vgg_plan):
    costs, replicas = costs_from_plan(vgg_plan), plan_replicas(vgg_plan)
    assert len(costs) == len(vgg_plan.stages) and sum(replicas) == vgg_plan.workers_used
    single = vgg_plan.single_worker_time_s
    compute_bound = max((c.fwd_s + c.bwd_s) / r for c, r in zip(costs, replicas))
    for name in ("pipedream", "1f1b"):
        schedule = build(name, len(costs), 36, replicas=replicas)
        validate(schedule)
        result = simulate(schedule, costs)
        assert result.throughput > 1 / single  # faster than one worker
        assert result.throughput < 1 / compute_bound  # but never faster than its busiest stage
    assert simulate(build("pipedream", len(costs), 36, replicas=replicas), costs).stashed_versions[0] == vgg_plan.noam


def test_data_parallel_matches_the_planners_estimate(vgg_plan):
    costs, workers = data_parallel_costs_from_plan(vgg_plan)
    result = simulate(build("dp", workers, workers), costs)
    assert 1 / result.throughput == pytest.approx(vgg_plan.data_parallel_time_s)
