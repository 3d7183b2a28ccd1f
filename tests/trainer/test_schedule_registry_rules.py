"""The registry's rules and its loading of schedule modules, in-process (trainer/schedule/registry.py).

test_schedule_registry.py checks PIPEBOARD_SCHEDULES through fresh ``pipeboard`` processes; these
run ``_load_extra`` and ``load_module`` here, on a registry set back to unloaded and restored
after, so each of their branches is seen: a module name, a path with or without ``.py``, relative
or absolute, a file stem that is no identifier, a missing file, a module that fails, one that
registers a taken name, a variable listing several entries, and that the variable is read once.
Also every refusal of ``ScheduleSpec``, ``register`` and ``having`` word for word, ``either``'s
phrasing, and ``_lazy``, the built-ins' import-on-first-call builders.
"""

from __future__ import annotations

import re
import sys
import textwrap

import pytest

from pipeboard.trainer.schedule import ScheduleError, ScheduleSpec, registry
from pipeboard.trainer.schedule import flush
from pipeboard.trainer.schedule.registry import BuildContext
from pipeboard.trainer.schedule.topology import replicated

# the six declared in registry.py, then the one-file schedules of trainer/schedule/library/
LIBRARY = tuple(s.name for s in registry.specs() if s.builder.__module__.startswith("pipeboard.trainer.schedule.library."))
BUILT_INS = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "pipedream", "dp") + LIBRARY


def _builder(ctx):
    return flush.one_f_one_b_builder(ctx)


@pytest.fixture
def fresh(monkeypatch):
    """A registry that has not read PIPEBOARD_SCHEDULES yet, with its own copy of the schedules;
    everything (the schedules, the flags, modules imported meanwhile) is put back afterwards."""
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(registry, "_load_error", None)
    monkeypatch.delenv(registry.ENV, raising=False)
    before = set(sys.modules)
    yield monkeypatch
    for name in set(sys.modules) - before:
        if name.startswith(("pipeboard_schedules.", "rules_sched")):
            del sys.modules[name]


def plugin(folder, filename: str, name: str, body: str = "") -> str:
    """A schedule module ``filename`` in ``folder`` registering ``name`` (gpipe's order); returns its path."""
    path = folder / filename
    path.write_text(textwrap.dedent(f"""
        from pipeboard.trainer.schedule.flush import gpipe_builder
        from pipeboard.trainer.schedule.registry import register
        {body}
        def builder(ctx):
            return gpipe_builder(ctx)

        register({name!r}, builder, description="A test's schedule.")
    """))
    return str(path)


# --- ScheduleSpec, register, having, either -------------------------------------------------------


@pytest.mark.parametrize("fields,problem", [
    ({"name": "Bad Name"}, "name must match ^[a-z0-9][a-z0-9._-]{0,39}$ (lower case, digits, . _ -)"),
    ({"builder": 42}, "builder must be callable"),
    ({"description": "two\nlines"}, "description must be one line"),
    ({"weight_grads": ("fast",)}, "weight_grads must be modes among batched, immediate"),
    ({"default_chunks": 2}, "default_chunks > 1 needs chunks=True"),
    ({"chunks": True}, "a schedule that takes chunks runs one worker per stage: replication=False"),
    ({"vertical_sync": True}, "vertical_sync applies to asynchronous schedules (synchronous=False)"),
    ({"needs_split_backward": True},
     "needs_split_backward excludes batched weight gradients (weight_grads without 'batched')"),
    ({"data_parallel": True, "replication": False},
     "data_parallel is one replicated stage: synchronous, replication, no chunks"),
])
def test_a_spec_that_cannot_work_is_refused_word_for_word(fields, problem):
    kw = {"name": "bad-one", "builder": _builder, "description": "A schedule that cannot be.", **fields}
    with pytest.raises(ScheduleError) as info:
        ScheduleSpec(**kw)
    assert str(info.value) == f"schedule {kw['name']!r}: {problem}"


def test_every_problem_of_a_spec_is_listed():
    with pytest.raises(ScheduleError) as info:
        ScheduleSpec("bad-one", 42, "two\nlines")
    assert str(info.value) == "schedule 'bad-one': builder must be callable; description must be one line"


