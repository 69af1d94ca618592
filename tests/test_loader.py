"""Plugin discovery (path, DEVKIT_PLUGIN_PATH, entry points, built-ins) and version negotiation."""

import os
import subprocess
import sys
import textwrap

import pytest

import devkit
from devkit.plugin import CODEGEN_FUNCTIONS, GRAPH_FUNCTIONS, HOST_REGISTRATION_FUNCTIONS, REQUIRED_FUNCTIONS
from tests.conftest import compile_plugin, run_python


def test_load_by_name_twice_returns_the_same_object():
    assert devkit.load_plugin("cpu") is devkit.load_plugin("cpu")


def test_load_by_path_returns_the_same_plugin_as_by_name():
    cpu = devkit.load_plugin("cpu")
    assert devkit.load_plugin(cpu.location) is cpu
    assert cpu.name == "cpu" and cpu.abi_version == (devkit.ABI_MAJOR, devkit.ABI_MINOR)
    assert cpu.source == "built-in" and cpu.version


def test_device_name_parsing():
    assert devkit.device("cpu:1") is devkit.load_plugin("cpu").device(1)
    assert devkit.device("cpu") is devkit.device("cpu:0")
    assert str(devkit.device("cpu:1")) == "cpu:1"
    with pytest.raises(IndexError, match="device index 9 out of range"):
        devkit.device("cpu:9")


def test_unknown_name_lists_where_it_looked():
    with pytest.raises(devkit.PluginLoadError) as info:
        devkit.load_plugin("no-such-accelerator")
    message = str(info.value)
    for place in ("DEVKIT_PLUGIN_PATH", "devkit.plugins", "built-in", "libdevkit_no-such-accelerator.so"):
        assert place in message


def test_missing_path():
    with pytest.raises(devkit.PluginLoadError, match="does not exist"):
        devkit.load_plugin("/nonexistent/libdevkit_gone.so")


def test_builtin_cuda_without_a_gpu_is_refused_with_the_reason():
    from devkit.backends.cuda.runtime import unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        pytest.skip("this machine has a usable CUDA device")
    with pytest.raises(devkit.PluginLoadError, match="UNAVAILABLE") as caught:
        devkit.load_plugin("cuda")
    assert reason in str(caught.value)


def test_plugin_path_discovery(tmp_path, monkeypatch):
    compile_plugin(tmp_path, "pathplug")
    monkeypatch.setenv("DEVKIT_PLUGIN_PATH", f"/nonexistent:{tmp_path}")
    plugin = devkit.load_plugin("pathplug")
    assert (plugin.name, plugin.source, plugin.version) == ("pathplug", "DEVKIT_PLUGIN_PATH", "9.9.9")
    listed = {d.name: d for d in devkit.list_plugins()}
    assert listed["pathplug"].loads and listed["pathplug"].abi_version == (devkit.ABI_MAJOR, devkit.ABI_MINOR)
    assert listed["pathplug"].device_count == 1


def test_list_plugins_reports_builtins():
    listed = {d.name: d for d in devkit.list_plugins()}
    cpu = listed["cpu"]
    assert cpu.loads and cpu.source == "built-in" and cpu.error is None
    assert cpu.abi_version == (devkit.ABI_MAJOR, devkit.ABI_MINOR) and cpu.device_count >= 1
    # Whether opencl loads depends on the machine (pyopencl and an OpenCL driver); it is always listed.
    assert listed["opencl"].source == "built-in"
    assert listed["opencl"].loads or "docs/opencl.md" in listed["opencl"].error


def _fake_distribution(site, entry_points: str, module: str):
    dist = site / "vendor_accel-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vendor-accel\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[devkit.plugins]\n{entry_points}\n")
    (site / "vendor_accel.py").write_text(textwrap.dedent(module))


