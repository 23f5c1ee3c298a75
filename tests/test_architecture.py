"""The layering of the packages and the size of their functions, read from the source with ``ast``
(nothing is imported).

``cli`` is the top layer (it may import every package below it: it drives training and bench and serves
the API); nothing imports it. Front ends (``api``, ``workers``) -> ``service`` -> core (``kvlink_rag``)
and ``store``; ``training`` uses the service, core and store, ``bench`` also the API and the router (the
routing simulation drives the router's real ranking), never the CLI or the workers; ``evaluation`` (NQ data, long-document builders) is beside ``training``: the CLI, training and
bench use it, serving never does. Inside the core, its rooms are floors (:data:`CORE_FLOORS`): a room
imports only the rooms below it (the runtime spans floors and is left out). Every ``import`` counts
(:mod:`import_graph`), including those inside functions (they run too) and those under ``if TYPE_CHECKING:`` (a
type a module names is a dependency too: a cycle there is a cycle). ``api`` reaches the core only through the
service, with no exception (what it names of the core, the service re-exports: ``service.text_rules``,
``service.core_types``). ``store`` imports from the core
only the declared kernel (``STORE_KERNEL``), which imports nothing else of the core. Configuration per layer
is checked in test_settings_layers.py.
"""

from __future__ import annotations

import ast

from import_graph import PACKAGES, ROOT, imported, module_graph

MAX_FUNCTION_LINES = 60  # the project guide: functions under ~60 lines
FORBIDDEN = {
    "kvlink_rag": {"cli", "api", "workers", "router", "service", "training", "bench", "evaluation", "store"},
    "store": {"cli", "api", "workers", "router", "service", "training", "bench", "evaluation"},
    "service": {"cli", "api", "workers", "router", "training", "bench", "evaluation"},
    "evaluation": {"cli", "api", "workers", "router", "service", "training", "bench"},
    "training": {"cli", "api", "workers", "router", "bench"},
    "api": {"cli", "workers", "router", "training", "bench", "evaluation", "kvlink_rag"},  # the core: through service/
    "workers": {"cli", "api", "router", "training", "bench", "evaluation"},
    "router": {"cli", "api", "workers", "training", "bench", "evaluation"},
    "bench": {"cli", "workers"},
}

# the core's rooms, lowest first: a room imports only the rooms on the floors below it. The kernel (types, cache
# contract, retention's kept tokens, text checks and normal form, settings, adapter names) is what the store may
# import too. The runtime
# (kvlink_rag/runtime/) spans floors: its KV and runner modules serve linking and decoding, its scheduler drives
# the engine, so it is left out of this rule (its own modules still may not form a cycle).
CORE_FLOORS = (
    ("types", "rows", "retention", "bounds", "cache", "encodable", "home", "settings", "omp_pool",
     "adapter_names"),  # kernel
    ("model",),  # loading, families, LoRA, attention capture
    ("text",),  # chat-template framing, conversations, chunks
    ("linking",),  # RoPE, mask, precompute, link tokens, linker
    ("decoding",),  # sampling, the decode loop, stop strings, grammar, logprobs
    ("reuse",),  # the reuse methods
    ("engine_documents",),  # the engine's documents: ids, keys, chunks, encoding, resolution
    ("engine",),  # the Engine facade
    ("explain", "adapter_registry"),  # explained answers; named adapters over engines
)
CORE_SPANNING = ("runtime",)

# the core modules the store may import: types, the cache contract, text normalisation (issue 29 item 2)
STORE_KERNEL = {
    "kvlink_rag.types": "DocumentKV, RetainedKV, LayeredDocuments, Document, dtypes: what the store keeps",
    "kvlink_rag.rows": "the RowWriter contract by which the store writes stored rows into a consumer's blocks",
    "kvlink_rag.cache": "the DocumentCache contract the store implements",
    "kvlink_rag.retention": "the importance order a stored record's layers follow (retention arithmetic)",
    "kvlink_rag.bounds": "the range of a retention (retention.py re-exports its check)",
    "kvlink_rag.encodable": "which texts and JSON values can be stored and served, and the normal form keys hash",
    "kvlink_rag.omp_pool": "helper threads that copy KV beside a forward open no OpenMP team of their own",
    "kvlink_rag.home": "the home folder, the settings base every layer's class derives from, the check of a name "
                       "against a registry",
}


def _wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """``"module -> imported"`` for every edge into a package its package may not import."""
    bad = []
    for mod, deps in sorted(graph.items()):
        top = mod.split(".")[0]
        for dep in sorted(deps):
            if dep.split(".")[0] in FORBIDDEN.get(top, ()):
                bad.append(f"{mod} -> {dep}")
    return bad


def test_no_import_points_the_wrong_way():
    assert _wrong_way(module_graph()) == []


def _api_core_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """``(api module, core module)`` of every import from ``api`` straight into ``kvlink_rag``."""
    return {(mod, dep) for mod, deps in graph.items() if mod.split(".")[0] == "api"
            for dep in deps if dep.split(".")[0] == "kvlink_rag"}