def test_specs_that_can_work_are_taken_with_weight_grads_as_a_tuple():
    chunked = ScheduleSpec("chunked", _builder, "Chunks, one worker per stage.", chunks=True, replication=False)
    assert chunked.chunks and not chunked.replication
    dp = ScheduleSpec("dp-again", _builder, "Data parallel.", data_parallel=True, weight_grads=())
    assert dp.data_parallel and dp.replication
    listed = ScheduleSpec("listed", _builder, "Weight grads given as a list.", weight_grads=["batched"])
    assert listed.weight_grads == ("batched",) and type(listed.weight_grads) is tuple
    assert listed.to_dict()["weight_grads"] == ["batched"]


@pytest.mark.parametrize("extra", [{"builder": _builder}, {"description": "More."}])
def test_register_takes_a_spec_alone(fresh, extra):
    spec = ScheduleSpec("spec-alone", _builder, "A spec with something more.")
    with pytest.raises(ScheduleError) as info:
        registry.register(spec, **extra)
    assert str(info.value) == "register(spec) takes the spec alone"
    assert not registry.known("spec-alone")


def test_unregister_removes_a_schedule_and_ignores_an_unknown_name(fresh):
    registry.register("short-lived", _builder, description="Registered, then removed.")
    registry.unregister("short-lived")
    assert not registry.known("short-lived")
    registry.unregister("short-lived")  # again: nothing to remove, no error
    registry.unregister("never-registered")
    assert registry.names() == BUILT_INS


@pytest.mark.parametrize("field", ["name", "builder", "description", "colour"])
def test_having_asks_about_capabilities_only(field):
    with pytest.raises(TypeError) as info:
        registry.having(**{field: "gpipe"})
    assert str(info.value) == f"having(): not a capability: {field}"
    with pytest.raises(TypeError) as info:
        registry.having(name="x", colour=1, chunks=True)
    assert str(info.value) == "having(): not a capability: name, colour"


def test_having_compares_weight_grads_given_as_any_sequence(fresh):
    def declared(names):  # the library's schedules have their own tests
        return tuple(n for n in names if n not in LIBRARY)

    assert registry.having(weight_grads=[]) == registry.having(weight_grads=())
    assert declared(registry.having(weight_grads=[])) == ("zb-h1", "dp")
    assert declared(registry.having(weight_grads=["batched", "immediate"])) == ("gpipe", "1f1b", "interleaved-1f1b", "pipedream")
    assert declared(registry.having(chunks=True)) == ("interleaved-1f1b",)


def test_either_phrases_a_list_of_names():
    assert registry.either([]) == "no schedule"
    assert registry.either(["a"]) == "'a'"
    assert registry.either(("a", "b")) == "'a' or 'b'"
    assert registry.either(["a", "b", "c"]) == "'a', 'b' or 'c'"
    assert registry.either(["a", "b", "c", "d"], quote="`", conj="and") == "`a`, `b`, `c` and `d`"


def test_a_lazy_builder_imports_its_function_on_first_call():
    target = "pipeboard.trainer.schedule.flush:gpipe_builder"
    builder = registry._lazy(target)
    assert builder.__name__ == builder.__qualname__ == target
    ctx = BuildContext(replicated(2, [1, 2]), 4, 2, 1, True, False, 1)
    assert builder(ctx) == flush.gpipe_builder(ctx)
    assert registry._lazy("pipeboard.trainer.schedule.flush:one_f_one_b_builder")(ctx) == flush.one_f_one_b_builder(ctx)
    assert registry.get("zb-h1").builder.__name__ == "pipeboard.trainer.schedule.zerobubble:zero_bubble_builder"


# --- PIPEBOARD_SCHEDULES, read on the first query ---------------------------------------------------


def test_without_the_variable_the_first_query_finds_the_built_ins_and_the_variable_is_read_once(fresh, tmp_path):
    assert registry.names() == BUILT_INS
    assert registry._loaded is True
    fresh.setenv(registry.ENV, plugin(tmp_path, "late.py", "late-one"))
    assert not registry.known("late-one") and registry.names() == BUILT_INS  # read once, at the first query


