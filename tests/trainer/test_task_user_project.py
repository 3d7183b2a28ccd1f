"""A user's own project, outside the repository: README's example task file and data, as a user
copies them, trains under gpipe, 1f1b and pipedream on 2 and 3 stages to its target; gpipe and
1f1b compute exactly single-process gradient accumulation."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.params import max_diff
from pipeboard.trainer.runtime import RunConfig, run_training
from pipeboard.trainer.runtime.checkpoint import assemble_model
from pipeboard.trainer.runtime.reference import train_sync

README = Path(__file__).resolve().parents[2] / "README.md"
PIPEBOARD = [sys.executable, "-c", "from pipeboard.app.cli import main; main()"]


def _readme_blocks() -> tuple[str, str, list[str]]:
    """The example's task file, its data script and its commands, as README shows them."""
    text = README.read_text()
    section = text[text.index("## Your own model and data"):]
    section = section[:section.index("\n## ", 3)]
    python = re.findall(r"```python\n(.*?)```", section, re.S)
    shell = re.findall(r"```sh\n(.*?)```", section, re.S)
    commands = [c.strip() for c in shell[1].replace("\\\n", " ").splitlines() if c.strip()]
    return python[0], shell[0], commands


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    task_file, data_script, _ = _readme_blocks()
    where = tmp_path_factory.mktemp("user-project")  # outside the repository, like a user's folder
    (where / "my_task.py").write_text(task_file)
    code = data_script.strip().removeprefix("python3 -c ").strip().strip('"')
    subprocess.run([sys.executable, "-c", code], cwd=where, check=True)
    assert (where / "tokens.txt").read_text().count("\n") == 4000
    return where


def test_the_readme_commands_work_as_written(project):
    *_, commands = _readme_blocks()
    assert [c.split()[:2] for c in commands] == [["pipeboard", "profile"], ["pipeboard", "plan"], ["pipeboard", "train"]]
    for command in commands:
        done = subprocess.run([*PIPEBOARD, *command.split()[1:]], cwd=project, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, (command, done.stderr)
    assert "target reached" in done.stdout, done.stdout


def _cfg(project: Path, **kw) -> RunConfig:
    return RunConfig(model=f"{project}/my_task.py:make_task", data=str(project / "tokens.txt"), batch_size=64,
                     microbatches=4, **kw)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "pipedream"])
@pytest.mark.parametrize("stages", [2, 3])
def test_trains_to_its_target(project, schedule, stages):
    summary = run_training(_cfg(project, schedule=schedule, num_stages=stages, target=0.9, max_steps=1500))
    assert summary["final_metric"] >= 0.9 and summary["time_to_target_s"] is not None, summary



@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages", [2, 3])
def test_sync_schedules_equal_gradient_accumulation(project, tmp_path, schedule, stages):
    cfg = _cfg(project, schedule=schedule, num_stages=stages, steps=5, checkpoint_dir=str(tmp_path),
               eval_at_end=False)
    run_training(cfg)
    trained, _ = assemble_model(cfg, tmp_path)
    assert max_diff(trained, train_sync(cfg, 0)) > 1e-4  # it really trained
    assert max_diff(trained, train_sync(cfg, 5)) < 1e-5
