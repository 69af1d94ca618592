"""devkit-bench ops: op latency on a plugin against NumPy and onnxruntime in the same run.

    devkit-bench ops [--plugin cpu] [--only Add,MatMul] [--repeat 20] [--json PATH]

Every benchmark runs the op through devkit.run_op on the default stream
(complete on return) with device-resident inputs, and the same computation
with NumPy and, where it is installed, onnxruntime (a one-node model,
CPUExecutionProvider, spinning off, on 1 and on 2 intra-op threads: the
faster is reported). The sides take turns, one repetition each, so a noisy
(shared) machine slows them alike; reported are the median time of each, the
ratios peer / devkit (above 1: devkit is faster) and the cores each side may
use. Memory-bound cases also report their bandwidth, against a NumPy copy's
measured in the same run (the machine's memcpy speed). NumPy's OpenBLAS runs
with OPENBLAS_THREAD_TIMEOUT=4 (set, unless given, by rerunning the command):
its threads then sleep right after a product instead of spinning on the
cores devkit's turn needs.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from collections.abc import Callable

import numpy as np

import devkit

from .engine import _interleaved, _ort_sessions
from .op_cases import MI, OpBench, _f32, _gelu, _layer_norm, _sigmoid, _softmax
from .ops_nn import NN_BENCHMARKS

PIPED_WIDTH = 1000  # columns of a table written to a pipe or file: rich sizes it to its content


BENCHMARKS = [
    OpBench("Add 16Mi f32", "Add", lambda r: [_f32(r, 16 * MI), _f32(r, 16 * MI)], np.add, memory_bound=True),
    OpBench("Add broadcast 4096x4096 + 4096", "Add", lambda r: [_f32(r, 4096, 4096), _f32(r, 4096)], np.add,
            memory_bound=True),
    OpBench("Mul 16Mi f32", "Mul", lambda r: [_f32(r, 16 * MI), _f32(r, 16 * MI)], np.multiply, memory_bound=True),
    OpBench("Exp 16Mi f32", "Exp", lambda r: [_f32(r, 16 * MI)], np.exp, memory_bound=True),
    OpBench("Sigmoid 16Mi f32", "Sigmoid", lambda r: [_f32(r, 16 * MI)], _sigmoid, memory_bound=True),
    OpBench("Gelu 16Mi f32 (NumPy: tanh form)", "Gelu", lambda r: [_f32(r, 16 * MI)], _gelu, memory_bound=True),
    OpBench("Relu 16Mi f32", "Relu", lambda r: [_f32(r, 16 * MI)], lambda x: np.maximum(x, 0), memory_bound=True),
    OpBench("ReduceSum 16Mi f32 (all)", "ReduceSum", lambda r: [_f32(r, 16 * MI)],
            lambda x: np.sum(x, keepdims=True), {"keepdims": 1}),
    OpBench("ReduceSum 4096x4096 axis -1", "ReduceSum", lambda r: [_f32(r, 4096, 4096), np.array([-1])],
            lambda x, axes: np.sum(x, axis=-1, keepdims=True)),
    OpBench("Softmax 4096x1024", "Softmax", lambda r: [_f32(r, 4096, 1024)], _softmax),
    OpBench("MatMul 1024x1024x1024 f32", "MatMul", lambda r: [_f32(r, 1024, 1024), _f32(r, 1024, 1024)], np.matmul,
            blas=True),
    OpBench("MatMul 2048x2048x2048 f32", "MatMul", lambda r: [_f32(r, 2048, 2048), _f32(r, 2048, 2048)], np.matmul,
            blas=True),
    # ResNet-18's classifier: a GEMV bound by reading the 2 MB of weights.
    OpBench("Gemm 1x512 by 1000x512^T + bias", "Gemm", lambda r: [_f32(r, 1, 512), _f32(r, 1000, 512), _f32(r, 1000)],
            lambda a, b, c: a @ b.T + c, {"transB": 1}, blas=True),
    OpBench("Transpose 4096x4096", "Transpose", lambda r: [_f32(r, 4096, 4096)],
            lambda x: np.ascontiguousarray(x.T)),
    OpBench("LayerNormalization 4096x1024", "LayerNormalization",
            lambda r: [_f32(r, 4096, 1024), _f32(r, 1024), _f32(r, 1024)], _layer_norm),
    # The neural-network cases (row kernels, pools, BatchNormalization, convolutions).
    *NN_BENCHMARKS,
]


def _median_seconds(fn: Callable[[], object], repeat: int) -> float:
    return _interleaved({"fn": fn}, repeat)["fn"]


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


def devkit_threads() -> int:
    """The cpu plugin's kernel threads: DEVKIT_CPU_THREADS, else the usable cores."""
    return int(os.environ.get("DEVKIT_CPU_THREADS") or usable_cores())


