"""torch's elastic agent (torchrun, `torch.distributed.run`) for one host's share of a job, as a
worker starts it (app/services/multihost.py): the same command line as torchrun's, run by torch's
own `main`; only, first, the agent is made to end with the worker that started it (its process
group is its own, out of the worker's), and its training processes are not (their parent is the
agent, which ends them itself).

    python -m pipeboard.app.services.node_agent --nnodes=N --nproc-per-node=K --rdzv-backend=c10d ...
"""

from __future__ import annotations

import os
import sys

from pipeboard.app.core.lifetime import die_with_parent_if_asked


def main(argv: list[str]) -> None:
    die_with_parent_if_asked()
    os.environ.pop("PIPEBOARD_PARENT_PID", None)
    from torch.distributed.run import main as torchrun

    torchrun(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
