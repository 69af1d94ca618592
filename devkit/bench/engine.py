"""devkit-bench engine: the host cost of devkit's execution engine against
torch, NumPy and onnxruntime, measured in the same run.

    devkit-bench engine [--plugins cpu,opencl] [--only eager,chain,models,host] [--models resnet18,gpt]
                        [--repeat 15] [--quick] [--json PATH]

- eager: a 1-element float32 Add through devkit.ops.Add (the call cache's
  path) against torch.add and numpy.add;
- chain: a 200-node chain of tiny elementwise ops (an ONNX model built here)
  through a devkit plan and the interpreter, against onnxruntime with 1 and 2
  intra-op threads: the time per node is the host's cost of a node;
- models: devkit.onnx.zoo's models and its large ones (ResNet-18 at 224x224,
  a 4-layer GPT-style stack), plan vs interpreter vs onnxruntime, and the
  launcher the plan's runs use;
- host (not in the default set): where a run of a zoo model (default: the
  mlp) spends its time beyond its kernels, stage by stage (host_cost_row).

Every chain and model row splits the plan's run: kernel_ms is its device
work alone (Plan.launch_device_work: the input copies, the calls, the output
copies) timed in the same interleaving as the run, host_ms the rest (binding
the feed, the staging copies, the launch's host side); plan_host_us_per_node
is the host's part per kernel call measured another way: a run on a
caller's stream, timed until it returns, before the work completes (and
plan_host_cpu_us_per_node the submitting thread's CPU time of it).

Each contender is timed in turn within every repetition (interleaved) and the
figures are medians over the repetitions; ratios are devkit / peer (below 1:
devkit is faster). The interpreter is interleaved with onnxruntime apart from
the plan (interpreter_over_onnxruntime within its own interleaving). torch runs with OMP_WAIT_POLICY=PASSIVE and onnxruntime
with spinning off, so neither's idle threads slow whatever runs next.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

import devkit

from .. import onnx as donnx
from ..engine.launch import StagedGraph
from ..onnx import zoo

CHAIN_OPS = ("Add", "Mul", "Relu", "Sigmoid", "Neg", "Abs")
CHAIN_WIDTH = 16


def _interleaved(contenders: dict[str, Callable[[], object]], repeat: int, calls: int = 1) -> dict[str, float]:
    """Median seconds per call of each contender; every repetition times each in turn."""
    for fn in contenders.values():
        fn()  # warm-up: plans, caches, thread pools
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeat):
        for name, fn in contenders.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(values) for name, values in times.items()}


def chain_model(nodes: int = 200, width: int = CHAIN_WIDTH):
    """x (width,) float32 through ``nodes`` elementwise ops cycling over CHAIN_OPS
    (Add and Mul take a constant); returns (model, inputs)."""
    from onnx import TensorProto, helper, numpy_helper

    initializers = [numpy_helper.from_array(np.full(width, 0.5, np.float32), "half")]
    graph_nodes, value = [], "x"
    for i in range(nodes):
        op = CHAIN_OPS[i % len(CHAIN_OPS)]
        inputs = [value, "half"] if op in ("Add", "Mul") else [value]
        output = "y" if i == nodes - 1 else f"v{i}"
        graph_nodes.append(helper.make_node(op, inputs, [output], name=f"n{i}"))
        value = output
    graph = helper.make_graph(graph_nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [width])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": np.linspace(-1, 1, width, dtype=np.float32)}


def _ort_sessions(model) -> dict[str, Callable]:
    """onnxruntime sessions with 1 and 2 intra-op threads, spinning off, by label."""
    import onnxruntime

    sessions = {}
    for threads in (1, 2):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[f"onnxruntime_{threads}t"] = onnxruntime.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sessions


def _model_row(model, inputs: dict, plugin: str, repeat: int) -> tuple[dict, object]:
    """Plan, interpreter and onnxruntime on one model, and the plan's device
    work alone (Plan.launch_device_work) in the same interleaving: times in
    ms and ratios; the plan's time beyond its device work is host_ms."""
    # Unfused (devkit-bench fusion measures the fused plans), on prepared
    # weights where the plugin prepares them. The same plan on the weights as
    # given runs the interpreter's kernels and must match it bit for bit.
    planned = donnx.prepare(model, f"{plugin}:0", fuse=False)
    given = donnx.prepare(model, f"{plugin}:0", fuse=False, prepare_weights=False)
    interpreted = donnx.prepare(model, f"{plugin}:0", plan=False)
    sessions = _ort_sessions(model)
    want = sessions["onnxruntime_1t"].run(None, inputs)
    got, given_got, interpreted_got = planned.run(inputs), given.run(inputs), interpreted.run(inputs)
    (plan,) = planned.plans.values()
    ort_1t, ort_2t = (lambda s=s: s.run(None, inputs) for s in sessions.values())
    # The plan and its device work each come after an onnxruntime session,
    # which leaves the caches alike: their difference is the run's host work.
    # The interpreter has an interleaving of its own: under load, what ran
    # right after it (and one onnxruntime run) took 3-5x its time.
    medians = _interleaved({"onnxruntime_1t": ort_1t, "plan": lambda: planned.run(inputs),
                            "onnxruntime_2t": ort_2t, "kernel": lambda: plan.launch_device_work(inputs)}, repeat)
    best_ort = min(medians["onnxruntime_1t"], medians["onnxruntime_2t"])
    beside_interpreter = _interleaved({"interpreter": lambda: interpreted.run(inputs), "onnxruntime_1t": ort_1t,
                                       "onnxruntime_2t": ort_2t}, repeat)
    medians["interpreter"] = beside_interpreter["interpreter"]
    row = {"plugin": plugin, **{f"{name}_ms": medians[name] * 1e3 for name in ("plan", "kernel")},
           "host_ms": (medians["plan"] - medians["kernel"]) * 1e3,
           **{f"{name}_ms": medians[name] * 1e3 for name in ("interpreter", "onnxruntime_1t", "onnxruntime_2t")},
           "plan_over_onnxruntime": medians["plan"] / best_ort,
           "interpreter_over_onnxruntime": medians["interpreter"] / min(beside_interpreter["onnxruntime_1t"],
                                                                         beside_interpreter["onnxruntime_2t"]),
           "plan_over_interpreter": medians["plan"] / medians["interpreter"],
           "prepared_inputs": len(plan.prepared),
           "plan_equals_interpreter": all(np.array_equal(a, b) for a, b in zip(given_got, interpreted_got)),
           "max_abs_diff_prepared_vs_given": max(float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0
                                                 for a, b in zip(got, given_got)),
           "max_abs_diff_vs_onnxruntime": max(float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0
                                              for a, b in zip(got, want))}
    wall, cpu = _submission_seconds(planned, inputs, plugin, repeat)
    row["plan_host_us_per_node"] = wall * 1e6 / len(plan.calls)
    row["plan_host_cpu_us_per_node"] = cpu * 1e6 / len(plan.calls)
    return row, plan


