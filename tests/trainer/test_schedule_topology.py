"""Where a schedule's chunks sit on its workers: one formula (topology.chunk_stages) for the
builders' topology, the simulator's cost split and the runtime's layout."""

from __future__ import annotations

import pytest

from pipeboard.trainer.runtime.run_config import RunConfig
from pipeboard.trainer.runtime.layout import resolve
from pipeboard.trainer.schedule import ScheduleError, build, costs_uniform, registry, simulate
from pipeboard.trainer.schedule.actions import Action, Kind
from pipeboard.trainer.schedule.interleaved import interleaved_builder
from pipeboard.trainer.schedule.topology import chunk_stages, interleaved


@pytest.mark.parametrize("p,v", [(1, 1), (2, 2), (3, 2), (4, 3)])
def test_loop_placement_is_megatrons_round_robin(p, v):
    for w in range(p):
        assert chunk_stages(w, p, v, "loop") == tuple(c * p + w for c in range(v))


def test_v_placement_goes_down_the_workers_and_back_up():
    assert [chunk_stages(w, 4, 2, "v") for w in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert [chunk_stages(w, 2, 4, "v") for w in range(2)] == [(0, 3, 4, 7), (1, 2, 5, 6)]


@pytest.mark.parametrize("placement", ["loop", "v"])
def test_every_virtual_stage_has_exactly_one_worker(placement):
    t = interleaved(4, 2, placement)
    held = sorted(s for w in t.workers for s in w.stages)
    assert held == list(range(8))
    assert all(t.stage_ranks[s] == (w.rank,) for w in t.workers for s in w.stages)


def test_an_unknown_placement_is_refused_naming_the_known_ones():
    with pytest.raises(ScheduleError, match="placement must be one of loop, v, got 'w'"):
        chunk_stages(0, 2, 2, "w")
    with pytest.raises(ScheduleError, match="placement must be one of loop, v"):
        registry.ScheduleSpec("x", interleaved_builder, "x", replication=False, chunks=True, placement="w")
    with pytest.raises(ScheduleError, match="needs chunks=True"):
        registry.ScheduleSpec("x", interleaved_builder, "x", placement="v")


def chunk_by_chunk(ctx):
    """Each worker: every forward of its chunks in order, then every backward in reverse; written
    from ``w.stages`` alone, so it runs on whatever placement the topology has."""
    m = ctx.microbatches
    programs = []
    for w in ctx.topology.workers:
        ops = [Action(Kind.FORWARD, s, i) for s in w.stages for i in range(m)]
        ops += [Action(Kind.BACKWARD, s, i) for s in reversed(w.stages) for i in reversed(range(m))]
        programs.append(ops + [Action(Kind.STEP, s, -1, 1) for s in w.stages])
    return programs


@pytest.fixture
def v_interleaved():
    registry.register("test-v-interleaved", chunk_by_chunk, description="chunk by chunk on a V.",
                      replication=False, chunks=True, default_chunks=2, placement="v")
    yield "test-v-interleaved"
    registry.unregister("test-v-interleaved")


def test_a_v_placed_schedule_builds_simulates_and_lays_out_the_runtime_alike(v_interleaved):
    s = build(v_interleaved, 2, 4, chunks=2)
    assert [w.stages for w in s.workers] == [(0, 3), (1, 2)]
    assert s.meta["placement"] == "v"
    # stages 1 and 2 are on one worker: no transfer between them
    sends = [a for acts in s.actions for a in acts if a.kind.is_comm and a.stage in (1, 2)
             and ((a.kind.value == "send_act" and a.stage == 1) or (a.kind.value == "send_grad" and a.stage == 2))]
    assert sends == []
    # two physical stages' costs go to the worker holding them, split over its chunks
    costs = costs_uniform(2, fwd_s=1.0, bwd_s=2.0)
    costs[1] = costs[1].scaled(3.0)
    result = simulate(s, costs)
    assert result.utilization[1] > result.utilization[0]
    layout = resolve(RunConfig(model="mlp", schedule=v_interleaved, num_stages=2, microbatches=4, batch_size=8))
    assert [layout.stages_of(r) for r in range(2)] == [(0, 3), (1, 2)]
