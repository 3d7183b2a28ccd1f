"""Reading a profile file in either format: pipeboard's JSON or PipeDream's graph.txt.

Kept apart from both formats so that each imports only what it reads (``graphtxt`` builds
``schema``'s objects; ``schema`` knows nothing of graph.txt).
"""

from __future__ import annotations

from pathlib import Path

from pipeboard.trainer.profile.graphtxt import parse_graph_txt
from pipeboard.trainer.profile.schema import Profile


def load_profile(path: str | Path) -> Profile:
    """The profile in ``path``, a profile JSON or a PipeDream graph.txt (chosen by content, not by
    name; a graph.txt's model is its folder's name)."""
    text = Path(path).read_text()
    if text.lstrip().startswith("{"):
        return Profile.from_json(text)
    return parse_graph_txt(text, model=Path(path).parent.name)