def numpy_blas_threads() -> int | None:
    """The threads of the OpenBLAS NumPy loaded, or None when it is not found."""
    np.ones((2, 2)) @ np.ones((2, 2))  # loads the BLAS
    with open("/proc/self/maps") as maps:
        paths = sorted(set(re.findall(r"/\S*numpy\S*openblas\S*\.so\S*", maps.read())))
    for path in paths:
        lib = ctypes.CDLL(path)
        for symbol in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                       "openblas_get_num_threads"):
            if hasattr(lib, symbol):
                return int(getattr(lib, symbol)())
    return None


def copy_bandwidth_gbps(repeat: int) -> float:
    """The machine's memcpy bandwidth as NumPy measures it: 64 MiB read and written."""
    src = np.ones(16 * MI, dtype=np.float32)
    dst = np.empty_like(src)
    seconds = _median_seconds(lambda: np.copyto(dst, src), repeat)
    return 2 * src.nbytes / seconds / 1e9


def single_node_model(bench: OpBench, inputs: list[np.ndarray]):
    """The op as a one-node ONNX model with inputs in0, in1, ... and its first output "out"
    (BatchNormalization in inference mode takes no other)."""
    from onnx import TensorProto, helper

    spec = devkit.ops.get(bench.op)
    names = [f"in{i}" for i in range(len(inputs))]
    node = helper.make_node(bench.op, names, ["out"], **bench.attrs)  # optional trailing outputs left off
    graph = helper.make_graph(
        [node], "bench",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
         for n, x in zip(names, inputs)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", spec.opset)])


def _onnxruntime_sessions(bench: OpBench, inputs: list[np.ndarray]) -> dict[str, Callable[[], object]]:
    """One-node onnxruntime sessions on 1 and 2 intra-op threads (spinning
    off) by label, or none without onnxruntime."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return {}
    feed = {f"in{i}": x for i, x in enumerate(inputs)}
    sessions = _ort_sessions(single_node_model(bench, inputs))
    return {label: (lambda s=s: s.run(["out"], feed)) for label, s in sessions.items()}


def run(plugin: str, only: list[str] | None, repeat: int) -> list[dict]:
    dev = devkit.load_plugin(plugin).device(0)  # a name or a library path
    copy_gbps = copy_bandwidth_gbps(repeat)
    blas_threads = numpy_blas_threads()
    rows = []
    for bench in BENCHMARKS:
        if only and bench.op not in only:
            continue
        rng = np.random.default_rng(0)
        inputs = bench.inputs(rng)
        spec = devkit.ops.get(bench.op)
        host_names = set(spec.host_inputs)
        device_inputs = [x if spec.inputs[min(i, len(spec.inputs) - 1)].name in host_names
                         else devkit.asarray(x, dev) for i, x in enumerate(inputs)]
        # Only the first output, as the onnxruntime model has (MaxPool then skips its Indices).
        result = devkit.run_op(bench.op, device_inputs, bench.attrs, outputs=1)[0].numpy()
        expected = bench.numpy(*inputs)
        error = float(np.max(np.abs(result.astype(np.float64) - expected))) if expected.size else 0.0
        timers = {"devkit": lambda: devkit.run_op(bench.op, device_inputs, bench.attrs, outputs=1),
                  "numpy": lambda: bench.numpy(*inputs), **_onnxruntime_sessions(bench, inputs)}
        seconds = _interleaved(timers, repeat)
        ort = min((name for name in seconds if name.startswith("onnxruntime_")), key=seconds.get,
                  default=None)
        devkit_s, numpy_s = seconds["devkit"], seconds["numpy"]
        ort_s = seconds[ort] if ort else None
        row = {"benchmark": bench.name, "op": bench.op, "plugin": plugin, "devkit_ms": devkit_s * 1e3,
               "numpy_ms": numpy_s * 1e3, "onnxruntime_ms": None if ort_s is None else ort_s * 1e3,
               "numpy_over_devkit": numpy_s / devkit_s,
               "onnxruntime_over_devkit": None if ort_s is None else ort_s / devkit_s,
               "devkit_cores": devkit_threads(),
               "numpy_cores": (blas_threads if bench.blas else 1),
               "numpy_openblas_thread_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
               "onnxruntime_cores": None if ort is None else int(ort.removeprefix("onnxruntime_")[:-1]),
               "max_abs_diff_vs_numpy": error,
               **{f"{name}_ms": s * 1e3 for name, s in seconds.items() if name.startswith("onnxruntime_")}}
        if bench.memory_bound:
            moved = sum(x.nbytes for x in inputs) + result.nbytes
            row.update(devkit_GBps=moved / devkit_s / 1e9, numpy_GBps=moved / numpy_s / 1e9,
                       copy_GBps=copy_gbps)
        rows.append(row)
    return rows


def table_console():
    """A rich Console for tables: the terminal's width on a terminal; piped, wide
    enough that no column or header is cut (rich assumes 80 columns otherwise)."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)


def print_rows(rows: list[dict]) -> None:
    from rich.table import Table

    copy = next((r["copy_GBps"] for r in rows if "copy_GBps" in r), None)
    title = "op latency (median of interleaved runs); ratio = peer time / devkit time, >1 means devkit is faster"
    if copy is not None:
        title += f"; NumPy copy: {copy:.1f} GB/s"
    table = Table(title=title)
    for column in ("benchmark", "devkit ms", "NumPy ms", "NumPy/devkit", "onnxruntime ms", "ORT/devkit",
                   "cores devkit/NumPy/ORT", "devkit GB/s (of copy)", "max |diff|"):
        table.add_column(column, justify="left" if column == "benchmark" else "right")
    for r in rows:
        ort = r["onnxruntime_ms"]
        cores = f"{r['devkit_cores']}/{r['numpy_cores'] or '?'}/{r['onnxruntime_cores'] or '-'}"
        bandwidth = (f"{r['devkit_GBps']:.1f} ({r['devkit_GBps'] / r['copy_GBps']:.0%})"
                     if "devkit_GBps" in r else "-")
        table.add_row(r["benchmark"], f"{r['devkit_ms']:.3f}", f"{r['numpy_ms']:.3f}", f"{r['numpy_over_devkit']:.2f}",
                      "-" if ort is None else f"{ort:.3f}",
                      "-" if ort is None else f"{r['onnxruntime_over_devkit']:.2f}", cores, bandwidth,
                      f"{r['max_abs_diff_vs_numpy']:.2g}")
    table_console().print(table)


def ops_main(args) -> int:
    if "OPENBLAS_THREAD_TIMEOUT" not in os.environ:
        # NumPy's OpenBLAS, the MatMul peer, keeps its threads spinning for
        # about 0.1 s after each product, on the cores the next contender
        # needs (devkit's MatMul 1024^2 right after it measured 1.8x slower).
        # OpenBLAS reads the variable when it loads, which importing devkit
        # has done: run the same command line again with the shortest spin
        # it allows.
        os.environ["OPENBLAS_THREAD_TIMEOUT"] = "4"
        os.execv(sys.executable, sys.orig_argv)
    only = args.only.split(",") if args.only else None
    rows = run(args.plugin, only, args.repeat)
    print_rows(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0

