"""Op conformance: every op x dtype x case of the spec, on the plugin under test.

Each case runs the plugin's kernel through devkit.run_op and compares every
output with the spec's float64 NumPy reference under the spec's tolerance for
the dtype (see docs/conformance.md for the table). The measured error is
recorded for the report. The first case of each (op, dtype) also runs with
every device input made non-contiguous (``-strided``), which exercises the
kernel's stride handling or the host's compaction for compact-only kernels.

A (op, dtype) pair runs as devkit.ops.explain says: the plugin's kernel, or
the op's decomposition into ops the plugin has (held to the decomposition's
tolerance where the spec gives one). A pair that resolves to neither is
skipped with that reason; the coverage test below compares the table with
the spec.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

import devkit
from devkit import ops
from devkit.ops import testing
from devkit.ops.dispatch import reference_arguments
from devkit.ops.spec import dtype_name


@functools.lru_cache(maxsize=8)
def cases_of(op: str, dtype_label: str) -> dict:
    spec = ops.get(op)
    dtype = next(d for d in spec.dtypes if dtype_name(d) == dtype_label)
    cases = spec.cases(dtype, testing.rng_for(op, dtype_label))
    return {case.name: case for case in cases}


def _params():
    params = []
    for spec in ops.all_specs():
        for dtype in spec.dtypes:
            label = dtype_name(dtype)
            names = list(cases_of(spec.name, label))
            cases_of.cache_clear()  # collection needs the names only
            for i, name in enumerate(names):
                params.append(pytest.param(spec.name, label, name, False, id=f"{spec.name}-{label}-{name}"))
                if i == 0:
                    params.append(pytest.param(spec.name, label, name, True,
                                               id=f"{spec.name}-{label}-{name}-strided"))
    return params


def _strided_copy(dev: devkit.Device, host: np.ndarray) -> devkit.Array:
    """``host`` on the device as a view with every other element of its last dim."""
    if host.ndim == 0 or host.size == 0:
        return devkit.asarray(host, dev)
    wide = np.zeros(host.shape[:-1] + (2 * host.shape[-1],), host.dtype)
    wide[..., ::2] = host
    view = devkit.asarray(wide, dev)[..., ::2]
    assert not view.is_contiguous
    return view


def _resolution(dev, op, dtype) -> str:
    """native, decomposed or unsupported (fallback is off in the suite)."""
    with ops.cpu_fallback(False):
        return ops.explain(op, dtype, dev).how


@pytest.mark.parametrize("op, dtype, case_name, strided", _params())
def test_op(dev, op, dtype, case_name, strided, record_property):
    spec = ops.get(op)
    case = cases_of(op, dtype)[case_name]
    key_dtype = next(d for d in spec.dtypes if dtype_name(d) == dtype)
    how = _resolution(dev, op, key_dtype)
    if how not in ("native", "decomposed"):
        pytest.skip(reason=f"plugin '{dev.plugin.name}' has no {op} kernel for {dtype} (not claimed) "
                           f"and no decomposition into its kernels")
    host = set(spec.host_inputs)
    declared = [spec.inputs[min(i, len(spec.inputs) - 1)] for i in range(len(case.inputs))]
    inputs = []
    for decl, value in zip(declared, case.inputs):
        if value is None or decl.name in host:
            inputs.append(value)
        else:
            array = np.asarray(value)
            inputs.append(_strided_copy(dev, array) if strided else devkit.asarray(array, dev))
    outputs = devkit.run_op(op, inputs, case.attrs)

    ref_inputs, attrs = reference_arguments(spec, case.inputs, case.attrs)
    with np.errstate(all="ignore"):
        references = spec.reference(ref_inputs, attrs)
    tolerance = case.tolerance or spec.tolerance_for(key_dtype, decomposed=how == "decomposed")
    record_property("op", op)
    record_property("dtype", dtype)
    record_property("resolution", how)
    record_property("tolerance", str(tolerance))
    compared = range(len(spec.outputs)) if case.compare is None else case.compare
    worst_ulp = worst_abs = 0.0
    failures = []
    for i in compared:
        result = testing.compare(outputs[i].numpy(), np.asarray(references[i]), tolerance)
        worst_ulp, worst_abs = max(worst_ulp, result.max_ulp), max(worst_abs, result.max_abs)
        if not result.ok:
            failures.append(f"output {spec.outputs[i]}: {result.message}")
    record_property("measured_error", worst_ulp if tolerance.ulp else worst_abs)
    record_property("max_abs_error", worst_abs)
    record_property("max_ulp_error", worst_ulp)
    assert not failures, "; ".join(failures)


def test_kernel_table_matches_spec(plugin, record_property):
    """The coverage manifest: every kernel the plugin claims is an (op, dtype)
    of the spec; the claimed share of the spec is recorded."""
    claimed = {(op, code, bits) for op, code, bits, _flags in plugin.kernels}
    wanted = {}
    for spec in ops.all_specs():
        for dtype in spec.dtypes:
            code, bits = devkit.dtypes.code_bits(dtype)
            wanted[(spec.name, code, bits)] = f"{spec.name}[{dtype_name(dtype)}]"
    unknown = sorted(f"{op}(code {code}, bits {bits})" for op, code, bits in claimed - wanted.keys())
    record_property("coverage", f"{len(claimed & wanted.keys())}/{len(wanted)}")
    assert not unknown, f"kernels outside the op spec: {', '.join(unknown)}"


def test_cpu_plugin_covers_the_whole_spec(plugin):
    """The cpu reference plugin claims every (op, dtype) of the spec; with
    DEVKIT_CPU_KERNELS=primitives it claims exactly the primitive set, and
    every other pair runs decomposed into it."""
    if plugin.name != "cpu":
        pytest.skip(reason="the full-coverage requirement is the cpu reference plugin's")
    if os.environ.get("DEVKIT_CPU_KERNELS") == "primitives":
        assert {op for op, *_ in plugin.kernels} == set(ops.PRIMITIVES)
        dev = plugin.device(0)
        missing = [f"{spec.name}[{dtype_name(d)}]" for spec in ops.all_specs() for d in spec.dtypes
                   if _resolution(dev, spec.name, d) not in ("native", "decomposed")]
        assert not missing, f"{len(missing)} (op, dtype) pairs do not decompose: {', '.join(missing[:40])}"
        return
    missing = [f"{spec.name}[{dtype_name(d)}]" for spec in ops.all_specs() for d in spec.dtypes
               if plugin.kernel_entry(spec.name, d) is None]
    assert not missing, f"{len(missing)} (op, dtype) pairs lack a kernel: {', '.join(missing[:40])}"


def _optional_output_params():
    return [pytest.param(spec.name, dtype_name(dtype), id=f"{spec.name}-{dtype_name(dtype)}")
            for spec in ops.all_specs() if spec.optional_outputs for dtype in spec.dtypes]


@pytest.mark.parametrize("op, dtype", _optional_output_params())
def test_optional_outputs_left_out(dev, op, dtype):
    """A call that wants only the required outputs (MaxPool without Indices)
    gets only those, bit-equal to the same outputs of the full call."""
    spec = ops.get(op)
    required = len(spec.outputs) - spec.optional_outputs
    with ops.cpu_fallback(False):
        if ops.explain(op, dtype, dev).how not in ("native", "decomposed"):
            pytest.skip(reason=f"{op}[{dtype}] does not run on {dev}")
        for name, case in cases_of(op, dtype).items():
            inputs = [None if x is None else devkit.asarray(x, dev) for x in case.inputs]
            full = devkit.run_op(op, inputs, case.attrs)
            wanted = devkit.run_op(op, inputs, case.attrs, outputs=required)
            assert len(full) == len(spec.outputs) and len(wanted) == required, name
            for got, expected in zip(wanted, full):  # bit-equal: NaNs too, of any float dtype
                got, expected = got.numpy(), expected.numpy()
                assert got.shape == expected.shape and got.tobytes() == expected.tobytes(), f"{op} case {name}"
