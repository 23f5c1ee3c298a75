"""Configuration per layer, read from the source with ``ast`` (nothing is imported): the core reads only
``EngineSettings``, the store only ``StoreSettings``; every other package takes its settings from
``service.settings`` (``Settings``: the three layers' classes in one, which the service hands down). A core or
store module that imports another layer's class, or reads a field its own class does not have, fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

from import_graph import ROOT, import_from_module, modules

# each layer's settings class, where it is defined, and the packages that read it
SETTINGS_CLASSES = {
    "kvlink_rag": ("kvlink_rag/settings.py", "EngineSettings"),
    "store": ("store/settings.py", "StoreSettings"),
    "service": ("service/settings.py", "Settings"),  # the three in one: the composition root hands them down
}
SETTINGS_NAMES = {"LayerSettings", "EngineSettings", "StoreSettings", "ServiceSettings", "Settings"}
BASE_SETTINGS_METHODS = {"model_copy", "model_dump", "model_fields", "model_fields_set", "model_dump_json"}


def _settings_fields(path: Path, cls: str) -> set[str]:
    """Field and property names of settings class ``cls`` in ``path``, its bases' (found by name in the
    settings modules) included."""
    classes = {}
    for p in ["kvlink_rag/home.py"] + [f for f, _ in SETTINGS_CLASSES.values()]:
        for node in ast.parse((ROOT / p).read_text()).body:
            if isinstance(node, ast.ClassDef):
                classes[node.name] = node

    def fields(name: str) -> set[str]:
        node = classes.get(name)
        if node is None:
            return set()
        own = {b.target.id for b in node.body if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)}
        own |= {b.name for b in node.body if isinstance(b, ast.FunctionDef)}
        return own.union(*(fields(b.id) for b in node.bases if isinstance(b, ast.Name)))

    return fields(cls)


def _settings_reads(path: Path) -> set[str]:
    """Attribute names read off anything called ``settings`` (``settings.x``, ``self.settings.x``)."""
    return {node.attr for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Attribute) and (
                (isinstance(node.value, ast.Name) and node.value.id == "settings")
                or (isinstance(node.value, ast.Attribute) and node.value.attr == "settings"))}


def _settings_imports(name: str, path: Path) -> set[tuple[str, str]]:
    """``(absolute module, class)`` of every settings class module ``name`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            mod = import_from_module(name, path, node)
            found |= {(mod, a.name) for a in node.names if a.name in SETTINGS_NAMES}
    return found


def _wrong_settings(name: str, path: Path, shown: str) -> list[str]:
    """What module ``name`` (at ``path``, named ``shown`` in messages) does wrong with settings: a settings
    class imported that is not its layer's, or (core and store) a field read that its class does not have."""
    pkg = name.split(".")[0]
    own_file, own_class = SETTINGS_CLASSES.get(pkg, SETTINGS_CLASSES["service"])
    allowed = {(own_file[:-3].replace("/", "."), own_class), ("kvlink_rag.home", "LayerSettings")}
    if pkg == "service":  # the composition root builds Settings from the three
        allowed |= {(f[:-3].replace("/", "."), c) for f, c in SETTINGS_CLASSES.values()}
        allowed |= {("service.settings", "ServiceSettings"), ("store.settings", "StoreSettings"),
                    ("kvlink_rag.settings", "EngineSettings")}
    bad = [f"{shown} imports {m}.{c}" for m, c in sorted(_settings_imports(name, path)) if (m, c) not in allowed]
    if pkg in ("kvlink_rag", "store"):
        fields = _settings_fields(ROOT / own_file, own_class) | BASE_SETTINGS_METHODS
        bad += [f"{shown} reads settings.{f}" for f in sorted(_settings_reads(path) - fields)]
    return bad


def test_each_package_reads_only_its_own_settings():
    settings_files = {ROOT / f for f, _ in SETTINGS_CLASSES.values()} | {ROOT / "kvlink_rag/home.py"}
    bad = []
    for name, path in sorted(modules().items()):
        if path not in settings_files:
            bad += _wrong_settings(name, path, str(path.relative_to(ROOT)))
    assert bad == []


def test_the_checker_sees_a_foreign_setting(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("from ..settings import EngineSettings\nfrom service.settings import Settings\n\n"
                    "def f(settings, self):\n    return settings.store_dir, self.settings.api_keys\n")
    assert _wrong_settings("store.tiers.probe", path, "probe") == [
        "probe imports service.settings.Settings", "probe imports store.settings.EngineSettings",
        "probe reads settings.api_keys"]
    assert _wrong_settings("kvlink_rag.x.probe", path, "probe") == [
        "probe imports service.settings.Settings", "probe reads settings.api_keys", "probe reads settings.store_dir"]
