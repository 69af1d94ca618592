"""devkit's layering, read from the import statements of every module (ast).

The import graph has an edge for each devkit import a module makes when it is
imported (module level, class bodies included, ``if TYPE_CHECKING:`` blocks
left out), plus the packages above the imported module that the importer is
not already inside (their ``__init__`` runs first). Imports inside functions
are deferred imports, kept apart.

``python -m tests.test_layering`` prints the graph's cycles and the deferred
imports.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path

import pytest

import devkit

from .conftest import run_python

PACKAGE = Path(devkit.__file__).parent


@dataclasses.dataclass(frozen=True)
class Import:
    importer: str
    target: str
    line: int
    deferred: bool  # inside a function: runs when the function is first called


@functools.cache
def modules() -> dict[str, Path]:
    """Every devkit module by its dotted name (new_plugin's templates are files it copies, not modules)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if "templates" in parts:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _owner(name: str) -> str:
    """The module that defines ``name`` (a module, or an attribute of one)."""
    while name not in modules():
        name = name.rpartition(".")[0]
    return name


def _targets(importer: str, node) -> list[str]:
    """The devkit modules an import statement of ``importer`` names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            package = importer.split(".")
            if modules()[importer].name != "__init__.py":
                package.pop()
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
        else:
            base = node.module
        # ``from package import name``: the submodule where there is one, else the package.
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules() else base for alias in node.names]
    return [_owner(name) for name in names if name == "devkit" or name.startswith("devkit.")]


@functools.cache
def imports(importer: str) -> tuple[Import, ...]:
    found: list[Import] = []

    def visit(node, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # annotations only
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend(Import(importer, target, child.lineno, deferred)
                             for target in _targets(importer, child) if target != importer)
            visit(child, deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(modules()[importer].read_text()), False)
    return tuple(found)


def _runs(importer: str, target: str) -> list[str]:
    """What importing ``target`` from ``importer`` runs: it, and the packages
    above it that ``importer`` is not inside."""
    parts = target.split(".")
    above = [".".join(parts[:i]) for i in range(1, len(parts))]
    return [package for package in above if not importer.startswith(package + ".")] + [target]


@functools.cache
def graph(deferred: bool = False) -> dict[str, set[str]]:
    """Module -> the modules its import runs (``deferred``: function-level imports too)."""
    return {module: {run for i in imports(module) if deferred or not i.deferred
                     for run in _runs(module, i.target) if run != module}
            for module in modules()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(edges[module]):
            if target not in index:
                connect(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            connect(module)
    return found


def deferred_imports() -> list[Import]:
    return [i for module in modules() for i in imports(module) if i.deferred]


# -- the core modules (from tests/test_layout.py) --------------------------------------

CORE = ("devkit._version", "devkit.abi", "devkit.errors", "devkit.dtypes", "devkit.driver", "devkit.plugin",
        "devkit.runtime")


def _reachable(module: str) -> set[str]:
    """The core modules ``module`` reaches through core modules, by imports at any level."""
    seen, todo = set(), [module]
    while todo:
        for target in graph(deferred=True)[todo.pop()] & set(CORE):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


@pytest.mark.parametrize("module", CORE)
def test_a_core_module_does_not_import_itself_back(module):
    assert module not in _reachable(module), f"{module} is part of an import cycle"


def test_the_loader_sits_below_the_runtime():
    assert "devkit.runtime" not in _reachable("devkit.plugin") and "devkit.plugin" not in _reachable("devkit.driver")
    assert {"devkit.driver", "devkit.plugin"} <= _reachable("devkit.runtime")


@pytest.mark.parametrize("module", ("driver", "plugin", "runtime", "engine.graph"))
def test_a_core_module_imports_on_its_own(module):
    """In a fresh interpreter, with devkit's __init__ left out so that only the
    module's own imports run: a cycle would meet a partly initialised module."""
    code = ("import sys, types\n"
            "package = types.ModuleType('devkit')\n"
            f"package.__path__ = [{str(PACKAGE)!r}]\n"
            "sys.modules['devkit'] = package\n"
            f"import devkit.{module}\n"
            "print(sorted(name for name in sys.modules if name.startswith('devkit.')))")
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    if module in ("driver", "plugin"):  # below the runtime: it never gets imported
        assert "'devkit.runtime'" not in result.stdout


def report() -> str:
    lines = ["cycles (module-level imports):"]
    lines += [f"  {len(c)}: {', '.join(c)}" for c in cycles(graph())] or ["  none"]
    lines += ["cycles (function-level imports too):"]
    lines += [f"  {len(c)}: {', '.join(c)}" for c in cycles(graph(deferred=True))] or ["  none"]
    found = deferred_imports()
    lines += [f"deferred devkit imports: {len(found)}"]
    lines += [f"  {modules()[i.importer].relative_to(PACKAGE.parent)}:{i.line} -> {i.target}" for i in found]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