def test_the_variable_lists_modules_separated_by_commas(fresh, tmp_path):
    first = plugin(tmp_path, "first.py", "first-one")
    second = plugin(tmp_path, "second.py", "second-one")
    fresh.setenv(registry.ENV, f" {first} ,{second}, ")
    assert registry.names() == (*BUILT_INS, "first-one", "second-one")


def test_a_module_that_cannot_be_imported_fails_every_query_the_same_way(fresh, tmp_path):
    missing = str(tmp_path / "missing.py")
    fresh.setenv(registry.ENV, missing)
    message = (f"PIPEBOARD_SCHEDULES: cannot import {missing!r}: FileNotFoundError: "
               f"no such file: {(tmp_path / 'missing.py').resolve()}")
    for query in (registry.names, lambda: registry.get("gpipe"), lambda: registry.known("gpipe")):
        with pytest.raises(ScheduleError) as info:
            query()
        assert str(info.value) == message


# --- load_module ------------------------------------------------------------------------------------


def test_a_file_loads_once_under_an_identifier_made_of_its_stem(fresh, tmp_path):
    path = plugin(tmp_path, "My-sched.v2.py", "stem-one", body="from dataclasses import dataclass\n"
                  "        @dataclass\n        class Options:\n            depth: int = 1\n")
    registry.load_module(path)
    module = sys.modules["pipeboard_schedules.My_sched_v2"]
    assert module.__file__ == path and module.Options().depth == 1  # a dataclass needs its module there
    assert registry.get("stem-one").builder.__module__ == "pipeboard_schedules.My_sched_v2"
    registry.load_module(path)  # again: already imported, not registered twice
    assert registry.names().count("stem-one") == 1


def test_a_relative_py_file_is_a_path(fresh, tmp_path):
    plugin(tmp_path, "rules_sched_rel.py", "relative-one")
    fresh.chdir(tmp_path)
    registry.load_module("rules_sched_rel.py")
    assert registry.known("relative-one")


def test_a_dotted_name_is_a_module_on_the_path(fresh, tmp_path):
    package = tmp_path / "rules_sched_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    plugin(package, "mod.py", "module-one")
    fresh.syspath_prepend(str(tmp_path))
    registry.load_module("rules_sched_pkg.mod")
    assert registry.known("module-one")
    with pytest.raises(ScheduleError) as info:
        registry.load_module("rules_sched_pkg.nothing")
    assert str(info.value) == ("PIPEBOARD_SCHEDULES: cannot import 'rules_sched_pkg.nothing': ModuleNotFoundError: "
                               "No module named 'rules_sched_pkg.nothing'")


@pytest.mark.parametrize("filename", ["missing.py", "missing"])
def test_a_missing_file_is_named(fresh, tmp_path, filename):
    entry = str(tmp_path / filename)
    with pytest.raises(ScheduleError) as info:
        registry.load_module(entry)
    assert str(info.value) == (f"PIPEBOARD_SCHEDULES: cannot import {entry!r}: FileNotFoundError: "
                               f"no such file: {(tmp_path / filename).resolve()}")


def test_a_module_that_fails_is_named_with_its_error_and_left_unimported(fresh, tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("raise ValueError('boom')\n")
    with pytest.raises(ScheduleError) as info:
        registry.load_module(str(path))
    assert str(info.value) == f"PIPEBOARD_SCHEDULES: cannot import {str(path)!r}: ValueError: boom"
    assert "pipeboard_schedules.broken" not in sys.modules


def test_a_module_registering_a_taken_name_says_so(fresh, tmp_path):
    path = plugin(tmp_path, "taken.py", "gpipe")
    with pytest.raises(ScheduleError) as info:
        registry.load_module(path)
    assert str(info.value) == (f"PIPEBOARD_SCHEDULES: {path}: schedule 'gpipe' is registered already "
                               "(replace=True to redefine it)")
    assert re.fullmatch(r"All forwards.*\(GPipe\)\.", registry.get("gpipe").description)
