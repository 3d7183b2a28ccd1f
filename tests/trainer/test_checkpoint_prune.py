"""Checkpoint folders: the newest `keep` complete ones stay; older ones, and incomplete ones older
than the newest complete one (a run killed while writing), go; a newer incomplete one stays."""

from __future__ import annotations

from pipeboard.trainer.runtime import checkpoint


def test_mark_complete_keeps_the_newest_k_and_drops_abandoned_partial_ones(tmp_path):
    layout = {"stages": 2}
    for step in (10, 20, 30):
        checkpoint.save_rank(tmp_path, step, 0, {"step": step})
        checkpoint.mark_complete(tmp_path, step, layout, keep=3)
    checkpoint.save_rank(tmp_path, 35, 0, {"step": 35})  # killed before COMPLETE
    checkpoint.save_rank(tmp_path, 40, 0, {"step": 40})
    checkpoint.mark_complete(tmp_path, 40, layout, keep=2)
    checkpoint.save_rank(tmp_path, 50, 0, {"step": 50})  # being written now by a later step
    assert checkpoint.complete_steps(tmp_path) == [30, 40]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000030", "step-00000040", "step-00000050"]
    assert checkpoint.latest(tmp_path, layout) == 40
