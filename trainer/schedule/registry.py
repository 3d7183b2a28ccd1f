"""The schedule registry: every schedule declared once, with what it can do.

A ``ScheduleSpec`` names a schedule, its builder (the function that writes each worker's
actions) and its capabilities; ``build(name, ...)`` (builder.py) dispatches through it, and the
runtime (trainer/runtime/run_config.py, layout.py, worker.py), the predictor, the API schemas and
``GET /api/v1/schedules``, the CLI's help and the dashboard's new-job form all read it. So no
caller compares a schedule's name to decide what it can do: it asks the registry
(``get(name).chunks``, ``is_async(name)``, ``having(vertical_sync=True)``, ...).

Adding a schedule is one file (docs/schedules.md)::

    from pipeboard.trainer.schedule.flush import one_f_one_b_ops
    from pipeboard.trainer.schedule.registry import register

    def my_programs(ctx):  # one list of actions per worker, rank order
        t = ctx.topology
        return [one_f_one_b_ops(t, w.rank, w.stages[0], ctx.microbatches, ctx.split_backward) for w in t.workers]

    register("my-1f1b", my_programs, description="1F1B again, under my name.")

put in ``trainer/schedule/library/`` (imported with this module: a built-in), or loaded by
importing it before the registry is read, or, for the CLI, the service and its workers, by
naming it in ``PIPEBOARD_SCHEDULES`` (comma-separated module names, ``.py`` paths or paths of
torch's schedule files, ``.csv``, torchcsv.py; imported on the registry's first query).

Torch- and numpy-free: ``pipeboard.trainer.runtime.run_config`` and every `pipeboard` command's help import
it. The built-in builders are referred to by ``"module:function"`` and imported on first call.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pipeboard.trainer.schedule.actions import ScheduleError
from pipeboard.trainer.schedule.topology import PLACEMENTS

if TYPE_CHECKING:
    from pipeboard.trainer.schedule.actions import Action
    from pipeboard.trainer.schedule.topology import Topology

ENV = "PIPEBOARD_SCHEDULES"  # extra schedule modules, imported on the first query
WEIGHT_GRADS = ("batched", "immediate")  # `pipeboard train --weight-grads`; the first is the default
DEFAULT = "1f1b"  # what the API and the dashboard's form pick when none is given
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,39}$"  # a CLI value, a JSON string, an HTML option value


class UnknownSchedule(ScheduleError):
    """A name no schedule is registered under; the message lists the known ones."""


@dataclass(frozen=True)
class BuildContext:
    """What a builder gets: the workers (already laid out from the capabilities) and the options."""

    topology: Topology  # workers, the stages each holds, replicas (interleaved: chunks x stages virtual ones)
    microbatches: int  # per iteration; asynchronous schedules: in total
    stages: int  # physical stages (data parallel: 1)
    chunks: int  # model chunks per worker (1 unless the schedule takes chunks)
    split_backward: bool  # each backward as BI and W
    vertical_sync: bool
    per_update: int  # asynchronous schedules: microbatches per weight update (1 otherwise)


Builder = Callable[[BuildContext], "list[list[Action]]"]


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule and what it can do.

    - ``builder(ctx)``: one program (ordered actions, and ``OverlapFB`` pairs) per worker of
      ``ctx.topology``, rank order.
      ``build`` then batches weight gradients (where honoured), places and hoists the receives
      and writes ``meta``.
    - ``synchronous``: one weight update per iteration of ``microbatches`` (a flush). False
      (pipedream): ``microbatches`` counts them in total, an update after every ``per_update``
      of them, weight stashing; the runtime runs one schedule per segment of a run.
    - ``replication``: stages may have several replicas.
    - ``chunks``: takes ``chunks > 1`` model chunks per worker (one worker per stage, so no
      replication); ``default_chunks``: what the runtime uses when a run asks for 1.
    - ``weight_grads``: the ``--weight-grads`` modes it honours; an empty tuple: it ignores the
      setting (dp: DDP all-reduces inside the backward; zb-h1 places each W itself).
    - ``vertical_sync``: takes vertical sync of weight versions (asynchronous schedules only).
    - ``needs_split_backward``: its backwards are always BI + W (zb-h1).
    - ``data_parallel``: the whole model on every worker: one stage, ``num_stages`` (or the
      only replica count) is the worker count, DDP reduces the gradients inside the backward.
    - ``placement``: how a schedule that takes chunks places its virtual stages on workers,
      ``"loop"`` (worker w holds w, w + p, ...) or ``"v"`` (down and back up: w, 2p - 1 - w, ...);
      ``topology.chunk_stages`` is the formula, read by the builders' topology and the runtime.
    - ``description``: one line, for help texts and the dashboard's form.
    """

    name: str
    builder: Builder
    description: str
    synchronous: bool = True
    replication: bool = True
    chunks: bool = False
    default_chunks: int = 1
    weight_grads: tuple[str, ...] = WEIGHT_GRADS
    vertical_sync: bool = False
    needs_split_backward: bool = False
    data_parallel: bool = False
    placement: str = "loop"

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.name, str) or not re.match(NAME_PATTERN, self.name):
            problems.append(f"name must match {NAME_PATTERN} (lower case, digits, . _ -)")
        if not callable(self.builder):
            problems.append("builder must be callable")
        if not self.description or "\n" in self.description:
            problems.append("description must be one line")
        if any(w not in WEIGHT_GRADS for w in self.weight_grads):
            problems.append(f"weight_grads must be modes among {', '.join(WEIGHT_GRADS)}")
        if self.default_chunks < 1 or (self.default_chunks > 1 and not self.chunks):
            problems.append("default_chunks > 1 needs chunks=True")
        if self.chunks and self.replication:
            problems.append("a schedule that takes chunks runs one worker per stage: replication=False")
        if self.vertical_sync and self.synchronous:
            problems.append("vertical_sync applies to asynchronous schedules (synchronous=False)")
        if self.needs_split_backward and "batched" in self.weight_grads:
            problems.append("needs_split_backward excludes batched weight gradients (weight_grads without 'batched')")
        if self.data_parallel and (self.chunks or not self.synchronous or not self.replication):
            problems.append("data_parallel is one replicated stage: synchronous, replication, no chunks")
        if self.placement not in PLACEMENTS:
            problems.append(f"placement must be one of {', '.join(PLACEMENTS)}")
        elif self.placement != "loop" and not self.chunks:
            problems.append("a placement other than 'loop' places chunks: it needs chunks=True")
        if problems:
            raise ScheduleError(f"schedule {self.name!r}: " + "; ".join(problems))
        object.__setattr__(self, "weight_grads", tuple(self.weight_grads))

    def to_dict(self) -> dict[str, Any]:
        """The capabilities as plain data (GET /api/v1/schedules): all but the builder."""
        d = asdict(self)
        del d["builder"]
        d["weight_grads"] = list(self.weight_grads)
        return d


