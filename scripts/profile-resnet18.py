"""Per-layer time of ResNet-18 (devkit.onnx.zoo.resnet18, 224x224, batch 1)
on the cpu plugin against onnxruntime's own per-node profile.

    python scripts/profile-resnet18.py [--repeat 15] [--threads 1,2]

devkit: Plan.profile (each call launched alone, warm; median of --repeat
passes). onnxruntime: SessionOptions.enable_profiling, its per-node kernel
times (medians over --repeat runs) with 1 and 2 intra-op threads, spinning
off, and per node the faster of them. Conv nodes are matched in graph order
(both run the BatchNormalization-folded Convs, each with its Relu/Add fused
or not); the rest is summed per op. Rows: ms devkit, ms onnxruntime,
ratio devkit / onnxruntime (above 1: devkit is slower).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile

import numpy as np


def _conv_label(x_shape, w_shape, strides) -> str:
    return (f"{x_shape[1]}@{x_shape[2]}x{x_shape[3]} k{w_shape[2]}"
            f"{' s' + str(strides) if strides != 1 else ''} -> {w_shape[0]}")


def devkit_profile(model, feed, repeat):
    from devkit import onnx as donnx

    prepared = donnx.prepare(model, "cpu:0")
    prepared.run(feed)
    (plan,) = prepared.plans.values()
    times = plan.profile(feed, repeat)
    rows = []
    for call, (op, seconds) in zip(plan.calls, times):
        label = op
        if op in ("Conv", "FusedConv"):
            x = [call.inputs[0].shape[d] for d in range(call.inputs[0].ndim)]
            w = [call.inputs[1].shape[d] for d in range(call.inputs[1].ndim)]
            strides = dict((name, value) for name, _, value in call.attributes).get("strides", [1, 1])
            label = _conv_label(x, w, list(strides)[0])
        rows.append((op, label, seconds))
    return rows


def ort_profile(model, feed, repeat, threads):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, feed)
    for _ in range(repeat):
        session.run(None, feed)
    with open(session.end_profiling()) as f:
        events = json.load(f)
    per_node = collections.defaultdict(list)
    order, info = [], {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        if name not in info:
            order.append(name)
            info[name] = e["args"]
        per_node[name].append(e["dur"] * 1e-6)
    # the warm-up runs are the first three of each node's times
    return [(info[n]["op_name"], n, info[n], statistics.median(per_node[n][3:])) for n in order]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    from devkit.onnx import zoo

    model, feed = zoo.resnet18()
    ours = devkit_profile(model, feed, args.repeat)
    theirs = {t: ort_profile(model, feed, args.repeat, t) for t in map(int, args.threads.split(","))}
    convs = {t: [r for r in rows if r[0] in ("Conv", "FusedConv")] for t, rows in theirs.items()}
    our_convs = [r for r in ours if r[0] in ("Conv", "FusedConv")]
    print(f"load {os.getloadavg()[0]:.2f}; onnxruntime threads {args.threads}")
    head = " ".join(f"ort{t}t" for t in theirs)
    print(f"{'layer':28s} {'devkit':>7s} {head} {'best':>6s} ratio")
    total_ours = total_best = 0.0
    for i, (_, label, seconds) in enumerate(our_convs):
        peer = [convs[t][i][3] if i < len(convs[t]) else float("nan") for t in theirs]
        best = min(peer)
        total_ours += seconds
        total_best += best
        cols = " ".join(f"{p * 1e3:5.3f}" for p in peer)
        print(f"{label:28s} {seconds * 1e3:7.3f} {cols} {best * 1e3:6.3f} {seconds / best:5.2f}")
    print(f"{'convs':28s} {total_ours * 1e3:7.3f} {'':{len(head)}s} {total_best * 1e3:6.3f} "
          f"{total_ours / total_best:5.2f}")
    rest = collections.Counter()
    for op, _, seconds in ours:
        if op not in ("Conv", "FusedConv"):
            rest[op] += seconds
    peer_rest = {t: collections.Counter() for t in theirs}
    for t, rows in theirs.items():
        for op, _, _, seconds in rows:
            if op not in ("Conv", "FusedConv"):
                peer_rest[t][op] += seconds
    print("other ops (devkit):", ", ".join(f"{op} {s * 1e3:.3f}" for op, s in rest.items()))
    for t in theirs:
        print(f"other ops (ort {t}t):", ", ".join(f"{op} {s * 1e3:.3f}" for op, s in peer_rest[t].items()))
    for t in theirs:
        print(f"total ort {t}t node time {sum(r[3] for r in theirs[t]) * 1e3:.3f} ms; devkit "
              f"{sum(r[2] for r in ours) * 1e3:.3f} ms")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
