"""The tuner: the split, schedule, microbatch count and recompute of a run, chosen together.

``search(profiles, workers=N, batch_size=B, memory_bytes=cap)`` enumerates the planner's splits
(``splits``), every registered schedule that can run them, the microbatch counts the profiles
cover and recompute off or on per stage; predicts each candidate's step time and per-worker
memory with the trainer's one cost model (``cost``: ``schedule.predict`` and
``plan.memory_fit``/``schedule.memory_model``) and ranks those that fit the cap by predicted time
per sample (``search``). ``verify`` runs the best few for a few steps with the real runtime and
re-ranks them by measurement; ``tuned`` turns a choice into the run configuration that trains it.
No torch import outside ``verify`` and ``tuned``'s run; no app import anywhere.
"""

from __future__ import annotations

from pipeboard.trainer.tune.candidate import Candidate, TuneError
from pipeboard.trainer.tune.search import DEFAULT_MICROBATCHES, TuneResult, search

__all__ = ["DEFAULT_MICROBATCHES", "Candidate", "TuneError", "TuneResult", "search"]
