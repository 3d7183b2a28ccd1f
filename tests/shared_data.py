"""Where the PipeDream reference profiles live, and what to do when they are absent.

They are not ours to commit: tests read them from `../shared/pipedream-profiles`. A user's fresh
clone may lack the folder (those cases skip); under CI=true its absence is a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "pipedream-profiles"
PROFILE_NAMES = [
    "alexnet", "vgg16", "resnet18", "resnet50", "resnet101", "resnext50", "resnext101",
    "densenet121", "inception_v3", "squeezenet1_0", "nasnetamobile", "nasnetalarge", "gnmt", "gnmt_large",
]


def shared_profiles_dir() -> Path:
    """The folder, or skip (fail under CI=true) when it is absent."""
    if SHARED_PROFILES.is_dir():
        return SHARED_PROFILES
    message = f"shared PipeDream profiles not found at {SHARED_PROFILES}"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def graph_txt(name: str) -> Path:
    return shared_profiles_dir() / name / "graph.txt"
