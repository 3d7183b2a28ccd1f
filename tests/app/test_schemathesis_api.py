"""Property-based runs of every operation in the OpenAPI schema, with an admin token: no input
may cause a 5xx, and every answer must conform to the schema (all of schemathesis's checks).

Schemathesis generates valid and invalid requests from the schema (its examples, its coverage of
each keyword, fuzzing, and stateful sequences that reuse what earlier answers returned) and sends
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
from schemathesis.config import SchemathesisConfig

from pipeboard.app.core.db import get_session, make_engine
from pipeboard.app.models import Base
from pipeboard.app.services.jobs import zoo_args  # the zoo's names, cached

CASES: dict[str, int] = {}
SPENT: dict[str, float] = {}
_lock = threading.Lock()
ADMIN: dict[str, str] = {}


def build_app():
    """The real app on a private SQLite file holding one admin token (made at import: the schema
    needs the app)."""
    from sqlalchemy.orm import sessionmaker

    from pipeboard.app.core.config import Settings
    from pipeboard.app.main import create_app
    from pipeboard.app.services.tokens import create_token
    from tests.conftest import SESSION_DIR  # removed with the test session

    db = SESSION_DIR / f"schemathesis-{os.getpid()}.sqlite"
    engine = make_engine(f"sqlite:///{db}")
    Base.metadata.create_all(engine)
    factory = sessionmaker(bind=engine, expire_on_commit=False)
    with factory() as s:
        _, secret = create_token(s, "schemathesis", "admin")
        s.commit()
    ADMIN["Authorization"] = f"Bearer {secret}"

    def private_session():
        with factory() as s:
            yield s

    app = create_app(Settings(allowed_hosts="testserver"))  # the Host schemathesis's ASGI client sends
    app.dependency_overrides[get_session] = private_session
    return app


# Every check is on. One is loosened where it cannot hold: generated requests (the coverage
# phase's boundary values, fuzzing, stateful chains) name models, modules, profiles and contexts
# that do not exist, which the API rightly answers 422 naming the field. The documented examples
# (the examples phase) must be accepted as they are.
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]  # schemathesis's default
NAMES_WHAT_IS_NOT_THERE = {"checks": {"positive_data_acceptance": {"expected-statuses": [*ACCEPTED, "422"]}}}
CONFIG = SchemathesisConfig.from_dict({"phases": {phase: NAMES_WHAT_IS_NOT_THERE for phase in ("coverage", "fuzzing", "stateful")}})
schema = schemathesis.openapi.from_asgi("/openapi.json", build_app(), config=CONFIG).exclude(path_regex=r".*/events$")


@pytest.fixture(scope="module", autouse=True)
def report_cases():
    yield
    print(f"\nschemathesis: {sum(CASES.values())} cases over {len(CASES)} operations: {CASES}")
    print({k: round(v, 2) for k, v in SPENT.items()})


def measures_a_model(case) -> bool:
    # Would measure a real model inline (seconds); tests/app/test_e2e_embedded.py covers it.
    return (case.operation.label == "POST /api/v1/plans" and isinstance(case.body, dict)
            and isinstance(case.body.get("model"), str) and case.body["model"] in zoo_args())


@schema.parametrize()
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_errors_and_no_conformance_failures(case):
    with _lock:
        CASES[case.operation.label] = CASES.get(case.operation.label, 0) + 1
    if measures_a_model(case):
        return
    t0 = time.perf_counter()
    response = case.call_and_validate(headers=ADMIN)
    with _lock:
        SPENT[case.operation.label] = SPENT.get(case.operation.label, 0.0) + time.perf_counter() - t0
    assert response.status_code < 500, f"{case.operation.label} -> {response.status_code}: {response.text[:500]}"


class Workflow(schema.as_state_machine()):
    """Stateful sequences: schemathesis chains operations whose answers feed later requests (a
    created job's id into GET /jobs/{job_id}, cancel, retry; a token's into revoke)."""

    def before_call(self, case):
        with _lock:
            CASES["stateful"] = CASES.get("stateful", 0) + 1

    def get_call_kwargs(self, case):
        return {"headers": ADMIN}

    def validate_response(self, response, case, additional_checks=(), **kwargs):
        assert response.status_code < 500, f"{case.operation.label} -> {response.status_code}: {response.text[:500]}"
        super().validate_response(response, case, additional_checks, **kwargs)


TestWorkflow = Workflow.TestCase
TestWorkflow.settings = settings(max_examples=10, stateful_step_count=6, deadline=None,
                                 suppress_health_check=list(HealthCheck), derandomize=True)