def test_api_reaches_the_core_only_through_the_service():
    assert sorted(_api_core_edges(module_graph())) == []  # no exception, TYPE_CHECKING imports included


def _core_room(mod: str) -> str | None:
    """The room of a core module (its sub-package, or its own name at the core's top), None outside the core
    or for the package itself."""
    parts = mod.split(".")
    return parts[1] if parts[0] == "kvlink_rag" and len(parts) > 1 else None


def _core_floor_errors(graph: dict[str, set[str]]) -> list[str]:
    """``"module -> imported"`` for every core edge that does not point to a lower floor, and
    ``"module: no floor"`` for a core room missing from :data:`CORE_FLOORS`."""
    floor = {room: i for i, rooms in enumerate(CORE_FLOORS) for room in rooms}
    bad = []
    for mod, deps in sorted(graph.items()):
        room = _core_room(mod)
        if room is None or room in CORE_SPANNING:
            continue
        if room not in floor:
            bad.append(f"{mod}: no floor")
            continue
        for dep in sorted(deps):
            other = _core_room(dep)
            if other is None or other == room or other in CORE_SPANNING:
                continue
            if other not in floor or floor[other] > floor[room] or (floor[other] == floor[room] and floor[room] > 0):
                bad.append(f"{mod} -> {dep}")
    return bad


def test_the_cores_rooms_import_only_the_floors_below():
    assert _core_floor_errors(module_graph()) == []


def test_the_floor_check_sees_an_edge_up_and_a_room_without_a_floor():
    graph = {"kvlink_rag.linking.linker": {"kvlink_rag.model.loader", "kvlink_rag.reuse.blend", "kvlink_rag.runtime.ragged"},
             "kvlink_rag.model.loader": {"kvlink_rag.types", "kvlink_rag.engine"}, "kvlink_rag.stray": set(),
             "kvlink_rag.types": {"kvlink_rag.retention"}}
    assert _core_floor_errors(graph) == ["kvlink_rag.linking.linker -> kvlink_rag.reuse.blend",
                                         "kvlink_rag.model.loader -> kvlink_rag.engine", "kvlink_rag.stray: no floor"]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles():
    # a package's __init__ re-exporting its submodules is not a cycle of modules
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in module_graph().items()}
    assert _cycles(graph) == []


def test_the_checker_sees_type_checking_imports_and_api_core_edges(tmp_path):
    path = tmp_path / "a.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n"
                    "else:\n    import pkg.c\n")
    assert {"pkg.b", "pkg.b.B", "pkg.c"} <= imported("pkg.a", path)
    graph = {"api.routes.openai": {"kvlink_rag.text.conversation", "service.chat"},
             "service.chat": {"kvlink_rag.text.conversation"}}
    assert _api_core_edges(graph) == {("api.routes.openai", "kvlink_rag.text.conversation")}


def test_the_checker_sees_a_cycle_and_a_wrong_edge():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = {"kvlink_rag.engine": {"store.doc_cache"}, "store.catalog": {"kvlink_rag.types", "service.queries"},
             "cli.core": {"service.runtime", "api.main"}, "api.state": {"kvlink_rag.engine", "service.core_types"}}
    assert _wrong_way(graph) == ["api.state -> kvlink_rag.engine", "kvlink_rag.engine -> store.doc_cache",
                                 "store.catalog -> service.queries"]


def _long_functions(limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name (N lines)`` of every function or method longer than ``limit`` lines (decorators
    excluded, its docstring and nested functions included)."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > limit:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    return found


def test_no_function_is_longer_than_60_lines():
    long = _long_functions()
    assert long == [], "split these functions (at most 60 lines each):\n" + "\n".join(long)


def test_no_source_file_is_longer_than_300_lines():
    """One concept per module: the source files (tests apart) stay under ~300 lines."""
    long = [f"{path.relative_to(ROOT)} ({n} lines)" for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > 300]
    assert long == [], "split these modules along a concept (at most 300 lines each):\n" + "\n".join(long)


def _kernel_edges(graph: dict[str, set[str]]) -> list[str]:
    """``"module -> core module"`` of every store edge into the core outside the kernel, and of every
    kernel edge into the rest of the core."""
    bad = []
    for mod, deps in sorted(graph.items()):
        top = mod.split(".")[0]
        if top == "store" or mod in STORE_KERNEL:
            bad += [f"{mod} -> {d}" for d in sorted(deps) if d.split(".")[0] == "kvlink_rag" and d not in STORE_KERNEL]
    return bad


def test_the_store_imports_only_the_kernel_of_the_core():
    graph = module_graph()
    assert _kernel_edges(graph) == []
    assert sorted(set(STORE_KERNEL) - set(graph)) == []  # every kernel module exists


def test_the_checker_sees_a_store_edge_past_the_kernel():
    graph = {"store.keys": {"kvlink_rag.encodable", "kvlink_rag.text.prompt"}, "kvlink_rag.cache": {"kvlink_rag.engine"},
             "service.documents": {"kvlink_rag.text.prompt"}}
    assert _kernel_edges(graph) == ["kvlink_rag.cache -> kvlink_rag.engine", "store.keys -> kvlink_rag.text.prompt"]
