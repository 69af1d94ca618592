"""The opencl plugin beyond the conformance suite: device selection, the
program cache across processes, error paths. Skipped without pyopencl or an
OpenCL device (scripts/install-opencl.sh installs PoCL)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("pyopencl", reason="pyopencl is not installed (scripts/install-opencl.sh)")

import devkit
from devkit.abi import C, ffi


def _plugin():
    try:
        return devkit.load_plugin("opencl")
    except devkit.PluginLoadError as exc:
        pytest.skip(reason=f"no usable OpenCL device: {exc}")


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, check=False,
                          text=True, timeout=300, env={**os.environ, **env})


def test_device_selection_by_index_and_name():
    plugin = _plugin()
    name = plugin.device(0).properties.name
    for selection in ("0:0", name[:8]):
        result = _run("""
            import devkit
            p = devkit.load_plugin("opencl")
            print(p.device_count, p.device(0).properties.name)
        """, DEVKIT_OPENCL_DEVICES=selection)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split(maxsplit=1)[1].strip() == name


def test_device_selection_that_matches_nothing_refuses_to_load():
    result = _run("""
        import devkit
        try:
            devkit.load_plugin("opencl")
        except devkit.PluginLoadError as exc:
            print(exc)
    """, DEVKIT_OPENCL_DEVICES="no-such-device-xyz")
    assert "DEVKIT_OPENCL_DEVICES" in result.stdout and "INVALID_ARGUMENT" in result.stdout, \
        result.stdout + result.stderr


def test_program_cache_hit_in_a_second_process(tmp_path):
    _plugin()
    code = """
        import numpy as np, devkit
        from devkit.backends.opencl.kernels import programs
        dev = devkit.load_plugin("opencl").device(0)
        x = devkit.asarray(np.arange(5, dtype=np.float32), dev)
        assert np.array_equal(devkit.run_op("Neg", [x])[0].numpy(), -np.arange(5, dtype=np.float32))
        print(programs.compiles, programs.disk_hits)
    """
    first = _run(code, XDG_CACHE_HOME=str(tmp_path))
    second = _run(code, XDG_CACHE_HOME=str(tmp_path))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.split() == ["1", "0"]
    assert second.stdout.split() == ["0", "1"]
    assert list((tmp_path / "devkit" / "opencl").glob("*.bin"))


def test_corrupt_cache_entry_is_rebuilt(tmp_path):
    _plugin()
    code = """
        import numpy as np, devkit
        from devkit.backends.opencl.kernels import programs
        dev = devkit.load_plugin("opencl").device(0)
        x = devkit.asarray(np.ones(3, np.float32), dev)
        devkit.run_op("Abs", [x])[0].numpy()
        print(programs.compiles)
    """
    assert _run(code, XDG_CACHE_HOME=str(tmp_path)).returncode == 0
    for entry in (tmp_path / "devkit" / "opencl").glob("*.bin"):
        entry.write_bytes(b"not a binary")
    result = _run(code, XDG_CACHE_HOME=str(tmp_path))
    assert result.returncode == 0 and result.stdout.split() == ["1"], result.stderr


def test_flags_describe_the_device():
    props = _plugin().device(0).properties
    assert props.device_type == C.DK_DEVICE_TYPE_OPENCL
    assert props.flags & C.DK_DEVICE_FP16 and props.flags & C.DK_DEVICE_BF16
    assert not props.flags & C.DK_DEVICE_HOST_POINTER_HANDLES, "handles are ids, not addresses"


def test_float64_claimed_only_with_fp64():
    plugin = _plugin()
    fp64 = all(d.properties.flags & C.DK_DEVICE_FP64 for d in plugin.devices())
    claims_f64 = any(code == C.DK_DTYPE_CODE_FLOAT and bits == 64 for _, code, bits, _ in plugin.kernels)
    assert claims_f64 == fp64


def test_callback_waiting_on_its_own_stream_is_refused():
    dev = _plugin().device(0)
    statuses = []
    with dev.create_stream() as stream:
        handle = stream.handle
        stream.add_callback(lambda: statuses.append(
            (dev.plugin.api.stream_synchronize(dev.index, handle),
             dev.plugin.api.device_synchronize(dev.index),
             dev.plugin.api.stream_destroy(dev.index, handle))))
        stream.synchronize()
    assert statuses == [(C.DK_FAILED_PRECONDITION,) * 3]


def test_kernel_with_bad_arguments_reports_a_status():
    plugin = _plugin()
    entry = plugin.kernel_entry("Add", np.dtype(np.float32))
    shape = ffi.new("int64_t[1]", [4])
    bogus = ffi.new("DK_Tensor[2]")
    for tensor in bogus:
        tensor.data = ffi.cast("void *", 0xDEAD0)
        tensor.ndim = 1
        tensor.shape = shape
        tensor.dtype = {"code": C.DK_DTYPE_CODE_FLOAT, "bits": 32, "lanes": 1}
    call = ffi.new("DK_KernelCall *", {"struct_size": ffi.sizeof("DK_KernelCall"), "inputs": bogus,
                                       "num_inputs": 2, "outputs": bogus, "num_outputs": 1})
    assert entry.fn(call) == C.DK_INVALID_ARGUMENT
    assert "not a live allocation" in plugin.last_error_message()
