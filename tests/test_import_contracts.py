"""The layers, enforced: the import-linter contracts in `.importlinter` hold for the code as it is.

No import cycles between sibling modules or packages anywhere in `trainer` or `app`; the engine
never imports the service; profiling, planning and schedules never import the runtime; the planner
never imports torch; API routes do not import each other. A change that breaks one fails here with
import-linter's report (which imports, at which lines).
"""

from __future__ import annotations

import configparser
from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".importlinter"


def test_contracts_are_the_documented_ones():
    """Each layer rule has its contract (deleting one from the file is a failure, not a pass)."""
    config = configparser.ConfigParser()
    config.read(CONFIG)
    contracts = {s.split(":", 2)[2]: dict(config[s]) for s in config.sections() if s.startswith("importlinter:contract:")}
    assert contracts["no-cycles"]["type"] == "acyclic_siblings"
    assert set(contracts["no-cycles"]["ancestors"].split()) == {"pipeboard.trainer", "pipeboard.app"}
    assert (contracts["trainer-not-app"]["source_modules"].split(), contracts["trainer-not-app"]["forbidden_modules"].split()) == (["pipeboard.trainer"], ["pipeboard.app"])
    assert set(contracts["offline-not-runtime"]["source_modules"].split()) == {"pipeboard.trainer.profile", "pipeboard.trainer.plan", "pipeboard.trainer.schedule"}
    assert contracts["offline-not-runtime"]["forbidden_modules"].split() == ["pipeboard.trainer.runtime"]
    assert contracts["planner-no-torch"]["forbidden_modules"].split() == ["torch"]
    assert contracts["routes-independent"]["type"] == "independence"
    assert not any("ignore_imports" in c for c in contracts.values()), "no exceptions to the layers"


def test_import_contracts_hold(capsys):
    code = lint_imports(config_filename=str(CONFIG), no_cache=True, no_logo=True)
    report = capsys.readouterr().out
    assert code == 0, report
