"""devkit-bench cuda: the cuda plugin against the device's own limits and CuPy.

    devkit-bench cuda [--repeat 10] [--json PATH]

On the plugin's device 0, through ``devkit.run_op`` on the default stream
(each call allocates its output and returns once the result is there):

- Add of two 256 Mi float32 vectors, in GB/s (three 1 GiB streams: two
  reads, one write), against the device-to-device copy bandwidth CuPy
  measures on the same device (a 1 GiB cudaMemcpy: a read and a write).
  The issue's goal: 80% of the copy bandwidth or more.
- MatMul 8192 x 8192 in float32 and bfloat16, in TFLOP/s, against
  ``cupy.matmul`` of the same shapes (float32; CuPy has no bfloat16 dtype,
  so bfloat16's peer is its float16 product, the same cuBLAS path at the same
  width). Goal: within 10% of CuPy.

Without CuPy, a driver or a device it prints why and exits 0 (skipped);
``--json`` then records the reason. Times are medians of interleaved
repetitions, each synchronised; the ratio is peer / devkit for times, so
above 1 means devkit is faster.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import devkit

from .. import dtypes
from .engine import _interleaved
from .ops import MI, table_console

ADD_ELEMENTS = 256 * MI
MATMUL_SIZE = 8192
ADD_GOAL, MATMUL_GOAL = 0.8, 0.9


def skip_reason() -> str | None:
    """Why the cuda plugin cannot run here (its own load error), or None."""
    found = [d for d in devkit.list_plugins() if d.name == "cuda"]
    if not found:
        return "no cuda plugin is listed"
    return None if found[0].loads else found[0].error


def _synchronised(fn):
    import cupy

    def run():
        result = fn()
        cupy.cuda.runtime.deviceSynchronize()
        return result
    return run


def add_bandwidth(repeat: int) -> dict:
    import cupy

    dev = devkit.device("cuda:0")
    n = ADD_ELEMENTS
    x = cupy.random.default_rng(0).standard_normal(n, dtype=cupy.float32)
    y = cupy.random.default_rng(1).standard_normal(n, dtype=cupy.float32)
    dx, dy = devkit.asarray(cupy.asnumpy(x), dev), devkit.asarray(cupy.asnumpy(y), dev)
    source, target = cupy.empty(n, cupy.float32), cupy.empty(n, cupy.float32)
    result = devkit.ops.Add(dx, dy)
    error = float(np.max(np.abs(result.numpy() - cupy.asnumpy(x + y))))
    del result
    nbytes = n * 4
    medians = _interleaved({
        "devkit": lambda: devkit.ops.Add(dx, dy),
        "copy": _synchronised(lambda: target.data.copy_from_device(source.data, nbytes)),
    }, repeat)
    add_gbps = 3 * nbytes / medians["devkit"] / 1e9
    copy_gbps = 2 * nbytes / medians["copy"] / 1e9
    return {"benchmark": "Add 256Mi f32", "device": dev.properties.name, "peer": "D2D copy (cudaMemcpy 1 GiB)",
            "devkit_ms": medians["devkit"] * 1e3, "peer_ms": medians["copy"] * 1e3,
            "devkit_rate": add_gbps, "peer_rate": copy_gbps, "unit": "GB/s", "fraction_of_peer": add_gbps / copy_gbps,
            "goal": ADD_GOAL, "max_abs_error": error}


def matmul_rate(dtype_name: str, repeat: int) -> dict:
    import cupy

    dev = devkit.device("cuda:0")
    n = MATMUL_SIZE
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    if dtype_name == "bfloat16":
        if dtypes.bfloat16 is None:
            return {"benchmark": f"MatMul {n}^2 bf16", "skipped": "ml_dtypes is not installed (bfloat16)"}
        host_a, host_b, peer_dtype = a.astype(dtypes.bfloat16), b.astype(dtypes.bfloat16), cupy.float16
    else:
        host_a, host_b, peer_dtype = a, b, cupy.float32
    da, db = devkit.asarray(host_a, dev), devkit.asarray(host_b, dev)
    pa, pb = cupy.asarray(a.astype(peer_dtype)), cupy.asarray(b.astype(peer_dtype))
    # Checked on a corner: 256 rows of the product against float64 on the host.
    got = devkit.ops.MatMul(da, db).numpy()[:256].astype(np.float64)
    want = host_a[:256].astype(np.float64) @ host_b.astype(np.float64)
    relative = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    medians = _interleaved({"devkit": lambda: devkit.ops.MatMul(da, db),
                            "cupy": _synchronised(lambda: cupy.matmul(pa, pb))}, repeat)
    flops = 2 * n ** 3
    short = "f32" if dtype_name == "float32" else "bf16"
    return {"benchmark": f"MatMul {n}^2 {short}", "device": dev.properties.name,
            "peer": f"cupy.matmul ({np.dtype(peer_dtype).name})",
            "devkit_ms": medians["devkit"] * 1e3, "peer_ms": medians["cupy"] * 1e3,
            "devkit_rate": flops / medians["devkit"] / 1e12, "peer_rate": flops / medians["cupy"] / 1e12,
            "unit": "TFLOP/s", "fraction_of_peer": medians["cupy"] / medians["devkit"], "goal": MATMUL_GOAL,
            "max_relative_error": relative}


def cuda_main(args) -> int:
    reason = skip_reason()
    if reason is not None:
        print(f"devkit-bench cuda: skipped: {reason}", file=sys.stderr)
        if args.json:
            Path(args.json).write_text(json.dumps({"skipped": reason}, indent=2))
        return 0
    from rich.table import Table

    rows = [add_bandwidth(args.repeat), matmul_rate("float32", args.repeat), matmul_rate("bfloat16", args.repeat)]
    table = Table(title="cuda plugin vs peers on the same device (medians of interleaved runs)")
    for column in ("benchmark", "peer", "devkit", "peer rate", "devkit/peer", "goal"):
        table.add_column(column, justify="left" if column in ("benchmark", "peer") else "right")
    for r in rows:
        if "skipped" in r:
            table.add_row(r["benchmark"], f"skipped: {r['skipped']}", "-", "-", "-", "-")
            continue
        table.add_row(r["benchmark"], r["peer"], f"{r['devkit_rate']:.1f} {r['unit']}",
                      f"{r['peer_rate']:.1f} {r['unit']}", f"{r['fraction_of_peer']:.2f}",
                      f">= {r['goal']:.2f}" + ("" if r["fraction_of_peer"] >= r["goal"] else " (missed)"))
    table_console().print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"cases": rows}, indent=2))
    return 0
