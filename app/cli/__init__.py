"""The `pipeboard` command line.

Each module registers its own commands; heavy imports (torch, the web stack) happen inside the
commands that need them, so that e.g. `pipeboard plan` starts without importing torch.
"""

from __future__ import annotations

import typer

from pipeboard.app.cli import jobs, plan, profile, schedule, server, simulate, storage, train, tune

cli = typer.Typer(
    name="pipeboard",
    help="Profile a model, plan its pipeline, simulate and run it, and serve the dashboard.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



@cli.callback()
def _before_any_command() -> None:
    # Huge pages for large tensors in every command that runs torch (profile, train, simulate), so
    # a profile is measured under the allocator settings the runtime trains with; it must happen
    # before torch allocates anything (see trainer/allocator.py). Commands import torch
    # themselves, after this.
    from pipeboard.trainer.allocator import prefer_huge_pages

    prefer_huge_pages()


for module in (profile, plan, simulate, schedule, train, tune, server, jobs, storage):
    module.register(cli)


def main() -> None:
    cli()
