"""What the plugins written in Python share -- devkit.backends.support and the
kernel library devkit.backends.kernels -- is neutral: it imports neither
pyopencl nor CuPy nor either plugin's package, so each plugin imports it
without the other's library (a GPU machine's image has no pyopencl)."""

import ast
from pathlib import Path

import pytest

import devkit

from .conftest import run_python

BACKENDS = Path(devkit.__file__).parent / "backends"
NEUTRAL = ("support", "kernels")
LIBRARIES = ("pyopencl", "cupy")
PLUGINS = ("devkit.backends.opencl", "devkit.backends.cuda")


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports anywhere (in functions too), relative ones
    resolved against devkit.backends.<package>."""
    package = ["devkit", "backends", path.parent.name]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            names = [node.module] if node.module else [alias.name for alias in node.names]
            found.update(".".join(base + [name]) for name in names)
    return found


@pytest.mark.parametrize("path", sorted(p for name in NEUTRAL for p in (BACKENDS / name).glob("*.py")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_neutral_module_imports_no_plugin_or_its_library(path):
    offending = sorted(m for m in _imports(path) if m.split(".")[0] in LIBRARIES or m.startswith(PLUGINS))
    assert not offending, f"{path.name} imports {offending}"


def test_the_shared_code_imports_with_pyopencl_and_cupy_blocked():
    result = run_python("""
import sys
sys.modules["pyopencl"] = sys.modules["cupy"] = None  # importing either raises ImportError
from devkit.backends.kernels import layer
from devkit.backends.support import boundary, graph_capture, table
layer.family_modules()
print(*sorted(name for name in sys.modules if name.startswith(("devkit.backends.opencl", "devkit.backends.cuda"))))
""", timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [], "the shared code imported a plugin's package"
