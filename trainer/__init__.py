"""pipeboard's engine: profiler, planner, schedules and simulator, runtime, model zoo.

Importable with no web stack; it never imports ``app``. Progress goes through a
``pipeboard.trainer.sink.Sink`` that the caller supplies.
"""

__all__ = ["Task", "TaskError", "load_task"]


def __getattr__(name: str):
    # Lazy: `import trainer` (the planner's CLI) must not import torch.
    if name == "load_task":
        from pipeboard.trainer.spec import load_task

        return load_task
    if name in __all__:
        from pipeboard.trainer import task

        return getattr(task, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