_SPECS: dict[str, ScheduleSpec] = {}
# a job's own schedule file, registered by the process that runs it (torchcsv.register_text):
# found by name (get, known) but never listed (specs, names, having, GET /schedules), so one
# job's file never shows up as a choice for the next job or in another test
_JOB_SPECS: dict[str, ScheduleSpec] = {}
_loaded = False
_load_error: str | None = None  # a PIPEBOARD_SCHEDULES entry that failed: every query says so


def register(spec: ScheduleSpec | str, builder: Builder | None = None, *, replace: bool = False,
             **capabilities: Any) -> ScheduleSpec:
    """Add a schedule: ``register(ScheduleSpec(...))`` or ``register(name, builder, description=...,
    **capabilities)``. A name already taken is a ScheduleError unless ``replace``. Returns the spec."""
    if isinstance(spec, str):
        if builder is None:
            raise ScheduleError(f"schedule {spec!r}: register(name, builder, description=...) needs a builder")
        spec = ScheduleSpec(spec, builder, **capabilities)
    elif builder is not None or capabilities:
        raise ScheduleError("register(spec) takes the spec alone")
    if spec.name in _SPECS and not replace:
        raise ScheduleError(f"schedule {spec.name!r} is registered already (replace=True to redefine it)")
    _SPECS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a schedule (tests that register their own), or a job's own."""
    _SPECS.pop(name, None)
    _JOB_SPECS.pop(name, None)


