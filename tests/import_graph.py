"""The project's modules and their imports, read from the source with ``ast`` (nothing is imported): what the
architecture and settings-layer tests check.

Every ``import`` counts, including those inside functions (they run too) and those under ``if TYPE_CHECKING:``
(a type a module names is a dependency too). ``ARCH_ROOT`` points the readers at another checkout.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(os.environ.get("ARCH_ROOT", Path(__file__).resolve().parent.parent))
PACKAGES = ("cli", "api", "workers", "router", "service", "training", "bench", "evaluation", "kvlink_rag", "store")


def modules() -> dict[str, Path]:
    """Dotted module name -> source file of every module of :data:`PACKAGES`."""
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            mods[name] = path
    return mods


def import_from_module(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` in module ``name`` (at ``path``) reads from (relative resolved)."""
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    return ".".join((base[: len(base) - node.level + 1] if node.level else []) + ([node.module] if node.module else []))


def imported(name: str, path: Path) -> set[str]:
    """Absolute module names imported by module ``name`` (relative imports resolved)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:  # every import, ``if TYPE_CHECKING:`` blocks included
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = import_from_module(name, path, node)
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def module_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports."""
    mods = modules()
    return {name: {m for m in imported(name, path) if m in mods and m != name} for name, path in mods.items()}
