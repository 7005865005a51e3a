"""The one Registry behind every name a config can give: registering, unknown names, plug-ins, lazy names."""

from __future__ import annotations

import sys
import types

import pytest

from horizonrl.errors import ConfigError
from horizonrl.registry import Registry, UnknownNameError


def _fn_a():
    return "a"


def _fn_b():
    return "b"


def test_register_decorator_direct_and_duplicates():
    reg: Registry = Registry("widget", register_with="@register_widget(NAME)")
    assert reg.register("a")(_fn_a) is _fn_a
    assert reg.register("b", _fn_b) is _fn_b
    reg.register("a", _fn_a)  # the same object again: a no-op
    with pytest.raises(ValueError, match=r"widget 'a' is already registered \(.*_fn_a\)"):
        reg.register("a", _fn_b)
    reg.register("a", _fn_b, replace=True)
    assert reg.get("a") is _fn_b
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("")
    first, second = (lambda: 1), (lambda: 2)  # same qualified name, different definitions
    reg.register("lam", first)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("lam", second)


def test_same_definition_from_a_reexecuted_module_replaces():
    reg: Registry = Registry("widget")
    ns1: dict = {"__name__": "fake_mod"}
    ns2: dict = {"__name__": "fake_mod"}
    exec("def f():\n    return 1", ns1)
    exec("def f():\n    return 2", ns2)
    reg.register("f", ns1["f"])
    reg.register("f", ns2["f"])
    assert reg.get("f")() == 2


def test_unknown_name_lists_known_and_how_to_register():
    class UnknownWidgetError(UnknownNameError):
        pass

    reg: Registry = Registry("widget", register_with="@register_widget(NAME)", error=UnknownWidgetError)
    reg.register("b", _fn_b)
    reg.register("a", _fn_a)
    with pytest.raises(UnknownWidgetError) as e:
        reg.get("nope")
    assert (
        str(e.value) == "unknown widget 'nope'; known: ['a', 'b']; register one with @register_widget(NAME)"
    )
    assert (
        isinstance(e.value, KeyError) and isinstance(e.value, ValueError) and isinstance(e.value, ConfigError)
    )
    with pytest.raises(UnknownNameError, match=r"^cfg.widget='nope': unknown widget; known: \['a', 'b'\]"):
        reg.get("nope", field="cfg.widget")
    with pytest.raises(UnknownNameError):
        reg.get(["unhashable"])  # type: ignore[arg-type]
    assert ["unhashable"] not in reg
    with pytest.raises(TypeError):
        Registry("widget", error=KeyError)  # type: ignore[arg-type]


def test_names_items_order_and_scratch():
    reg: Registry = Registry("widget", sort=False)
    reg.register("b", _fn_b)
    reg.register("a", _fn_a)
    assert reg.names() == ["b", "a"] and list(reg) == ["b", "a"] and len(reg) == 2
    assert reg.items() == [("b", _fn_b), ("a", _fn_a)]
    assert Registry("w").names() == []
    with reg.scratch():
        reg.register("c", _fn_a)
        reg.register("a", _fn_b, replace=True)
        reg.unregister("b")
        assert reg.names() == ["a", "c"]
    assert reg.items() == [("b", _fn_b), ("a", _fn_a)]


def test_plugins_load_before_first_lookup(monkeypatch):
    reg: Registry = Registry("widget", plugins=("unit_plugin_mod", "unit_missing_plugin_mod"))
    imported = []

    def import_module(name):
        imported.append(name)
        if name == "unit_missing_plugin_mod":  # an optional extra that is not installed: skipped
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        reg.register("from_plugin", _fn_a)
        return types.ModuleType(name)

    monkeypatch.setattr("horizonrl.registry.importlib.import_module", import_module)
    assert reg.names() == ["from_plugin"]
    assert "from_plugin" in reg and reg.get("from_plugin") is _fn_a
    assert imported == ["unit_plugin_mod", "unit_missing_plugin_mod"]  # once


def test_plugin_missing_a_dependency_raises(monkeypatch):
    reg: Registry = Registry("widget", plugins=("unit_plugin_mod",))

    def import_module(name):
        raise ModuleNotFoundError("No module named 'somedep'", name="somedep")

    monkeypatch.setattr("horizonrl.registry.importlib.import_module", import_module)
    with pytest.raises(ModuleNotFoundError, match="somedep"):
        reg.get("x")


def test_failed_plugin_import_is_retried(monkeypatch):
    reg: Registry = Registry("widget", plugins=("unit_broken_plugin_mod",))
    attempts = []

    def import_module(name):
        attempts.append(name)
        if len(attempts) < 3:
            raise RuntimeError("the plug-in failed while importing")
        return types.ModuleType(name)

    monkeypatch.setattr("horizonrl.registry.importlib.import_module", import_module)
    with pytest.raises(RuntimeError):
        reg.names()
    with pytest.raises(RuntimeError):  # tried again, not silently empty
        reg.get("x")
    assert reg.names() == [] and reg.names() == [] and len(attempts) == 3


def test_lazy_names_are_known_before_their_module_is_imported(monkeypatch):
    reg: Registry = Registry("engine", lazy={"slow": "unit_lazy_engine_mod"})
    assert reg.names() == ["slow"] and "slow" in reg and reg.items() == []
    monkeypatch.setitem(sys.modules, "unit_lazy_engine_mod", None)  # its dependency is missing
    with pytest.raises(ImportError):
        reg.get("slow")

    mod = types.ModuleType("unit_lazy_engine_mod")

    def import_module(name):
        assert name == "unit_lazy_engine_mod"
        reg.register("slow", _fn_a)
        return mod

    monkeypatch.setattr("horizonrl.registry.importlib.import_module", import_module)
    assert reg.get("slow") is _fn_a and reg.names() == ["slow"]
