"""A schedule added in one file: GPipe's order under another name.

This file is all it takes (docs/schedules.md): a builder and one ``register`` call. The tests
load it the way a user would: ``PIPEBOARD_SCHEDULES=tests/schedule_plugin.py`` for the CLI, the
service and its workers (tests/trainer/test_schedule_registry.py, tests/e2e/test_schedules.py),
or ``registry.load_module`` in-process.
"""

from __future__ import annotations

from pipeboard.trainer.schedule.flush import gpipe_ops
from pipeboard.trainer.schedule.registry import BuildContext, register

NAME = "gpipe-twin"
DESCRIPTION = "GPipe's order under another name (a test's schedule, added in one file)."


def gpipe_twin(ctx: BuildContext):
    t = ctx.topology
    return [gpipe_ops(t, w.rank, w.stages[0], ctx.microbatches, ctx.split_backward) for w in t.workers]


register(NAME, gpipe_twin, description=DESCRIPTION)
