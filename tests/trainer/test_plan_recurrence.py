"""The plain recurrence (trainer/plan/recurrence.py) on a 3- and a 4-layer chain worked out by hand.

What the planner-wide tests (exact, reference, strategies) cannot see because every path reads it
the same way: a block that ends before it starts has no compute time, which rows a level solves
(every start 0..n, only 0 on the final level, or the ones asked for) and what a missing row
reads as, that re-deriving a choice applies the memory check with the machines used so far,
and the work estimate the planner uses to choose a strategy (trainer/plan/solve.py).
"""

from __future__ import annotations

import math

from pipeboard.trainer.plan.formulas import LevelSpec
from pipeboard.trainer.plan.recurrence import level1_value, solve_level, solve_levels, work
from pipeboard.trainer.plan.states import state_chain
from pipeboard.trainer.profile.schema import Layer, Profile


def chain(n: int):
    """n layers in a line: layer i (1-based) runs i ms forward and 2i ms backward, outputs 100 i
    bytes and holds 10 i bytes of weights."""
    layers = [Layer(f"l{i}", forward_ms=float(i), backward_ms=2.0 * i, activation_bytes=100.0 * i,
                    parameter_bytes=10.0 * i) for i in range(1, n + 1)]
    return state_chain(Profile(layers=layers, edges=[(f"l{i}", f"l{i + 1}") for i in range(1, n)]))


def test_the_hand_chain_is_what_the_recurrence_reads():
    c = chain(3)
    assert c.size == 3 and c.pair_count() == 3
    assert c.compute_s == [0.003, 0.003 + 0.006, 0.003 + 0.006 + 0.009]
    assert c.activation == [100.0, 300.0, 600.0] and c.parameters == [10.0, 30.0, 60.0]
    assert c.sent_after == [100.0, 200.0, 0.0]


def test_a_block_ending_before_it_starts_has_no_compute_time():
    c = chain(3)
    value = level1_value(c)
    assert value(0, 2) == c.compute_s[2] and value(1, 2) == c.compute_s[2] - c.compute_s[0]
    assert value(1, 1) == c.compute_s[1] - c.compute_s[0]
    assert value(2, 1) == math.inf and value(1, 0) == math.inf


def test_the_final_level_solves_the_block_starting_at_state_zero_only():
    c = chain(3)
    table = solve_level(c, LevelSpec(2, 1e9), level1_value(c))
    assert sorted(table.rows) == [0]
    assert table.entry(0, 2, 1) < math.inf
    assert table.entry(1, 2, 1) == math.inf and table.entry(2, 2, 0) == math.inf  # rows not solved


def test_an_inner_level_solves_every_block_start_and_rows_can_be_chosen():
    c = chain(3)
    inner = solve_level(c, LevelSpec(2, 1e9, final=False), level1_value(c))
    assert sorted(inner.rows) == [0, 1, 2, 3]  # every start 0..n; row n is empty
    assert all(x == math.inf for row in inner.rows[3] for x in row)
    assert inner.entry(1, 2, 0) == c.compute_s[2] - c.compute_s[0]  # states 1..2 as one stage on one machine
    chosen = solve_level(c, LevelSpec(2, 1e9, final=False), level1_value(c), rows=[1])
    assert sorted(chosen.rows) == [1] and chosen.entry(0, 2, 1) == math.inf
    assert chosen.rows[1] == inner.rows[1]
    final_chosen = solve_level(c, LevelSpec(2, 1e9), level1_value(c), rows=[0, 2])
    assert sorted(final_chosen.rows) == [0, 2]


def test_re_deriving_a_choice_checks_the_stash_with_the_machines_used_so_far():
    # States 0..2 on 2 of 3 machines (m = 1): the only candidates are a last stage 1..2 after
    # state 0 (k = 0) or 2..2 after state 1 (k = 1), on one replica. With 2 machines used, a stage
    # stashes ceil((3 - 2) / 1) = 1 copy: states 1..2 stash 500 + 50 = 550 bytes > 400, so k = 0
    # does not fit, although its time, max(0.003, 0.018 s), is finite.
    c = chain(3)
    value = level1_value(c)
    target = max(c.compute_s[0], c.compute_s[2] - c.compute_s[0])
    unchecked = solve_level(c, LevelSpec(3, 1e9, final=False), value)
    assert unchecked.first_equal(0, 2, 1, target) == (0, 1)
    tight = solve_level(c, LevelSpec(3, 1e9, final=False, memory=400.0), value)
    assert tight.first_equal(0, 2, 1, target) is None
    assert tight.entry(0, 2, 1) == math.inf  # nothing else fits: states 0..1 first stash 2 x 330 bytes
    # With room for the 550 bytes the same candidate is found again.
    roomy = solve_level(c, LevelSpec(3, 1e9, final=False, memory=550.0), value)
    assert roomy.first_equal(0, 2, 1, target) == (0, 1)


def test_every_level_reads_the_level_below_on_all_its_machines():
    c = chain(3)
    inner, outer = solve_levels(c, [LevelSpec(2, 1e9, final=False), LevelSpec(2, 1e8, sharing=2)])
    assert sorted(outer.rows) == [0]
    assert outer.value(0, 2) == inner.entry(0, 2, 1) and outer.value(1, 2) == inner.entry(1, 2, 1)


def test_work_counts_last_stages_three_times_and_candidates_once():
    # 4 states in a chain: 6 (k, j) pairs. On 3 machines a last stage takes 1 or 2 replicas (2 per
    # pair, 3 units each); machine counts m = 1, 2 offer 1 + 2 = 3 replica counts per pair per row.
    c = chain(4)
    assert c.pair_count() == 6
    final = LevelSpec(3, 1e9)
    inner = LevelSpec(3, 1e9, final=False)
    assert work(c, [final]) == 3 * 6 * 2 + 6 * 1 * 3  # 54: one row (block start 0)
    assert work(c, [inner]) == 3 * 6 * 2 + 6 * 2 * 3  # 72: (4 + 1) // 2 = 2 rows on average
    assert work(c, [inner, final]) == 72 + 54
    assert work(c, [LevelSpec(3, 1e9, straight=True)]) == 3 * 6 * 1 + 6 * 1 * 2  # one replica only
    assert work(chain(3), [LevelSpec(2, 1e9)]) == 3 * 3 * 1 + 3 * 1 * 1
