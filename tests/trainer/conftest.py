"""Fixtures shared by the trainer's tests."""

import pytest


@pytest.fixture
def one_thread():
    """One intra-op thread: the machine is shared, and oversubscribed threads make tiny ops slow."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