def test_entry_point_discovery(tmp_path):
    library = compile_plugin(tmp_path, "vendoraccel")
    site = tmp_path / "site"
    _fake_distribution(site, "accel = vendor_accel:library_path\n"
                             "accelobj = vendor_accel:plugin_object\n"
                             "broken = vendor_accel:raises\n"
                             "garbage = vendor_accel:garbage", f"""
        from devkit.abi import ffi
        def library_path():
            return {str(library)!r}
        class _PythonPlugin:
            def __init__(self):
                self._lib = ffi.dlopen({str(library)!r})
                self.dk_plugin_init = ffi.cast("DK_PluginInitFn", self._lib.DK_PluginInit)
        def plugin_object():
            return _PythonPlugin()
        def raises():
            raise RuntimeError("vendor driver missing")
        def garbage():
            return 42
    """)
    result = run_python(textwrap.dedent("""
        import devkit
        p = devkit.load_plugin("accel")
        print(p.name, p.source)
        q = devkit.load_plugin("accelobj")
        print(q.name, q.source, q.device_count)
        for name in ("broken", "garbage"):
            try:
                devkit.load_plugin(name)
            except devkit.PluginLoadError as e:
                print("ERR", e)
        listed = {d.name: d for d in devkit.list_plugins()}
        print("LIST", listed["accel"].loads, listed["broken"].loads)
    """), env={"PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "vendoraccel entry point"
    assert lines[1] == "vendoraccel entry point 1"
    assert "vendor driver missing" in lines[2] and "broken = vendor_accel:raises" in lines[2]
    assert "neither a library path nor an object" in lines[3]
    assert lines[4] == "LIST True False"


def test_older_minor_plugin_loads_and_its_missing_functions_are_absent(build_plugin):
    plugin = devkit.load_plugin(build_plugin("oldminor", "OLDER_MINOR"))
    assert all(plugin.has(fn) for fn in REQUIRED_FUNCTIONS)
    # copy_p2p's bytes are non-NULL in the library but lie past struct_size.
    assert not plugin.has("copy_p2p") and not plugin.has_collectives
    assert plugin.kernels == []


def test_abi_1_0_plugin_loads_without_the_graph_section(build_plugin):
    plugin = devkit.load_plugin(build_plugin("abi10", "ABI_1_0"))
    assert plugin.abi_version == (1, 0)
    # graph_begin_capture's bytes are non-NULL in the library but lie past struct_size.
    assert not plugin.has_graphs and not any(plugin.has(fn) for fn in GRAPH_FUNCTIONS)
    assert all(plugin.has(fn) for fn in REQUIRED_FUNCTIONS)


def test_abi_1_1_plugin_loads_without_the_codegen_section(build_plugin):
    plugin = devkit.load_plugin(build_plugin("abi11", "ABI_1_1"))
    assert plugin.abi_version == (1, 1)
    # codegen_dialect's bytes are non-NULL in the library but lie past struct_size.
    assert not plugin.has_codegen and not any(plugin.has(fn) for fn in CODEGEN_FUNCTIONS)
    assert all(plugin.has(fn) for fn in REQUIRED_FUNCTIONS)


def test_abi_1_2_plugin_loads_without_host_registration(build_plugin):
    plugin = devkit.load_plugin(build_plugin("abi12", "ABI_1_2"))
    assert plugin.abi_version == (1, 2)
    # mem_register_host's bytes are non-NULL in the library but lie past struct_size.
    assert not plugin.has_host_registration
    assert not any(plugin.has(fn) for fn in HOST_REGISTRATION_FUNCTIONS)
    assert all(plugin.has(fn) for fn in REQUIRED_FUNCTIONS)


def test_newer_minor_plugin_loads(build_plugin):
    plugin = devkit.load_plugin(build_plugin("newminor", "NEWER_MINOR"))
    assert plugin.abi_version == (devkit.ABI_MAJOR, devkit.ABI_MINOR + 7)
    assert plugin.device(0).properties.name == "loader test device"


def test_unimplemented_function_raises_with_the_plugin_message(build_plugin):
    plugin = devkit.load_plugin(build_plugin("stubby"))
    with pytest.raises(devkit.UnimplementedError, match="stubby.mem_alloc: not implemented by the loader"):
        plugin.device(0).alloc(16)


def test_plugin_log_lines_reach_python_logging():
    result = run_python(
        "import logging; logging.basicConfig(level=logging.DEBUG, format='%(name)s|%(message)s')\n"
        "import devkit; devkit.load_plugin('cpu')")
    assert result.returncode == 0, result.stderr
    assert any(line.startswith("devkit.plugin.cpu|") for line in result.stderr.splitlines()), result.stderr


# -- lookup rules: specs are names, built-in names are reserved, paths are absolute ------------


def test_a_device_spec_never_loads_a_path(tmp_path, monkeypatch):
    # A library whose constructor leaves a mark: loading it at all would run it.
    source = tmp_path / "marker.c"
    source.write_text('#include <stdio.h>\n'
                      '__attribute__((constructor)) static void mark(void) { fclose(fopen("ran", "w")); }\n')
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(tmp_path / "x.so")], check=True)
    monkeypatch.chdir(tmp_path)
    for spec in ("x.so:0", "./x.so", f"{tmp_path}/x.so:0"):
        with pytest.raises(ValueError, match=r"names a path; a device spec is 'name:index'.*"
                                             r"devkit\.load_plugin\("):
            devkit.device(spec)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("spec, error, message", [
    ("cpu:-1", IndexError, r"device index -1 out of range: plugin 'cpu' has \d+ device"),
    ("cpu:one", ValueError, r"device spec 'cpu:one': the index 'one' is not an integer"),
    ("cpu:+1", ValueError, r"the index '\+1' is not an integer"),
    (":0", ValueError, r"device spec ':0' has no plugin name"),
])
def test_device_spec_errors_name_the_problem(spec, error, message):
    with pytest.raises(error, match=message):
        devkit.device(spec)


