"""Task factories: ``package.module:function`` or ``path/to/file.py:function``, found, checked
against their arguments, and called to build a :class:`Task`. (A zoo name is looked up by
``pipeboard.trainer.spec``, which then builds the zoo's factory here, the same way.)

The function (a *task factory*) is called with the model arguments as keyword arguments and, when
given, the data location as ``data=``; it returns a Task. It runs with torch's random state seeded
by the run's seed, so every worker process that calls it builds the same initial weights. Every
way this can go wrong is a :class:`TaskError` whose one-line message names the thing at fault.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from pipeboard.trainer.task import old_name
from pipeboard.trainer.task.task import Task, TaskError


def is_factory_path(spec: str) -> bool:
    """Whether SPEC names a factory (``module:function`` or ``file.py:function``), not a zoo name."""
    return ":" in spec


def _import_file(path: Path, spec: str):
    """Import a user's task file as a module of its own, its folder on ``sys.path`` so it can
    import its siblings. Registered in ``sys.modules`` so its classes pickle by name.

    The folder goes last, not first as ``python file.py`` would put it: this process goes on
    importing the standard library and installed packages lazily (transformers does), and a
    user's ``profile.py`` or ``types.py`` must not shadow them. A project's own top-level
    ``trainer`` or ``app`` is found all the same: pipeboard's are ``pipeboard.trainer`` and
    ``pipeboard.app``."""
    name = "pipeboard_task_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    old_name.install()
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.append(folder)
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise TaskError(f"model {spec!r}: importing {path.name} raised {_one_line(exc)}") from None
    return module


def _one_line(exc: BaseException) -> str:
    """``Type: message (at file.py:N)``, the innermost frame outside pipeboard and torch."""
    here = str(Path(__file__).resolve().parents[1])
    torch_dir = os.path.dirname(torch.__file__)
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith((here, torch_dir)) and "importlib" not in f.filename]
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    message = " ".join(str(exc).split()) or "(no message)"
    return f"{type(exc).__name__}: {message}{where}"


def resolve_factory(spec: str) -> Callable[..., Task]:
    """The callable a factory path SPEC names."""
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise TaskError(f"model {spec!r}: a task factory looks like 'package.module:function' or "
                        "'path/to/file.py:function'")
    if where.endswith(".py") or os.sep in where or "/" in where:
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise TaskError(f"model {spec!r}: file {where} does not exist")
        module = _import_file(path, spec)
    else:
        # The working folder's packages import, as under `python -m`, but after the installed ones
        # (see _import_file).
        if os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())
        old_name.install()
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as exc:
            raise TaskError(f"model {spec!r}: no module named {exc.name!r}") from None
        except Exception as exc:
            raise TaskError(f"model {spec!r}: importing {where} raised {_one_line(exc)}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise TaskError(f"model {spec!r}: {where} has no function {attr!r}")
    return factory


def factory_arguments(factory: Callable) -> dict[str, Any]:
    """The model arguments a factory takes (``data`` excluded), with their defaults
    (``inspect.Parameter.empty`` where there is none)."""
    params = inspect.signature(factory).parameters
    return {k: p.default for k, p in params.items()
            if k != "data" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _check_arguments(spec: str, factory: Callable, model_args: dict[str, Any], data: str | None) -> None:
    params = inspect.signature(factory).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    known = factory_arguments(factory)
    for key, value in model_args.items():
        if key not in known and not takes_any:
            raise TaskError(f"model argument {key!r}: {spec} takes no such argument "
                            f"(arguments: {', '.join(sorted(known)) or 'none'})")
        default = known.get(key, inspect.Parameter.empty)
        want = type(default) if default not in (inspect.Parameter.empty, None) else None
        if want is bool and not isinstance(value, bool):
            raise TaskError(f"model argument {key!r}: must be true or false, got {value!r}")
        if want is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise TaskError(f"model argument {key!r}: must be an integer, got {value!r}")
        if want is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise TaskError(f"model argument {key!r}: must be a number, got {value!r}")
    missing = [k for k, d in known.items() if d is inspect.Parameter.empty and k not in model_args]
    if missing:
        raise TaskError(f"model argument {missing[0]!r}: {spec} needs it (--model-arg {missing[0]}=...)")
    if data is not None:
        if "data" not in params and not takes_any:
            raise TaskError(f"data: {spec} takes no data location (its factory has no 'data' parameter)")
        if not os.path.exists(os.path.expanduser(data)):
            raise TaskError(f"data: {data} does not exist")
    elif "data" in params and params["data"].default is inspect.Parameter.empty:
        raise TaskError(f"data: {spec} needs a data location (--data PATH)")


def build_task(spec: str, factory: Callable[..., Task], model_args: dict[str, Any] | None = None,
               data: str | None = None, seed: int = 0) -> Task:
    """Call ``factory`` (SPEC's) with the model arguments and ``data``, its weights fixed by
    ``seed``. The model comes back as it is: it is captured whole when it is split."""
    model_args = dict(model_args or {})
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TaskError(f"seed: must be an integer, got {seed!r}")
    _check_arguments(spec, factory, model_args, data)
    kwargs = dict(model_args)
    if data is not None:
        kwargs["data"] = os.path.expanduser(data)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            task = factory(**kwargs)
        except TaskError:
            raise
        except Exception as exc:
            raise TaskError(f"model {spec!r}: the task factory raised {_one_line(exc)}") from None
    if not isinstance(task, Task):
        raise TaskError(f"model {spec!r}: the task factory returned {type(task).__name__}, not a pipeboard.trainer.Task")
    task.name = task.name or spec
    task.model_args = model_args
    task.seed = seed
    return task
