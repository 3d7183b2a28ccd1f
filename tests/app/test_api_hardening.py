"""Every input valid or a 4xx, and what is stored can always be read back: JSON nesting bounded at
the door, Last-Event-ID parsed strictly, data only under the data roots (one answer outside them),
damaged archives a 422 naming the file."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from pipeboard.app.api.nesting import MAX_JSON_DEPTH, json_depth
from pipeboard.app.api.routes.events import BAD_EVENT_ID, parse_last_event_id
from pipeboard.app.core.config import get_settings
from pipeboard.app.services.contexts import DAMAGED, pack
from pipeboard.app.services.errors import ServiceError

JOB = {"model": "mlp-digits", "workers": 2, "stop": {"steps": 2}}
TOO_DEEP = f"body: JSON nested more than {MAX_JSON_DEPTH} levels deep"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_json_depth_counts_brackets_outside_strings_only():
    assert json_depth(b'{"a": [1, {"b": "[[[["}]}') == 3
    assert json_depth(b'"\\"[[" 1') == 0 and json_depth(b"1") == 0
    assert json_depth(nested(100_000).encode()) == 100_000


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 500, 100_000])
def test_a_body_nested_too_deep_is_a_422_naming_the_body_and_nothing_is_stored(client, depth):
    text = '{"name": "deep", "source": "json:loads", "config": ' + '{"k": ' * depth + "0" + "}" * depth + "}"
    answer = client.post("/api/v1/models", content=text, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422 and answer.json()["detail"] == TOO_DEEP
    for path in ("/api/v1/jobs", "/api/v1/plans", "/api/v1/tokens"):
        deep = client.post(path, content=nested(depth), headers={"Content-Type": "application/json"})
        assert deep.status_code == 422 and deep.json()["detail"] == TOO_DEEP, path
    listed = client.get("/api/v1/models")
    assert listed.status_code == 200 and "deep" not in {m["name"] for m in listed.json()["data"]}
    # the same body nested two levels is answered on its own merits
    shallow = client.post("/api/v1/models", json={"name": "deep", "source": "json:loads", "config": {"k": {"k": 0}}})
    assert shallow.status_code == 202, shallow.text


def test_a_profile_upload_nested_too_deep_is_a_422_naming_the_file(client):
    answer = client.post("/api/v1/profiles/upload",
                         files={"file": ("p.json", io.BytesIO(nested(100_000).encode()), "application/json")})
    assert answer.status_code == 422
    assert answer.json()["detail"] == f"file: JSON nested more than {MAX_JSON_DEPTH} levels deep"


@pytest.mark.parametrize("header", ["\u00b2", "5" * 5000, "-1", "", "1.0", "0x10", "2147483648", "9999999999", "\u0661"])
def test_last_event_id_other_than_ascii_digits_in_range_is_a_400(client, header):
    with pytest.raises(ServiceError, match="Last-Event-ID"):
        parse_last_event_id(header)
    if header.isascii():  # httpx sends headers as ASCII; the unit check above covers the rest
        answer = client.get("/api/v1/jobs/1/events", headers={"Last-Event-ID": header})
        assert answer.status_code == 400 and answer.json()["detail"] == BAD_EVENT_ID


def test_last_event_id_byte_0xb2_on_the_wire_is_a_400(client):
    answer = client.get("/api/v1/jobs/1/events", headers=[("Last-Event-ID".encode(), b"\xb2")])
    assert answer.status_code == 400 and answer.json()["detail"] == BAD_EVENT_ID


def test_last_event_id_in_range_is_read():
    assert [parse_last_event_id(v) for v in ("0", "17", " 42 ", "2147483647")] == [0, 17, 42, 2**31 - 1]


@pytest.fixture
def data_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "datasets"
    root.mkdir()
    monkeypatch.setenv("PIPEBOARD_DATA_ROOTS", str(root))
    get_settings.cache_clear()
    yield root
    monkeypatch.delenv("PIPEBOARD_DATA_ROOTS")
    get_settings.cache_clear()


def test_data_outside_the_roots_gets_one_answer_whether_or_not_it_exists(client, data_root: Path, tmp_path: Path):
    (data_root / "digits.csv").write_text("1,2\n")
    (tmp_path / "secret").write_text("x")
    os.symlink(tmp_path / "secret", data_root / "link-out")
    answers = {}
    for data in ("/etc/shadow", "/etc/nonexistent", str(tmp_path / "secret"), str(data_root / "link-out"),
                 str(data_root / ".." / "secret"), "relative/path"):
        answer = client.post("/api/v1/jobs", json={**JOB, "data": data})
        assert answer.status_code == 422, (data, answer.text)
        answers[data] = answer.json()["detail"].replace(repr(data), "DATA")
    assert len(set(answers.values())) == 1, answers
    assert "not an allowed data location" in answers["/etc/shadow"]
    missing = client.post("/api/v1/jobs", json={**JOB, "data": str(data_root / "missing.csv")})
    assert missing.status_code == 422 and "does not exist" in missing.json()["detail"]
    inside = client.post("/api/v1/jobs", json={**JOB, "data": str(data_root / "digits.csv")})
    assert inside.status_code == 201, inside.text


def test_a_truncated_or_corrupt_archive_is_a_422_naming_the_file(client, tmp_path: Path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "task.py").write_text("x = 1\n" * 2000)
    whole = pack(tmp_path / "p")
    corrupt = whole[:40] + bytes(b ^ 0x5A for b in whole[40:80]) + whole[80:]
    for name, content in (("cut.tar.gz", whole[: len(whole) // 2]), ("end-cut.tar.gz", whole[:-6]),
                          ("corrupt.tar.gz", corrupt), ("cut.zip", b"PK\x03\x04" + whole[:100])):
        answer = client.post("/api/v1/contexts", files={"file": (name, io.BytesIO(content), "application/gzip")})
        assert answer.status_code == 422 and answer.json()["detail"] == DAMAGED, (name, answer.text)
