"""The opencl plugin beyond the conformance suite: device selection, the
program cache across processes, error paths. Skipped without pyopencl or an
OpenCL device (scripts/install-opencl.sh installs PoCL)."""

import json
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


def test_second_process_compiles_nothing_with_a_warm_cache(tmp_path):
    """The first process fills the on-disk cache (the driver's, or pyopencl's
    under devkit's directory); a second one with the same cache adds nothing
    to it, so it compiled nothing."""
    _plugin()
    code = """
        import numpy as np, devkit
        from devkit.backends.opencl.launch import programs
        dev = devkit.load_plugin("opencl").device(0)
        x = devkit.asarray(np.arange(6, dtype=np.float32).reshape(2, 3), dev)
        assert np.array_equal(devkit.ops.ReduceSum(devkit.ops.Neg(x), keepdims=0).numpy(), np.float32(-15))
        print(programs.builds)
    """

    def cache_files():  # PoCL leaves an empty temporary file at each start: not a compile
        return {p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size}

    env = {"XDG_CACHE_HOME": str(tmp_path), "POCL_CACHE_DIR": str(tmp_path / "pocl" / "kcache")}
    first = _run(code, **env)
    assert first.returncode == 0, first.stderr
    after_first = cache_files()
    assert after_first, "the first process left nothing on disk"
    second = _run(code, **env)
    assert second.returncode == 0, second.stderr
    assert first.stdout.split() == second.stdout.split() == ["2"], "one program each for Neg and ReduceSum"
    assert cache_files() == after_first, "the second process compiled again"


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
        tensor.device = {"device_type": C.DK_DEVICE_TYPE_OPENCL, "device_id": 0}
        tensor.ndim = 1
        tensor.shape = shape
        tensor.dtype = {"code": C.DK_DTYPE_CODE_FLOAT, "bits": 32, "lanes": 1}
    call = ffi.new("DK_KernelCall *", {"struct_size": ffi.sizeof("DK_KernelCall"), "inputs": bogus,
                                       "num_inputs": 2, "outputs": bogus, "num_outputs": 1,
                                       "user_data": entry.user_data})
    assert entry.fn(call) == C.DK_INVALID_ARGUMENT
    assert "not a live allocation" in plugin.last_error_message()


def test_claims_the_whole_spec_less_justified_exclusions():
    """Every (op, dtype) of the spec has a kernel, or is in a family module's
    UNCLAIMED with its reason; float64 is left out only without fp64."""
    from devkit import ops
    from devkit.backends.kernels.layer import family_modules
    from devkit.ops.spec import dtype_name

    plugin = _plugin()
    fp64 = all(d.properties.flags & C.DK_DEVICE_FP64 for d in plugin.devices())
    unclaimed = {pair: reason for module in family_modules() for pair, reason in module.UNCLAIMED.items()}
    assert all(len(reason) > 20 for reason in unclaimed.values()), "each exclusion states its reason"
    missing, claimed_anyway = [], []
    for spec in ops.all_specs():
        for dtype in spec.dtypes:
            name = dtype_name(dtype)
            has_kernel = plugin.kernel_entry(spec.name, dtype) is not None
            excused = (spec.name, name) in unclaimed or (name == "float64" and not fp64)
            if not has_kernel and not excused:
                missing.append(f"{spec.name}[{name}]")
            if has_kernel and (spec.name, name) in unclaimed:
                claimed_anyway.append(f"{spec.name}[{name}]")
    assert not missing, f"{len(missing)} (op, dtype) pairs lack a kernel: {', '.join(missing[:40])}"
    assert not claimed_anyway, f"listed as unclaimed but claimed: {', '.join(claimed_anyway)}"


def test_bench_compares_with_the_peers_on_the_same_device(tmp_path):
    """devkit-bench opencl: the three benchmarks, devkit's results checked
    against float64, each peer measured or reported as not installed, and
    both start-up times."""
    _plugin()
    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, "-m", "devkit.bench", "opencl", "--repeat", "1",
                             "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    rows = {row["benchmark"]: row for row in report["ops"]}
    assert set(rows) == {"Add 16Mi f32", "ReduceSum 16Mi f32 (all)", "MatMul 1024x1024 f32"}
    assert rows["Add 16Mi f32"]["max_abs_error_vs_float64"] == 0  # one float32 rounding of exact inputs
    assert rows["ReduceSum 16Mi f32 (all)"]["max_abs_error_vs_float64"] < 1e-2
    assert rows["MatMul 1024x1024 f32"]["max_abs_error_vs_float64"] < 1e-3
    for row in rows.values():
        if row["peer_ms"] is not None:
            assert row["peer_over_devkit"] == pytest.approx(row["peer_ms"] / row["devkit_ms"])
        else:
            assert row["peer_over_devkit"] is None
    assert report["startup_s"]["cold"] > 0 and report["startup_s"]["warm"] > 0