def test_plugin_path_never_shadows_a_builtin_name(tmp_path):
    impostor = compile_plugin(tmp_path, "cpu")  # reports the name "cpu" too
    result = run_python(textwrap.dedent("""
        import warnings
        import devkit
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cpu = devkit.load_plugin("cpu")
        print(cpu.source, cpu.location)
        for warning in caught:
            print("WARN", warning.message)
        print("LIST", [(d.source, d.location) for d in devkit.list_plugins() if d.name == "cpu"])
    """), env={"DEVKIT_PLUGIN_PATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("built-in ") and str(impostor) not in lines[0]
    warned = [line for line in lines if line.startswith("WARN")]
    assert warned == [f"WARN devkit: {impostor} is not loaded: 'cpu' is a built-in plugin name, which always "
                      f"means the built-in backend; load that plugin by its library path "
                      f"(devkit.load_plugin(path)) or give it another name"]
    assert lines[-1].startswith("LIST [('built-in', ") and str(impostor) not in lines[-1]


def test_an_entry_point_never_shadows_a_builtin_name(tmp_path):
    library = compile_plugin(tmp_path, "opencl")
    site = tmp_path / "site"
    _fake_distribution(site, "opencl = vendor_accel:library_path", f"""
        def library_path():
            return {str(library)!r}
    """)
    result = run_python(textwrap.dedent("""
        import warnings
        import devkit
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                plugin = devkit.load_plugin("opencl")
                print(plugin.source, plugin.location)
            except devkit.PluginLoadError as exc:  # no pyopencl or no driver: still the built-in
                print("built-in refused:", "docs/opencl.md" in str(exc))
        print("WARN", *(w.message for w in caught))
    """), env={"PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stderr
    first, warned = result.stdout.splitlines()
    assert first in ("built-in devkit.backends.opencl", "built-in refused: True")
    assert warned.startswith("WARN devkit: entry point opencl = vendor_accel:library_path is not loaded: "
                             "'opencl' is a built-in plugin name")


def test_relative_plugin_path_entries_are_ignored_with_a_warning(tmp_path, monkeypatch):
    compile_plugin(tmp_path, "relplug")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DEVKIT_PLUGIN_PATH", f".{os.pathsep}plugins")
    with pytest.warns(UserWarning) as caught, pytest.raises(devkit.PluginLoadError, match="no plugin named 'relplug'"):
        devkit.load_plugin("relplug")
    messages = {str(w.message) for w in caught}
    for entry in (".", "plugins"):
        assert (f"devkit: DEVKIT_PLUGIN_PATH entry '{entry}' is ignored: it is not an absolute path, and a "
                f"relative one would depend on the current directory") in messages


def test_two_plugins_named_cpu_are_told_apart_by_location(tmp_path):
    result = run_python(textwrap.dedent(f"""
        import numpy as np
        import devkit
        from devkit.backends.cpu import build
        other = devkit.load_plugin(build.build({str(tmp_path)!r}, kernels=[], name="cpu"))
        builtin = devkit.load_plugin("cpu")
        assert other is not builtin and other.name == builtin.name == "cpu"
        x = devkit.asarray(np.ones(2, np.float32), "cpu:0")
        y = devkit.asarray(np.ones(2, np.float32), other.device(0))
        try:
            devkit.ops.Add(x, y)
        except ValueError as exc:
            print(exc)
        print(builtin.location)
        print(other.location)
    """))
    assert result.returncode == 0, result.stderr
    message, builtin, other = result.stdout.splitlines()
    assert message == (f"Add: input 'B' is on cpu:0 (plugin at {other}), but the op runs on "
                       f"cpu:0 (plugin at {builtin}) (where its first input is)")



def test_openblas_resolves_for_a_library_without_its_rpath(tmp_path):
    """A venv with --system-site-packages has scipy-openblas32 only in its base,
    where none of the cpu plugin's rpaths point: the loader retries with
    OpenBLAS loaded from the importable package, so a library that links it
    without an rpath opens through the loader (and not through a bare dlopen)."""
    import scipy_openblas32

    source = tmp_path / "uses_blas.c"
    source.write_text("void scipy_cblas_sgemm(void);\n"
                      "void *uses_blas(void) { return (void *)scipy_cblas_sgemm; }\n")
    library = tmp_path / "libuses_blas.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(library),
                    f"-L{scipy_openblas32.get_lib_dir()}", f"-l{scipy_openblas32.get_library()}"],
                   check=True)
    script = textwrap.dedent(f"""
        import ctypes, sys
        import devkit
        try:
            if sys.argv[1] == "loader":
                devkit.load_plugin({str(library)!r})
            else:
                ctypes.CDLL({str(library)!r})
            print("opened")
        except (OSError, devkit.PluginLoadError) as exc:
            print("refused", exc)
        """)
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    runs = {mode: subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True,
                                 check=True, env=env).stdout for mode in ("loader", "bare")}
    # The loader opened it (OpenBLAS resolved), then found it is no plugin.
    assert runs["loader"].startswith("refused") and "does not export DK_PluginInit" in runs["loader"]
    assert runs["bare"].startswith("refused") and "libscipy_openblas" in runs["bare"]