def register_job_schedule(spec: ScheduleSpec) -> ScheduleSpec:
    """Add a job's own schedule (its file's text): resolvable by name, left out of every listing.
    The same name again replaces it (the name is its text's hash: the same schedule)."""
    if spec.name in _SPECS:
        raise ScheduleError(f"schedule {spec.name!r} is a listed schedule; a job's own file cannot take its name")
    _JOB_SPECS[spec.name] = spec
    return spec


def specs() -> tuple[ScheduleSpec, ...]:
    """Every schedule, in registration order (the built-ins first)."""
    _load_extra()
    return tuple(_SPECS.values())


def names() -> tuple[str, ...]:
    return tuple(s.name for s in specs())


def known(name: object) -> bool:
    _load_extra()
    return isinstance(name, str) and (name in _SPECS or name in _JOB_SPECS)


def listed(name: object) -> bool:
    """A schedule a request may name: ``known``, less the jobs' own files (those go by ``custom``)."""
    _load_extra()
    return isinstance(name, str) and name in _SPECS


def get(name: str) -> ScheduleSpec:
    """The spec of ``name``; UnknownSchedule naming the known ones otherwise."""
    _load_extra()
    try:
        return _SPECS[name] if name in _SPECS else _JOB_SPECS[name]
    except (KeyError, TypeError):
        raise UnknownSchedule(f"unknown schedule {name!r} (known: {', '.join(_SPECS)})") from None


def having(**capabilities: Any) -> tuple[str, ...]:
    """Names of the schedules whose spec has every given field equal to the given value, e.g.
    ``having(synchronous=False)``, ``having(weight_grads=())``."""
    fields = ScheduleSpec.__dataclass_fields__
    unknown = [k for k in capabilities if k not in fields or k in ("name", "builder", "description")]
    if unknown:
        raise TypeError(f"having(): not a capability: {', '.join(unknown)}")
    wanted = {k: tuple(v) if k == "weight_grads" else v for k, v in capabilities.items()}
    return tuple(s.name for s in specs() if all(getattr(s, k) == v for k, v in wanted.items()))


# --- the capability questions callers ask by name ------------------------------------------


def is_async(name: str) -> bool:
    """No flush: microbatches counted in total, an update per batch, weight stashing (pipedream)."""
    return not get(name).synchronous


def takes_chunks(name: str) -> bool:
    return get(name).chunks


def takes_vertical_sync(name: str) -> bool:
    return get(name).vertical_sync


def is_data_parallel(name: str) -> bool:
    return get(name).data_parallel


def honours(name: str, weight_grads: str) -> bool:
    """Whether ``--weight-grads weight_grads`` changes what ``name`` runs."""
    return weight_grads in get(name).weight_grads


def either(names_: tuple[str, ...] | list[str], quote: str = "'", conj: str = "or") -> str:
    """``'a'``, ``'a' or 'b'``, ``'a', 'b' or 'c'``: for messages naming the schedules that can."""
    items = [f"{quote}{n}{quote}" for n in names_]
    if not items:
        return "no schedule"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" {conj} " + items[-1]


# --- extra schedule modules -----------------------------------------------------------------


def _load_extra() -> None:
    """Import the modules ``PIPEBOARD_SCHEDULES`` names, once (they call ``register``). If one
    cannot be imported, this query and every later one is that ScheduleError: a registry without
    a schedule its deployment names would only fail later, and less clearly."""
    global _loaded, _load_error
    if _load_error is not None:
        raise ScheduleError(_load_error)
    if _loaded:
        return
    _loaded = True  # before importing: a module that queries the registry sees the built-ins
    for entry in (e.strip() for e in os.environ.get(ENV, "").split(",")):
        if entry:
            try:
                load_module(entry)
            except ScheduleError as exc:
                _load_error = str(exc)
                raise


