"""A user's project may have top-level packages named `trainer` and `app`: pipeboard installs its
own as `pipeboard.trainer` and `pipeboard.app`, so neither shadows the other. Factories written
for the old top-level name (`from trainer import Task`) still get the engine, unless the project
brings a `trainer` of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

OWN_PACKAGES_TASK = textwrap.dedent('''
    import torch
    from torch.utils.data import TensorDataset

    from pipeboard.trainer import Task
    from trainer.blocks import make_model      # the project's own trainer package
    from app.settings import WIDTH             # the project's own app package

    def make_task():
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
        return Task(model=make_model(WIDTH), train_data=data, loss=torch.nn.functional.mse_loss)
''')

OLD_NAME_TASK = textwrap.dedent('''
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from trainer import Task                   # the engine's old top-level name
    from trainer.task.task import TaskError

    def make_task():
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
        return Task(model=nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), train_data=data,
                    loss=nn.functional.mse_loss)
''')


def write_project_with_own_packages(where: Path) -> Path:
    """A project with a top-level `trainer` and `app` of its own, and a task file using both."""
    (where / "trainer").mkdir(parents=True)
    (where / "trainer" / "__init__.py").write_text("OWN = True\n")
    (where / "trainer" / "blocks.py").write_text(
        "from torch import nn\n\ndef make_model(width):\n"
        "    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))\n")
    (where / "app").mkdir()
    (where / "app" / "__init__.py").write_text("")
    (where / "app" / "settings.py").write_text("WIDTH = 6\n")
    (where / "my_task.py").write_text(OWN_PACKAGES_TASK)
    return where


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """CODE in a fresh interpreter (imports are process-wide), run in the project's folder."""
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_a_project_with_its_own_trainer_and_app_packages_builds_its_task(tmp_path):
    project = write_project_with_own_packages(tmp_path / "project")
    done = run_python(textwrap.dedent("""
        from pipeboard.trainer.spec import load_task
        task = load_task("my_task.py:make_task")
        import trainer, app
        assert trainer.OWN and "project" in trainer.__file__ and "project" in app.__file__, (trainer, app)
        assert type(task).__module__ == "pipeboard.trainer.task.task"
        print(task.model[0].out_features)
    """), cwd=project)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["6"]


def test_a_factory_using_the_old_name_gets_the_engine_itself(tmp_path):
    (tmp_path / "old.py").write_text(OLD_NAME_TASK)
    done = run_python(textwrap.dedent(f"""
        from pipeboard.trainer.spec import load_task
        from pipeboard.trainer.task.task import Task, TaskError
        import pipeboard.trainer.task.task as engine_task
        task = load_task("{tmp_path}/old.py:make_task")
        import trainer, trainer.task.task
        assert isinstance(task, Task)                     # one Task class, not a copy
        assert trainer.task.task is engine_task and trainer.task.task.TaskError is TaskError
        assert trainer.__spec__.name == "pipeboard.trainer"  # the engine keeps its own spec
        print("ok")
    """), cwd=ROOT)  # the checkout's root: its trainer/ folder must not load a second time
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok"]


def test_an_unknown_module_under_the_old_name_is_not_found(tmp_path):
    (tmp_path / "bad.py").write_text("from trainer.no_such_module import x\n\ndef make_task():\n    pass\n")
    done = run_python(textwrap.dedent(f"""
        from pipeboard.trainer.spec import load_task
        from pipeboard.trainer.task.task import TaskError
        try:
            load_task("{tmp_path}/bad.py:make_task")
        except TaskError as exc:
            print(exc)
    """), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "No module named 'trainer.no_such_module'" in done.stdout, done.stdout


def test_pipeboard_installs_no_top_level_trainer_or_app(tmp_path):
    done = run_python("import importlib.util as u; print(u.find_spec('trainer'), u.find_spec('app'))", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.split() == ["None", "None"], done.stdout + done.stderr


def test_the_package_list_names_every_package_folder():
    """pyproject lists the packages (their names differ from their folders); a new subpackage
    left out of it would be missing from a built wheel."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"pipeboard." + ".".join(p.parent.relative_to(ROOT).parts)
             for top in ("trainer", "app") for p in (ROOT / top).rglob("__init__.py")}
    assert listed == found
