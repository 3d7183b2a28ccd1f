"""Which splits an asynchronous schedule can run when layers share a parameter (tied weights: a
profile's ``meta["tied"]``, e.g. GPT-2's embedding and head). Its one update per stage clock
cannot keep the copies on two workers one parameter, so the runtime refuses such a split
(``runtime.tied.check``); the planner's choice and the tuner leave it out by this one rule."""

from __future__ import annotations

from pipeboard.trainer.schedule import registry


def tied_refusal(tied: list[list[str]] | None, stages: list[list[str]], schedule: str) -> str | None:
    """Why ``schedule`` cannot run ``stages`` (layer names per stage) of a model whose layer
    groups ``tied`` share a parameter, or None."""
    if registry.get(schedule).synchronous:
        return None
    stage_of = {name: i for i, names in enumerate(stages) for name in names}
    for group in tied or []:
        on = sorted({stage_of[name] for name in group if name in stage_of})
        if len(on) > 1:
            return (f"{schedule}: layers {', '.join(group)} share a parameter (tied weights) and sit on stages "
                    f"{', '.join(map(str, on))}")
    return None
