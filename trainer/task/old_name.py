"""``import trainer`` in a user's project: pipeboard's engine under the name it once had.

The engine installs as ``pipeboard.trainer`` and never as a top-level ``trainer``, so that a
project may have a ``trainer`` package of its own. Task factories written when the engine was a
top-level ``trainer`` say ``from trainer import Task``; while pipeboard loads a factory that name
still gives the engine, as the very same module objects (one ``Task`` class, not two), unless the
project has a ``trainer`` of its own, which always wins. Neither shadows the other.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from pathlib import Path

ENGINE_DIR = Path(__file__).resolve().parents[1]


def _is_engine(spec: importlib.machinery.ModuleSpec) -> bool:
    """Whether SPEC is the engine's own folder reached under the old name (a checkout's root on
    sys.path): loading it would make a second copy of every module."""
    return any(Path(p).resolve() == ENGINE_DIR for p in spec.submodule_search_locations or ())


class ModuleAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``alias`` and ``alias.*`` as the modules ``target`` and ``target.*`` themselves. With
    ``yield_to_own``, a package of the alias's name found on sys.path (not the engine's own
    folder) is imported instead, as if the alias were not there."""

    def __init__(self, alias: str, target: str, *, yield_to_own: bool = False) -> None:
        self.alias, self.target, self.yield_to_own = alias, target, yield_to_own

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.alias:
            found = importlib.machinery.PathFinder.find_spec(fullname) if self.yield_to_own else None
            if found is not None and not _is_engine(found):
                return None  # the project's own package
        elif fullname.startswith(self.alias + "."):
            if sys.modules.get(self.alias) is not sys.modules.get(self.target):
                return None  # inside the project's own package
        else:
            return None
        name = self.target + fullname[len(self.alias):]
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                return None  # no such module: "No module named '<alias>...'"
            raise
        spec = importlib.machinery.ModuleSpec(fullname, self, is_package=hasattr(module, "__path__"))
        spec.loader_state = module
        return spec

    def create_module(self, spec):
        module = spec.loader_state
        spec.loader_state = module.__spec__  # the import system overwrites it; exec_module restores it
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state

    def install(self) -> None:
        """First on sys.meta_path (before the path finder, which would find the engine's folder
        under the old name in a checkout); once per process and alias."""
        if not any(isinstance(f, ModuleAlias) and f.alias == self.alias for f in sys.meta_path):
            sys.meta_path.insert(0, self)


def install() -> None:
    """``trainer`` for ``pipeboard.trainer``, a project's own ``trainer`` first."""
    ModuleAlias("trainer", "pipeboard.trainer", yield_to_own=True).install()
