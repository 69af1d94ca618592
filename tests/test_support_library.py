"""The plugin-support library (devkit/abi/support) on its own: a plugin of
hooks and one kernel, built from devkit.abi's shipped sources, loads and
runs, reads its configuration from DEVKIT_<NAME>_* and exports nothing of
the library."""

import ctypes
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

import devkit.abi
from devkit.abi import include_dir, support_dir, support_sources
from tests.conftest import run_python

SOURCE = Path(__file__).parent / "plugins" / "support_minimal.c"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "libdevkit_tiny.so"
    subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-O1", "-Wall", "-Wextra", "-fPIC", "-shared", "-pthread",
                    f"-I{include_dir()}", f"-I{support_dir()}", str(SOURCE), *support_sources(), "-o", str(out),
                    "-lm"], check=True, capture_output=True, text=True)
    return out


def run(code: str, **env) -> list[str]:
    result = run_python(textwrap.dedent(code), env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_a_plugin_of_hooks_and_one_kernel_runs(tiny):
    lines = run(f"""
        import logging, numpy as np, devkit
        messages = []
        class Keep(logging.Handler):
            def emit(self, record):
                messages.append(record.getMessage())
        logging.getLogger("devkit").addHandler(Keep())
        logging.getLogger("devkit").setLevel(logging.INFO)
        plugin = devkit.load_plugin({str(tiny)!r})
        dev = plugin.device(0)
        x = devkit.asarray(np.array([-1.5, 2.0, -3.0, 4.0], np.float32), dev)
        with dev.create_stream() as stream:
            y = devkit.run_op("Relu", [x], stream=stream)[0]
            stream.synchronize()
        print(plugin.name, plugin.device_count, dev.properties.name, dev.properties.device_type)
        print(y.numpy().tolist())
        print([m for m in messages if "support library" in m])
    """)
    assert lines[0] == f"tiny 1 tiny device 0 {devkit.abi.C.DK_DEVICE_TYPE_EXT_DEV}"
    assert lines[1] == str([0.0, 2.0, 0.0, 4.0])
    assert "devkit tiny plugin 0.0.1 (support library 1.0): 1 device(s)" in lines[2]


def test_configuration_is_read_from_variables_named_after_the_plugin(tiny):
    code = f"""
        import devkit
        try:
            dev = devkit.load_plugin({str(tiny)!r}).device(0)
            print(dev.properties.total_memory, dev.mem_get_info())
        except devkit.PluginLoadError as e:
            print(e)
    """
    assert run(code, DEVKIT_TINY_MEMORY="1MiB") == ["1048576 (1048576, 1048576)"]
    refused, = run(code, DEVKIT_TINY_THREADS="0")
    assert 'DEVKIT_TINY_THREADS="0" is invalid: expected an integer in [1, 256]' in refused
    assert run(code, DEVKIT_CPU_MEMORY="1MiB") == [f"{1 << 30} ({1 << 30}, {1 << 30})"]


def test_the_library_stays_hidden_inside_the_plugin(tiny):
    library = ctypes.CDLL(str(tiny))
    assert library.DK_PluginInit
    for symbol in ("dks_plugin_init", "dks_set_error", "dks_parallel_for", "dks_register_kernels"):
        with pytest.raises(AttributeError):
            getattr(library, symbol)