def _submission_seconds(planned, inputs: dict, plugin: str, repeat: int) -> tuple[float, float]:
    """Median seconds of the host's part of a planned run, a run on a
    caller's stream until it returns (before its work completes): wall time,
    and the CPU time of the submitting thread, which a loaded machine or a
    device sharing the host's cores (PoCL's pthread device) inflates less."""
    stream = devkit.device(f"{plugin}:0").create_stream()
    planned.run(inputs, stream)
    stream.synchronize()
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.thread_time()
        planned.run(inputs, stream)
        wall.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
        stream.synchronize()
    stream.destroy()
    return statistics.median(wall), statistics.median(cpu)


def eager_rows(repeat: int, calls: int) -> list[dict]:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts its pool
    one = np.ones(1, np.float32)
    a, b = devkit.asarray(one), devkit.asarray(one)
    contenders = {"devkit": lambda: devkit.ops.Add(a, b), "numpy": lambda: np.add(one, one)}
    try:
        import torch
    except ImportError:  # torch is an optional peer: the row says it is absent
        torch = None
    else:
        ta, tb = torch.from_numpy(one.copy()), torch.from_numpy(one.copy())
        contenders["torch"] = lambda: torch.add(ta, tb)
    medians = _interleaved(contenders, repeat, calls)
    row = {"benchmark": "eager Add 1 element", **{f"{name}_us": seconds * 1e6 for name, seconds in medians.items()},
           **{f"devkit_over_{name}": medians["devkit"] / seconds for name, seconds in medians.items() if name != "devkit"}}
    if torch is None:
        row["torch"] = "not installed (pip install 'devkit[torch]')"
    return [row]


def chain_rows(plugins: list[str], nodes: int, repeat: int) -> list[dict]:
    model, inputs = chain_model(nodes)
    rows = []
    for plugin in plugins:
        row, _ = _model_row(model, inputs, plugin, repeat)
        for name in ("plan", "interpreter", "onnxruntime_1t", "onnxruntime_2t"):
            row[f"{name}_us_per_node"] = row[f"{name}_ms"] * 1e3 / nodes
        rows.append({"benchmark": f"chain of {nodes} elementwise ops", "nodes": nodes, **row})
    return rows


def model_rows(plugins: list[str], models: list[str] | None, quick: bool, repeat: int) -> list[dict]:
    builders = {**zoo.MODELS, **zoo.LARGE_MODELS}
    if models is None:  # the quick run (the test's): two small models
        models = ["mlp", "resnet"] if quick else list(builders)
    unknown = sorted(set(models) - set(builders))
    if unknown:
        raise SystemExit(f"devkit-bench engine: no model {unknown[0]!r} (the zoo has {', '.join(builders)})")
    builders = {name: builders[name] for name in models}
    rows = []
    for plugin in plugins:
        for name, build in builders.items():
            model, inputs = build()
            row, plan = _model_row(model, inputs, plugin, repeat)
            rows.append({"benchmark": f"model {name}", "model": name, **row, "launcher": type(plan.launcher).__name__,
                         "kernel_calls": len(plan.calls), "arena_bytes": plan.arena_bytes,
                         "intermediate_bytes": plan.memory.total_bytes})
    return rows


