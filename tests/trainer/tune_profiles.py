"""Synthetic profiles for the tuner's tests: a chain of Linear-like layers whose times and
activations scale with the microbatch size, so microbatch counts genuinely trade off."""

from pipeboard.trainer.profile.calibration_records import Link
from pipeboard.trainer.profile.schema import Layer, Profile


def chain_profile(batch_size: int, layers: int = 8, *, act_per_sample: float = 4096.0, params: float = 40_000.0,
                  fixed_ms: float = 0.05, per_sample_ms: float = 0.02) -> Profile:
    """``layers`` layers of equal cost: each forward ``fixed_ms + per_sample_ms x samples``,
    its backward twice that (half input gradient), activations ``act_per_sample`` per sample."""
    fwd = fixed_ms + per_sample_ms * batch_size
    out = [Layer(name=f"l{i}", desc="Linear(in_features=64, out_features=64, bias=True)", forward_ms=fwd,
                 backward_ms=2 * fwd, backward_input_ms=fwd, optimizer_ms=0.01,
                 activation_bytes=act_per_sample * batch_size, parameter_bytes=params) for i in range(layers)]
    edges = [(f"l{i}", f"l{i + 1}") for i in range(layers - 1)]
    return Profile(layers=out, edges=edges, model="mlp", batch_size=batch_size,
                   link=Link(latency_ms=0.01, bytes_per_ms=1e6), meta={"optimizer": "adam"})


def profiles(batch: int, counts=(1, 2, 4, 8), **kw) -> list[Profile]:
    return [chain_profile(batch // m, **kw) for m in counts if batch % m == 0]
