"""The docker-compose GPU worker: a pipeboard worker whose container gets the host's NVIDIA GPUs
and a torch build that can use them (PyPI's default index: Linux wheels with CUDA)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_worker_reserves_the_nvidia_gpus_and_runs_a_cuda_torch():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    gpu = compose["services"]["gpu-worker"]
    assert gpu["command"][:2] == ["pipeboard", "worker"]
    assert gpu["restart"] == compose["services"]["worker"]["restart"]  # comes back when it dies, as the CPU one
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] and d.get("count") == "all" for d in devices)
    # the same database and broker as the other services
    assert gpu["environment"] == compose["services"]["worker"]["environment"]
    # no CPU-only wheel index: torch from PyPI's default index bundles CUDA
    assert gpu["build"]["args"]["TORCH_INDEX_URL"] == ""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==' in dockerfile
