"""The pipeline runtime: real multi-process training that executes a schedule's action lists.

``run_training(RunConfig(...), sink)`` starts one process per stage replica, runs the schedule
(``gpipe``, ``1f1b``, ``interleaved-1f1b``, ``zb-h1``, ``pipedream``, ``dp``) and reports through
the sink. See docs/runtime.md.
"""

from trainer.runtime.config import ConfigError, RunConfig
from trainer.runtime.launch import RunFailed, run_training

__all__ = ["ConfigError", "RunConfig", "RunFailed", "run_training"]
