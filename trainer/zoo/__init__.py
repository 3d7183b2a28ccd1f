"""The model zoo: trainable models whose data ship with installed packages (no downloads).

``names()`` lists them, ``describe()`` says what each is, ``get(name, **model_args)`` builds one
as a :class:`ZooModel` (model, data, loss, metric, target).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from trainer.zoo.base import ZooModel

__all__ = ["ZooModel", "UnknownModelError", "names", "describe", "get"]


class UnknownModelError(KeyError, ValueError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def _factories() -> dict[str, Callable[..., ZooModel]]:
    # Imported here so that `import trainer.zoo` stays cheap (no sklearn until a model is built).
    from trainer.zoo.digits import cnn_digits, mlp_digits, resnet_digits
    from trainer.zoo.synthetic import mlp
    from trainer.zoo.text import transformer_text

    return {
        "mlp-digits": mlp_digits,
        "cnn-digits": cnn_digits,
        "resnet-digits": resnet_digits,
        "transformer-text": transformer_text,
        "mlp": mlp,
    }


_INFO = {
    # name -> (description, metric, target); kept in sync with the factories by a test.
    "mlp-digits": ("MLP on scikit-learn digits (8x8 images, 10 classes)", "accuracy", 0.95),
    "cnn-digits": ("3-layer CNN on scikit-learn digits", "accuracy", 0.96),
    "resnet-digits": ("residual CNN (a DAG of skip connections) on scikit-learn digits", "accuracy", 0.96),
    "transformer-text": ("byte-level Transformer LM on Python standard-library sources", "perplexity", 6.0),
    "mlp": ("synthetic regression MLP (depth x Linear(width, width)+ReLU); the runtime benchmark", "mse", 0.7),
}


def names() -> list[str]:
    return list(_factories())


def model_args_defaults(name: str) -> dict[str, Any]:
    """The model arguments a zoo entry takes, with their defaults (``seed`` excluded)."""
    params = inspect.signature(_factory(name)).parameters
    return {k: p.default for k, p in params.items() if k != "seed"}


def describe() -> list[dict[str, Any]]:
    """One dict per model: name, description, metric, target, higher_is_better, args."""
    from trainer.zoo.base import METRICS

    out = []
    for name in names():
        desc, metric, target = _INFO[name]
        out.append({
            "name": name,
            "description": desc,
            "metric": metric,
            "target": target,
            "higher_is_better": METRICS[metric][1],
            "args": model_args_defaults(name),
        })
    return out


def _factory(name: str) -> Callable[..., ZooModel]:
    factories = _factories()
    if name not in factories:
        raise UnknownModelError(f"unknown zoo model {name!r} (known: {', '.join(factories)})")
    return factories[name]


def get(name: str, seed: int = 0, **model_args: Any) -> ZooModel:
    """Build zoo model ``name`` with weights fixed by ``seed``; unknown arguments are an error
    naming the argument."""
    factory = _factory(name)
    defaults = model_args_defaults(name)
    for key, value in model_args.items():
        if key not in defaults:
            raise ValueError(f"model {name!r} has no argument {key!r} (arguments: {', '.join(sorted(defaults)) or 'none'})")
        want = type(defaults[key])
        if want is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"model {name!r}: argument {key!r} must be an integer, got {value!r}")
        if want is int and value < 1:  # every integer argument of the zoo is a size or a count
            raise ValueError(f"model {name!r}: argument {key!r} must be >= 1, got {value!r}")
        if want is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"model {name!r}: argument {key!r} must be a number, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"model {name!r}: argument 'seed' must be an integer, got {seed!r}")
    return factory(seed=seed, **model_args)
