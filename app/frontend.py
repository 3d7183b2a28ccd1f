"""Serving the dashboard (static files in `frontend/`) from the API.

The dashboard is plain HTML, CSS and ES modules: no build step. plotly.js comes from the
installed `plotly` Python package, served at a path that names its version so browsers may cache
it for a year; `index.html` names that path through a placeholder filled in here, and is itself
served uncached so a new release (or a new plotly) is picked up at once.
"""

from __future__ import annotations

import gzip
import os
from functools import lru_cache
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.routing import Match, Mount
from starlette.types import Scope

FRONTEND_DIR = Path(__file__).resolve().parents[1] / "frontend"
PLOTLY_PLACEHOLDER = "{{PLOTLY_SRC}}"
YEAR_CACHE = "public, max-age=31536000, immutable"


@lru_cache(maxsize=1)
def plotly_js() -> tuple[str, bytes, bytes]:
    """(plotly.js version, the minified bundle, its gzip) read once from the plotly package."""
    import plotly
    from plotly.offline import get_plotlyjs_version

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    data = path.read_bytes()
    return get_plotlyjs_version(), data, gzip.compress(data, compresslevel=6)


def plotly_path() -> str:
    return f"/vendor/plotly-{plotly_js()[0]}.min.js"


class _FrontendMount(Mount):
    """A mount at `/` that never answers for `/api`, whatever order the routes were added in.

    A plain `Mount("/")` matches every path, so if it were registered before the API router it
    would turn unknown API paths (and, worse, real ones) into static-file 404s.
    """

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        path = scope.get("path", "")
        if path == "/api" or path.startswith("/api/"):
            return Match.NONE, {}
        return super().matches(scope)


def _index_html() -> str:
    html = (FRONTEND_DIR / "index.html").read_text(encoding="utf-8")
    return html.replace(PLOTLY_PLACEHOLDER, plotly_path())


def mount_frontend(app: FastAPI) -> None:
    """Serve the dashboard at `/` and plotly.js at `/vendor/plotly-<version>.min.js`."""
    version = plotly_js()[0]

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    @app.api_route("/index.html", methods=["GET", "HEAD"], include_in_schema=False)
    def dashboard_index() -> HTMLResponse:
        # Re-read each time: it is small, and edits show up without a restart.
        return HTMLResponse(_index_html(), headers={"Cache-Control": "no-cache"})

    @app.api_route(f"/vendor/plotly-{version}.min.js", methods=["GET", "HEAD"], include_in_schema=False)
    def plotly_bundle(request: Request) -> Response:
        _, raw, packed = plotly_js()
        headers = {"Cache-Control": YEAR_CACHE, "Vary": "Accept-Encoding"}
        if "gzip" in request.headers.get("accept-encoding", ""):
            headers["Content-Encoding"] = "gzip"
            return Response(packed, media_type="text/javascript", headers=headers)
        return Response(raw, media_type="text/javascript", headers=headers)

    # Static assets (css/, js/) below everything else; html=False: the router lives in the hash.
    static = StaticFiles(directory=os.fspath(FRONTEND_DIR), html=False, check_dir=False)
    app.router.routes.append(_FrontendMount("/", app=static, name="frontend"))
