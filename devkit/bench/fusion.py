"""devkit-bench fusion: fused plans (docs/fusion.md) against the unfused
ones and the native kernels, measured in the same run.

    devkit-bench fusion [--plugins cpu,opencl] [--rows 256] [--width 2048] [--repeat 15] [--json PATH]

- patterns: RMSNorm, LayerNorm, tanh-GELU and SwiGLU written as chains of
  basic ONNX ops (MODELS: Mul, ReduceMean, Add, Sqrt, Div, Exp, Sub, ...) on
  rows x width float32, fused and unfused; RMSNorm also against the native
  RMSNormalization kernel (a one-node model);
- models: devkit.onnx.zoo's llama_decoder and the GPT-style stack, fused and
  unfused.

Three times per contender: "kernels" is the sum of the plan's calls each
launched alone and complete when it returns (Plan.profile, the median of
three passes, so warm: the kernels' own time, the work fusion changes); "calls" the calls replayed on a stream
and one synchronization (a launch's hand-over to the stream's worker
too; the inputs are copied in before it, untimed); "run" a whole
PreparedModel.run (the inputs' copies in, binding and the outputs' copies
back too). Each
contender is timed in turn within every repetition (interleaved); figures
are medians; ratios are unfused / fused (above 1: fusion is faster);
fused_wins_* is the share of repetitions in which the fused time was the
lower; "load" the machine's 1-minute load average when the row was done.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from .. import onnx as donnx
from ..onnx import zoo


def _model(name: str, nodes: list, inputs: list[tuple[str, tuple]], initializers: dict, opset: int = 18):
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _node(op: str, inputs: list[str], output: str, **attrs):
    return helper.make_node(op, inputs, [output], **attrs)


def _feed(rng, *shapes) -> dict:
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes}


def rmsnorm(rows: int, width: int):
    """x / sqrt(mean(x^2) + eps) * w: Mul, ReduceMean, Add, Sqrt, Div, Mul."""
    rng = np.random.default_rng(0)
    nodes = [_node("Mul", ["x", "x"], "sq"), _node("ReduceMean", ["sq", "axes"], "ms", keepdims=1),
             _node("Add", ["ms", "eps"], "mse"), _node("Sqrt", ["mse"], "rms"), _node("Div", ["x", "rms"], "xn"),
             _node("Mul", ["xn", "w"], "y")]
    init = {"w": rng.standard_normal(width).astype(np.float32), "eps": np.float32(1e-6),
            "axes": np.array([-1], np.int64)}
    return _model("rmsnorm", nodes, [("x", (rows, width))], init), _feed(rng, ("x", (rows, width)))


def rmsnorm_native(rows: int, width: int):
    rng = np.random.default_rng(0)
    nodes = [_node("RMSNormalization", ["x", "w"], "y", axis=-1, epsilon=1e-6)]
    init = {"w": rng.standard_normal(width).astype(np.float32)}
    return _model("rmsnorm_native", nodes, [("x", (rows, width))], init, opset=23), _feed(rng, ("x", (rows, width)))


def layernorm(rows: int, width: int):
    """(x - mean) / sqrt(var + eps) * g + b, as nine ops."""
    rng = np.random.default_rng(0)
    nodes = [_node("ReduceMean", ["x", "axes"], "mean", keepdims=1), _node("Sub", ["x", "mean"], "d"),
             _node("Mul", ["d", "d"], "d2"), _node("ReduceMean", ["d2", "axes"], "var", keepdims=1),
             _node("Add", ["var", "eps"], "ve"), _node("Sqrt", ["ve"], "sd"), _node("Div", ["d", "sd"], "n"),
             _node("Mul", ["n", "g"], "ng"), _node("Add", ["ng", "b"], "y")]
    init = {"g": rng.standard_normal(width).astype(np.float32), "b": rng.standard_normal(width).astype(np.float32),
            "eps": np.float32(1e-5), "axes": np.array([-1], np.int64)}
    return _model("layernorm", nodes, [("x", (rows, width))], init), _feed(rng, ("x", (rows, width)))


def gelu(rows: int, width: int):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), tanh(u) = 1 - 2 / (e^{2u} + 1), in primitives."""
    rng = np.random.default_rng(0)
    nodes = [_node("Mul", ["x", "x"], "x2"), _node("Mul", ["x2", "x"], "x3"), _node("Mul", ["x3", "c"], "cx3"),
             _node("Add", ["x", "cx3"], "inner"), _node("Mul", ["inner", "k2"], "u2"), _node("Exp", ["u2"], "e"),
             _node("Add", ["e", "one"], "e1"), _node("Div", ["two", "e1"], "q"), _node("Sub", ["one", "q"], "t"),
             _node("Add", ["t", "one"], "t1"), _node("Mul", ["x", "t1"], "xt"), _node("Mul", ["xt", "half"], "y")]
    init = {"c": np.float32(0.044715), "k2": np.float32(2 * math.sqrt(2 / math.pi)), "one": np.float32(1),
            "two": np.float32(2), "half": np.float32(0.5)}
    return _model("gelu", nodes, [("x", (rows, width))], init), _feed(rng, ("x", (rows, width)))


def swiglu(rows: int, width: int):
    """a * sigmoid(a) * b, sigmoid(a) = 1 / (1 + e^{-a}), in primitives."""
    rng = np.random.default_rng(0)
    nodes = [_node("Mul", ["a", "minus"], "na"), _node("Exp", ["na"], "e"), _node("Add", ["e", "one"], "e1"),
             _node("Div", ["a", "e1"], "silu"), _node("Mul", ["silu", "b"], "y")]
    init = {"minus": np.float32(-1), "one": np.float32(1)}
    return (_model("swiglu", nodes, [("a", (rows, width)), ("b", (rows, width))], init),
            _feed(rng, ("a", (rows, width)), ("b", (rows, width))))