# A staged run's stages (Plan.run without a stream, on a plugin with graphs: engine.launch.StagedGraph).
HOST_COST_STAGES = ("feed_checks", "run_dispatch", "input_copies", "launch", "kernels", "output_wrapping")


def host_cost_row(model, inputs: dict, plugin: str, repeat: int, calls: int = 200) -> dict:
    """Where a PreparedModel.run of ``model`` spends its time beyond its
    kernels, per stage, in microseconds (medians of interleaved repetitions
    of ``calls`` calls each):

    - feed_checks: PreparedModel.run's checks of the feed and its plan
      look-up (the run less Plan.run, both with the graph launch left out);
    - run_dispatch: Plan.run's own work (the lock, the choice of path, the
      result list: Plan.run with the graph launch left out, less the input
      copies and the output wrapping);
    - input_copies: the feed into the staged graph's input arrays;
    - launch: the one graph launch less its kernels (the launch's host side
      and the copies it holds; the default stream completes it, so there is
      no separate synchronisation). A difference of two device timings: it
      may come out slightly negative where it is within their noise;
    - kernels: the calls alone (Plan.launch_calls);
    - output_wrapping: the results copied out of the output staging arrays.

    The run must be staged (a plugin with graphs, a feed not bound in place);
    ``host_us`` is the run less its kernels."""
    prepared = donnx.prepare(model, f"{plugin}:0", fuse=False)
    prepared.run(inputs)
    (plan,) = prepared.plans.values()
    staged = plan.launcher
    if not isinstance(staged, StagedGraph):
        raise SystemExit(f"devkit-bench engine: the host-cost split needs a staged run; {plugin}'s plan of this "
                         f"model runs through {type(staged).__name__}")
    feed = prepared._bind(inputs)
    values = [feed[name] for name in plan._feed_order]

    @contextlib.contextmanager
    def without_launch():  # the run's host work alone: its graph launch made a no-op for the sample
        staged.launch = lambda: None
        try:
            yield
        finally:
            del staged.launch

    timers = {"run": (lambda: prepared.run(inputs), contextlib.nullcontext),
              "run_host": (lambda: prepared.run(inputs), without_launch),
              "plan_run_host": (lambda: plan.run(feed), without_launch),
              "input_copies": (lambda: staged.fill(values), contextlib.nullcontext),
              "graph_launch": (staged.launch, contextlib.nullcontext),
              "kernels": (plan.launch_calls, contextlib.nullcontext),
              "output_wrapping": (lambda: [output.copy() for output in staged.outputs], contextlib.nullcontext)}
    for fn, _ in timers.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(repeat):
        for name, (fn, setting) in timers.items():
            with setting():
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                times[name].append((time.perf_counter() - start) / calls * 1e6)
    us = {name: statistics.median(values) for name, values in times.items()}
    stages = {"feed_checks": us["run_host"] - us["plan_run_host"],
              "run_dispatch": us["plan_run_host"] - us["input_copies"] - us["output_wrapping"],
              "input_copies": us["input_copies"], "launch": us["graph_launch"] - us["kernels"],
              "kernels": us["kernels"], "output_wrapping": us["output_wrapping"]}
    return {"plugin": plugin, "run_us": us["run"], "host_us": us["run"] - us["kernels"],
            **{f"{stage}_us": stages[stage] for stage in HOST_COST_STAGES}, "kernel_calls": len(plan.calls)}


def host_cost_rows(plugins: list[str], models: list[str] | None, repeat: int, calls: int) -> list[dict]:
    rows = []
    for plugin in plugins:
        for name in models or ["mlp"]:
            model, inputs = zoo.MODELS[name]()
            rows.append({"benchmark": f"host cost {name}", "model": name,
                         **host_cost_row(model, inputs, plugin, repeat, calls)})
    return rows


def run(plugins: list[str], only: list[str], repeat: int, quick: bool, models: list[str] | None = None) -> list[dict]:
    rows = []
    if "eager" in only:
        rows += eager_rows(repeat, 200 if quick else 2000)
    if "chain" in only:
        rows += chain_rows(plugins, 20 if quick else 200, repeat)
    if "models" in only:
        rows += model_rows(plugins, models, quick, repeat)
    if "host" in only:
        rows += host_cost_rows(plugins, models, repeat, 20 if quick else 200)
    return rows


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def print_rows(rows: list[dict]) -> None:
    print("devkit engine benchmark (medians of interleaved repetitions; ratios devkit / peer, below 1: devkit "
          "is faster; a shared machine's figures are noisy)")
    for row in rows:
        fields = ", ".join(f"{key} {_format(value)}" for key, value in row.items() if key != "benchmark")
        print(f"{row['benchmark']}: {fields}")


def engine_main(args) -> int:
    plugins = args.plugins.split(",")
    only = args.only.split(",")
    if args.plugins and "opencl" in plugins:
        os.environ.setdefault("POCL_DEVICES", "pthread pthread")
    rows = run(plugins, only, args.repeat, args.quick, args.models.split(",") if args.models else None)
    print_rows(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0
