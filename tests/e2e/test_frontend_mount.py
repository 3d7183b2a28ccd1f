"""How the API serves the dashboard (no browser): `/`, static modules, versioned plotly.js, and
`/api` never shadowed by the static mount, whatever order the two were added in."""

from __future__ import annotations

import gzip

from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient

from pipeboard.app.frontend import FRONTEND_DIR, PLOTLY_PLACEHOLDER, mount_frontend, plotly_js, plotly_path


def make_app(frontend_first: bool) -> FastAPI:
    app = FastAPI()
    router = APIRouter(prefix="/api/v1")

    @router.get("/ping")
    def ping() -> dict:
        return {"pong": True}

    if frontend_first:
        mount_frontend(app)
        app.include_router(router)
    else:
        app.include_router(router)
        mount_frontend(app)
    return app


def test_index_names_the_versioned_plotly_and_is_not_cached() -> None:
    client = TestClient(make_app(frontend_first=False))
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["cache-control"] == "no-cache"
    assert PLOTLY_PLACEHOLDER not in response.text
    assert f'<meta name="plotly-src" content="{plotly_path()}">' in response.text
    assert '<script type="module" src="/js/main.js">' in response.text


def test_plotly_bundle_is_long_cached_and_gzipped_on_request() -> None:
    client = TestClient(make_app(frontend_first=False))
    version, raw, _ = plotly_js()
    assert plotly_path() == f"/vendor/plotly-{version}.min.js"
    plain = client.get(plotly_path(), headers={"Accept-Encoding": "identity"})
    assert plain.status_code == 200
    assert plain.content == raw
    assert "max-age=31536000" in plain.headers["cache-control"]
    assert plain.headers["content-type"].startswith("text/javascript")
    packed = client.get(plotly_path(), headers={"Accept-Encoding": "gzip"})
    assert packed.headers["content-encoding"] == "gzip"
    assert packed.content == raw  # httpx undoes the gzip: the bytes survive the round trip
    assert len(gzip.compress(raw)) < len(raw) / 2


def test_static_modules_are_served_with_a_javascript_type() -> None:
    client = TestClient(make_app(frontend_first=False))
    for path in ("/js/main.js", "/js/gantt.js", "/js/pages/job.js", "/css/app.css"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.content == (FRONTEND_DIR / path.lstrip("/")).read_bytes()
    assert "javascript" in client.get("/js/api.js").headers["content-type"]
    assert client.get("/js/no-such-module.js").status_code == 404


def test_api_routes_win_whatever_the_order_of_registration() -> None:
    for frontend_first in (True, False):
        client = TestClient(make_app(frontend_first))
        assert client.get("/api/v1/ping").json() == {"pong": True}
        missing = client.get("/api/v1/no-such-route")
        assert missing.status_code == 404
        assert missing.json() == {"detail": "Not Found"}  # the API's JSON 404, not a static-file miss


def test_the_real_app_serves_the_dashboard_and_its_api() -> None:
    from pipeboard.app.main import create_app

    client = TestClient(create_app(), base_url="http://localhost")  # a Host the app answers
    assert plotly_path() in client.get("/").text
    assert client.head("/").status_code == 200
    assert client.get("/openapi.json").status_code == 200
    assert all(not p.startswith(("/js", "/vendor")) for p in client.get("/openapi.json").json()["paths"])
