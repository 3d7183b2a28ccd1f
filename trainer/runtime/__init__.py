"""The pipeline runtime: real multi-process training that executes a schedule's action lists.

``run_training(RunConfig(...), sink)`` starts one process per stage replica, runs the schedule
(any in trainer/schedule/registry.py: ``gpipe``, ``1f1b``, ``interleaved-1f1b``, ``zb-h1``,
``pipedream``, ``dp``, and those registered besides) and reports through the sink. See docs/runtime.md. Importing the package is cheap; torch loads with the launcher.
"""

from pipeboard.trainer.runtime.run_config import ConfigError, RunConfig

__all__ = ["ConfigError", "RunConfig", "RunFailed", "run_training"]


def __getattr__(name: str):
    if name in ("RunFailed", "run_training"):
        from pipeboard.trainer.runtime import launch

        return getattr(launch, name)
    raise AttributeError(f"module 'pipeboard.trainer.runtime' has no attribute {name!r}")
