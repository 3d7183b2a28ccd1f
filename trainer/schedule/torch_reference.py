"""torch's own schedules as a reference for ours: its schedule classes built on stand-in stages
(no process group: the classes only read a stage's index, the stage count and the group's size
and rank), and its unit-step simulator (``_simulate_comms_compute``). The schedule tests take it
as their oracle and bench/schedules.py compares bubbles with it; it reads torch's private
helpers, so it follows the pinned torch."""

from __future__ import annotations

from torch.distributed.pipelining import schedules as ts

from pipeboard.trainer.schedule import Schedule
from pipeboard.trainer.schedule.torchcsv import export_rows
from pipeboard.trainer.schedule.topology import chunk_stages

# pipeboard's name -> torch's class and how it places its chunks
TORCH_CLASSES = {
    "zbv": (ts.ScheduleZBVZeroBubble, "v"),
    "dualpipev": (ts.ScheduleDualPipeV, "v"),
    "interleaved-zb": (ts.ScheduleInterleavedZeroBubble, "loop"),
    "looped-bfs": (ts.ScheduleLoopedBFS, "loop"),
    "interleaved-1f1b": (ts.ScheduleInterleaved1F1B, "loop"),
}


class StandInStage:
    """What a torch schedule's constructor reads of a stage."""

    def __init__(self, index: int, num_stages: int, group_size: int, group_rank: int) -> None:
        self.stage_index, self.num_stages = index, num_stages
        self.group_size, self.group_rank = group_size, group_rank
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.submod = None


def torch_schedule(name: str, p: int, m: int, chunks: int = 2, rank: int = 0):
    """torch's schedule object for ``name`` on ``p`` ranks (seen from ``rank``)."""
    cls, placement = TORCH_CLASSES[name]
    stages = [StandInStage(s, p * chunks, p, rank) for s in chunk_stages(rank, p, chunks, placement)]
    return cls(stages, m, loss_fn=lambda out, target: out)


def torch_rows(name: str, p: int, m: int, chunks: int = 2) -> list[list[str]]:
    """torch's compute order per rank, as the cells its ``_dump_csv`` writes (idle cells dropped)."""
    order = torch_schedule(name, p, m, chunks).pipeline_order
    return [[str(a) for a in order[r] if a is not None] for r in range(p)]


def _in_sequence(rows: list[list[str]]) -> dict[int, list]:
    """Rows as torch actions, an OVERLAP_F_B as its two halves (torch's unit-step simulator
    cannot schedule a pair: it looks its stage up, and a pair's is -1)."""
    out = {}
    for r, row in enumerate(rows):
        acts = []
        for cell in row:
            a = ts._Action.from_str(cell)
            acts += list(a.sub_actions) if a.sub_actions else [a]
        out[r] = acts
    return out


def torch_steps(rows: list[list[str]], p: int, placement: str, chunks: int = 2) -> int:
    """The unit steps torch's ``_simulate_comms_compute`` takes for compute rows, lowered with its
    own ``_add_send_recv`` (pairs in sequence)."""
    owner = {s: r for r in range(p) for s in chunk_stages(r, p, chunks, placement)}
    with_comms = ts._add_send_recv(_in_sequence(rows), stage_to_rank=owner.__getitem__, num_stages=p * chunks)
    timeline = ts._simulate_comms_compute(with_comms, owner.__getitem__, p * chunks)
    return max(len(steps) for steps in timeline.values())


def our_rows(schedule: Schedule) -> list[list[str]]:
    return export_rows(schedule, comms=False)


def unit_bubble(name: str, p: int, m: int, **build_options) -> float:
    """The Zero Bubble paper's bubble rate at its unit times (T_F = T_B = T_W = 1 per physical
    stage, a full backward 2; chunks split a stage's times evenly): each worker's idle time within
    the iteration over its compute, 3m, averaged over workers."""
    from pipeboard.trainer.schedule import build, costs_uniform, simulate

    schedule = build(name, p, m, **build_options)
    result = simulate(schedule, costs_uniform(p, fwd_s=1.0, bwd_s=2.0, bwd_input_s=1.0, bwd_weight_s=1.0))
    compute = 3.0 * m
    return sum(result.iteration_time_s - compute for _ in range(p)) / (p * compute)
