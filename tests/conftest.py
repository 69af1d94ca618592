import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.abi import include_dir
from devkit.ops import dispatch

TEST_PLUGIN_SOURCE = Path(__file__).parent / "plugins" / "test_plugin.c"


def compile_plugin(out_dir: Path, name: str, defines=(), source: Path = TEST_PLUGIN_SOURCE,
                   libraries=(), link_args=()) -> Path:
    """Build a plugin library from C source, named as DEVKIT_PLUGIN_PATH expects."""
    path = out_dir / f"libdevkit_{name}.so"
    command = [os.environ.get("CC", "cc"), "-std=c11", "-Wall", "-Werror", "-Wno-unused-function", "-fPIC", "-shared",
               "-fvisibility=hidden", f"-I{include_dir()}", f'-DPLUGIN_NAME="{name}"',
               *(f"-D{define}" for define in defines), str(source), "-o", str(path),
               *(f"-l{library}" for library in libraries), *link_args]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return path


@pytest.fixture
def build_plugin(tmp_path):
    """build_plugin(name, *defines) -> path of a freshly compiled test plugin."""
    return lambda name, *defines: compile_plugin(tmp_path, name, defines)


def run_python(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (plugins read their configuration once per process)."""
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def device_ops(monkeypatch):
    """Counts the ops that reach the device (dispatch.run_op), by name."""
    counts = collections.Counter()
    run_op = dispatch.run_op

    def counting(name, *args, **kwargs):
        counts[name] += 1
        return run_op(name, *args, **kwargs)

    monkeypatch.setattr(dispatch, "run_op", counting)
    return counts
