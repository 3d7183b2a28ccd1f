"""Browser tests in real Chromium: Debian's /usr/bin/chromium driven by playwright's Python API.

- `chromium`: the executable; the tests skip when it is absent, except under CI=true where they
  fail (CI installs it). Never a downloaded browser.
- `start_server(workers=1)`: `pipeboard up` (migrations, uvicorn, real Celery workers on the
  embedded SQLite broker) on a free port with its own data folder; stopped after the module. Its
  `token` is the admin token the first start printed (`api()` sends it); `sign_in(page)` opens
  the dashboard through the sign-in link it printed with it.
- `static_server` / `module_page`: the dashboard's files alone, and a blank same-origin page with
  plotly.js loaded, for tests of the JS modules that need no API.
- `browser` / `page`: a headless Chromium and a fresh 1280x800 page per test whose console errors
  and uncaught exceptions are collected in `page.errors` (tests assert it is empty).
- `shoot(page, name)`: a full-page screenshot under test-artifacts/ (git ignores it) to look at.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = ROOT / "test-artifacts"
VIEWPORT = {"width": 1280, "height": 800}


@pytest.fixture(scope="session")
def chromium() -> str:
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} not found (apt-get install -y chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


class LiveServer:
    """A `pipeboard up` child process (own process group) and its base URL."""

    def __init__(self, data_dir: Path, workers: int = 1, extra_env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir.parent / f"up-{self.port}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIPEBOARD_") or k.startswith("PIPEBOARD_TEST_")}
        # With workers, a 1 s heartbeat finds a lost one within seconds. Without any, nothing heart-beats for
        # the jobs tests seed as running: 1 s would have the reaper retry them 3 s after their claim, mid-test.
        heartbeat = "1" if workers else "600"
        env.update({"PIPEBOARD_DATA_DIR": str(data_dir), "PIPEBOARD_HEARTBEAT_SECONDS": heartbeat, **(extra_env or {})})
        self.env = env
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from pipeboard.app.cli import main; main()", "up", "--port", str(self.port), "--workers", str(workers)],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_ready(workers)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, workers: int, timeout: float = 90) -> None:
        import re

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pipeboard up exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            signed = re.search(r"/#token=(pb_[A-Za-z0-9_-]+)", self.log())  # printed once the API is up
            try:
                with urllib.request.urlopen(f"{self.url}/api/v1/health", timeout=5) as response:
                    import json

                    health = json.loads(response.read())
                    if health.get("workers", 0) >= workers and signed:
                        self.token = signed.group(1)
                        return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"pipeboard up not ready after {timeout}s:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass

    def sign_in(self, page: Any) -> None:
        """Open the dashboard through the first start's sign-in link (`#token=`), as a user would."""
        page.goto(f"{self.url}/#token={self.token}")
        page.locator("#auth-status", has_text="admin (admin)").wait_for()

    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        """A JSON request to the API with the admin token, or `token` (test setup and checks go
        through the real HTTP API too)."""
        import httpx

        headers = {"Authorization": f"Bearer {token or self.token}"}
        response = httpx.request(method, f"{self.url}/api/v1{path}", json=body, headers=headers, timeout=120)
        response.raise_for_status()
        return response.json()


@pytest.fixture(scope="module")
def start_server(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LiveServer]]:
    """Factory: `start_server(workers=1, extra_env=None)`, each with its own data folder; all are
    stopped when the module's tests are done."""
    started: list[LiveServer] = []

    def start(workers: int = 1, extra_env: dict[str, str] | None = None) -> LiveServer:
        server = LiveServer(tmp_path_factory.mktemp("e2e") / "data", workers=workers, extra_env=extra_env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def browser(chromium: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        instance = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield instance
        instance.close()


def collect_errors(page: Any) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    return errors


@pytest.fixture(scope="module")
def browser_context(browser: Any) -> Iterator[Any]:
    """One context per test module: its pages share the HTTP cache, so plotly.js (served with a
    year's max-age) is fetched once per module. Each server has its own origin (port), hence its
    own localStorage."""
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    yield context
    context.close()


PAGE_TIMEOUT_MS = 60_000


@pytest.fixture
def page(browser_context: Any) -> Iterator[Any]:
    new_page = browser_context.new_page()
    new_page.errors = collect_errors(new_page)
    # A wait that succeeds returns at once; the bound only matters when two test processes and a
    # training run share two cores (make test), where a page's first render can take 20 s.
    new_page.set_default_timeout(PAGE_TIMEOUT_MS)
    yield new_page
    new_page.close()


@pytest.fixture
def shoot() -> Callable[[Any, str], Path]:
    ARTIFACTS.mkdir(exist_ok=True)

    def take(page: Any, name: str) -> Path:
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


@pytest.fixture(scope="session")
def static_server(chromium: str) -> Iterator[str]:
    """The dashboard's files alone (`mount_frontend` on a bare app, uvicorn in a thread): for
    tests of the JS modules that need no API. Yields the base URL."""
    import threading

    import uvicorn
    from fastapi import FastAPI

    from pipeboard.app.frontend import mount_frontend

    app = FastAPI()
    mount_frontend(app)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{server.config.port}"
    server.should_exit = True
    thread.join(timeout=10)


BLANK_HTML = """<!doctype html><html><head><meta charset="utf-8"><script src="{plotly}"></script></head>
<body><div id="chart" style="width:1200px"></div></body></html>"""


@pytest.fixture(scope="module")
def _blank_page(browser: Any, static_server: str) -> Iterator[Any]:
    from pipeboard.app.frontend import plotly_path

    context = browser.new_context(viewport=VIEWPORT)
    shared = context.new_page()
    shared.errors = collect_errors(shared)
    shared.set_default_timeout(PAGE_TIMEOUT_MS)
    shared.route(f"{static_server}/blank", lambda route: route.fulfill(content_type="text/html", body=BLANK_HTML.format(plotly=plotly_path())))
    shared.goto(f"{static_server}/blank")
    shared.wait_for_function("() => !!window.Plotly")
    yield shared
    context.close()


@pytest.fixture
def module_page(_blank_page: Any) -> Any:
    """A same-origin blank page with plotly.js loaded, for importing the dashboard's modules.

    One page per test module (parsing plotly.js takes seconds here); each test gets a fresh
    `#chart` div and an empty `errors` list.
    """
    _blank_page.evaluate("""() => { const old = document.getElementById('chart'); window.Plotly.purge(old);
      const div = document.createElement('div'); div.id = 'chart'; div.style.width = '1200px'; old.replaceWith(div); }""")
    _blank_page.errors.clear()
    return _blank_page
