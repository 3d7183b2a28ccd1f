"""Tasks: what a user hands pipeboard to train (model, data, loss, metric), and how a task
factory builds one. ``from trainer import Task``; a model SPEC (zoo name or factory path) becomes
a Task through ``pipeboard.trainer.load_task`` (``pipeboard.trainer.spec``).

Lazy: importing ``pipeboard.trainer.task.names`` (torch-free) must not import torch through this package.
"""

__all__ = ["OPTIMIZERS", "Task", "TaskError", "check_task"]


def __getattr__(name: str):
    if name == "OPTIMIZERS":
        from pipeboard.trainer.task.names import OPTIMIZERS

        return OPTIMIZERS
    if name in ("Task", "TaskError"):
        from pipeboard.trainer.task import task

        return getattr(task, name)
    if name == "check_task":
        from pipeboard.trainer.task.check import check_task

        return check_task
    raise AttributeError(f"module 'pipeboard.trainer.task' has no attribute {name!r}")
