"""A failure a run's configuration asks for (``RunConfig.fail_at``): one rank exits, is killed,
hangs or runs out of memory at one step, in real worker processes, so that the launcher's and the
service's failure paths (detail before a failure, retries, out-of-memory messages) are exercised
as they happen, not imitated."""

from __future__ import annotations

import os
import time
from typing import Any, NoReturn

import torch


class InjectedFault:
    """``fail_at`` = ``{"rank": r, "step": s[, "mode": "exit" | "kill" | "hang" | "oom"]}``."""

    def __init__(self, fail_at: dict[str, Any], device: torch.device) -> None:
        self.rank, self.step = fail_at.get("rank"), fail_at.get("step")
        self.mode = fail_at.get("mode", "exit")
        self.device = device

    @classmethod
    def of(cls, fail_at: dict[str, Any] | None, rank: int, device: torch.device) -> InjectedFault | None:
        """This rank's fault, or None."""
        return cls(fail_at, device) if fail_at and fail_at.get("rank") == rank else None

    def due(self, step: int) -> bool:
        return step == self.step

    def fire(self) -> NoReturn:
        if self.mode == "hang":
            while True:
                time.sleep(1)
        if self.mode == "kill":  # as if killed from outside
            os.kill(os.getpid(), 9)
        if self.mode == "oom":  # a real allocation no device can make (2**50 bytes)
            torch.empty(2**50, dtype=torch.uint8, device=self.device)
        os._exit(3)
