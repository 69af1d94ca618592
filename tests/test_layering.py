"""devkit's layering, read from the import statements of every module (ast).

Each layer imports only itself and the layers below it (devkit/__init__.py's
docstring and README.md's "Layers" name them):

    abi, errors, dtypes, _version, openblas
    driver      (Device, Stream, Event, Buffer: a plugin only as the object it is given)
    plugin      (finding and loading plugins, through tables: no backend imported)
    runtime     (Array, device specs), creation
    engine.calls, engine.launch, engine.memory  (prebuilt kernel calls and their launchers)
    ops         (specs, resolution, dispatch, the families and rules), operators
    engine      (graph capture, plans and I/O binding, fusion, codegen, the interpreter)
    devkit      (the package's public names)
    backends    (the reference plugins, loaded by name)
    frameworks  (onnx, torch, paddle, distributed, bench, conformance_cli, cli, new_plugin;
                 ops.reference_doc, the docs/operators.md writer)

The import graph has an edge for each devkit import a module makes when it is
imported (module level, class bodies included, ``if TYPE_CHECKING:`` blocks
left out), plus the packages above the imported module that the importer is
not already inside (their ``__init__`` runs first). Imports inside functions
are deferred imports, kept apart: each one is in DEFERRED with why.

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


# -- the layers --------------------------------------------------------------------------

LAYERS = (
    ("base", ("devkit._version", "devkit.abi", "devkit.errors", "devkit.dtypes", "devkit.openblas")),
    ("driver", ("devkit.driver",)),
    ("plugin", ("devkit.plugin",)),
    ("runtime", ("devkit.runtime", "devkit.creation")),
    ("calls", ("devkit.engine", "devkit.engine.calls", "devkit.engine.launch", "devkit.engine.memory")),
    ("ops", ("devkit.ops", "devkit.operators")),
    ("engine", ("devkit.engine.binding", "devkit.engine.fusion", "devkit.engine.graph", "devkit.engine.interpreter",
                "devkit.engine.plan", "devkit.codegen")),
    ("package", ("devkit",)),
    ("backends", ("devkit.backends",)),
    # ops.reference_doc writes docs/operators.md, the cpu plugin's float32 error bounds included.
    ("frameworks", ("devkit.onnx", "devkit.torch", "devkit.paddle", "devkit.distributed", "devkit.bench",
                    "devkit.conformance_cli", "devkit.cli", "devkit.new_plugin", "devkit.ops.reference_doc")),
)
# The host core: what a framework builds on. It names no specific backend.
CORE_LAYERS = ("base", "driver", "plugin", "runtime", "calls", "ops", "engine", "package")


def layer(module: str) -> int | None:
    """The rank of the layer of ``module``: its own entry, else its package's
    (the longest prefix; "devkit" is the package's __init__ alone). None: no layer."""
    ranks = {prefix: rank for rank, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes}
    name = module
    while name not in ranks and "." in name:
        name = name.rpartition(".")[0]
    return ranks[name] if name != "devkit" or module == "devkit" else None


_STARTUP = ("start-up: devkit imports engine.graph (Stream.capture); codegen and engine.fusion add "
            "about 20 ms to it that only the end of a fused capture needs")
_SUBCOMMAND = ("start-up: each devkit-bench subcommand's module is imported when it runs; the "
               "collectives ranks (one process per rank) import none of them, nor the ONNX side "
               "(devkit.onnx and onnx, about 0.1 s) that engine, ops, cuda and fusion import")
_TORCH = "optional dependency: devkit.torch imports torch, imported once it is known to be installed"
_PADDLE = ("optional dependency, and order: devkit.paddle builds the bridge and sets CUSTOM_DEVICE_ROOT, "
           "imported once paddle is known to be installed and DEVKIT_PADDLE_PLUGIN is set, before paddle")

# Every function-level devkit import, (importer, imported module) -> why it is deferred.
DEFERRED = {
    ("devkit.engine.graph", "devkit.codegen"): _STARTUP,
    ("devkit.engine.graph", "devkit.engine.fusion"): _STARTUP,
    ("devkit.onnx", "devkit.onnx.backend"): "start-up: devkit.onnx.Backend imports onnx.backend, which is slow: "
                                            "on first use",
    **{("devkit.bench", f"devkit.bench.{command}"): _SUBCOMMAND
       for command in ("fusion", "torch", "paddle", "engine", "opencl", "cuda", "ops")},
    ("devkit.bench.torch", "devkit.torch"): _TORCH,
    ("devkit.bench.torch", "devkit.torch.models"): _TORCH,
    ("devkit.bench.paddle", "devkit.paddle"): _PADDLE,
    ("devkit.bench.paddle", "devkit.paddle.models"): _PADDLE,
}


def test_every_module_has_a_layer():
    assert [module for module in modules() if layer(module) is None] == []


def test_devkit_modules_import_no_cycle():
    """Module level: a cycle makes a module's import depend on which one
    happens to be imported first (a partly initialised module)."""
    assert cycles(graph()) == []


def test_no_deferred_import_hides_a_cycle():
    """Function-level imports counted as module-level ones: still no cycle, so
    none is deferred to dodge one."""
    assert cycles(graph(deferred=True)) == []


def test_each_layer_imports_only_itself_and_those_below():
    upward = [f"{importer} ({LAYERS[layer(importer)][0]}) imports {target} ({LAYERS[layer(target)][0]})"
              for importer, targets in graph().items() for target in sorted(targets)
              if layer(target) > layer(importer)]
    assert upward == []


def test_the_host_core_imports_no_backend():
    core = {rank for rank, (name, _) in enumerate(LAYERS) if name in CORE_LAYERS}
    found = [f"{i.importer}:{i.line} imports {i.target}" for module in modules() if layer(module) in core
             for i in imports(module) if i.target.startswith("devkit.backends")]
    assert found == []


def test_every_deferred_import_says_why():
    found = {(i.importer, i.target): i for i in deferred_imports()}
    unlisted = [f"{modules()[i.importer].relative_to(PACKAGE.parent)}:{i.line} -> {i.target}"
                for key, i in found.items() if key not in DEFERRED]
    assert unlisted == [], "import these at module level, or add them to DEFERRED with the reason"
    stale = [key for key in DEFERRED if key not in found]
    assert stale == [], "DEFERRED lists imports that are no longer deferred"


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