MODELS = {"rmsnorm": rmsnorm, "layernorm": layernorm, "gelu": gelu, "swiglu": swiglu}
TIMES = ("kernels", "calls", "run")  # each contender's timers (see the module doc)


def _contender(model, feed: dict, device: str, fuse: bool):
    """The model's plan's timers (kernels, calls, run; see the module doc),
    and its fusion report. A timer runs its work and returns the seconds
    that count."""
    prepared = donnx.prepare(model, device, fuse=fuse)
    prepared.run(feed)  # builds the plan
    (plan,) = prepared.plans.values()
    stream = plan.device.create_stream()
    inputs = [(array, np.ascontiguousarray(feed[name]).reshape(-1).view(np.uint8)) for name, array in plan._inputs]

    def calls() -> float:
        # The inputs again, untimed (the arena may reuse their bytes), then
        # the calls replayed and one synchronization: the work fusion changes.
        for array, host in inputs:
            array.buffer.copy_from_host(host, stream=stream)
        stream.synchronize()
        start = time.perf_counter()
        plan._launcher.replay(stream)
        stream.synchronize()
        return time.perf_counter() - start

    def whole_run() -> float:
        start = time.perf_counter()
        prepared.run(feed)
        return time.perf_counter() - start

    def kernels() -> float:  # each call launched alone, complete when it returns (Plan.profile)
        # The median of three passes: each call warm, as in a model, where a
        # kernel reads what the one before it has just written; one pass
        # would time the fused kernel's reads cold after the other
        # contenders' traffic, while the unfused plan's intermediates stay hot.
        return sum(seconds for _, seconds in plan.profile(feed, repeat=3))

    return {"kernels": kernels, "calls": calls, "run": whole_run}, prepared.fusion


def _samples(contenders: dict[str, dict], repeat: int) -> dict[str, list[float]]:
    """Each contender's timer's seconds, one per repetition, keyed
    "<contender>_<timer>". Every repetition runs every timer once, in turn
    (interleaved, so a load that drifts weighs on all alike)."""
    for fns in contenders.values():
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {f"{who}_{what}": [] for who, fns in contenders.items() for what in fns}
    for _ in range(repeat):
        for who, fns in contenders.items():
            for what, fn in fns.items():
                times[f"{who}_{what}"].append(fn())
    return times


def _row(name: str, plugin: str, model, feed, repeat: int, native=None) -> dict:
    device = f"{plugin}:0"
    contenders = {"unfused": _contender(model, feed, device, False), "fused": _contender(model, feed, device, True)}
    if native is not None:
        contenders["native"] = _contender(*native, device, False)
    report = contenders["fused"][1]
    samples = _samples({who: fns for who, (fns, _) in contenders.items()}, repeat)
    ms = {name: statistics.median(values) * 1e3 for name, values in samples.items()}
    (fusion,) = report.values() if report else ({},)
    row = {"benchmark": name, "plugin": plugin, **{f"{k}_ms": v for k, v in ms.items()},
           **{f"speedup_{what}": ms[f"unfused_{what}"] / ms[f"fused_{what}"] for what in TIMES},
           # the share of repetitions in which fused beat unfused: on a
           # shared machine steadier than a ratio of medians near 1
           **{f"fused_wins_{what}": _wins(samples[f"fused_{what}"], samples[f"unfused_{what}"]) for what in TIMES},
           "groups": fusion.get("groups", 0), "ops_per_group": fusion.get("ops_per_group", []),
           "kernels_saved": fusion.get("kernels_saved", 0),
           # the machine's 1-minute load average when the row was done (None where
           # the OS has none): on a shared machine, how loaded it was while measured
           "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
    if native is not None:
        row.update({f"fused_vs_native_{what}": ms[f"fused_{what}"] / ms[f"native_{what}"] for what in TIMES})
    return row


def _wins(fused: list[float], unfused: list[float]) -> float:
    return sum(f < u for f, u in zip(fused, unfused)) / len(fused)


def run(plugins: list[str], rows: int, width: int, repeat: int, models: bool = True) -> list[dict]:
    results = []
    for plugin in plugins:
        for name, build in MODELS.items():
            native = rmsnorm_native(rows, width) if name == "rmsnorm" else None
            results.append(_row(name, plugin, *build(rows, width), repeat, native))
        if models:
            for name, build in (("llama_decoder", zoo.MODELS["llama_decoder"]), ("gpt", zoo.LARGE_MODELS["gpt"])):
                model, inputs = build()
                results.append(_row(name, plugin, model, inputs, repeat))
    return results


def print_rows(rows: list[dict]) -> None:
    print("devkit fusion benchmark (medians of interleaved repetitions, ms; speedup = unfused / fused, above 1: "
          "fusion is faster; fused_wins = share of repetitions fused was faster; fused_vs_native = fused / native "
          "kernel; a shared machine's figures are noisy)")
    for row in rows:
        fields = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                           for k, v in row.items() if k not in ("benchmark", "plugin"))
        print(f"{row['benchmark']} on {row['plugin']}: {fields}")


def fusion_main(args) -> int:
    plugins = args.plugins.split(",")
    if "opencl" in plugins:
        os.environ.setdefault("POCL_DEVICES", "pthread pthread")
    rows = run(plugins, args.rows, args.width, args.repeat, not args.no_models)
    print_rows(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0
