#!/usr/bin/env python3
"""Decomposed against native time on the cpu plugin (docs/primitives.md's tables).

    scripts/measure-decompositions.py ops [--repeat 15]   # per op: run_decomposed vs run_op
    scripts/measure-decompositions.py zoo [--repeat 10]   # devkit.onnx.zoo models: prints this process's times

The zoo mode times the models on the plugin this process loaded; run it
once plainly and once with DEVKIT_CPU_KERNELS=primitives and compare. The ops
mode interleaves the two forms in one process and reports the median of each
and their ratio (decomposed / native).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import devkit
from devkit import ops
from devkit.onnx import zoo
from devkit.ops import dispatch


def _f32(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


# (label, op, inputs(rng), attrs): one mid-sized call per family.
CASES = [
    ("Sub 1Mi", "Sub", lambda r: [_f32(r, 1 << 20), _f32(r, 1 << 20)], {}),
    ("Relu 1Mi", "Relu", lambda r: [_f32(r, 1 << 20)], {}),
    ("Sigmoid 1Mi", "Sigmoid", lambda r: [_f32(r, 1 << 20)], {}),
    ("Tanh 1Mi", "Tanh", lambda r: [_f32(r, 1 << 20)], {}),
    ("Gelu 1Mi", "Gelu", lambda r: [_f32(r, 1 << 20)], {}),
    ("ReduceMean 1024x1024 axis 1", "ReduceMean", lambda r: [_f32(r, 1024, 1024), np.array([1])], {}),
    ("Softmax 1024x1024", "Softmax", lambda r: [_f32(r, 1024, 1024)], {}),
    ("LayerNormalization 1024x1024", "LayerNormalization",
     lambda r: [_f32(r, 1024, 1024), _f32(r, 1024), _f32(r, 1024)], {}),
    ("Gemm 512^3", "Gemm", lambda r: [_f32(r, 512, 512), _f32(r, 512, 512), _f32(r, 512)], {}),
    ("Conv 8x32x32x32, 3x3 pad 1", "Conv", lambda r: [_f32(r, 8, 32, 32, 32), _f32(r, 32, 32, 3, 3)],
     {"pads": [1, 1, 1, 1]}),
    ("MaxPool 8x32x64x64, 3x3 s2", "MaxPool", lambda r: [_f32(r, 8, 32, 64, 64)],
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool 8x32x64x64, 2x2 s2", "AveragePool", lambda r: [_f32(r, 8, 32, 64, 64)],
     {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("Attention 2x8x128x64", "Attention", lambda r: [_f32(r, 2, 8, 128, 64), _f32(r, 2, 8, 128, 64),
                                                     _f32(r, 2, 8, 128, 64)], {}),
    ("Einsum bij,bjk->bik 16x128^2", "Einsum", lambda r: [_f32(r, 16, 128, 128), _f32(r, 16, 128, 128)],
     {"equation": "bij,bjk->bik"}),
    ("TopK 64x1024, K 16", "TopK", lambda r: [_f32(r, 64, 1024), np.array([16])], {}),
    ("Resize linear 4x16x64x64 x2", "Resize", lambda r: [_f32(r, 4, 16, 64, 64), None,
                                                         np.array([1, 1, 2, 2], np.float32)], {"mode": "linear"}),
    ("GatherElements 1024x1024", "GatherElements",
     lambda r: [_f32(r, 1024, 1024), r.integers(0, 1024, (1024, 1024))], {"axis": 1}),
    ("ConvGrad 8x32x32x32, 3x3 pad 1", "ConvGrad",
     lambda r: [_f32(r, 8, 32, 32, 32), _f32(r, 8, 32, 32, 32), _f32(r, 32, 32, 3, 3)], {"pads": [1, 1, 1, 1]}),
    ("Adam 1Mi", "Adam", lambda r: [np.array(0.01, np.float32), np.array(3), *[_f32(r, 1 << 20) for _ in range(4)]],
     {}),
]


def _median_pair(native, decomposed, repeat):
    native(), decomposed()  # warm-up
    times = {"native": [], "decomposed": []}
    for _ in range(repeat):  # interleaved: the shared machine's noise hits both alike
        for key, fn in (("native", native), ("decomposed", decomposed)):
            start = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - start)
    return statistics.median(times["native"]), statistics.median(times["decomposed"])


def measure_ops(repeat: int) -> None:
    dev = devkit.device("cpu:0")
    rng = np.random.default_rng(0)
    print("| Op (inputs) | native ms | decomposed ms | decomposed / native |")
    print("|---|---|---|---|")
    for label, op, make, attrs in CASES:
        spec = ops.get(op)
        inputs = [v if v is None or spec.inputs[min(i, len(spec.inputs) - 1)].host else devkit.asarray(v, dev)
                  for i, v in enumerate(make(rng))]
        native, decomposed = _median_pair(lambda: devkit.run_op(op, inputs, attrs),
                                          lambda: dispatch.run_decomposed(op, inputs, attrs), repeat)
        print(f"| {label} | {native * 1e3:.2f} | {decomposed * 1e3:.2f} | {decomposed / native:.1f} |")


def measure_zoo(repeat: int) -> None:
    from devkit import onnx as donnx

    dev = devkit.device("cpu:0")
    kernels = len({op for op, *_ in dev.plugin.kernels})
    for name in sorted(zoo.MODELS):
        model, inputs = zoo.MODELS[name]()
        prepared = donnx.prepare(model, dev)
        prepared.run(inputs)  # warm-up
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            prepared.run(inputs)
            times.append(time.perf_counter() - start)
        print(f"{name}\t{statistics.median(times) * 1e3:.2f} ms\t({kernels} ops with kernels)")
    assert not ops.fallback_report(), "a model fell back to the cpu plugin"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("ops", "zoo"))
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    (measure_ops if args.mode == "ops" else measure_zoo)(args.repeat)


if __name__ == "__main__":
    main()
