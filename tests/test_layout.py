"""The package's layering: the core modules import downwards only.

    abi, errors, dtypes, _version  <-  driver (devices, streams, memory)
        <-  plugin (loading)  <-  runtime (arrays, device specs)

(devkit.graph sits above the runtime; Stream.capture, in the driver, imports
it when a capture begins.)

A cycle among them (the one plugin.py and runtime.py had: a plugin made its
devices from runtime.Device, which imported the loader) makes a module's
import depend on which one happens to be imported first.
"""

import ast
from pathlib import Path

import pytest

import devkit

from .conftest import run_python

PACKAGE = Path(devkit.__file__).parent
CORE = ("_version", "abi", "errors", "dtypes", "driver", "plugin", "runtime")


def _devkit_imports(module: str) -> set[str]:
    """The core modules ``devkit.<module>`` imports anywhere in its code (in
    functions too, which still make a cycle), leaving out ``if TYPE_CHECKING:``
    blocks (annotations only)."""
    path = PACKAGE / f"{module}.py"
    tree = ast.parse((path if path.exists() else PACKAGE / module / "__init__.py").read_text())
    found: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [alias.name for alias in node.names]
            found.update(name.split(".")[0] for name in names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("devkit."):
            found.add(node.module.split(".")[1])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found & set(CORE)


def _reachable(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for imported in _devkit_imports(todo.pop()):
            if imported not in seen:
                seen.add(imported)
                todo.append(imported)
    return seen


@pytest.mark.parametrize("module", CORE)
def test_a_core_module_does_not_import_itself_back(module):
    assert module not in _reachable(module), f"devkit.{module} is part of an import cycle"


def test_the_loader_sits_below_the_runtime():
    assert "runtime" not in _reachable("plugin") and "plugin" not in _reachable("driver")
    assert {"driver", "plugin"} <= _reachable("runtime")


@pytest.mark.parametrize("module", ("driver", "plugin", "runtime", "graph"))
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
