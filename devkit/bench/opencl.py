"""devkit-bench opencl: the opencl plugin against pyopencl's own arrays and CLBlast.

    devkit-bench opencl [--repeat 10] [--json PATH]

Side by side on the same OpenCL device (the plugin's device 0): devkit's
Add (16 Mi float32), ReduceSum (16 Mi float32 to one value) and MatMul
(1024 x 1024 float32) through ``devkit.run_op`` on the default stream, and
the same computation with ``pyopencl.array`` (``a + b``, ``pyopencl.array.sum``)
and, for MatMul, CLBlast's SGEMM through ``pyclblast`` (``pyopencl.array``
has no matrix product). A peer that is not installed (pyclblast; Mako, which
pyopencl's reductions need) is reported with the package it needs. Each peer's time includes
allocating its output and waiting for the result, as devkit's does. Reported:
medians and the ratio peer / devkit (above 1: devkit is faster).

It also measures start-up: a fresh process that imports devkit, loads the
plugin and runs the ``mlp`` and ``resnet`` zoo models, first with an empty
program cache (``XDG_CACHE_HOME`` in a new directory: devkit's and PoCL's
caches are both under it) and then again with the cache the first one left.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import devkit

from .ops import MI, _median_seconds, table_console

_STARTUP_SCRIPT = """
import time
start = time.perf_counter()
import devkit
from devkit.onnx import prepare, zoo
for build in (zoo.mlp, zoo.resnet):
    model, inputs = build()
    prepare(model, "opencl:0").run(inputs)
print(time.perf_counter() - start)
"""


def startup_seconds() -> tuple[float, float]:
    """(cold, warm): a new process's import + load + two models, without and with a program cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        times = []
        for _ in range(2):
            result = subprocess.run([sys.executable, "-c", _STARTUP_SCRIPT], env=env, capture_output=True,
                                    text=True, check=True, timeout=1800)
            times.append(float(result.stdout.split()[-1]))
        return times[0], times[1]


def _missing(module: str, package: str) -> str | None:
    """``package`` (what to pip install) when ``module`` does not import, else None."""
    try:
        importlib.import_module(module)
    except ImportError:
        return package
    return None


def _pyopencl_sum(x, finished):
    """pyopencl.array.sum, whose reduction kernels pyopencl writes with Mako: (run, missing)."""
    import pyopencl.array as cla

    missing = _missing("mako", "Mako")
    return (None, missing) if missing else (finished(lambda: cla.sum(x)), None)


def _clblast_gemm(queue, a, b):
    """CLBlast's SGEMM through pyclblast: (run, missing)."""
    missing = _missing("pyclblast", "pyclblast")
    if missing:
        return None, missing
    import pyclblast
    import pyopencl.array as cla

    def run():
        c = cla.empty(queue, (a.shape[0], b.shape[1]), np.float32)
        pyclblast.gemm(queue, a.shape[0], b.shape[1], a.shape[1], a, b, c, a_ld=a.shape[1],
                       b_ld=b.shape[1], c_ld=b.shape[1])
        queue.finish()
        return c

    return run, None


def run(repeat: int) -> list[dict]:
    import pyopencl as cl
    import pyopencl.array as cla

    dev = devkit.device("opencl:0")
    context = cl.Context([_find_cl_device(dev.properties.name)])
    queue = cl.CommandQueue(context)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(16 * MI, dtype=np.float32)
    y = rng.standard_normal(16 * MI, dtype=np.float32)
    a = rng.standard_normal((1024, 1024), dtype=np.float32)
    b = rng.standard_normal((1024, 1024), dtype=np.float32)
    dx, dy, da, db = (devkit.asarray(v, dev) for v in (x, y, a, b))
    px, py, pa, pb = (cla.to_device(queue, v) for v in (x, y, a, b))

    def finished(make):
        def run_peer():
            result = make()
            queue.finish()
            return result
        return run_peer

    cases = [
        ("Add 16Mi f32", lambda: devkit.ops.Add(dx, dy), {"pyopencl.array": (finished(lambda: px + py), None)},
         x + y),
        ("ReduceSum 16Mi f32 (all)", lambda: devkit.ops.ReduceSum(dx, keepdims=0),
         {"pyopencl.array": _pyopencl_sum(px, finished)}, np.sum(x, dtype=np.float64)),
        ("MatMul 1024x1024 f32", lambda: devkit.ops.MatMul(da, db),
         {"CLBlast (pyclblast)": _clblast_gemm(queue, pa, pb)}, a.astype(np.float64) @ b),
    ]
    rows = []
    for name, devkit_fn, peers, expected in cases:
        result = devkit_fn()
        error = float(np.max(np.abs(result.numpy().astype(np.float64) - expected)))
        devkit_s = _median_seconds(devkit_fn, repeat)
        for peer, (peer_fn, missing) in peers.items():
            peer_s = None if peer_fn is None else _median_seconds(peer_fn, repeat)
            rows.append({"benchmark": name, "device": dev.properties.name, "peer": peer, "peer_missing": missing,
                         "devkit_ms": devkit_s * 1e3, "peer_ms": None if peer_s is None else peer_s * 1e3,
                         "peer_over_devkit": None if peer_s is None else peer_s / devkit_s,
                         "max_abs_error_vs_float64": error})
    return rows


def _find_cl_device(name: str):
    import pyopencl as cl

    for platform in cl.get_platforms():
        for device in platform.get_devices():
            if device.name.strip() == name.strip():
                return device
    raise RuntimeError(f"no OpenCL device named {name!r}")


def opencl_main(args) -> int:
    from rich.table import Table

    if _missing("pyopencl", "pyopencl"):
        print("devkit-bench opencl: pyopencl is not installed: pip install 'devkit[opencl]', and an OpenCL "
              "driver (scripts/install-opencl.sh installs PoCL and pyopencl)", file=sys.stderr)
        return 2
    try:
        devkit.device("opencl:0")
    except devkit.PluginLoadError as exc:
        print(f"devkit-bench opencl: the opencl plugin does not load: {exc}", file=sys.stderr)
        return 2
    rows = run(args.repeat)
    table = Table(title="opencl plugin vs peers on the same device (median); ratio > 1: devkit is faster")
    for column in ("benchmark", "peer", "devkit ms", "peer ms", "peer/devkit", "max |error|"):
        table.add_column(column, justify="left" if column in ("benchmark", "peer") else "right")
    for r in rows:
        missing = r["peer_ms"] is None
        table.add_row(r["benchmark"], r["peer"] + (f" (not run: pip install {r['peer_missing']})" if missing else ""),
                      f"{r['devkit_ms']:.2f}", "-" if missing else f"{r['peer_ms']:.2f}",
                      "-" if missing else f"{r['peer_over_devkit']:.2f}", f"{r['max_abs_error_vs_float64']:.2g}")
    console = table_console()
    console.print(table)
    cold, warm = startup_seconds()
    console.print(f"start-up (import, load, mlp + resnet): cold program cache {cold:.1f} s, "
                  f"warm {warm:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"ops": rows, "startup_s": {"cold": cold, "warm": warm}},
                                              indent=2))
    return 0

