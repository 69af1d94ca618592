"""devkit-bench paddle: the Paddle bridge (devkit.paddle) against Paddle's own CPU place in the same run.

    devkit-bench paddle [--plugin cpu] [--repeat 15] [--calls 200] [--steps 5] [--json PATH]

ops: the time of one Paddle op on small float32 tensors (64 elements; an 8x8
matmul, a 1x2x6x6 conv2d) on ``devkit:0`` and on Paddle's CPU place; the
ratio of the medians is the bridge's per-op overhead (the target on the cpu
plugin is at most 2x). cnn: one training step (forward, CrossEntropyLoss,
backward, Adam) of devkit.paddle.models.cnn on a batch of 8, the suite's
CNN (the target is at most 1.5x Paddle CPU). Repetitions interleave devkit
and Paddle CPU, so a busy machine slows both alike; times are wall-clock
(time.perf_counter) medians. Paddle picks the devkit plugin once, when it is
imported: this command sets DEVKIT_PADDLE_PLUGIN to --plugin first.
"""

from __future__ import annotations

import json
import os
import statistics
import time

OP_TARGET_RATIO = 2.0
CNN_TARGET_RATIO = 1.5


def _op_cases(paddle):
    functional = paddle.nn.functional
    return {
        "add": (lambda a, b: a + b, [(64,), (64,)]),
        "multiply": (lambda a, b: a * b, [(64,), (64,)]),
        "relu": (lambda a: functional.relu(a), [(64,)]),
        "exp": (lambda a: paddle.exp(a), [(64,)]),
        "sum": (lambda a: a.sum(), [(64,)]),
        "mean": (lambda a: a.mean(axis=1), [(8, 8)]),
        "matmul": (lambda a, b: paddle.matmul(a, b), [(8, 8), (8, 8)]),
        "softmax": (lambda a: functional.softmax(a), [(8, 8)]),
        "layer_norm": (lambda a: functional.layer_norm(a, [8]), [(8, 8)]),
        "conv2d": (lambda a, w: functional.conv2d(a, w, padding=1), [(1, 2, 6, 6), (2, 2, 3, 3)]),
        "cast": (lambda a: a.astype("float64"), [(64,)]),
    }


def _per_call(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def ops(paddle, repeat: int, calls: int) -> list[dict]:
    import numpy as np

    rng = np.random.default_rng(0)
    rows = []
    for name, (op, shapes) in _op_cases(paddle).items():
        arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
        tensors = {place: [paddle.to_tensor(a, place=place) for a in arrays]
                   for place in (paddle.CPUPlace(), paddle.CustomPlace("devkit", 0))}
        (cpu_args, devkit_args) = tensors.values()
        np.testing.assert_allclose(op(*devkit_args).numpy(), op(*cpu_args).numpy(), rtol=1e-5, atol=1e-5)
        devkit_times, cpu_times = [], []
        for _ in range(repeat):
            devkit_times.append(_per_call(lambda: op(*devkit_args), calls))
            cpu_times.append(_per_call(lambda: op(*cpu_args), calls))
        devkit_us, cpu_us = statistics.median(devkit_times) * 1e6, statistics.median(cpu_times) * 1e6
        rows.append({"op": name, "devkit_us": devkit_us, "paddle_cpu_us": cpu_us, "ratio": devkit_us / cpu_us})
    return rows


def cnn_step(paddle, repeat: int, steps: int) -> dict:
    from devkit.paddle import models

    step_of = {}
    for place in ("cpu", "devkit:0"):
        paddle.set_device(place)
        paddle.seed(0)
        net = models.cnn(paddle)
        optimizer = paddle.optimizer.Adam(learning_rate=0.01, parameters=net.parameters())
        step_of[place] = models.training_step(paddle, net, optimizer, models.CNN_INPUT, models.CNN_CLASSES)
    times = {place: [] for place in step_of}

    def run(place):
        paddle.set_device(place)  # a layer's new tensors go to the current place
        for _ in range(steps):
            step_of[place]()
        if place != "cpu":  # the step's work complete (Paddle's CPU place runs it synchronously)
            paddle.device.synchronize(place)

    for place in step_of:
        run(place)  # warm: kernels resolved, the allocators' chunks cached
    for _ in range(repeat):
        for place in step_of:
            start = time.perf_counter()
            run(place)
            times[place].append((time.perf_counter() - start) / steps)
    devkit_ms, cpu_ms = statistics.median(times["devkit:0"]) * 1e3, statistics.median(times["cpu"]) * 1e3
    return {"model": f"devkit.paddle.models.cnn, batch {models.CNN_INPUT[0]}, Adam", "devkit_ms": devkit_ms,
            "paddle_cpu_ms": cpu_ms, "ratio": devkit_ms / cpu_ms}


def paddle_main(args) -> int:
    os.environ["DEVKIT_PADDLE_PLUGIN"] = args.plugin
    import importlib.util

    if importlib.util.find_spec("paddle") is None:
        print("devkit-bench paddle needs PaddlePaddle: pip install 'devkit[paddle]'")
        return 1
    import devkit.paddle  # noqa: F401  (before paddle: Paddle looks for custom devices when imported)
    import paddle

    paddle.disable_signal_handler()
    threads = {"DEVKIT_CPU_THREADS": os.environ.get("DEVKIT_CPU_THREADS", "default"),
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "default"), "cores": os.cpu_count()}
    rows = ops(paddle, args.repeat, args.calls)
    print(f"ops, devkit:0 ({args.plugin}) vs Paddle CPU (median of {args.repeat} interleaved rounds of "
          f"{args.calls} calls, wall time)")
    print(f"{'op':<12}{'devkit us':>12}{'paddle us':>12}{'ratio':>8}")
    for row in rows:
        print(f"{row['op']:<12}{row['devkit_us']:>12.1f}{row['paddle_cpu_us']:>12.1f}{row['ratio']:>8.2f}")
    median_ratio = statistics.median(r["ratio"] for r in rows)
    print(f"median ratio per op: {median_ratio:.2f}x (target <= {OP_TARGET_RATIO:g}x on cpu)")
    cnn = cnn_step(paddle, args.repeat, args.steps)
    print(f"cnn: {cnn['model']}: devkit {cnn['devkit_ms']:.3f} ms, Paddle CPU {cnn['paddle_cpu_ms']:.3f} ms a step, "
          f"ratio {cnn['ratio']:.2f}x (target <= {CNN_TARGET_RATIO:g}x on cpu)")
    print(f"threads: {threads}")
    if args.json:
        args.json.write_text(json.dumps({"plugin": args.plugin, "ops": rows, "median_ratio": median_ratio,
                                         "cnn": cnn, "threads": threads}, indent=2))
    return 0
