"""Checkpoint folders: which complete ones are kept, and how ranks on several hosts (a folder each)
agree on the step to resume from and get rank files their own host does not hold."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeboard.trainer.runtime import checkpoint

LAYOUT = {"stages": 2}


def test_mark_complete_keeps_the_newest_k_and_drops_abandoned_partial_ones(tmp_path):
    for step in (10, 20, 30):
        checkpoint.save_rank(tmp_path, step, 0, {"step": step})
        checkpoint.mark_complete(tmp_path, step, LAYOUT, keep=3, settle_s=0)
    checkpoint.save_rank(tmp_path, 35, 0, {"step": 35})  # killed before COMPLETE
    checkpoint.save_rank(tmp_path, 40, 0, {"step": 40})
    checkpoint.mark_complete(tmp_path, 40, LAYOUT, keep=2, settle_s=0)
    checkpoint.save_rank(tmp_path, 50, 0, {"step": 50})  # being written now by a later step
    assert checkpoint.complete_steps(tmp_path) == [30, 40]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000030", "step-00000040", "step-00000050"]
    assert checkpoint.latest(tmp_path, LAYOUT) == 40 and checkpoint.latest(tmp_path, LAYOUT, at_most=39) == 30


def test_an_old_checkpoint_stays_until_a_newer_one_has_settled(tmp_path):
    """A run resumes from a checkpoint at or before the last step the service recorded, which lags
    the run: however many checkpoints a fast run completes meanwhile, one that old is kept."""
    import os

    def complete(step: int, age_s: float) -> None:
        checkpoint.save_rank(tmp_path, step, 0, {"step": step})
        checkpoint.mark_complete(tmp_path, step, LAYOUT, keep=2, settle_s=5)
        marker = checkpoint.step_dir(tmp_path, step) / "COMPLETE"
        os.utime(marker, (marker.stat().st_atime, marker.stat().st_mtime - age_s))

    complete(100, age_s=9)
    complete(200, age_s=8)
    complete(300, age_s=1)
    complete(400, age_s=0)
    # 200 settled (8 s > 5 s): 100 goes, 200 to 400 stay though keep=2
    assert checkpoint.complete_steps(tmp_path) == [200, 300, 400]
    complete(500, age_s=0)
    assert checkpoint.complete_steps(tmp_path) == [200, 300, 400, 500]


def _agree(rank: int, world: int, store_path: str, folders: list[str], out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    try:
        out[rank] = checkpoint.agree(folders[rank], LAYOUT, None, rank, world)
    finally:
        dist.destroy_process_group()


def test_ranks_on_other_hosts_than_before_resume_from_a_step_they_hold_between_them(tmp_path):
    a, b = tmp_path / "host-a", tmp_path / "host-b"
    # Before: rank 0 ran on host b, rank 1 on host a. Both hosts completed step 10; host a also
    # step 20, which host b never did (it was lost): step 20 lacks rank 0's file anywhere.
    for folder, rank, steps in ((b, 0, (10,)), (a, 1, (10, 20))):
        for step in steps:
            checkpoint.save_rank(folder, step, rank, {"step": step, "rank": rank, "w": torch.full((3,), float(rank + step))})
            checkpoint.mark_complete(folder, step, LAYOUT)
    # Now rank 0 runs on host a and rank 1 on host b: each must get its file from the other.
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_agree, args=(2, str(tmp_path / "store"), [str(a), str(b)], out), nprocs=2, start_method="fork")
        results = dict(out)
    for rank in (0, 1):
        step, state = results[rank]
        assert step == 10 and state["rank"] == rank and torch.equal(state["w"], torch.full((3,), float(rank + 10)))
