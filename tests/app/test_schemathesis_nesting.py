"""Schemathesis's generated JSON bodies, sent again nested too deep: every one is a 422 naming the
body, never a 5xx (app/api/nesting.py measures nesting before any parser recurses).

For each JSON POST operation schemathesis generates bodies from the schema (its examples and
fuzzing phases, on the same real app and admin token as tests/app/test_schemathesis_api.py); each is sent with its first field nested 33,
500 and 100,000 levels deep, and again whole inside that many arrays.
"""

from __future__ import annotations

import json

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from pipeboard.app.api.nesting import MAX_JSON_DEPTH
from pipeboard.app.core.config import Settings
from tests.app.test_schemathesis_api import ADMIN
from tests.app.test_schemathesis_api import schema as api_schema

DEPTHS = (MAX_JSON_DEPTH + 1, 500, 100_000)
MAX_BODY_BYTES = Settings().max_body_bytes
TOO_DEEP = f"body: JSON nested more than {MAX_JSON_DEPTH} levels deep"
# The same app, its documented examples and fuzzed bodies. Not the coverage phase's hundreds of boundary
# variants of each body (tests/app/test_schemathesis_api.py sends those): nesting is measured before any
# field is read, so what the fields hold does not matter here, and six requests each made this file a minute.
NESTING_CONFIG = SchemathesisConfig.from_dict({"phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}}})
schema = schemathesis.openapi.from_asgi("/openapi.json", api_schema.app, config=NESTING_CONFIG)
# The JSON-body POSTs; uploads are multipart, and cancel, retry and revoke take no body (never parsed).
JSON_POSTS = schema.include(method="POST").exclude(path_regex=r"/(contexts|upload|cancel|retry|revoke)$")
SENT: dict[str, int] = {}


def too_deep_bodies(body: object, depth: int) -> list[str]:
    """`body` inside `depth` arrays, and (for an object) its first field's value inside them."""
    text = json.dumps(body)
    bodies = ["[" * depth + text + "]" * depth]
    if isinstance(body, dict) and body:
        key, *_ = body
        rest = json.dumps({k: v for k, v in body.items() if k != key})[1:-1]
        deep_field = f"{json.dumps(key)}: " + "[" * depth + json.dumps(body[key]) + "]" * depth
        bodies.append("{" + deep_field + (", " + rest if rest else "") + "}")
    return bodies


@JSON_POSTS.parametrize()
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_generated_bodies_nested_too_deep_are_a_422_naming_the_body(case):
    client = TestClient(schema.app, base_url="http://testserver")
    body = case.body if isinstance(case.body, (dict, list, str, int, float, bool)) else {}  # NotSet: no body
    for depth in DEPTHS:
        for text in too_deep_bodies(body, depth):
            answer = client.post(case.formatted_path, content=text,
                                 headers={**ADMIN, "Content-Type": "application/json"})
            if len(text.encode()) > MAX_BODY_BYTES:  # the size limit answers first, before any parsing
                assert answer.status_code == 413 and "PIPEBOARD_MAX_BODY_BYTES" in answer.json()["detail"], answer.text[:300]
            else:
                assert answer.status_code == 422 and answer.json()["detail"] == TOO_DEEP, (case.operation.label, answer.text[:300])
            SENT[case.operation.label] = SENT.get(case.operation.label, 0) + 1


def test_zz_report_what_was_sent():
    """Runs after the generated cases (file order): how many too-deep requests each operation got."""
    print(f"\nnested too deep: {sum(SENT.values())} requests over {len(SENT)} operations: {SENT}")
    json_posts = {f"POST {path}" for path, ops in schema.app.openapi()["paths"].items()
                  if "application/json" in ops.get("post", {}).get("requestBody", {}).get("content", {})}
    assert set(SENT) == json_posts and all(count >= 6 for count in SENT.values()), (SENT, json_posts)
