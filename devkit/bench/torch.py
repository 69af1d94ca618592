"""devkit-bench torch: the torch bridge (devkit.torch) against torch's CPU in the same run.

    devkit-bench torch [--plugin cpu] [--repeat 7] [--json PATH]

eager: the time of one aten op on small tensors (64 float32 elements) on the
plugin through devkit.torch, and on torch's CPU; the overhead is the
difference of the medians (the target on cpu is at most 15 us). The floor
is the same call of a custom op whose devkit kernel is a Python function
returning its input: what torch's dispatcher alone costs a Python backend.
Times are the process's CPU time (time.process_time: every thread, the
plugin's too), which a machine shared with other work disturbs less than
wall time; torch runs with OMP_WAIT_POLICY=PASSIVE (unless set otherwise)
so that its idle OpenMP threads do not spin, and the report says how many
threads torch uses.
compile: a GPT-style block (models.gpt_block) forward under
torch.compile(backend="devkit") against torch eager on the CPU (the target
is at most 1.5x). Repetitions interleave devkit and torch so that a busy
machine slows both alike.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import time

EAGER_TARGET_US = 15.0
COMPILE_TARGET_RATIO = 1.5


def _eager_cases(torch):
    return {
        "add": lambda a, b: torch.add(a, b), "mul_scalar": lambda a, b: a * 2.0, "relu": lambda a, b: torch.relu(a),
        "exp": lambda a, b: torch.exp(a), "sum": lambda a, b: a.sum(), "mm": lambda a, b: a.view(8, 8) @ b.view(8, 8),
        "add_": lambda a, b: a.add_(b), "view": lambda a, b: a.view(8, 8), "transpose": lambda a, b: a.view(8, 8).t(),
        "where": lambda a, b: torch.where(a > b, a, b),
    }


def _time_per_call(fn, calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls


def eager(torch, dt, repeat: int, calls: int = 200) -> list[dict]:
    cpu_a, cpu_b = torch.randn(64), torch.randn(64)
    dev_a, dev_b = cpu_a.to(dt.DEVICE_TYPE), cpu_b.to(dt.DEVICE_TYPE)
    rows = []
    for name, op in _eager_cases(torch).items():
        op(dev_a, dev_b)  # resolves the lowering once
        devkit_times, torch_times = [], []
        for _ in range(repeat):
            devkit_times.append(_time_per_call(lambda: op(dev_a, dev_b), calls))
            torch_times.append(_time_per_call(lambda: op(cpu_a, cpu_b), calls))
        devkit_us, torch_us = statistics.median(devkit_times) * 1e6, statistics.median(torch_times) * 1e6
        rows.append({"op": name, "devkit_us": devkit_us, "torch_cpu_us": torch_us, "overhead_us": devkit_us - torch_us})
    return rows


def dispatch_floor(torch, dt, repeat: int, calls: int = 200) -> float:
    """us per call of a custom op whose devkit (PrivateUse1) kernel is a Python no-op."""
    library = torch.library.Library("devkit_bench", "FRAGMENT")
    if not hasattr(torch.ops.devkit_bench, "noop"):
        library.define("noop(Tensor self, Tensor other) -> Tensor")
    library.impl("noop", lambda a, b: a, "PrivateUse1")
    a, b = torch.randn(64).to(dt.DEVICE_TYPE), torch.randn(64).to(dt.DEVICE_TYPE)
    noop = torch.ops.devkit_bench.noop
    return statistics.median(_time_per_call(lambda: noop(a, b), calls) for _ in range(repeat)) * 1e6


def compile_block(torch, dt, models, repeat: int, calls: int = 5) -> dict:
    torch.manual_seed(0)
    block = models.gpt_block(64, 4).eval()
    x = torch.randn(4, 32, 64)
    compiled = torch.compile(copy.deepcopy(block).to(dt.DEVICE_TYPE), backend="devkit")
    x_dev = x.to(dt.DEVICE_TYPE)
    with torch.no_grad():
        compiled(x_dev)
        compiled_times, eager_times = [], []
        for _ in range(repeat):
            compiled_times.append(_time_per_call(lambda: compiled(x_dev), calls))
            eager_times.append(_time_per_call(lambda: block(x), calls))
    compiled_ms, eager_ms = statistics.median(compiled_times) * 1e3, statistics.median(eager_times) * 1e3
    return {"model": "gpt_block(64, 4), x (4, 32, 64), forward", "devkit_compiled_ms": compiled_ms,
            "torch_eager_cpu_ms": eager_ms, "ratio": compiled_ms / eager_ms}


def torch_main(args) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when torch's OpenMP starts
    try:
        import torch
    except ImportError:
        print("devkit-bench torch needs PyTorch: pip install 'devkit[torch]'")
        return 1
    # devkit.torch imports torch, an optional dependency: only once it is known to be installed.
    import devkit.torch as dt
    from devkit.torch import models

    dt.register(args.plugin)
    rows = eager(torch, dt, args.repeat)
    print(f"eager, {args.plugin} vs torch CPU (median of {args.repeat} interleaved repetitions, 64 float32)")
    print(f"{'op':<12}{'devkit us':>12}{'torch us':>12}{'overhead us':>14}")
    for row in rows:
        print(f"{row['op']:<12}{row['devkit_us']:>12.1f}{row['torch_cpu_us']:>12.1f}{row['overhead_us']:>14.1f}")
    median_overhead = statistics.median(r["overhead_us"] for r in rows)
    floor = dispatch_floor(torch, dt, args.repeat)
    print(f"median overhead per aten op: {median_overhead:.1f} us (target <= {EAGER_TARGET_US:g} us on cpu); "
          f"torch's dispatch to a Python no-op kernel: {floor:.1f} us")
    print(f"torch CPU threads: {torch.get_num_threads()}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    block = compile_block(torch, dt, models, args.repeat)
    print(f"compile: {block['model']}: devkit {block['devkit_compiled_ms']:.2f} ms, torch eager CPU "
          f"{block['torch_eager_cpu_ms']:.2f} ms, ratio {block['ratio']:.2f}x (target <= {COMPILE_TARGET_RATIO:g}x)")
    if args.json:
        args.json.write_text(json.dumps({"plugin": args.plugin, "eager": rows, "median_overhead_us": median_overhead,
                                         "dispatch_floor_us": floor, "torch_threads": torch.get_num_threads(),
                                         "compile": block}, indent=2))
    return 0
