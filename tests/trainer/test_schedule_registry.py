"""The schedule registry (trainer/schedule/registry.py): every schedule declared once and read by
the builder, the runtime's layout, the predictor, the API, the CLI and the dashboard.

- every registered schedule builds, validates and simulates, and lays out as the runtime runs it;
- the registry refuses what cannot work and answers the capability questions callers ask;
- a schedule added in one file (tests/schedule_plugin.py) is seen everywhere: in-process (build,
  runtime layout, predictor, API schemas and GET /schedules), and through PIPEBOARD_SCHEDULES by
  `pipeboard train --help`, `pipeboard simulate --help` and `--schedule`, `pipeboard train`, the
  OpenAPI document and GET /api/v1/schedules (the new-job form: tests/e2e/test_schedules.py);
- no caller of the runtime, the simulator, the API or the CLI compares a schedule's name.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeboard.trainer.runtime.run_config import ConfigError, RunConfig
from pipeboard.trainer.runtime.layout import resolve
from pipeboard.trainer.schedule import ScheduleError, ScheduleSpec, build, registry, validate
from pipeboard.trainer.schedule.action_costs import costs_uniform
from pipeboard.trainer.schedule.predict import steady_step_s
from pipeboard.trainer.schedule.simulator import simulate

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tests" / "schedule_plugin.py"
PLUGIN_NAME = "gpipe-twin"
PIPEBOARD = [sys.executable, "-c", "from pipeboard.app.cli import main; main()"]


def variants(spec: ScheduleSpec) -> list[tuple[int, int, dict]]:
    """(stages, microbatches, build options) that exercise what ``spec`` says it takes."""
    if spec.data_parallel:
        return [(3, 6, {}), (1, 4, {"replicas": [2]})]
    p = 2 if spec.chunks else 3
    out = [(p, 6, {}), (1, 2, {})]
    if spec.chunks:
        out += [(p, 6, {"chunks": max(2, spec.default_chunks)})]
    if spec.replication:
        out += [(p, 6, {"replicas": [2] + [1] * (p - 1)})]
    if not spec.synchronous:
        out += [(p, 12, {"per_update": 3}), (p, 12, {"per_update": 2, "replicas": [2] * p})]
    if spec.vertical_sync:
        out += [(p, 6, {"vertical_sync": True})]
    if "batched" in spec.weight_grads:
        out += [(p, 6, {"batch_weight_grads": True})]
    if not spec.needs_split_backward and "batched" not in spec.weight_grads:
        out += [(p, 6, {"split_backward": True})]
    return out


CASES = [(spec.name, *v) for spec in registry.specs() for v in variants(spec)]


@pytest.mark.parametrize("name,p,m,kw", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}-{c[3]}" for c in CASES])
def test_every_registered_schedule_builds_validates_and_simulates(name, p, m, kw):
    spec = registry.get(name)
    schedule = build(name, p, m, **kw)
    report = validate(schedule)
    assert report.actions > 0
    chunks = kw.get("chunks", 1)
    assert schedule.meta["sync"] is spec.synchronous
    assert schedule.meta["physical_stages"] == (1 if spec.data_parallel else p)
    assert schedule.meta["split_backward"] is (kw.get("split_backward", spec.needs_split_backward))
    assert schedule.meta["batch_weight_grads"] is bool(kw.get("batch_weight_grads"))
    assert ("per_update" in schedule.meta) is (not spec.synchronous)
    costs = costs_uniform(schedule.meta["physical_stages"] * chunks, 1e-3, 2e-3, comm_s=1e-4)
    result = simulate(schedule, costs)
    assert result.iteration_time_s > 0 and 0 <= result.bubble_fraction < 1
    json.dumps(result.summary())


@pytest.mark.parametrize("name", registry.names())
def test_every_registered_schedule_runs_as_the_runtime_lays_it_out_and_predicts(name):
    spec = registry.get(name)
    cfg = RunConfig(model="mlp", schedule=name, batch_size=8, microbatches=4,
                    num_stages=None if spec.data_parallel else 2, workers=2 if spec.data_parallel else None)
    cfg.validate()
    layout = resolve(cfg)
    assert layout.chunks == (spec.default_chunks if spec.chunks else 1)
    assert layout.batch_weight_grads is ("batched" in spec.weight_grads)
    assert cfg.is_async is (not spec.synchronous)
    validate(layout.build(cfg.microbatches))
    costs = costs_uniform(layout.virtual_stages, 1e-3, 2e-3, comm_s=1e-4)
    assert steady_step_s(costs, name, 4, chunks=layout.chunks, replicas=list(layout.replicas)) > 0


DECLARED = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "pipedream", "dp")  # in registry.py itself


def declared(names: tuple[str, ...]) -> tuple[str, ...]:
    """Of ``names``, those registry.py declares (trainer/schedule/library/ adds more: their own tests)."""
    return tuple(n for n in names if n in DECLARED)


def test_the_built_ins_and_what_they_can_do():
    assert registry.names()[:6] == DECLARED
    assert registry.known(registry.DEFAULT)
    assert declared(registry.having(synchronous=False)) == ("pipedream",)
    assert declared(registry.having(chunks=True)) == ("interleaved-1f1b",)
    assert declared(registry.having(replication=False)) == ("interleaved-1f1b",)
    assert declared(registry.having(vertical_sync=True)) == ("pipedream",)
    assert declared(registry.having(weight_grads=())) == ("zb-h1", "dp")
    assert declared(registry.having(data_parallel=True)) == ("dp",)
    assert declared(registry.having(needs_split_backward=True)) == ("zb-h1",)
    assert registry.is_async("pipedream") and not registry.is_async("1f1b")
    assert registry.takes_chunks("interleaved-1f1b") and not registry.takes_chunks("gpipe")
    assert registry.takes_vertical_sync("pipedream") and registry.is_data_parallel("dp")
    assert registry.honours("1f1b", "batched") and not registry.honours("zb-h1", "batched")
    assert registry.get("interleaved-1f1b").default_chunks == 2
    d = registry.get("pipedream").to_dict()
    assert "builder" not in d and d["weight_grads"] == ["batched", "immediate"] and d["synchronous"] is False
    with pytest.raises(TypeError, match="not a capability"):
        registry.having(builder=None)


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(registry.UnknownSchedule, match=r"unknown schedule 'zigzag' \(known: gpipe, 1f1b"):
        registry.get("zigzag")
    assert issubclass(registry.UnknownSchedule, ScheduleError) and issubclass(ScheduleError, ValueError)
    assert not registry.known("zigzag") and not registry.known(None)
    with pytest.raises(ScheduleError, match="schedule must be one of gpipe, 1f1b"):
        build("zigzag", 2, 4)
    with pytest.raises(ConfigError, match="schedule: unknown schedule 'zigzag'"):
        RunConfig(model="mlp", schedule="zigzag", batch_size=8, microbatches=4).validate()


def _builder(ctx):
    from pipeboard.trainer.schedule.flush import one_f_one_b_builder

    return one_f_one_b_builder(ctx)


@pytest.mark.parametrize("fields,match", [
    ({"name": "Has Space"}, "name must match"),
    ({"name": ""}, "name must match"),
    ({"description": "two\nlines"}, "one line"),
    ({"description": ""}, "one line"),
    ({"builder": "not callable"}, "callable"),
    ({"weight_grads": ("sometimes",)}, "weight_grads"),
    ({"default_chunks": 2}, "needs chunks=True"),
    ({"chunks": True}, "replication=False"),
    ({"vertical_sync": True}, "asynchronous"),
    ({"needs_split_backward": True}, "excludes batched"),
    ({"data_parallel": True, "synchronous": False}, "data_parallel"),
])
def test_the_registry_refuses_what_cannot_work(fields, match):
    kw = {"name": "bad-one", "builder": _builder, "description": "A schedule that cannot be.", **fields}
    with pytest.raises(ScheduleError, match=match):
        ScheduleSpec(**kw)
    assert not registry.known("bad-one")


def test_register_refuses_a_taken_name_unless_replaced():
    with pytest.raises(ScheduleError, match="registered already"):
        registry.register("gpipe", _builder, description="Another gpipe.")
    with pytest.raises(ScheduleError, match="needs a builder"):
        registry.register("new-one", description="No builder.")
    spec = registry.register(ScheduleSpec("tmp-1f1b", _builder, "1F1B under a temporary name."))
    try:
        assert registry.get("tmp-1f1b") is spec and registry.names()[-1] == "tmp-1f1b"
        again = registry.register("tmp-1f1b", _builder, description="Replaced.", replace=True)
        assert registry.get("tmp-1f1b") is again
        assert build("tmp-1f1b", 3, 6).actions == build("1f1b", 3, 6).actions
    finally:
        registry.unregister("tmp-1f1b")
    assert not registry.known("tmp-1f1b")


def test_a_builder_that_writes_the_wrong_number_of_programs_is_refused():
    registry.register("short-one", lambda ctx: [[]], description="One program for any number of workers.")
    try:
        with pytest.raises(ScheduleError, match="wrote 1 programs for 3 workers"):
            build("short-one", 3, 4)
    finally:
        registry.unregister("short-one")


# --- a schedule added in one file ---------------------------------------------------------------


@pytest.fixture
def plugin():
    """tests/schedule_plugin.py loaded in-process, as PIPEBOARD_SCHEDULES would; removed after."""
    registry.load_module(str(PLUGIN))
    yield registry.get(PLUGIN_NAME)
    registry.unregister(PLUGIN_NAME)
    for name in [n for n in sys.modules if n.startswith("pipeboard_schedules.")]:
        del sys.modules[name]


@pytest.mark.parametrize("p,m,kw", [(3, 6, {}), (4, 8, {"replicas": [1, 2, 1, 1]}), (2, 4, {"batch_weight_grads": True}),
                                    (3, 6, {"split_backward": True})])
def test_a_schedule_from_one_file_builds_and_simulates(plugin, p, m, kw):
    twin, gpipe = build(PLUGIN_NAME, p, m, **kw), build("gpipe", p, m, **kw)
    assert twin.name == PLUGIN_NAME and twin.actions == gpipe.actions and twin.meta == gpipe.meta
    validate(twin)
    costs = costs_uniform(p, 1e-3, 2e-3, comm_s=1e-4)
    a, b = simulate(twin, costs).summary(), simulate(gpipe, costs).summary()
    assert (a.pop("schedule"), b.pop("schedule")) == (PLUGIN_NAME, "gpipe") and a == b


def test_a_schedule_from_one_file_runs_in_the_runtime_layout_and_the_predictor(plugin):
    cfg = RunConfig(model="mlp", schedule=PLUGIN_NAME, batch_size=8, microbatches=4, num_stages=2, workers=4)
    cfg.validate()
    layout = resolve(cfg)
    assert layout.replicas == (2, 2) and not cfg.is_async
    assert layout.build(4).actions == resolve(cfg.with_(schedule="gpipe")).build(4).actions
    takers = registry.having(chunks=True)
    with pytest.raises(ConfigError, match=f"chunks: only {registry.either(takers, quote='')} hold{'s' * (len(takers) == 1)} several chunks"):
        resolve(cfg.with_(chunks=2))
    costs = costs_uniform(2, 1e-3, 2e-3)
    assert steady_step_s(costs, PLUGIN_NAME, 4) == steady_step_s(costs, "gpipe", 4)


def test_a_schedule_from_one_file_is_in_the_api(plugin, client):
    from pipeboard.app.main import create_app
    from pipeboard.app.schemas import JobSpec, PlanCreate

    listed = client.get("/api/v1/schedules").json()
    assert listed["count"] == len(registry.names()) and [s["name"] for s in listed["data"]] == list(registry.names())
    twin = next(s for s in listed["data"] if s["name"] == PLUGIN_NAME)
    assert twin["description"] == plugin.description and twin["synchronous"] and not twin["default"]
    assert [s["name"] for s in listed["data"] if s["default"]] == [registry.DEFAULT]
    schemas = create_app().openapi()["components"]["schemas"]
    # a job's schedule is in its specification's layout, where `custom` (the job's own schedule_file)
    # follows the registry's schedules; a plan names a registered one
    for model, extra in (("LayoutSection", ["custom"]), ("PlanCreate", [])):
        field = schemas[model]["properties"]["schedule"]
        assert field["enum"] == [*registry.names(), *extra] and field["default"] == registry.DEFAULT
        assert PLUGIN_NAME in field["description"] and plugin.description.rstrip(".") in field["description"]
    assert JobSpec(model={"name": "mlp-digits"}, layout={"schedule": PLUGIN_NAME}).layout.schedule == PLUGIN_NAME
    assert PlanCreate(model="mlp-digits", levels=[{"workers": 2, "bandwidth": 1e9}], schedule=PLUGIN_NAME)
    registry.unregister(PLUGIN_NAME)
    refused = client.post("/api/v1/jobs", json={"model": "mlp-digits", "schedule": PLUGIN_NAME})
    assert refused.status_code == 422 and refused.json()["detail"].startswith("layout.schedule: Input should be 'gpipe'")
    assert PLUGIN_NAME not in create_app().openapi()["components"]["schemas"]["LayoutSection"]["properties"]["schedule"]["enum"]


# --- ... and through PIPEBOARD_SCHEDULES, in fresh processes -------------------------------------


def with_plugin(entry: str = str(PLUGIN)) -> dict[str, str]:
    return {**os.environ, registry.ENV: entry, "COLUMNS": "400"}


def pipeboard(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*PIPEBOARD, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env or with_plugin())


@pytest.mark.parametrize("command", ["train", "simulate"])
def test_the_cli_help_lists_a_schedule_from_one_file(command):
    # (read, not imported: importing it here would register it in this process for good)
    DESCRIPTION = re.search(r'^DESCRIPTION = "(.*)"$', PLUGIN.read_text(), re.M).group(1)
    r = pipeboard(command, "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    built_ins = [n for n in registry.names() if n != PLUGIN_NAME]
    assert f"{', '.join(built_ins)} or {PLUGIN_NAME} (listed below)" in text
    assert f"{PLUGIN_NAME}: {DESCRIPTION}" in text


def test_pipeboard_simulate_runs_a_schedule_from_one_file():
    args = ["simulate", "--stages", "3", "--fwd", "1", "--bwd", "2", "--comm", "0.1", "--microbatches", "6", "--json"]
    twin = pipeboard(*args, "--schedule", PLUGIN_NAME)
    assert twin.returncode == 0, twin.stderr
    gpipe = pipeboard(*args, "--schedule", "gpipe")
    a, b = json.loads(twin.stdout), json.loads(gpipe.stdout)
    assert (a.pop("schedule"), b.pop("schedule")) == (PLUGIN_NAME, "gpipe") and a == b
    human = pipeboard(*args[:-1], "--schedule", PLUGIN_NAME)
    assert human.stdout.startswith(f"{PLUGIN_NAME}: 3 stages, 3 workers, 6 microbatches")
    wrong = pipeboard(*args, "--schedule", PLUGIN_NAME, "--per-update", "2")
    assert wrong.returncode == 2 and wrong.stderr.strip() == (
        f"error: --per-update: pipedream only ({PLUGIN_NAME} updates once per iteration of its microbatches)")


def test_pipeboard_train_runs_a_schedule_from_one_file():
    r = pipeboard("train", "--model", "mlp", "--model-arg", "depth=2", "--model-arg", "width=16",
                  "--model-arg", "samples=128", "--batch-size", "16", "--microbatches", "2", "--stages", "2",
                  "--schedule", PLUGIN_NAME, "--steps", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["steps"] == 2


API_DUMP = """
import json
from fastapi.testclient import TestClient
from pipeboard.app.core.db import get_session
from pipeboard.app.main import create_app
app = create_app()
app.dependency_overrides[get_session] = lambda: None  # anonymous reads touch no database
client = TestClient(app, base_url="http://localhost")  # a Host the app answers
print(json.dumps({"openapi": client.get("/openapi.json").json(), "schedules": client.get("/api/v1/schedules").json()}))
"""


def test_the_openapi_and_the_schedules_endpoint_list_a_schedule_from_one_file(tmp_path):
    # reads need a token unless PIPEBOARD_READ_AUTH is false: this one reads anonymously, without a database
    env = {**with_plugin(), "PIPEBOARD_DATA_DIR": str(tmp_path), "PIPEBOARD_READ_AUTH": "false"}
    r = subprocess.run([sys.executable, "-c", API_DUMP], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    schemas = out["openapi"]["components"]["schemas"]
    for model, last in (("LayoutSection", -2), ("PlanCreate", -1)):  # LayoutSection's ends with `custom`
        assert schemas[model]["properties"]["schedule"]["enum"][last] == PLUGIN_NAME
    assert "/api/v1/schedules" in out["openapi"]["paths"]
    assert [s["name"] for s in out["schedules"]["data"]][-1] == PLUGIN_NAME


def test_a_schedule_module_that_cannot_be_imported_is_one_line_naming_the_variable():
    env = with_plugin("/no/such/schedules.py")
    r = pipeboard("simulate", "--stages", "2", "--fwd", "1", "--bwd", "1", "--schedule", "1f1b", "--microbatches", "2",
                  env=env)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: PIPEBOARD_SCHEDULES: cannot import '/no/such/schedules.py': FileNotFoundError: "
        "no such file: /no/such/schedules.py"]
    assert pipeboard("simulate", "--help", env=env).returncode == 0  # help still shows, saying why


# --- no caller compares a schedule's name for what it can do --------------------------------------

NAMES = "|".join(re.escape(n) for n in ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "pipedream", "dp"))
COMPARISON = re.compile(rf"""(==|!=|\bin|\bnot in)\s*\(?\s*["']({NAMES})["']|["']({NAMES})["']\s*(==|!=|===|!==)|(===|!==)\s*["']({NAMES})["']""")
CALLERS = ["trainer/runtime", "trainer/schedule", "app/cli", "app/api", "app/schemas.py", "app/services/planning.py",
           "frontend/js"]


def test_no_caller_compares_a_schedule_name():
    found = []
    for entry in CALLERS:
        path = ROOT / entry
        for f in ([path] if path.is_file() else sorted(path.rglob("*.py")) + sorted(path.rglob("*.js"))):
            for i, line in enumerate(f.read_text().splitlines(), 1):
                if COMPARISON.search(line):
                    found.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_schedule_modules_import_one_another_without_a_cycle():
    """builder.py dispatches through the registry, whose built-in builders are imported on first
    use, so no module of trainer/schedule imports one that imports it back (builder.py and
    async_1f1b.py did)."""
    import ast

    deps: dict[str, set[str]] = {}
    for f in sorted((ROOT / "trainer" / "schedule").glob("*.py")):
        if f.name == "__init__.py":
            continue
        mine = deps.setdefault(f.stem, set())
        for node in ast.parse(f.read_text()).body:  # module level (not TYPE_CHECKING blocks, not functions)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeboard.trainer.schedule"):
                mine |= ({a.name for a in node.names} if node.module == "pipeboard.trainer.schedule"
                         else {node.module.rsplit(".", 1)[1]})

    def reach(start: str, seen: set[str]) -> set[str]:
        for d in deps.get(start, ()):
            if d not in seen:
                seen.add(d)
                reach(d, seen)
        return seen

    assert [m for m in deps if m in reach(m, set())] == []
    assert "pipedream" not in reach("build", set())


def test_the_registry_loads_neither_torch_nor_numpy():
    code = ("import sys, pipeboard.trainer.runtime.run_config, pipeboard.app.cli; from pipeboard.trainer.schedule import registry; registry.names(); "
            "print('torch' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "False"]
