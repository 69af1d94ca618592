"""Codegen conformance (devkit.h, "codegen", ABI 1.2): compile, look up,
launch and unload generated code, through the table and through
devkit.codegen, and fused plans against the unfused ones.

Every case is skipped, with the reason, on a plugin without the section.
Sources are written per dialect (SOURCES); the fused cases render theirs
from the ops' expression rules. Launch results are exact (a multiply-add
of small integers in float32); fused plans match the unfused plan within
float32 rounding of their reordered sums.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

import devkit
import devkit.onnx
from devkit import codegen
from devkit.abi import C, ffi

N = 1000

# y[i] += a * x[i] over the launch range, in each dialect devkit knows.
SOURCES = {
    "c": """
#include <stdint.h>
void axpy(void *const *args, int64_t begin, int64_t end) {
  const float *x = (const float *)args[0];
  float *y = (float *)args[1];
  float a = *(const float *)args[2];
  for (int64_t i = begin; i < end; i++) y[i] += a * x[i];
}
""",
    "opencl-c": """
__kernel void axpy(__global const float *xb, ulong xo, __global float *yb, ulong yo, float a) {
  __global const float *x = (__global const float *)((__global const char *)xb + xo);
  __global float *y = (__global float *)((__global char *)yb + yo);
  size_t i = get_global_id(0);
  y[i] += a * x[i];
}
""",
}
KINDS = ["tensor", "tensor", "float32"]
BROKEN = "int broken(void) { return undeclared_identifier_of_the_test; }\n"


@pytest.fixture
def dialect(plugin, dev):
    if not plugin.has_codegen:
        pytest.skip(reason=f"plugin '{plugin.name}' has no codegen section: its plans run unfused")
    name = codegen.dialect(dev)
    assert name in codegen.PRINTERS, f"unknown dialect {name!r}"
    if name not in SOURCES:
        pytest.skip(reason=f"the suite has no test source in dialect {name!r}")
    return name


@pytest.fixture
def axpy(dev, dialect):
    module = codegen.Module(dev, SOURCES[dialect])
    yield module, module.function("axpy", KINDS)
    del module


def _data(dev):
    x = np.arange(N, dtype=np.float32) % 17
    y = np.arange(N, dtype=np.float32) % 5
    return x, y, devkit.asarray(x, dev), devkit.asarray(y, dev)


def test_launch_computes_in_stream_order(dev, axpy):
    _, function = axpy
    x, y, dx, dy = _data(dev)
    with dev.create_stream() as stream:
        function.launch([dx, dy, 2.0], (N,), stream=stream)
        function.launch([dx, dy, 3.0], (N,), stream=stream)
        stream.synchronize()
    np.testing.assert_array_equal(dy.numpy(), y + 5 * x)


def test_launch_on_the_null_stream_is_complete_on_return(dev, axpy):
    _, function = axpy
    x, y, dx, dy = _data(dev)
    function.launch([dx, dy, -1.0], (N,))
    np.testing.assert_array_equal(dy.numpy(), y - x)


def test_an_empty_launch_range_runs_nothing(dev, axpy):
    _, function = axpy
    _, y, dx, dy = _data(dev)
    function.launch([dx, dy, 2.0], (0,))
    np.testing.assert_array_equal(dy.numpy(), y)


def test_compile_error_carries_the_compiler_log(dev, dialect):
    with pytest.raises(devkit.InvalidArgumentError, match="undeclared_identifier_of_the_test"):
        codegen.Module(dev, BROKEN)


def test_unknown_function_is_not_found(dev, axpy):
    module, _ = axpy
    with pytest.raises(devkit.NotFoundError, match="no_such_function"):
        module.function("no_such_function", KINDS)


class _Raw:
    """A launch through the table, with each part replaceable."""

    def __init__(self, dev, function):
        self.dev, self.function = dev, function
        _, _, self.dx, self.dy = _data(dev)
        self.keep: list = []
        self.args = codegen.launch_args(list(zip(KINDS, [self.dx, self.dy, 1.0])), self.keep)
        self.shape = codegen.launch_shape((N,))

    def launch(self, args=None, num_args=3, shape=None, handle=None) -> int:
        api = self.dev.plugin.api
        return api.codegen_launch(self.dev.index, self.function.handle if handle is None else handle,
                                  self.args if args is None else args, num_args,
                                  self.shape if shape is None else shape, ffi.NULL)


def test_bad_launches_are_refused_with_a_status(dev, axpy):
    _, function = axpy
    raw = _Raw(dev, function)
    assert raw.launch() == C.DK_OK
    assert raw.launch(num_args=2) == C.DK_INVALID_ARGUMENT  # wrong count
    assert "3" in dev.plugin.last_error_message()
    wrong_kind = codegen.launch_args(list(zip(["tensor", "tensor", "int64"], [raw.dx, raw.dy, 1])), raw.keep)
    assert raw.launch(args=wrong_kind) == C.DK_INVALID_ARGUMENT
    null_tensor = codegen.launch_args(list(zip(KINDS, [raw.dx, raw.dy, 1.0])), raw.keep)
    null_tensor[0].tensor.data = ffi.NULL
    assert raw.launch(args=null_tensor) == C.DK_INVALID_ARGUMENT
    assert "NULL" in dev.plugin.last_error_message()
    assert raw.launch(args=ffi.NULL) == C.DK_INVALID_ARGUMENT
    for ndim in (0, 4):
        bad = codegen.launch_shape((N,))
        bad.ndim = ndim
        assert raw.launch(shape=bad) == C.DK_INVALID_ARGUMENT, ndim
    assert raw.launch(shape=ffi.NULL) == C.DK_INVALID_ARGUMENT
    assert raw.launch(handle=ffi.cast("DK_Function", 0x5EED)) == C.DK_INVALID_ARGUMENT


def test_a_tensor_past_its_allocation_is_refused(dev, axpy):
    _, function = axpy
    raw = _Raw(dev, function)
    too_long = codegen.launch_args(list(zip(KINDS, [raw.dx, raw.dy, 1.0])), raw.keep)
    too_long[1].tensor.shape[0] = N * 4
    status = raw.launch(args=too_long)
    assert status in (C.DK_OUT_OF_RANGE, C.DK_INVALID_ARGUMENT)


def test_a_launch_of_an_unloaded_module_is_refused(dev, dialect):
    module = codegen.Module(dev, SOURCES[dialect])
    function = module.function("axpy", KINDS)
    raw = _Raw(dev, function)
    assert dev.plugin.api.codegen_unload(dev.index, module.handle) == C.DK_OK
    module.handle = None  # unloaded above
    assert raw.launch() == C.DK_INVALID_ARGUMENT
    assert dev.plugin.api.codegen_unload(dev.index, ffi.NULL) == C.DK_OK


def test_a_captured_launch_runs_at_every_graph_launch(dev, axpy):
    if not dev.plugin.has_graphs:
        pytest.skip(reason=f"plugin '{dev.plugin.name}' has no graph section")
    _, function = axpy
    x, y, dx, dy = _data(dev)
    with dev.create_stream() as stream:
        with stream.capture(mode="native") as graph:
            function.launch([dx, dy, 1.0], (N,), stream=stream)
        stream.synchronize()
        np.testing.assert_array_equal(dy.numpy(), y)  # recorded, not run
        graph.launch(stream)
        graph.launch(stream)
        stream.synchronize()
    np.testing.assert_array_equal(dy.numpy(), y + 2 * x)


def _plugin_spec(plugin) -> str:
    return plugin.location if plugin.source == "path" else plugin.name


def test_a_second_process_hits_the_disk_cache(plugin, dev, dialect, tmp_path):
    source = SOURCES[dialect] + f"\n/* {uuid.uuid4().hex} */\n"
    script = ("import sys, devkit; from devkit import codegen\n"
              f"dev = devkit.load_plugin({_plugin_spec(plugin)!r}).device(0)\n"
              "m = codegen.Module(dev, sys.stdin.read()); print(int(m.from_cache))\n")
    env = {**os.environ, "DEVKIT_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", script], input=source, capture_output=True, text=True,
                           env=env, timeout=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    assert [run.stdout.split()[-1] for run in runs] == ["0", "1"]
    assert any((tmp_path / "codegen").rglob("*")), "nothing was cached under DEVKIT_CACHE_DIR/codegen"


# -- fused plans ------------------------------------------------------------------------

def _norm_model(kind: str, rows: int = 8, width: int = 96):
    from devkit.bench import fusion as patterns

    return patterns.MODELS[kind](rows, width)


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "gelu", "swiglu"])
def test_fused_plan_matches_the_unfused_one(dev, dialect, kind):
    model, feed = _norm_model(kind)
    unfused = devkit.onnx.prepare(model, dev, fuse=False)
    fused = devkit.onnx.prepare(model, dev, fuse=True)
    want, got = unfused.run(feed), fused.run(feed)
    (report,) = fused.fusion.values()
    assert report["groups"] >= 1 and report["kernels_saved"] >= 2 and not report["fallbacks"], report
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


# -- generated math over edge inputs ------------------------------------------------------

def _edge_inputs() -> np.ndarray:
    """Every 4999th float32 bit pattern (both signs, every binade, the
    subnormals, infinities and NaNs) and every float32 in a window around
    the points where exp overflows (88.72), turns subnormal (-87.34), rounds
    to 0 (-103.97) or leaves the C dialect's checked fast path (86)."""
    points = np.array([86.0, 88.72, 87.34, 103.97, 0.0], np.float32)
    windows = [np.arange(b - 2048, b + 2048, dtype=np.int64)
               for b in np.concatenate([points, -points]).view(np.int32).astype(np.int64)]
    return np.concatenate([np.arange(0, 1 << 32, 4999, dtype=np.uint64).astype(np.uint32),
                           *(w.astype(np.uint32) for w in windows)]).view(np.float32)