def known_quietly(name: str) -> bool:
    """``known`` without reading ``PIPEBOARD_SCHEDULES`` (for the loader itself)."""
    return name in _SPECS


def load_module(entry: str) -> None:
    """Import one schedule module: a module name (``mypkg.schedules``), a path to a ``.py`` file,
    or a path to torch's schedule file (``.csv``). ScheduleError naming ``PIPEBOARD_SCHEDULES``
    and the entry if it cannot be loaded."""
    try:
        if entry.endswith(".csv"):  # torch's schedule file: registered as custom-<stem>
            # (by name, as the plugins are: torchcsv registers through this module)
            torchcsv = importlib.import_module("pipeboard.trainer.schedule.torchcsv")
            if not known_quietly(torchcsv.schedule_name(entry)):
                torchcsv.register_file(entry)
            return
        if entry.endswith(".py") or os.sep in entry or "/" in entry:
            path = Path(entry).resolve()
            module_name = f"pipeboard_schedules.{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}"
            if module_name in sys.modules:
                return
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None or spec.loader is None or not path.is_file():
                raise FileNotFoundError(f"no such file: {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[module_name]
                raise
        else:
            importlib.import_module(entry)
    except ScheduleError as exc:
        raise ScheduleError(f"{ENV}: {entry}: {exc}") from None
    except Exception as exc:
        raise ScheduleError(f"{ENV}: cannot import {entry!r}: {type(exc).__name__}: {exc}") from exc


# --- the built-in schedules -----------------------------------------------------------------


def _lazy(target: str) -> Builder:
    """A builder named ``"module:function"``, imported on its first call (keeps this module light)."""
    module, _, attr = target.partition(":")

    def builder(ctx: BuildContext) -> list[list[Action]]:
        return getattr(importlib.import_module(module), attr)(ctx)

    builder.__qualname__ = builder.__name__ = target
    return builder


register("gpipe", _lazy("pipeboard.trainer.schedule.flush:gpipe_builder"),
         description="All forwards, then all backwards, then one weight update per iteration (GPipe).")
register("1f1b", _lazy("pipeboard.trainer.schedule.flush:one_f_one_b_builder"),
         description="Warm-up forwards, then one backward per forward, one update per iteration (PipeDream-Flush).")
register("interleaved-1f1b", _lazy("pipeboard.trainer.schedule.interleaved:interleaved_builder"),
         description="1F1B over several model chunks per worker (Megatron-LM): a smaller bubble, no replicas.",
         replication=False, chunks=True, default_chunks=2)
register("zb-h1", _lazy("pipeboard.trainer.schedule.zerobubble:zero_bubble_builder"),
         description="1F1B with each backward split into input and weight gradients, the W filling the drain (ZB-H1).",
         weight_grads=(), needs_split_backward=True)
register("pipedream", _lazy("pipeboard.trainer.schedule.async_1f1b:pipedream_builder"),
         description="Asynchronous 1F1B without a flush: weight stashing, one update per batch (PipeDream).",
         synchronous=False, vertical_sync=True)
register("dp", _lazy("pipeboard.trainer.schedule.flush:one_f_one_b_builder"),
         description="Data parallel: the whole model on every worker, gradients all-reduced inside the backward.",
         weight_grads=(), data_parallel=True)


LIBRARY = "pipeboard.trainer.schedule.library"


def _load_library() -> None:
    """The one-file schedules of ``trainer/schedule/library/``, in name order. They import this
    module to register, as ``PIPEBOARD_SCHEDULES`` modules do, so they are found by path and
    imported by name, like those."""
    folder = Path(__file__).resolve().parent / "library"
    for module in sorted(m.name for m in pkgutil.iter_modules([str(folder)])):
        importlib.import_module(f"{LIBRARY}.{module}")


_load_library()
