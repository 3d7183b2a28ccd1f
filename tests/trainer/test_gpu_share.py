"""Several stage processes on one GPU, packed by memory (trainer/runtime/gpu_share.py), on plain numbers."""

from __future__ import annotations

import pytest

from pipeboard.trainer.runtime.gpu_share import (PROCESS_OVERHEAD_BYTES, ShareError, assign, pack, pair_transport,
                                                    per_process, shares_a_gpu)

GIB = 2**30


def test_with_a_gpu_for_each_process_each_has_its_own():
    assert sorted(pack([GIB, 2 * GIB, 3 * GIB], [80 * GIB] * 3)) == [0, 1, 2]


def test_four_stages_share_the_one_gpu_when_their_memory_fits():
    assert pack([GIB] * 4, [80 * GIB]) == [0, 0, 0, 0]


def test_the_largest_go_first_each_on_the_gpu_with_most_room():
    # 40 -> gpu0 (80 left 40-0.5), 30 -> gpu1, 20 -> gpu1 (room 49.5 > gpu0's 39.5), 10 -> gpu0
    assert pack([10 * GIB, 40 * GIB, 20 * GIB, 30 * GIB], [80 * GIB, 80 * GIB]) == [0, 0, 1, 1]


def test_a_process_that_fits_nowhere_is_one_line_naming_it_and_the_room_left():
    with pytest.raises(ShareError) as err:
        pack([30 * GIB, 30 * GIB, 30 * GIB], [80 * GIB])
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("stage process 2 needs 30.50 GiB (predicted peak 30.00 GiB and 512.0 MiB for its CUDA context)")
    assert text.endswith(f"the most any GPU has left is {(80 * GIB - 2 * (30 * GIB + PROCESS_OVERHEAD_BYTES)) / GIB:.2f} GiB")


def test_no_gpu_and_negative_figures_are_refused():
    with pytest.raises(ShareError):
        pack([GIB], [])
    with pytest.raises(ShareError):
        pack([-1], [GIB])


def test_a_process_holding_several_stages_needs_their_workers_figure_once():
    # memory_predict gives each virtual stage its worker's total: a worker of stages 0 and 3 needs it once
    assert per_process({0: 5, 1: 7, 2: 7, 3: 5}, [(0, 3), (1, 2)]) == [5, 7]


def test_a_rank_takes_its_own_gpu_where_there_are_enough():
    assert assign(3, 4, [GIB] * 3, [80 * GIB] * 4) == [0, 1, 2]


def test_more_ranks_than_gpus_pack_by_memory_and_share():
    # 40 and 10 on one GPU, 30 and 20 on the other (worst fit, largest first)
    assert assign(4, 2, [10 * GIB, 40 * GIB, 20 * GIB, 30 * GIB], [80 * GIB] * 2) == [0, 0, 1, 1]
    assert assign(4, 1, [GIB] * 4, [80 * GIB]) == [0, 0, 0, 0]


def test_without_a_prediction_ranks_go_round_robin():
    assert assign(5, 2) == [0, 1, 0, 1, 0]


def test_stages_that_cannot_fit_on_the_gpus_are_refused():
    with pytest.raises(ShareError, match="stage process 2 needs"):
        assign(3, 1, [30 * GIB] * 3, [80 * GIB])
    with pytest.raises(ShareError, match="3 processes on 1 GPUs"):
        assign(3, 1, [GIB] * 2, [80 * GIB])
    with pytest.raises(ShareError):
        assign(2, 0)


def test_ranks_on_one_gpu_go_through_host_memory_the_others_over_nccl():
    devices = [0, 0, 1, 1]
    assert shares_a_gpu(devices) and not shares_a_gpu([0, 1, 2])
    assert pair_transport(devices, 0, 1) == "host"
    assert pair_transport(devices, 2, 3) == "host"
    assert pair_transport(devices, 1, 2) == "nccl"
    assert pair_transport(devices, 3, 0) == "nccl"