_erf = np.frompyfunc(math.erf, 1, 1)


# The float32 math rules over the edge inputs, against float64 under each
# op's float32 tolerance. Sin, Cos and Atan go through double where the
# dialect has it (the float versions at hand measured up to 2 ulp off:
# glibc's vector sinf, cosf and atanf, PoCL's sin and cos), and Softplus
# as max(x, 0) + log1p(e^-|x|) (ln(1 + e^x) overflowed above x = 88.7).
_MATH_REFERENCES = {"Exp": np.exp, "Sigmoid": lambda x: 1 / (1 + np.exp(-x)), "Tanh": np.tanh, "Sqrt": np.sqrt,
                    "Erf": lambda x: _erf(x).astype(np.float64), "Log": np.log, "Atan": np.arctan, "Sin": np.sin,
                    "Cos": np.cos, "Softplus": lambda x: np.logaddexp(0, x)}


@pytest.mark.parametrize("op", ["Exp", "Sigmoid", "Tanh", "Sqrt", "Erf", "Log", "Atan", "Sin", "Cos", "Softplus"])
def test_a_generated_kernel_is_within_its_ops_tolerance_over_edge_inputs(dev, dialect, op):
    """A one-op group, rendered and compiled as the fusion pass does, against
    float64 under the op's own float32 tolerance (NaN for NaN, infinities
    and zeros exact): the C dialect's checked exp and its reruns included,
    over chunks that start and end inside its blocks."""
    from devkit.engine import fusion
    from devkit.ops import spec
    from devkit.ops.testing import compare

    x = _edge_inputs()
    tensor = codegen.TensorArg(x.shape, (1,), np.dtype(np.float32))
    group = codegen.Group(x.shape, [tensor], [codegen.GroupOp(op, (("in", 0),), {}, (tensor.dtype,), tensor.dtype,
                                                                x.shape)], [(0, tensor)])
    kernel = codegen.render(group, codegen.printer(dialect))
    function = codegen.compile_module(dev, kernel.source, fusion.OPTIONS[dialect]).function(kernel.name,
                                                                                            ["tensor"] * 2)
    out = devkit.asarray(np.zeros_like(x), dev)
    function.launch([devkit.asarray(x, dev), out], (kernel.items,), (1000,) if dialect == "c" else ())
    with np.errstate(all="ignore"):
        want = _MATH_REFERENCES[op](x.astype(np.float64))
    result = compare(out.numpy(), want, spec.get(op).tolerance_for(np.float32))
    assert result.ok, f"{op}: {result.message}"
