"""Property-based run of every operation in the OpenAPI schema: no input may cause a 5xx.

Schemathesis generates valid and invalid requests from the schema (and its examples) and sends
them to the real app on a private SQLite database. The live event stream is left out: for a
queued job it rightly never ends (it is covered by the end-to-end tests).
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance, status_code_conformance

from app.core.db import get_session, make_engine
from app.models import Base
from app.services.jobs import zoo_args  # the zoo's names, cached

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
CASES: dict[str, int] = {}
SPENT: dict[str, float] = {}
_lock = threading.Lock()


def build_app():
    """The real app on a private SQLite file (made at import: the schema needs the app)."""
    from sqlalchemy.orm import sessionmaker

    from app.main import create_app
    from tests.conftest import SESSION_DIR  # removed with the test session

    db = SESSION_DIR / f"schemathesis-{os.getpid()}.sqlite"
    engine = make_engine(f"sqlite:///{db}")
    Base.metadata.create_all(engine)
    factory = sessionmaker(bind=engine, expire_on_commit=False)

    def private_session():
        with factory() as s:
            yield s

    app = create_app()
    app.dependency_overrides[get_session] = private_session
    return app


schema = schemathesis.openapi.from_asgi("/openapi.json", build_app()).exclude(path_regex=r".*/events$")


@pytest.fixture(scope="module", autouse=True)
def report_cases():
    yield
    print(f"\nschemathesis: {sum(CASES.values())} cases over {len(CASES)} operations: {CASES}")
    print({k: round(v, 2) for k, v in SPENT.items()})


@schema.parametrize()
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_errors(case):
    with _lock:
        CASES[case.operation.label] = CASES.get(case.operation.label, 0) + 1
    if case.operation.label == "POST /api/v1/plans" and isinstance(case.body, dict) and isinstance(case.body.get("model"), str) and case.body["model"] in zoo_args():
        return  # would measure a real model inline (seconds); tests/app/test_e2e_embedded.py covers it
    t0 = time.perf_counter()
    response = case.call()
    with _lock:
        SPENT[case.operation.label] = SPENT.get(case.operation.label, 0.0) + time.perf_counter() - t0
    assert response.status_code < 500, f"{case.operation.label} -> {response.status_code}: {response.text[:500]}"
    # Starlette's 405 lists only one route's methods in `Allow`; that check is left out.
    case.validate_response(response, checks=CHECKS)
