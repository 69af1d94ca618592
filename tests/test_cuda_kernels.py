"""The cuda plugin's kernel table, checked without a GPU: what it registers
(against the opencl plugin, whose families it runs), the programs it can
build (against the nvcc check's), and its pure-Python launch planning --
OpenCL ND-ranges as CUDA grids (plan_launch, on every launch the families
make on PoCL) and MatMul/Gemm as cuBLAS calls (blas.plan, on the families'
own product planning, emulated in NumPy)."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import numpy as np
import pytest

from devkit.abi import C, ffi
from devkit.backends.cuda import blas, dialect, sources
from devkit.backends.cuda import kernels as kernels_module
from devkit.backends.cuda.kernels import LaunchPlan, plan_launch
from devkit.backends.cuda.runtime import unavailable_reason
from devkit.backends.cuda.table import device_table
from devkit.backends.kernels import linalg
from devkit.backends.kernels.layer import DeviceLimits, Local
from devkit.backends.kernels.linalg_gemm import _GPU_TILES, tiles
from devkit.backends.support.boundary import PluginError

REASON = unavailable_reason()
# An H200's cudaDeviceProp, as runtime.limits_of reads it.
H200 = DeviceLimits(max_group_size=1024, max_item_sizes=(1024, 1024, 64), local_mem_size=232448,
                    compute_units=132, is_cpu=False, exact_divide_sqrt=True)


@pytest.fixture(scope="module")
def cuda_table():
    return device_table.build_kernel_table([sources._CallStandIn()])


def _opencl_plugin():
    pytest.importorskip("pyopencl", reason="pyopencl is not installed (scripts/install-opencl.sh)")
    import devkit

    try:
        return devkit.load_plugin("opencl")
    except devkit.PluginLoadError as exc:
        pytest.skip(reason=f"no usable OpenCL device: {exc}")


# -- what the table registers and builds ---------------------------------------------------


def test_cuda_table_registers_every_kernel_the_opencl_plugin_does(cuda_table):
    plugin = _opencl_plugin()
    opencl = {(op, code, bits) for op, code, bits, _ in plugin.kernels}
    cuda = {(op, key & 0xFF, (key >> 8) & 0xFF) for op, key, _ in cuda_table.runs}
    assert len(cuda) == len(cuda_table.entries) == len(cuda_table.runs)
    assert len(opencl) == len(plugin.kernels)
    fp64 = all(d.properties.flags & C.DK_DEVICE_FP64 for d in plugin.devices())
    float64 = {entry for entry in cuda if entry[1:] == (C.DK_DTYPE_FLOAT64 & 0xFF, 64)}
    # Every CUDA device has fp64: the cuda table has float64 where the opencl one may not.
    assert cuda - opencl == (set() if fp64 else float64)
    assert opencl <= cuda


def _reached_builders(run) -> set[str]:
    reached: set = set()
    sources._reached(run, reached)
    return {f"{fn.__module__.rsplit('.', 1)[1]}.{fn.__name__}" for fn in reached}


def test_the_check_compiles_every_program_the_table_builds(cuda_table):
    """The source builders the cuda table's kernels reach are exactly the ones
    the check renders programs of (for each dtype a kernel reaching them has)."""
    programs = sources.programs()
    checked = {p.name.split("[")[0] for p in programs}
    builders = {f"{name}.{builder}" for name in sources.family_modules()
                for builder, _ in sources._builders(importlib.import_module(f"{sources.KERNELS}.{name}"))}
    reached = set().union(*(_reached_builders(run) for _, _, run in cuda_table.runs))
    assert reached & builders == checked & builders
    inline = {name for name, _, _ in sources._inline()}
    assert {"training_conv._conv_grad", "training_rows._softmax_grad"} <= reached
    assert {n.split("[")[0] for n in inline} <= checked
    # Each builder's programs cover the dtypes of every kernel that reaches it.
    from devkit.backends.kernels.layer import CL_TYPES

    labels = {p.name for p in programs}
    elementwise = [(op, key) for op, key, run in cuda_table.runs if "elementwise._unary_source" in
                   _reached_builders(run)]
    assert elementwise
    for op, key in elementwise:
        assert f"elementwise._unary_source[{CL_TYPES[key].name}]" in labels, (op, CL_TYPES[key].name)


def test_every_program_opencl_builds_at_run_time_is_one_the_check_compiles(monkeypatch):
    """Ops of every family run on PoCL; each source the launches build is among
    the check's programs (the cuda plugin builds the same sources)."""
    plugin = _opencl_plugin()
    import devkit
    from devkit.backends.opencl import launch

    if not all(d.properties.flags & C.DK_DEVICE_FP64 for d in plugin.devices()):
        pytest.skip(reason="the check's programs are built for fp64 devices; this OpenCL device has none")
    built = []
    original = launch.ProgramCache.get
    monkeypatch.setattr(launch.ProgramCache, "get", lambda self, device, source, options="":
                        built.append(source) or original(self, device, source, options))
    monkeypatch.setattr(launch, "programs", launch.ProgramCache())  # every program built afresh
    dev = plugin.device(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    a = devkit.asarray(x, dev)
    ops = devkit.ops
    results = [
        (ops.Add(a, a), x + x), (ops.Exp(ops.Cast(a, to=np.float16)), np.exp(x.astype(np.float16))),
        (ops.ReduceSum(a, axes=[1], keepdims=0), x.sum(1)),
        (ops.MatMul(a, ops.Transpose(a, perm=[0, 2, 1])), x @ x.transpose(0, 2, 1)),
        (ops.Softmax(a, axis=-1), np.exp(x) / np.exp(x).sum(-1, keepdims=True)),
        (ops.Gather(a, devkit.asarray(np.array([2, 0], np.int64), dev), axis=1), x[:, [2, 0]]),
        (ops.Transpose(a, perm=[2, 0, 1]), x.transpose(2, 0, 1)),
    ]
    for got, want in results:
        np.testing.assert_allclose(got.numpy().astype(np.float64), want.astype(np.float64), rtol=2e-3, atol=1e-5)
    checked = {p.source for p in sources.programs()}
    assert built and all(source in checked for source in built), \
        [dialect.kernel_names(s) for s in built if s not in checked]


def test_the_families_import_without_pyopencl():
    """A GPU machine's image has CuPy but no pyopencl: the cuda table and the check must build there."""
    code = textwrap.dedent("""
        import sys
        sys.modules["pyopencl"] = None
        from devkit.backends.cuda import sources, table
        print(len(table.device_table.build_kernel_table([sources._CallStandIn()]).entries), len(sources.programs()))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    entries, programs = map(int, result.stdout.split())
    assert entries > 500 and programs > 100


# -- grids and blocks ---------------------------------------------------------------------


def test_an_nd_range_becomes_a_grid_of_its_work_groups():
    plan = plan_launch((1024, 64, 3), (16, 16, 1), [np.int64(7)], H200)
    assert plan == LaunchPlan((64, 4, 3), (16, 16, 1), 0, (np.int64(7),))
    assert plan_launch(256 * 5, 256, [], H200).grid == (5, 1, 1)


def test_without_a_local_size_blocks_divide_the_range():
    """OpenCL kernels launched without a local size read no id past the range."""
    assert plan_launch(1000, None, [], H200).block == (1000, 1, 1)
    assert plan_launch(2048 * 3, None, [], H200).block == (1024, 1, 1)
    assert plan_launch(1031, None, [], H200).block == (1, 1, 1)  # a prime past 1024
    plan = plan_launch((6, 1000), None, [], H200)
    assert plan.block == (6, 125, 1) and plan.grid == (1, 8, 1)


def test_local_arguments_become_aligned_offsets_into_the_shared_memory():
    plan = plan_launch(256, 256, [np.int32(1), Local(10), Local(8), Local(4)], H200)
    assert [int(a) for a in plan.args[1:]] == [0, 16, 32]
    assert plan.shared_bytes == 36
    assert dialect.SHARED_ALIGNMENT == 16


def test_launches_cuda_cannot_make_are_refused_with_the_reason():
    with pytest.raises(PluginError, match="do not divide the ND-range") as info:
        plan_launch(1000, 256, [], H200)
    assert info.value.status == C.DK_INTERNAL
    with pytest.raises(PluginError, match="at most 65535") as info:
        plan_launch((1, 70000), (1, 1), [], H200)
    assert info.value.status == C.DK_OUT_OF_RANGE
    with pytest.raises(PluginError, match="shared memory") as info:
        plan_launch(256, 256, [Local(300000)], H200)
    assert info.value.status == C.DK_RESOURCE_EXHAUSTED
    with pytest.raises(PluginError, match="at most 1024"):
        plan_launch(2048, 2048, [], H200)


def test_every_launch_the_families_make_on_pocl_plans_as_a_cuda_launch(monkeypatch):
    """Each ND-range the families launch (for PoCL's limits) becomes a grid
    whose blocks cover it exactly, with the arguments in order."""
    plugin = _opencl_plugin()
    import devkit
    from devkit.backends.opencl import launch

    plans = []
    original = launch.OpenCLCall.launch

    def planned(self, source, name, args, global_size, local_size=None, options=""):
        plan = plan_launch(global_size, local_size, args, self.device.limits)
        covered = [g * b for g, b in zip(plan.grid, plan.block)]
        assert covered[:len(np.atleast_1d(global_size))] == [int(n) for n in np.atleast_1d(global_size)]
        assert len(plan.args) == len(args)
        assert len(dialect.local_parameters(source, name)) == sum(isinstance(a, Local) for a in args)
        plans.append(name)
        return original(self, source, name, args, global_size, local_size, options)

    monkeypatch.setattr(launch.OpenCLCall, "launch", planned)
    dev = plugin.device(0)
    x = np.arange(2 * 3 * 8 * 8, dtype=np.float32).reshape(2, 3, 8, 8) / 100
    a = devkit.asarray(x, dev)
    ops = devkit.ops
    # Large enough for the tiled implicit GEMM (k_conv, with local-memory tables).
    image = np.random.default_rng(3).standard_normal((1, 8, 32, 32)).astype(np.float32)
    w = np.linspace(-1, 1, 32 * 8 * 3 * 3, dtype=np.float32).reshape(32, 8, 3, 3)
    conv = ops.Conv(devkit.asarray(image, dev), devkit.asarray(w, dev), pads=[1, 1, 1, 1]).numpy()
    ref = np.zeros((1, 32, 32, 32), np.float64)
    padded = np.pad(image, ((0, 0), (0, 0), (1, 1), (1, 1)))
    for i in range(3):
        for j in range(3):
            ref += np.einsum("bchw,oc->bohw", padded[:, :, i:i + 32, j:j + 32], w[:, :, i, j])
    np.testing.assert_allclose(conv, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ops.ReduceMax(a, axes=[2, 3], keepdims=0).numpy(), x.max((2, 3)))
    np.testing.assert_allclose(ops.TopK(a, devkit.asarray(np.array([3], np.int64), dev))[0].numpy(),
                               -np.sort(-x, -1)[..., :3])
    np.testing.assert_allclose(ops.CumSum(a, devkit.asarray(np.array(3, np.int64), dev)).numpy(),
                               np.cumsum(x, 3), rtol=1e-5)
    np.testing.assert_allclose(ops.MaxPool(a, kernel_shape=[2, 2], strides=[2, 2]).numpy(),
                               x.reshape(2, 3, 4, 2, 4, 2).max((3, 5)))
    assert {"k_conv", "k_CumSum", "k_TopK_local"} <= set(plans), plans


# -- dtype dispatch and build options -------------------------------------------------------


def test_a_cuda_device_builds_the_programs_the_check_compiled():
    """On an H200's limits every linalg dtype takes the first GPU tiles and the
    reductions work-groups of 256: the -D options the check compiles with."""

    class Device:
        limits = H200

    for key in (C.DK_DTYPE_FLOAT32, C.DK_DTYPE_FLOAT64, C.DK_DTYPE_FLOAT16, C.DK_DTYPE_BFLOAT16, C.DK_DTYPE_INT64):
        assert tiles(Device(), key) == _GPU_TILES[0]
    assert f"-DWG=256 {_GPU_TILES[0].options()}" == sources._options()


def test_the_cuda_table_dispatches_every_float_dtype_of_matmul(cuda_table):
    from devkit.backends.kernels.layer import CL_TYPES

    matmul = sorted(CL_TYPES[key].name for op, key, _ in cuda_table.runs if op == "MatMul")
    assert {"float16", "bfloat16", "float32", "float64"} <= set(matmul)
    assert set(blas.CUDA_TYPES) == {C.DK_DTYPE_FLOAT16, C.DK_DTYPE_BFLOAT16, C.DK_DTYPE_FLOAT32,
                                    C.DK_DTYPE_FLOAT64}


# -- cuBLAS ---------------------------------------------------------------------------------


def test_operand_layouts_as_cublas_takes_them():
    N, T = blas.CUBLAS_OP_N, blas.CUBLAS_OP_T
    assert blas.operand(4, 6, 6, 1) == (N, 6)       # row-major: its column-major transpose
    assert blas.operand(4, 6, 8, 1) == (N, 8)       # rows padded to 8
    assert blas.operand(4, 6, 1, 4) == (T, 4)       # a transposed view: column-major
    assert blas.operand(1, 6, 0, 1) == (N, 6)       # one row: any row stride
    assert blas.operand(4, 1, 1, 0) == (N, 1)       # one column
    assert blas.operand(4, 6, 12, 2) is None        # neither stride 1
    assert blas.operand(4, 6, 3, 1) is None         # rows overlap


class _Flat:
    """A tensor as the families read it: ``view``'s elements in a flat host
    array (the view's base, compact) as its buffer, with the view's offset and strides."""

    def __init__(self, view: np.ndarray):
        base = view if view.base is None else view.base
        assert base.flags.c_contiguous
        self.flat = base.reshape(-1)
        self.buffer = self.flat
        self.offset = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // view.itemsize
        self.shape, self.strides = list(view.shape), [s // view.itemsize for s in view.strides]
        self.ndim, self.size = view.ndim, view.size


class _EmulatedCall:
    """Runs linalg's MatMul/Gemm planning, its products through blas.plan,
    computed as cublasGemmStridedBatchedEx would (column-major) in NumPy."""

    def __init__(self, inputs, output, attrs=None):
        self.inputs, self.outputs, self.attrs = inputs, [output], attrs or {}
        self.calls = 0

    def input(self, j):
        return self.inputs[j] if j < len(self.inputs) else None

    def expect(self, inputs, outputs):
        pass

    def library_gemm(self, key, a, b, y, m, n, k, batch, alpha, beta, addend):
        assert addend is None
        p = blas.plan(key, a, b, y, m, n, k, batch)
        assert p is not None, (a, b, y, batch)
        outer = [range(size) for size, *_ in p.outer]
        for index in np.ndindex(*[len(r) for r in outer]) if outer else [()]:
            shift = [sum(i * d[j] for i, d in zip(index, p.outer)) for j in (2, 1, 3)]
            for batch_index in range(p.count):
                first = self._matrix(b.buffer, b.offset + shift[0] + batch_index * p.strides[0],
                                     p.op_first, p.m, p.k, p.ld_first)
                second = self._matrix(a.buffer, a.offset + shift[1] + batch_index * p.strides[1],
                                      p.op_second, p.k, p.n, p.ld_second)
                product = alpha * (first.astype(np.float64) @ second.astype(np.float64))
                base = y.offset + shift[2] + batch_index * p.strides[2]
                rows, cols = np.meshgrid(np.arange(p.m), np.arange(p.n), indexing="ij")
                y.buffer[base + rows + cols * p.ld_out] = product
        self.calls += 1
        return True

    @staticmethod
    def _matrix(flat, offset, op, rows, cols, ld):
        """op(X) as a rows x cols matrix, X column-major at ``offset`` with ``ld``."""
        r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        return flat[offset + (r + c * ld if op == blas.CUBLAS_OP_N else c + r * ld)]


@pytest.mark.parametrize("a_shape, b_shape, transpose_a", [
    ((5, 7), (7, 3), False), ((2, 5, 7), (7, 3), False), ((2, 5, 7), (2, 7, 3), True),
    ((3, 1, 4, 6), (2, 6, 5), False), ((7,), (7, 3), False), ((4, 7), (7,), False), ((1, 7), (2, 7, 1), True)])
def test_matmul_products_through_the_cublas_plan_match_numpy(a_shape, b_shape, transpose_a):
    rng = np.random.default_rng(1)
    a = rng.standard_normal(a_shape).astype(np.float32)
    if transpose_a:  # a transposed view: unit row stride
        a = np.swapaxes(np.ascontiguousarray(np.swapaxes(a, -1, -2)), -1, -2)
    b = rng.standard_normal(b_shape).astype(np.float32)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    y = _Flat(np.zeros(want.shape, np.float32))
    call = _EmulatedCall([_Flat(a), _Flat(b)], y)
    linalg._matmul(call, C.DK_DTYPE_FLOAT32)
    assert call.calls == 1
    np.testing.assert_allclose(y.flat.reshape(want.shape), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_transposes_through_the_cublas_plan_match_numpy(trans_a, trans_b):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((6, 4) if trans_a else (4, 6)).astype(np.float32)
    b = rng.standard_normal((5, 6) if trans_b else (6, 5)).astype(np.float32)
    want = 1.5 * ((a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b).astype(np.float64))
    y = _Flat(np.zeros((4, 5), np.float32))
    call = _EmulatedCall([_Flat(a), _Flat(b)], y, {"transA": trans_a, "transB": trans_b, "alpha": 1.5, "beta": 1.0})
    linalg._gemm(call, C.DK_DTYPE_FLOAT32)
    np.testing.assert_allclose(y.flat.reshape(4, 5), want, rtol=1e-5)
    assert call.calls == 1


def test_layouts_and_dtypes_cublas_cannot_take_stay_on_the_kernels():
    from devkit.backends.kernels.linalg_gemm import Matrix

    contiguous = Matrix(None, 0, 8, 1)
    assert blas.plan(C.DK_DTYPE_INT32, contiguous, contiguous, contiguous, 8, 8, 8, []) is None
    assert blas.plan(C.DK_DTYPE_FLOAT32, Matrix(None, 0, 16, 2), contiguous, contiguous, 8, 8, 8, []) is None
    transposed_y = Matrix(None, 0, 1, 8)
    assert blas.plan(C.DK_DTYPE_FLOAT32, contiguous, contiguous, transposed_y, 8, 8, 8, []) is None
    assert blas.plan(C.DK_DTYPE_FLOAT32, contiguous, contiguous, contiguous, 8, 8, 0, []) is None  # an empty sum
    assert blas.plan(C.DK_DTYPE_FLOAT32, contiguous, contiguous, contiguous, 8, 8, 8,
                     [(70000, 64, 64, 64)]) is None
    assert inspect.signature(blas.gemm).parameters.keys() >= {"alpha", "beta", "addend"}


# -- the table's entries on a stand-in CuPy -------------------------------------------------


class _FakeCuPy:
    """What the cuda plugin calls of CuPy, recording instead of running: one
    device with an H200's limits; allocations are bytes in ``memory`` that
    copies and memsets change; kernels and cuBLAS calls are records (the
    index check, k_check_indices, is also emulated). Stream capture records
    the work queued on a capturing stream, which a graph launch replays on
    its stream; capture refuses what CUDA refuses (a synchronization of the
    stream, its pool, a copy from or to host memory)."""

    def __init__(self):
        fake = self
        self.launches, self.gemms, self.freed, self.synced, self.uploads = [], [], [], [], []
        self.modules_loaded = 0
        self.math_modes = []
        self.memory: dict[int, bytearray] = {}
        self.capturing: dict[int, list] = {}   # stream -> the work captured so far
        self.graphs: dict[int, list] = {}      # cudaGraph_t / cudaGraphExec_t -> that work
        self.graph_launches, self.instantiated = [], 0
        self.uncapturable = False  # set: work queued on a capturing stream fails, as CUDA's refusals do
        self.current_stream, self.next_pointer = None, 1 << 32

        class CUDARuntimeError(RuntimeError):
            def __init__(self, status, message):
                super().__init__(message)
                self.status = status

        def refuse_in_capture(stream, what):
            if stream in fake.capturing:
                raise CUDARuntimeError(900, f"{what}: cudaErrorStreamCaptureUnsupported")

        def allocate(size, stream=None):
            refuse_in_capture(stream, "cudaMallocAsync")
            fake.next_pointer += 1 << 20
            fake.memory[fake.next_pointer] = bytearray(size)
            return fake.next_pointer

        def view(address, size):
            """Device bytes (a memoryview into ``memory``), or None for host memory."""
            for base, data in fake.memory.items():
                if base <= address < base + len(data):
                    assert address + size <= base + len(data), "a copy past the allocation's end"
                    return memoryview(data)[address - base:address - base + size]
            return None

        def on_stream(stream, work):
            """Runs ``work(stream)``, or records it on a capturing stream."""
            if stream in fake.capturing:
                if fake.uncapturable:
                    raise CUDARuntimeError(900, "cudaErrorStreamCaptureUnsupported")
                fake.capturing[stream].append(work)
            else:
                work(stream)

        def copy(dst, src, size):
            to, source = view(dst, size), view(src, size)
            data = bytes(source) if source is not None else bytes(ffi.buffer(ffi.cast("char *", src), size))
            if to is not None:
                to[:] = data
            else:
                ffi.memmove(ffi.cast("char *", dst), data, size)
            return data

        def memcpy_async(dst, src, size, kind, stream):
            if stream in fake.capturing and (view(dst, size) is None or view(src, size) is None):
                raise CUDARuntimeError(900, "cudaMemcpyAsync from or to pageable host memory in a capture")
            on_stream(stream, lambda s: fake.uploads.append((dst, copy(dst, src, size), s)))

        def memset_async(address, value, size, stream):
            on_stream(stream, lambda s: view(address, size).__setitem__(slice(None), bytes([value]) * size))

        def synchronize(stream):
            refuse_in_capture(stream, "cudaStreamSynchronize")
            fake.synced.append(stream)

        def new_handle():
            fake.next_pointer += 1 << 20
            return fake.next_pointer

        def begin_capture(stream, mode):
            assert stream not in fake.capturing and mode == 2  # relaxed
            fake.capturing[stream] = []

        def end_capture(stream):
            graph = new_handle()
            fake.graphs[graph] = fake.capturing.pop(stream)
            return graph

        def instantiate(graph):
            fake.instantiated += 1
            executable = new_handle()
            fake.graphs[executable] = list(fake.graphs[graph])
            return executable

        def graph_launch(executable, stream):
            fake.graph_launches.append((executable, stream))
            for work in fake.graphs[executable]:
                work(stream)

        runtime = types.SimpleNamespace(
            getDeviceProperties=lambda index: {
                "name": b"Fake H200", "major": 9, "minor": 0, "maxThreadsPerBlock": 1024,
                "maxThreadsDim": (1024, 1024, 64), "sharedMemPerBlock": 49152, "sharedMemPerBlockOptin": 232448,
                "multiProcessorCount": 132, "totalGlobalMem": 1 << 37},
            streamCreateWithFlags=lambda flags: new_handle(), malloc=allocate, mallocAsync=allocate,
            memGetInfo=lambda: (1 << 36, 1 << 37),
            free=lambda pointer: fake.memory.pop(pointer),
            freeAsync=lambda pointer, stream: fake.freed.append((pointer, stream)),
            memcpyAsync=memcpy_async, memcpy=lambda dst, src, size, kind: copy(dst, src, size),
            memsetAsync=memset_async, streamSynchronize=synchronize, getDeviceCount=lambda: 1,
            deviceSynchronize=lambda: fake.synced.append("device"),
            eventCreateWithFlags=lambda flags: new_handle(), eventQuery=lambda event: 0,
            eventSynchronize=lambda event: None, eventDestroy=lambda event: None,
            driverGetVersion=lambda: 13000, runtimeGetVersion=lambda: 13000, streamDestroy=lambda stream: None,
            eventRecord=lambda event, stream: on_stream(stream, lambda s: fake.launches.append(
                types.SimpleNamespace(name="eventRecord", event=event, stream=s))),
            streamBeginCapture=begin_capture, streamEndCapture=end_capture, graphInstantiate=instantiate,
            graphLaunch=graph_launch, graphDestroy=lambda graph: fake.graphs.pop(graph),
            graphExecDestroy=lambda executable: fake.graphs.pop(executable), CUDARuntimeError=CUDARuntimeError)

        class Context:
            compute_capability = "90"

            def __init__(self, index=0):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        class ForeignStream:  # what Stream.from_external makes
            def __init__(self, pointer):
                self.pointer = pointer

            def __enter__(self):
                fake.current_stream = self.pointer

            def __exit__(self, *exc):
                fake.current_stream = None

        class Kernel:
            max_dynamic_shared_size_bytes = 0

            def __init__(self, module, name):
                assert name in module.code, name
                self.module, self.name = module, name

            def __call__(self, grid, block, args, shared_mem=0):
                def run(stream):
                    fake.launches.append(types.SimpleNamespace(
                        name=self.name, code=self.module.code, options=self.module.options, grid=grid,
                        block=block, args=args, shared_mem=shared_mem, stream=stream))
                    if self.name == "k_check_indices":
                        check_indices(*args)

                on_stream(fake.current_stream, run)

        def check_indices(indices, offset, wide, ndim, meta, depth, bounds, base, count, first, slot):
            """k_check_indices on contiguous indices: the first bad one's place in its chunk."""
            dtype = np.int64 if wide else np.int32
            values = np.frombuffer(bytes(fake.memory[int(indices)]), dtype)[int(offset):]
            limits = np.frombuffer(bytes(view(int(bounds), 8 * int(depth))), np.int64)
            for e in range(int(base), int(base) + int(count)):
                bound = limits[e % int(depth)]
                if not -bound <= values[e] < bound:
                    view(int(first) + 4 * int(slot), 4)[:] = np.uint32(e - int(base)).tobytes()
                    return

        class NVRTCError(RuntimeError):
            pass

        def compile_program(program, options):
            program["options"] = list(options)
            if "#error" in program["code"]:
                raise NVRTCError("NVRTC_ERROR_COMPILATION (6)")

        # A "cubin" is the program's code and options as JSON, which RawModule(path=) reads back.
        nvrtc = types.SimpleNamespace(
            NVRTCError=NVRTCError, getVersion=lambda: (13, 0), getSupportedArchs=lambda: (75, 80, 90),
            createProgram=lambda code, name, headers, include_names: {"code": code},
            compileProgram=compile_program, getProgramLog=lambda program: "devkit.cu(1): error: #error",
            getCUBIN=lambda program: json.dumps(program).encode(), destroyProgram=lambda program: None)

        class RawModule:
            def __init__(self, path):
                module = json.loads(Path(path).read_text())
                self.code, self.options = module["code"], module["options"]
                fake.modules_loaded += 1

            def get_function(self, name):
                return Kernel(self, name)

        def gemm(*args):
            # CuPy's binding: the handle's stream becomes CuPy's current stream,
            # and a capturing one is refused.
            if fake.current_stream in fake.capturing:
                raise NotImplementedError("calling cuBLAS API during stream capture is currently unsupported")
            fake.cublas_stream = fake.current_stream
            on_stream(fake.cublas_stream, lambda s: fake.gemms.append(args))

        cublas = types.SimpleNamespace(gemmStridedBatchedEx=gemm, create=lambda: 7,
                                       setMathMode=lambda handle, mode: fake.math_modes.append((handle, mode)))
        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(
            runtime=runtime, Device=Context, get_cuda_path=lambda: None,
            Stream=types.SimpleNamespace(from_external=lambda obj: ForeignStream(obj.__cuda_stream__()[1])),
            nvrtc=nvrtc, cublas=cublas)


@pytest.fixture
def fake_cuda(monkeypatch, tmp_path):
    return on_a_fake_cuda(monkeypatch, tmp_path)


def on_a_fake_cuda(monkeypatch, cache):
    """(the stand-in CuPy, the plugin's device on it, its kernel table), for
    one test, with devkit's cache in the directory ``cache``."""
    from devkit.backends.cuda import runtime

    monkeypatch.setenv("DEVKIT_CACHE_DIR", str(cache))
    fake = _FakeCuPy()
    monkeypatch.setattr(runtime, "_cupy", fake)
    monkeypatch.setattr(kernels_module, "modules", kernels_module.ModuleCache())
    monkeypatch.setattr(blas, "_handles", threading.local())  # cuBLAS handles of the stand-in
    device = runtime.Device(0)
    monkeypatch.setattr(device_table, "devices", [device])
    return fake, device, device_table.build_kernel_table([device])


def _tensor(device, shape, dtype_key, keep):
    handle = device.alloc(int(np.prod(shape)) * 8)
    shape_array = ffi.new("int64_t[]", list(shape) or [0])
    keep += [shape_array]
    return {"data": handle, "device": {"device_type": C.DK_DEVICE_TYPE_CUDA, "device_id": 0},
            "ndim": len(shape), "shape": shape_array, "strides": ffi.NULL,
            "dtype": {"code": dtype_key & 0xFF, "bits": (dtype_key >> 8) & 0xFF, "lanes": 1}, "byte_offset": 0}


def _call(table, device, op, key, inputs, outputs, stream, input_keys=None, ints=None):
    """Runs the table's (op, key) entry on tensors of those shapes (of dtype
    ``key``, or ``input_keys`` per input) with int attributes ``ints``;
    (status, input pointers, output pointers)."""
    index = next(i for i, (o, k, _) in enumerate(table.runs) if (o, k) == (op, key))
    entry, keep = table.entries[index], []
    input_keys = input_keys or [key] * len(inputs)
    ins = ffi.new("DK_Tensor[]", [_tensor(device, s, k, keep) for s, k in zip(inputs, input_keys)])
    outs = ffi.new("DK_Tensor[]", [_tensor(device, s, key, keep) for s in outputs])
    names = [ffi.new("char[]", name.encode()) for name in ints or {}]
    attributes = [ffi.new("DK_Attribute *", {"struct_size": ffi.sizeof("DK_Attribute"), "name": name,
                                             "type": C.DK_ATTR_INT, "i": value})
                  for name, value in zip(names, (ints or {}).values())]
    array = ffi.new("DK_Attribute *[]", attributes) if attributes else ffi.NULL
    keep += [names, attributes, array]
    call = ffi.new("DK_KernelCall *", {
        "struct_size": ffi.sizeof("DK_KernelCall"), "device": 0, "stream": ffi.cast("DK_Stream", stream),
        "inputs": ins, "num_inputs": len(inputs), "outputs": outs, "num_outputs": len(outputs),
        "attributes": array, "num_attributes": len(attributes), "user_data": entry.user_data})
    pointers = [[int(ffi.cast("uintptr_t", t.data)) for t in (array[i] for i in range(n))]
                for array, n in ((ins, len(inputs)), (outs, len(outputs)))]
    return entry.fn(call), *pointers


def test_an_add_entry_launches_its_rendered_kernel_on_the_calls_stream(fake_cuda):
    fake, device, table = fake_cuda
    device.streams.add(0x5EED)
    status, (x, y), (out,) = _call(table, device, "Add", C.DK_DTYPE_FLOAT32, [(3, 4), (4,)], [(3, 4)], 0x5EED)
    assert status == C.DK_OK
    (launch,) = fake.launches
    assert launch.name == "k_Add" and launch.stream == 0x5EED
    assert launch.grid[0] * launch.block[0] >= 12 and launch.block == (256, 1, 1)
    assert {"--fmad=false", "--prec-div=true", "--ftz=false", "-arch=sm_90"} <= set(launch.options)
    # x, its offset, y (broadcast), its offset, the output, its offset, ndim, the shape/stride table, n.
    assert [int(a) for a in launch.args[:6]] == [x, 0, y, 0, out, 0]
    meta = int(launch.args[7])
    uploaded = {dst: np.frombuffer(data, np.int64) for dst, data, _ in fake.uploads}
    assert list(uploaded[meta]) == [3, 4, 4, 1, 0, 1, 4, 1]  # shape, then the strides of x, y and out
    assert int(launch.args[8]) == 12
    # The table is a temporary of the call, freed in stream order; a stream call does not wait.
    assert (meta, 0x5EED) in fake.freed and fake.synced == []


def test_a_null_stream_call_waits_for_its_private_stream(fake_cuda):
    fake, device, table = fake_cuda
    status, _, _ = _call(table, device, "Neg", C.DK_DTYPE_FLOAT16, [(5,)], [(5,)], 0)
    assert status == C.DK_OK
    (launch,) = fake.launches
    assert launch.stream == device.null_stream and fake.synced == [device.null_stream]
    assert "vload_half" in launch.code and "__float2half_rn" in launch.code


def test_a_one_dimensional_range_runs_the_tableless_kernel(fake_cuda):
    """Operands that _merge_dims makes one dimension (contiguous, or a scalar
    broadcast) go to k_Add_1d: each offset and step as arguments, no table."""
    fake, device, table = fake_cuda
    device.streams.add(0x5EED)
    for y_shape, y_step in (((3, 4), 1), ((), 0)):
        fake.launches.clear()
        fake.uploads.clear()
        status, (x, y), (out,) = _call(table, device, "Add", C.DK_DTYPE_FLOAT32, [(3, 4), y_shape], [(3, 4)],
                                       0x5EED)
        assert status == C.DK_OK
        (launch,) = fake.launches
        assert launch.name == "k_Add_1d" and "kernel void k_Add_1d(" not in launch.code  # rendered for CUDA
        assert [int(a) for a in launch.args[:10]] == [x, 0, 1, y, 0, y_step, out, 0, 1, 12]
        assert fake.uploads == []  # no shape and stride table


def test_a_float_matmul_entry_runs_cublas_and_an_integer_one_the_kernel(fake_cuda):
    fake, device, table = fake_cuda
    device.streams.add(0x5EED)
    status, (a, b), (y,) = _call(table, device, "MatMul", C.DK_DTYPE_BFLOAT16, [(4, 6), (6, 5)], [(4, 5)], 0x5EED)
    assert status == C.DK_OK and fake.launches == []
    (args,) = fake.gemms
    handle, op_first, op_second, m, n, k = args[:6]
    assert (handle, op_first, op_second, m, n, k) == (7, blas.CUBLAS_OP_N, blas.CUBLAS_OP_N, 5, 4, 6)
    assert args[7:9] == (b, 14) and args[11:13] == (a, 14) and args[16] == y  # CUDA_R_16BF
    assert args[-2:] == (blas.CUBLAS_COMPUTE_32F, blas.CUBLAS_GEMM_DEFAULT) and fake.cublas_stream == 0x5EED
    # The plugin's own handle: sums stay float32 (no split-K partials in bfloat16), made once.
    assert fake.math_modes == [(7, blas.CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)]
    status, _, _ = _call(table, device, "MatMul", C.DK_DTYPE_INT32, [(4, 6), (6, 5)], [(4, 5)], 0x5EED)
    assert status == C.DK_OK and [launch.name for launch in fake.launches] == ["k_gemm_direct"]


def test_a_bad_index_is_the_streams_sticky_error_and_a_null_stream_calls_status(fake_cuda, monkeypatch):
    """A stream-order check's error is reported by the call's stream, as the
    ABI has work that fails in stream order reported (and as the plugin's
    CUDA graphs and the opencl plugin do); a NULL-stream call returns it."""
    fake, device, table = fake_cuda
    device.streams.add(0x5EED)
    allocate = device.alloc

    def alloc(size, stream=None):  # the (2,) int64 indices: [1, 9], 9 out of range of 4 rows
        handle = allocate(size) if stream is None else allocate(size, stream)
        if size == 16:
            fake.memory[int(ffi.cast("uintptr_t", handle))][:16] = np.array([1, 9], np.int64).tobytes()
        return handle

    monkeypatch.setattr(device, "alloc", alloc)
    gather = dict(input_keys=[C.DK_DTYPE_FLOAT32, C.DK_DTYPE_INT64], ints={"axis": 0})
    status, _, _ = _call(table, device, "Gather", C.DK_DTYPE_FLOAT32, [(4, 3), (2,)], [(2, 3)], 0x5EED, **gather)
    assert status == C.DK_OK and 0x5EED in fake.synced
    for _ in range(2):  # sticky
        with pytest.raises(PluginError, match=r"Gather: index 9 \(element 1 of indices\) is out of range") as info:
            device_table.stream_synchronize(0, ffi.cast("DK_Stream", 0x5EED))
        assert info.value.status == C.DK_OUT_OF_RANGE
    status, _, _ = _call(table, device, "Gather", C.DK_DTYPE_FLOAT32, [(4, 3), (2,)], [(2, 3)], 0, **gather)
    assert status == C.DK_OUT_OF_RANGE


def test_free_memory_counts_what_the_plugin_holds_for_this_process(fake_cuda):
    """mem_get_info's free memory moves with the plugin's allocations alone:
    DK_Mems, a call's temporaries until they are freed in stream order."""
    fake, device, table = fake_cuda
    device.streams.add(0x5EED)
    assert device.mem_info() == (1 << 36, 1 << 37)
    mem = device.alloc(1000)
    assert device.mem_info()[0] == (1 << 36) - 1000
    temporaries = []
    original = device.malloc_internal
    device.malloc_internal = lambda n, stream=None: temporaries.append(n) or original(n, stream)
    status, _, _ = _call(table, device, "Add", C.DK_DTYPE_FLOAT32, [(3, 4), (4,)], [(3, 4)], 0x5EED)
    assert status == C.DK_OK and temporaries and not device.internal  # freed (in stream order) by the call
    device.free(mem)
    assert len(device.mems) == 3 and device.mem_info()[0] == (1 << 36) - sum(device.mems.values())


def test_programs_compile_once_into_the_disk_cache_and_errors_carry_the_log(fake_cuda):
    """NVRTC is called with the plugin's options (denormals kept: CuPy's own
    compile path would add -ftz=true); a second process (a new ModuleCache)
    loads the cubin from the cache; a compile error raises NVRTC's log."""
    fake, device, table = fake_cuda
    source = "__kernel void k_one(__global float *x) { x[0] = 1.0f; }"
    first = kernels_module.ModuleCache()
    kernel = first.function(0, source, "-DWG=64", "k_one")
    assert first.builds == 1 and "--ftz=false" in kernel.module.options and "-DWG=64" in kernel.module.options
    assert first.function(0, source, "-DWG=64", "k_one") is kernel and fake.modules_loaded == 1
    (cached,) = kernels_module.cache_dir().glob("*.cubin")
    second = kernels_module.ModuleCache()
    assert second.function(0, source, "-DWG=64", "k_one").name == "k_one" and second.builds == 0
    second.function(0, source, "-DWG=32", "k_one")  # other options: another program
    assert second.builds == 1 and len(list(kernels_module.cache_dir().glob("*.cubin"))) == 2
    with pytest.raises(PluginError, match=r"NVRTC: NVRTC_ERROR_COMPILATION \(6\)\ndevkit.cu\(1\): error"):
        second.function(0, "#error broken\n" + source, "", "k_one")
    assert not list(kernels_module.cache_dir().glob("*.part"))


def test_a_bad_call_is_refused_before_anything_is_launched(fake_cuda):
    fake, device, table = fake_cuda
    device.streams.add(0x5EED)
    status, _, _ = _call(table, device, "Add", C.DK_DTYPE_FLOAT32, [(3, 4), (5,)], [(3, 4)], 0x5EED)
    assert status == C.DK_INVALID_ARGUMENT and fake.launches == []
    from devkit.backends.support.boundary import last_error_message

    assert "Add" in ffi.string(last_error_message()).decode()
    status, _, _ = _call(table, device, "Add", C.DK_DTYPE_FLOAT32, [(3, 4), (4,)], [(3, 4)], 0xDEAD)
    assert status == C.DK_INVALID_ARGUMENT and "not a live stream" in ffi.string(last_error_message()).decode()


def test_the_plugin_loads_on_a_stand_in_cupy_with_the_whole_kernel_table():
    """DK_PluginInit on the stand-in CuPy (in a process of its own: a loaded
    plugin stays loaded): the opencl plugin's kernel count, the collectives
    and the graph section (graph.py)."""
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, "tests")
        import test_cuda_kernels
        fake = sys.modules["cupy"] = test_cuda_kernels._FakeCuPy()
        from devkit.backends.cuda import runtime
        runtime._cupy = fake  # on a GPU machine test_cuda_kernels' REASON imported the real CuPy
        import devkit
        from devkit.backends.cuda import sources, table
        plugin = devkit.load_plugin("cuda")
        print(len(plugin.kernels), len(table.device_table.build_kernel_table([sources._CallStandIn()]).entries),
              plugin.has_graphs, plugin.has_collectives, plugin.device_type)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    published, built, graphs, collectives, device_type = result.stdout.split()
    assert published == built and int(published) > 500
    assert (graphs, collectives, device_type) == ("True", "True", "cuda")


# -- on a GPU (ci/gpu-check.sh); elsewhere skipped with the plugin's reason -----------------

@pytest.mark.skipif(REASON is not None, reason=f"cuda plugin unavailable: {REASON}")
def test_kernels_cublas_and_the_index_check_on_the_gpu():
    import devkit
    from devkit import dtypes

    dev = devkit.device("cuda:0")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    w = rng.standard_normal((96, 48)).astype(np.float32)
    a, b = devkit.asarray(x, dev), devkit.asarray(w, dev)
    ops = devkit.ops
    np.testing.assert_array_equal(ops.Add(a, a).numpy(), x + x)  # exact in float32
    np.testing.assert_allclose(ops.MatMul(a, b).numpy(), x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    if dtypes.bfloat16 is not None:
        xb, wb = x.astype(dtypes.bfloat16), w.astype(dtypes.bfloat16)
        got = ops.MatMul(devkit.asarray(xb, dev), devkit.asarray(wb, dev)).numpy().astype(np.float64)
        np.testing.assert_allclose(got, xb.astype(np.float64) @ wb.astype(np.float64), rtol=2e-2, atol=2e-1)
    np.testing.assert_allclose(ops.ReduceSum(a, axes=[1], keepdims=0).numpy(), x.sum(1), rtol=1e-5, atol=1e-5)
    with pytest.raises(devkit.errors.OutOfRangeError, match="index 64"):
        ops.Gather(a, devkit.asarray(np.array([1, 64], np.int64), dev), axis=0).numpy()
