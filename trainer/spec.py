"""From a model SPEC to a :class:`~pipeboard.trainer.task.Task`: a zoo name, ``package.module:function``
or ``path/to/file.py:function``.

The zoo's entries are task factories like a user's: a name only says which one, and both are
built by ``pipeboard.trainer.task.factory.build_task``. This module sits above the two (``pipeboard.trainer.task`` knows
nothing of the zoo, the zoo builds on ``pipeboard.trainer.task``).
"""

from __future__ import annotations

from typing import Any, Callable

from pipeboard.trainer import zoo
from pipeboard.trainer.task.factory import build_task, is_factory_path, resolve_factory
from pipeboard.trainer.task.task import Task


def factory_of(spec: str) -> Callable[..., Task]:
    """The task factory SPEC names: a factory path's function, or the zoo entry's."""
    return resolve_factory(spec) if is_factory_path(spec) else zoo.factory(spec)


def load_task(spec: str, model_args: dict[str, Any] | None = None, data: str | None = None,
              seed: int = 0) -> Task:
    """Build the Task SPEC names with these model arguments and data location, its weights fixed
    by ``seed`` (every worker process that calls this builds the same initial weights)."""
    return build_task(spec, factory_of(spec), model_args, data, seed)
