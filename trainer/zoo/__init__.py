"""The model zoo: task factories whose data ship with installed packages (no downloads).

Each entry is a task factory like a user's (``pipeboard.trainer.task.factory``): ``names()`` lists them,
``describe()`` says what each is, ``get(name, seed, **model_args)`` builds one as a
:class:`pipeboard.trainer.Task` through the same ``load_task`` a user's factory goes through.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from pipeboard.trainer.task.task import Task, TaskError

__all__ = ["UnknownModelError", "names", "describe", "get", "factory"]


class UnknownModelError(KeyError, TaskError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def _factories() -> dict[str, Callable[..., Task]]:
    # Imported here so that `import pipeboard.trainer.zoo` stays cheap (no sklearn until a model is built).
    from pipeboard.trainer.zoo.digits import cnn_digits, mlp_digits, resnet_digits
    from pipeboard.trainer.zoo.synthetic import mlp
    from pipeboard.trainer.zoo.text import transformer_text
    from pipeboard.trainer.zoo.hf import bert_text, gpt2_text, llama_text, resnet18_images

    return {
        "mlp-digits": mlp_digits,
        "cnn-digits": cnn_digits,
        "resnet-digits": resnet_digits,
        "transformer-text": transformer_text,
        "mlp": mlp,
        "gpt2-text": gpt2_text,
        "llama-text": llama_text,
        "bert-text": bert_text,
        "resnet18-images": resnet18_images,
    }


_INFO = {
    # name -> (description, metric, target); kept in sync with the factories by a test.
    "mlp-digits": ("MLP on scikit-learn digits (8x8 images, 10 classes)", "accuracy", 0.95),
    "cnn-digits": ("3-layer CNN on scikit-learn digits", "accuracy", 0.96),
    "resnet-digits": ("residual CNN (a DAG of skip connections) on scikit-learn digits", "accuracy", 0.96),
    "transformer-text": ("byte-level Transformer LM on Python standard-library sources", "perplexity", 6.0),
    "mlp": ("synthetic regression MLP (depth x Linear(width, width)+ReLU); the runtime benchmark", "mse", 0.7),
    "gpt2-text": ("transformers GPT-2 causal LM (random init) on a local text/parquet/JSON file (--data)",
                  "perplexity", 6.0),
    "llama-text": ("transformers Llama causal LM (random init) on a local text/parquet/JSON file (--data)",
                   "perplexity", 6.0),
    "bert-text": ("transformers BERT encoder, masked LM (random init) on a local text/parquet/JSON file (--data)",
                  "perplexity", 6.0),
    "resnet18-images": ("transformers ResNet-18 layout (random init) on an imagefolder tree of PNG/JPEG files "
                        "(--data; default: scikit-learn's digits as PNG files)", "accuracy", 0.9),
}


def names() -> list[str]:
    return list(_factories())


def model_args_defaults(name: str) -> dict[str, Any]:
    """The model arguments a zoo entry takes, with their defaults (``data``, the data location,
    is not one)."""
    params = inspect.signature(factory(name)).parameters
    return {k: p.default for k, p in params.items() if k != "data"}


def describe() -> list[dict[str, Any]]:
    """One dict per model: name, description, metric, target, higher_is_better, args."""
    from pipeboard.trainer.task.metrics import METRICS

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


def factory(name: str) -> Callable[..., Task]:
    """The task factory of zoo entry ``name``."""
    factories = _factories()
    if name not in factories:
        raise UnknownModelError(f"unknown zoo model {name!r} (known: {', '.join(factories)}); or give a task "
                                "factory 'package.module:function' or 'path/to/file.py:function'")
    return factories[name]


def get(name: str, seed: int = 0, **model_args: Any) -> Task:
    """Build zoo task ``name`` with weights fixed by ``seed``; unknown or mistyped arguments are
    an error naming the argument."""
    from pipeboard.trainer.task.factory import build_task

    for key, value in model_args.items():  # every integer argument of the zoo is a size or a count
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise TaskError(f"model {name!r}: argument {key!r} must be >= 1, got {value!r}")
    return build_task(name, factory(name), model_args, seed=seed)
