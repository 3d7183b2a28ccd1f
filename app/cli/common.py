"""Helpers the `pipeboard` commands share: one-line errors, `--model-arg k=v` parsing and the
schedules' help (from the schedule registry)."""

from __future__ import annotations

import ast
import os
import re
import sys
from typing import Any, NoReturn

import typer
from typer.core import TyperCommand


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one line on stderr and exit with `code` (2: bad input), never a traceback."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def parse_model_args(pairs: list[str]) -> dict[str, Any]:
    """`k=v` strings to keyword arguments; values become int, float or bool where they read so."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--model-arg {pair!r}: expected key=value")
        value: Any = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            for cast in (int, float):
                try:
                    value = cast(raw)
                    break
                except ValueError:
                    pass
        out[key.strip()] = value
    return out



def without_blas_threads() -> None:
    """For a command that uses NumPy but no linear algebra (`plan` on a profile file, `simulate`):
    NumPy's OpenBLAS starts a thread per core as NumPy is imported, and they spin for a while
    (about 0.09 s of CPU on the machine of docs/planner.md, as much as the import itself). One
    thread, unless the environment says otherwise; it is read when NumPy is first imported, so
    this acts only before that."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def text_table(title: str, header: list[str], rows: list[list[str]], left: set[str] = frozenset()) -> list[str]:
    """A table as lines of plain text: the title, then the header and the rows in columns as wide
    as their widest cell, right-aligned but for the columns named in ``left``. (Printed with rich,
    the plan's tables took 0.08 s to import and render, a third of `pipeboard plan`'s run, and
    were cut to the terminal's width, or 80 columns in a pipe.)"""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    lines = [title]
    for cells in [header, *rows]:
        lines.append("  ".join(cell.ljust(w) if name in left else cell.rjust(w)
                               for cell, w, name in zip(cells, widths, header)).rstrip())
    return lines


def schedule_names(conj: str = "or", **capabilities: Any) -> str:
    """For help texts: the registered schedules (with these capabilities, e.g. ``synchronous=False``),
    as "pipedream" or "gpipe, 1f1b or dp". A registry that cannot be read (a broken
    PIPEBOARD_SCHEDULES) gives a placeholder here; the commands that need it say why in one line."""
    from pipeboard.trainer.schedule import ScheduleError, registry

    try:
        return registry.either(registry.having(**capabilities) if capabilities else registry.names(), quote="",
                               conj=conj)
    except ScheduleError:
        return "(schedules unavailable: see PIPEBOARD_SCHEDULES)"


def schedules_epilog() -> str:
    """The end of `--help` (train's and simulate's): each registered schedule and its one line."""
    from pipeboard.trainer.schedule import ScheduleError, registry

    try:
        return "Schedules:\n\n" + "\n\n".join(f"{s.name}: {s.description}" for s in registry.specs())
    except ScheduleError as exc:
        return f"Schedules: none can be listed: {exc}"


# Help texts name the registered schedules, but reading the registry imports every builder: done
# for every command, that is most of `pipeboard plan`'s start-up. So a help text holds
# placeholders, filled in only when a help page is printed:
#   {schedules}                      every name, "gpipe, 1f1b or dp"
#   {schedules synchronous=False}    those with these capabilities (literal values)
#   {schedules and weight_grads=()}  joined with "and"
#   {schedules listed}               the epilog: each schedule and its one line
PLACEHOLDER = re.compile(r"\{schedules((?: [^{}\s]+)*)\}")


def _expand(text: str | None) -> str | None:
    def one(match: re.Match) -> str:
        words = match.group(1).split()
        if words == ["listed"]:
            return schedules_epilog()
        conj = words.pop(0) if words and words[0] in ("and", "or") else "or"
        capabilities = {}
        for word in words:
            key, _, value = word.partition("=")
            capabilities[key] = ast.literal_eval(value)
        return schedule_names(conj, **capabilities)

    return PLACEHOLDER.sub(one, text) if text else text


class RegistryHelpCommand(TyperCommand):
    """A command whose help texts may hold ``{schedules ...}`` placeholders (see above)."""

    def format_help(self, ctx, formatter) -> None:
        self.help, self.epilog = _expand(self.help), _expand(self.epilog)
        for param in self.params:
            if getattr(param, "help", None):
                param.help = _expand(param.help)
        super().format_help(ctx, formatter)
