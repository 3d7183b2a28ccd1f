"""PipeDream graph.txt: the 14 published profiles import and round-trip; bad lines name line and field."""

from __future__ import annotations

import pytest

from tests.shared_data import PROFILE_NAMES, graph_txt
from pipeboard.trainer.profile import Layer, Profile, ProfileError, parse_graph_txt, to_graph_txt
from pipeboard.trainer.profile.files import load_profile

GOOD = (
    "node1 -- Input -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=100.0, parameter_size=0.000\n"
    "node2 -- Conv2d(3, 8) -- forward_compute_time=1.5, backward_compute_time=2.25, activation_size=[40.0; 60.0], parameter_size=216.0, stage_id=1\n"
    "node3 -- Add -- forward_compute_time=0.1, backward_compute_time=0.2, activation_size=50.0, parameter_size=0.0\n"
    "\tnode1 -- node2\n"
    "\tnode2 -- node3\n"
)


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_shared_profile_imports_and_round_trips(name, tmp_path):
    path = graph_txt(name)
    text = path.read_text()
    prof = load_profile(path)
    node_lines = [line for line in text.splitlines() if line.strip() and not line[0].isspace()]
    edge_lines = [line for line in text.splitlines() if line.strip() and line[0].isspace()]
    assert len(prof.layers) == len(node_lines) > 0
    assert len(prof.edges) == len(edge_lines)
    assert prof.model == name
    assert all(layer.forward_ms >= 0 and layer.backward_ms >= 0 for layer in prof.layers)
    # export then import gives an equal profile, through graph.txt and through JSON
    again = parse_graph_txt(to_graph_txt(prof), model=name)
    assert again.layers == prof.layers and again.edges == prof.edges
    out = tmp_path / "p.json"
    prof.save(out)
    loaded = load_profile(out)
    assert loaded.to_dict() == prof.to_dict()


def test_multi_output_list_and_stage_id_parse():
    prof = parse_graph_txt(GOOD, model="m")
    assert prof.layer_names() == ["node1", "node2", "node3"]
    assert prof.layers[1] == Layer(name="node2", desc="Conv2d(3, 8)", forward_ms=1.5, backward_ms=2.25,
                                   activation_bytes=[40.0, 60.0], parameter_bytes=216.0, stage_id=1)
    assert prof.layers[1].activation_total == 100.0
    assert prof.edges == [("node1", "node2"), ("node2", "node3")]
    assert parse_graph_txt(to_graph_txt(prof)).layers == prof.layers


def _bad(line2: str) -> str:
    lines = GOOD.splitlines()
    lines[1] = line2
    return "\n".join(lines) + "\n"


NODE = "node2 -- Conv -- "
BAD_CASES = [
    # (text, words the error must contain)
    (_bad(NODE + "forward_compute_time=abc, backward_compute_time=1, activation_size=1, parameter_size=1"),
     ["line 2", "forward_compute_time", "abc"]),
    (_bad(NODE + "forward_compute_time=1, backward_compute_time=1, activation_size=1"), ["line 2", "parameter_size"]),
    (_bad(NODE + "forward_compute_time=1, backward_compute_time=1, activation_size=[1; 2, parameter_size=1"),
     ["line 2", "activation_size"]),
    (_bad(NODE + "forward_compute_time=1, backward_compute_time=1, activation_size=[1; x], parameter_size=1"),
     ["line 2", "activation_size", "x"]),
    (_bad(NODE + "forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1, stage_id=one"),
     ["line 2", "stage_id"]),
    (_bad(NODE + "forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1, colour=red"),
     ["line 2", "colour"]),
    (_bad(NODE + "forward_compute_time=1, backward_compute_time 1, activation_size=1, parameter_size=1"),
     ["line 2", "backward_compute_time 1"]),
    (_bad(NODE + "forward_compute_time=-1, backward_compute_time=1, activation_size=1, parameter_size=1"),
     ["line 2", "forward_compute_time", "negative"]),
    (_bad(NODE + "forward_compute_time=nan, backward_compute_time=1, activation_size=1, parameter_size=1"),
     ["line 2", "forward_compute_time"]),
    (_bad("node2 Conv forward_compute_time=1"), ["line 2", "nodeN -- Desc -- metrics"]),
    (GOOD.replace("\tnode2 -- node3", "\tnode2 -> node3"), ["line 5", "edge"]),
    (GOOD.replace("\tnode2 -- node3", "\tnode2 -- node9"), ["line 5", "node9"]),
    (GOOD.replace("node3 -- Add", "node2 -- Add"), ["line 3", "node2", "line 2"]),
    (GOOD + "\tnode3 -- node2\n", ["line 5", "cycle", "node2 -> node3 -> node2"]),
    (GOOD + "\tnode1 -- node1\n", ["line 6", "cycle", "node1 -> node1"]),
    ("", ["no node lines"]),
    ("\tnode1 -- node2\n", ["no node lines"]),
]


@pytest.mark.parametrize("text,words", BAD_CASES)
def test_bad_lines_name_line_and_field(text, words):
    with pytest.raises(ProfileError) as info:
        parse_graph_txt(text)
    message = str(info.value)
    for word in words:
        assert word in message, (word, message)


def test_load_picks_the_format_by_content(tmp_path):
    graph = tmp_path / "model-x" / "anything.json"
    graph.parent.mkdir()
    graph.write_text(GOOD)
    prof = load_profile(graph)
    assert prof.model == "model-x" and len(prof.layers) == 3
    js = tmp_path / "graph.txt"
    js.write_text(prof.to_json())
    assert load_profile(js).to_dict() == prof.to_dict()


@pytest.mark.parametrize("patch,words", [
    (lambda d: d.update(version=99), ["version", "99"]),
    (lambda d: d.update(format="other"), ["format"]),
    (lambda d: d["layers"][0].update(colour=1), ["layers[0]", "colour"]),
    (lambda d: d["edges"].append(["node1", "ghost"]), ["edges[2]"]),
    (lambda d: d.update(layers=[]), ["layers"]),
    (lambda d: d["layers"][1].update(forward_ms="fast"), ["layers[1]", "forward_ms"]),
    (lambda d: d["edges"].append(["node3", "node1"]), ["edges", "cycle", "node1 -> node2 -> node3 -> node1"]),
])
def test_bad_profile_json_names_the_field(patch, words):
    data = parse_graph_txt(GOOD).to_dict()
    patch(data)
    with pytest.raises(ProfileError) as info:
        Profile.from_dict(data)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_bad_json_text_names_the_line():
    with pytest.raises(ProfileError, match="line 2"):
        Profile.from_json('{\n  "format": oops}\n')
