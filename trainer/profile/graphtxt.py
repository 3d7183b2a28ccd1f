"""Import and export of PipeDream's ``graph.txt`` profile format.

Node lines::

    nodeN -- Desc -- forward_compute_time=MS, backward_compute_time=MS, activation_size=BYTES, parameter_size=BYTES[, stage_id=K]

where ``activation_size`` may be a list ``[a; b]`` for a node with several outputs; edge lines
are tab-indented ``nodeA -- nodeB``. Layers keep the file's order (the planner's topological
sort reproduces the reference's, which depends on that order). Floats are written with ``repr``
so an export re-imports to an equal profile.
"""

from __future__ import annotations

import math

from pipeboard.trainer.profile.schema import Layer, Profile, ProfileError, find_cycle

_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")


def _parse_float(text: str, lineno: int, field: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ProfileError(f"graph.txt line {lineno}: field {field!r}: {text!r} is not a number") from None
    # times and sizes: a NaN, an infinity or a negative value would silently poison the planner
    if not math.isfinite(value):
        raise ProfileError(f"graph.txt line {lineno}: field {field!r}: {text!r} is not a finite number")
    if value < 0:
        raise ProfileError(f"graph.txt line {lineno}: field {field!r}: {text!r} is negative")
    return value


def _parse_node(line: str, lineno: int) -> Layer:
    # Desc may itself contain " -- " only in pathological cases; the metrics are always last.
    head, sep, metrics = line.rpartition(" -- ")
    name, sep2, desc = head.partition(" -- ")
    if not sep or not sep2 or not name.strip():
        raise ProfileError(f"graph.txt line {lineno}: expected 'nodeN -- Desc -- metrics', got {line.strip()[:80]!r}")
    values: dict[str, str] = {}
    for part in metrics.split(", "):
        key, eq, value = part.partition("=")
        if not eq:
            raise ProfileError(f"graph.txt line {lineno}: malformed field {part.strip()!r} (expected key=value)")
        values[key.strip()] = value.strip()
    for f in _FIELDS:
        if f not in values:
            raise ProfileError(f"graph.txt line {lineno}: missing field {f!r}")
    unknown = set(values) - set(_FIELDS) - {"stage_id"}
    if unknown:
        raise ProfileError(f"graph.txt line {lineno}: unknown field {sorted(unknown)[0]!r}")
    raw_act = values["activation_size"]
    if raw_act.startswith("["):
        if not raw_act.endswith("]"):
            raise ProfileError(f"graph.txt line {lineno}: field 'activation_size': unterminated list {raw_act!r}")
        items = [s for s in raw_act[1:-1].split(";") if s.strip()]
        activation: float | list[float] = [_parse_float(s.strip(), lineno, "activation_size") for s in items]
    else:
        activation = _parse_float(raw_act, lineno, "activation_size")
    stage_id = None
    if "stage_id" in values:
        try:
            stage_id = int(values["stage_id"])
        except ValueError:
            raise ProfileError(f"graph.txt line {lineno}: field 'stage_id': {values['stage_id']!r} is not an integer") from None
    return Layer(
        name=name.strip(),
        desc=desc,
        forward_ms=_parse_float(values["forward_compute_time"], lineno, "forward_compute_time"),
        backward_ms=_parse_float(values["backward_compute_time"], lineno, "backward_compute_time"),
        activation_bytes=activation,
        parameter_bytes=_parse_float(values["parameter_size"], lineno, "parameter_size"),
        stage_id=stage_id,
    )


def parse_graph_txt(text: str, model: str = "") -> Profile:
    layers: list[Layer] = []
    seen: dict[str, int] = {}
    edges: list[tuple[str, str]] = []
    pending_edges: list[tuple[int, str, str]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if line[0] in " \t":
            src, sep, dst = line.strip().partition(" -- ")
            if not sep or not src or not dst or " " in src or " " in dst:
                raise ProfileError(f"graph.txt line {lineno}: expected edge 'nodeA -- nodeB', got {line.strip()[:80]!r}")
            pending_edges.append((lineno, src, dst))
            continue
        layer = _parse_node(line, lineno)
        if layer.name in seen:
            raise ProfileError(f"graph.txt line {lineno}: node {layer.name!r} already defined on line {seen[layer.name]}")
        seen[layer.name] = lineno
        layers.append(layer)
    if not layers:
        raise ProfileError("graph.txt: no node lines found")
    edge_line: dict[tuple[str, str], int] = {}
    for lineno, src, dst in pending_edges:
        for end in (src, dst):
            if end not in seen:
                raise ProfileError(f"graph.txt line {lineno}: edge names unknown node {end!r}")
        edges.append((src, dst))
        edge_line.setdefault((src, dst), lineno)
    cycle = find_cycle([layer.name for layer in layers], edges)
    if cycle:  # the planner needs a DAG; name the line of the cycle's first edge
        raise ProfileError(f"graph.txt line {edge_line[(cycle[0], cycle[1])]}: edges form a cycle: {' -> '.join(cycle)}")
    return Profile(layers=layers, edges=edges, model=model, meta={"source": "graph.txt"})


def _fmt(x: float) -> str:
    return repr(float(x))


def to_graph_txt(profile: Profile) -> str:
    lines = []
    for layer in profile.layers:
        act = layer.activation_bytes
        act_s = "[" + "; ".join(_fmt(a) for a in act) + "]" if isinstance(act, list) else _fmt(act)
        desc = layer.desc.replace("\n", " ") or layer.name
        line = (
            f"{layer.name} -- {desc} -- forward_compute_time={_fmt(layer.forward_ms)}, "
            f"backward_compute_time={_fmt(layer.backward_ms)}, activation_size={act_s}, "
            f"parameter_size={_fmt(layer.parameter_bytes)}"
        )
        if layer.stage_id is not None:
            line += f", stage_id={layer.stage_id}"
        lines.append(line)
    for src, dst in profile.edges:
        lines.append(f"\t{src} -- {dst}")
    return "\n".join(lines) + "\n"
